import Foundation

/// The server as the sync engine sees it: where change sets go up and checkpoints come down.
/// ``PostgresSyncServer`` is the conformance that talks to PostgreSQL itself (docs/SYNC.md); a
/// sync gateway would be another, so the engine and its state machines are one code
/// whatever a machine reaches.
package protocol SyncServer: Sendable {
    /// Opens a connection for the engine's statements, as machine `machine` (a gateway binds
    /// the connection to it). `closed` is called when it closes (the server restarted, the
    /// network cut it), so that a waiting engine wakes and finds out.
    func connect(machine: UUID, closed: @escaping @Sendable () -> Void) async throws -> any SyncServerConnection

    /// Listens for the group's changes until it fails or the task is cancelled: `notify` with
    /// the id of each transaction that changed the group, or nil for a change that may be
    /// anything (each time the listener connects: whatever happened while it did not listen).
    func listen(machine: UUID, _ notify: @escaping @Sendable (UInt64?) -> Void) async throws

    /// Whether an error of this server means offline (the network, the server down) or an
    /// error an operator must fix (authentication, privileges, tables), with its message.
    func classify(_ error: any Error) -> (SyncEngine.Status.State, String)

    /// The server's name for the log (credentials left out).
    var redacted: String { get }

    /// Whether a server accepts connections now: a connection opened and closed, nothing sent,
    /// bounded by a fraction of a second. The engine probes while it waits offline, to notice
    /// a server that came back (``ConnectionStateMachine/probed(reachable:)``).
    func probe() async -> Bool
}

extension SyncServer {
    /// No probe: a server that does not know how is never found back before the delay ends.
    package func probe() async -> Bool { false }
}

/// One connection of the engine to its ``SyncServer``.
package protocol SyncServerConnection: Sendable {
    /// Which server of the configuration it reached, when there are several (for the log).
    var serverName: String? { get }

    /// Makes the server ready for `schema`: creates or migrates its tables where the role may,
    /// checks them where it may not. Again after each migration of the store.
    func prepare(_ schema: ServerSchema) async throws

    /// The highest number of `machine`'s change sets the server has (0: none).
    func uploadedThrough(machine: UUID) async throws -> Int64

    /// The digests (``QueuedChangeSet/digest``) the server recorded for `numbers` of
    /// `machine`'s change sets; a number it has no digest of is absent.
    func digests(machine: UUID, numbers: [Int64]) async throws -> [Int64: Int64]

    /// Uploads change sets in order, exactly once; one outcome per change set, and the ids of
    /// the server transactions that applied them (nil: not known).
    func upload(_ batch: [QueuedEntry], machine: UUID) async throws
        -> (outcomes: [ServerSession.UploadOutcome], transactions: [UInt64]?)

    /// The checkpoint after `previous` (nil: a first sync), with the refusals of this
    /// machine's uploads numbered after `rejectedAfter`. A snapshot's pages go to `stage`
    /// as they are read (nil: staged; else why not, and the read throws
    /// ``Checkpoint/StagingFailed``).
    func readCheckpoint(
        after previous: String?, rejectedAfter: Int64, machine: UUID, pageSize: Int,
        stage: @escaping @Sendable (SnapshotPage) async -> String?
    ) async throws -> Checkpoint

    /// Compacts the server's log, keeping `retention` seconds of it.
    func compact(retention: TimeInterval) async throws

    /// Closes the connection.
    func close()
}
