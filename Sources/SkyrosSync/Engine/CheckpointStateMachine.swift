import Foundation

/// The downstream half of a machine's sync, as a value: the cursor (the last checkpoint
/// applied), the server's notifications, this machine's own uploads not yet read back, and the
/// compaction's timing. It takes events and returns what the engine must do next
/// (``Action``); it does no I/O, so that every rule below is tested as a transcript
/// (`Tests/SkyrosSyncTests`).
///
/// The rules:
/// - A checkpoint is read when something may have changed: a notification of a transaction
///   that is neither this machine's own upload nor in the last checkpoint, a wake-up that may
///   stand for anything (a notification without an id, the listener connected again, the
///   connection closed), the poll interval passing without a signal, a migration, a refusal.
/// - This machine's uploads are read back with the next change another writer makes (or at
///   the poll interval), not at once, unless the server refused some of them (the refusal is
///   told now), their transactions are not known, or the uploads not read back grow past a batch.
/// - The write-checkpoint rule (``Checkpoint/isWriteCheckpoint(for:)``): a checkpoint that does
///   not include every change set uploaded so far is not applied; the queue goes first.
/// - An empty checkpoint moves the cursor in memory only (after a restart, reading again from
///   the one the store recorded finds the same nothing).
/// - The server's log is compacted every ``compactionInterval``, the first time 30 s after
///   connecting (or one interval, when shorter), after a checkpoint was applied.
package struct CheckpointStateMachine: Sendable {
    /// What the engine does next.
    package enum Action: Sendable, Equatable {
        /// Read the checkpoint after this one (a `pg_snapshot` text; nil: a first sync, a snapshot).
        case read(after: String?)
        /// Hand the checkpoint read to the daemon, then tell ``applied(_:now:)``.
        case apply
        /// Upload what is queued first, then come back (the checkpoint is read again).
        case uploadFirst
        /// Compact the server's log, then tell ``compacted()``.
        case compact
        /// Wait for a signal (a local commit, a notification), at most this long, then tell
        /// ``wokeUp(signaled:)``.
        case wait(Duration)
        /// The checkpoint cannot be applied (the reason, for the status): wait this long, then
        /// come round again (the checkpoint is read again).
        case fail(String, retryAfter: Duration)
    }

    /// What the engine read: the parts of a ``Checkpoint`` the rules look at.
    package struct Summary: Sendable, Equatable {
        package var snapshot: String
        package var number: UInt64
        package var uploadedThrough: Int64
        package var lagMilliseconds: Int
        /// Nothing to apply: no object, no refusal, not a snapshot.
        package var isEmpty: Bool
        /// A snapshot whose pages are staged: applied once patched with the changes since it.
        package var isSnapshot: Bool

        package init(
            snapshot: String, number: UInt64, uploadedThrough: Int64, lagMilliseconds: Int = 0, isEmpty: Bool,
            isSnapshot: Bool = false
        ) {
            self.snapshot = snapshot
            self.number = number
            self.uploadedThrough = uploadedThrough
            self.lagMilliseconds = lagMilliseconds
            self.isEmpty = isEmpty
            self.isSnapshot = isSnapshot
        }

        /// The summary of `checkpoint`.
        package init(_ checkpoint: Checkpoint) {
            self.init(
                snapshot: checkpoint.snapshot, number: checkpoint.number, uploadedThrough: checkpoint.uploadedThrough,
                lagMilliseconds: checkpoint.lagMilliseconds,
                isEmpty: !checkpoint.isSnapshot && checkpoint.objects.isEmpty && checkpoint.rejected.isEmpty,
                isSnapshot: checkpoint.isSnapshot)
        }
    }

    /// How often a checkpoint is read when no signal came.
    package let pollInterval: Duration
    /// How often the server's log is compacted.
    package let compactionInterval: Duration
    /// How many of this machine's change sets may go up before a checkpoint is read for them.
    package let backlogLimit: Int
    /// The most transaction ids remembered between two reads; past it, any notification reads.
    package static let notifiedLimit = 1_000

    /// The last checkpoint applied (a `pg_snapshot` text; nil: none yet).
    package private(set) var cursor: String?
    /// The last checkpoint applied's number (its snapshot's xmin; 0: none yet in this run).
    package private(set) var checkpointNumber: UInt64 = 0
    /// How old the newest change of the last checkpoint applied was when it was read.
    package private(set) var lagMilliseconds = 0
    /// The highest upload number of this machine whose refusal, if it was refused, the store
    /// has recorded (the last checkpoint applied's ``Checkpoint/uploadedThrough``): a checkpoint
    /// carries the refusals numbered after it, whatever its kind, so that none is missed (a
    /// refusal followed by a first sync) or told twice.
    package private(set) var rejectedThrough: Int64
    /// The snapshot whose pages the daemon staged, not yet applied (its `pg_snapshot` text):
    /// the next reads are the changes since it, which patch the stage and make it a checkpoint
    /// (``Action/apply``, as the daemon's `applyStaged`). A snapshot is read page by page, each
    /// page at its own PostgreSQL snapshot and in no long transaction; the changes since its
    /// start bring every row to one consistent state. A machine that keeps saving reads only
    /// those changes again, not the whole snapshot, until one includes its uploads.
    package private(set) var staged: String?
    /// Whether the next round reads a checkpoint whatever was notified.
    package private(set) var mustRead = true
    /// The transactions notified since the last look.
    private var notified: Set<UInt64> = []
    /// A wake-up that may stand for any change was notified.
    private var notifiedUnknown = false
    /// The server transactions of this machine's uploads since the last checkpoint read.
    package private(set) var ownTransactions: Set<UInt64> = []
    /// How many change sets those uploads carried.
    package private(set) var ownChangeSets = 0
    /// The checkpoint read and not yet applied.
    private var pending: Summary?
    private var lastCompaction: ContinuousClock.Instant?

    /// A machine whose store last applied `cursor`, and recorded the refusals of its uploads
    /// through `rejectedThrough`.
    package init(
        cursor: String?, rejectedThrough: Int64 = 0, pollInterval: Duration = .seconds(5),
        compactionInterval: Duration = .seconds(600), backlogLimit: Int = 1_000
    ) {
        self.cursor = cursor
        self.rejectedThrough = rejectedThrough
        self.pollInterval = pollInterval
        self.compactionInterval = compactionInterval
        self.backlogLimit = backlogLimit
    }

    // MARK: - Events from anywhere

    /// The server notified a change: the transaction `xid`, or nil for a wake-up that may stand
    /// for any change (a notification without an id, the listener connected again, the
    /// connection closed).
    package mutating func notified(_ xid: UInt64?) {
        if let xid, notified.count < Self.notifiedLimit {
            notified.insert(xid)
        } else {
            notifiedUnknown = true
        }
    }

    // MARK: - The loop's events

    /// The machine took a new id (its store was restored or copied): none of its uploads is
    /// on the server under it yet, and the next round reads a checkpoint.
    ///
    /// The store's rows are not the server's as of its cursor any more: a restored or copied
    /// store holds what its backup held, and the server never logged some of what became of
    /// it (an insert and its delete uploaded in one batch, a change set the server refused,
    /// both dropped from the queue as the server's). The next checkpoint is therefore a
    /// snapshot, which brings every row to the server's (a snapshot already staged is one).
    package mutating func reidentified() {
        cursor = nil
        rejectedThrough = 0
        ownTransactions = []
        ownChangeSets = 0
        mustRead = true
    }

    /// A connection came up at `now`: the first round reads a checkpoint.
    package mutating func connected(now: ContinuousClock.Instant) {
        mustRead = true
        pending = nil
        lastCompaction = now - compactionInterval + min(.seconds(30), compactionInterval)
    }

    /// The group's store was migrated: read a checkpoint in its new shape (a stage of the old
    /// shape is read again).
    package mutating func schemaChanged() {
        mustRead = true
        staged = nil
    }

    /// This machine uploaded `changeSets` change sets in the server transactions
    /// `transactions` (nil: not known), `refused` some of them or not.
    package mutating func uploaded(changeSets: Int, transactions: [UInt64]?, refused: Bool) {
        ownChangeSets += changeSets
        if let transactions { ownTransactions.formUnion(transactions) }
        if refused || transactions == nil || ownChangeSets >= backlogLimit { mustRead = true }
    }

    /// The uploads are done for now: read a checkpoint, or wait.
    package mutating func uploadsDone() -> Action {
        // Woken by notifications of this machine's own uploads, or of transactions the last
        // checkpoint has already: nothing to read.
        if !mustRead && notificationsSeen() { return .wait(pollInterval) }
        mustRead = false
        return .read(after: staged ?? cursor)
    }

    /// The checkpoint after ``Action/read(after:)``, read while this machine's queue was on the
    /// server through `uploadedThrough`, at `now`.
    package mutating func read(_ checkpoint: Summary, uploadedThrough: Int64, now: ContinuousClock.Instant) -> Action {
        if checkpoint.isSnapshot {
            // Staged: read the changes since its start, which make it consistent and current.
            staged = checkpoint.snapshot
            return .read(after: checkpoint.snapshot)
        }
        guard Checkpoint.isWriteCheckpoint(checkpoint.uploadedThrough, for: uploadedThrough) else {
            mustRead = true
            return .uploadFirst
        }
        pending = checkpoint
        guard checkpoint.isEmpty && staged == nil else { return .apply }
        return accept(now: now)
    }

    /// What the daemon did with the checkpoint of ``Action/apply``, at `now`.
    package mutating func applied(_ result: SyncApplyResult, now: ContinuousClock.Instant) -> Action {
        switch result {
        case .applied:
            return accept(now: now)
        case .pendingUploads:
            // A change set was queued since: upload it first, then read again.
            pending = nil
            mustRead = true
            return .uploadFirst
        case .failed(let reason):
            return fail("the checkpoint cannot be applied to the store: \(reason)")
        }
    }

    /// A snapshot's page was refused by the store (the reason).
    package mutating func stagingFailed(_ reason: String) -> Action {
        staged = nil
        return fail("the checkpoint cannot be applied to the store: \(reason)")
    }

    /// The log was compacted.
    package mutating func compacted() -> Action {
        .wait(pollInterval)
    }

    /// The wait of ``Action/wait(_:)`` ended: by a signal, or at its timeout (then a
    /// checkpoint is read whatever was notified).
    package mutating func wokeUp(signaled: Bool) {
        mustRead = !signaled
    }

    // MARK: - Rules

    private mutating func accept(now: ContinuousClock.Instant) -> Action {
        guard let checkpoint = pending else { return .wait(pollInterval) }
        pending = nil
        staged = nil
        cursor = checkpoint.snapshot
        rejectedThrough = max(rejectedThrough, checkpoint.uploadedThrough)
        checkpointNumber = checkpoint.number
        lagMilliseconds = checkpoint.lagMilliseconds
        // The uploads this checkpoint brought back are read.
        ownTransactions = ownTransactions.filter { Checkpoint.isVisible($0, in: checkpoint.snapshot) != true }
        if ownTransactions.isEmpty { ownChangeSets = 0 }
        if let last = lastCompaction, now - last >= compactionInterval {
            lastCompaction = now
            return .compact
        }
        return .wait(pollInterval)
    }

    private mutating func fail(_ message: String) -> Action {
        pending = nil
        staged = nil  // the snapshot is read again
        mustRead = true
        return .fail(message, retryAfter: pollInterval)
    }

    /// Whether every transaction notified since the last call is this machine's own upload
    /// or in the checkpoint applied last (false when one came without its id, or when
    /// something else may have changed). True when none was notified: the wake-up was a local
    /// commit's, already uploaded. Forgets them.
    private mutating func notificationsSeen() -> Bool {
        defer {
            notified = []
            notifiedUnknown = false
        }
        guard !notifiedUnknown else { return false }
        guard !notified.isEmpty else { return true }
        guard let cursor else { return false }
        return notified.allSatisfy { ownTransactions.contains($0) || Checkpoint.isVisible($0, in: cursor) == true }
    }
}

extension Checkpoint {
    /// The write-checkpoint rule (docs/SYNC.md): a checkpoint is applied only when it includes
    /// every change set of this machine's queue through `queuedThrough` (the engine: those
    /// uploaded; the daemon: every one queued), so that a saved value never reverts and comes
    /// back. `uploadedThrough` is the checkpoint's (``Checkpoint/uploadedThrough``).
    package static func isWriteCheckpoint(_ uploadedThrough: Int64, for queuedThrough: Int64) -> Bool {
        uploadedThrough >= queuedThrough
    }

    /// Whether this checkpoint includes every change set queued through `queuedThrough`
    /// (``isWriteCheckpoint(_:for:)``).
    package func isWriteCheckpoint(for queuedThrough: Int64) -> Bool {
        Self.isWriteCheckpoint(uploadedThrough, for: queuedThrough)
    }
}
