import Foundation

/// What became of a checkpoint handed to the daemon.
package enum SyncApplyResult: Sendable, Equatable {
    /// Applied (or nothing to apply) and recorded.
    case applied
    /// Not applied: change sets are queued that it does not include (they would be hidden
    /// until their upload, and come back: a flicker). Upload them, then read again.
    case pendingUploads
    /// Not applied: the store refused it (the reason).
    case failed(String)
}

/// What the daemon does for its sync engine, on the daemon's own thread.
package protocol SyncHost: AnyObject, Sendable {
    /// Applies a checkpoint to the group's store as one change set, published to the apps like
    /// any other, with the checkpoint recorded in the same transaction; nothing, when the store
    /// has change sets queued that the checkpoint does not include (it would hide them until
    /// their upload: the engine uploads them and reads again). A snapshot checkpoint applies
    /// the pages staged for it (``stage(_:)``), and only when every one of them was.
    func apply(_ checkpoint: Checkpoint) async -> SyncApplyResult
    /// Stages a page of a snapshot checkpoint, out of the apps' sight (the first page drops
    /// whatever was staged before); nil when staged, else why not.
    func stage(_ page: SnapshotPage) async -> String?

    /// Patches the staged snapshot `base` with `checkpoint` (the changes since `base`: each
    /// object's row as the server has it now, or its deletion) and applies the stage as the
    /// store's state at `checkpoint`, recording it, its refusals told, under the write-checkpoint
    /// rule (``SyncApplyResult/pendingUploads`` when a change set was queued that it lacks).
    func applyStaged(_ checkpoint: Checkpoint, base: String) async -> SyncApplyResult
    /// The queued change sets through `number` are on the server: the queue may drop them.
    func uploaded(through number: Int64) async
    /// The store was restored from an older backup or copied from another machine: the server
    /// has change sets under this machine's id that the store did not make. The daemon gives
    /// the store the machine id `machine`, drops the queued change sets numbered `dropping`
    /// (the server has them, the same), and logs `reason`. False when the store refused.
    func reidentify(as machine: UUID, dropping: [Int64], reason: String) async -> Bool

    /// The engine's state changed (for the log and the metrics).
    func syncStateChanged(_ status: SyncEngine.Status)
}
