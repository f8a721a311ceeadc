import Foundation
import Skyros
import SkyrosSync
import SkyrosWire

/// The daemon's group commit, against a store and nothing else: the saves of one turn are
/// committed in one transaction, each recorded in the journal with the next sequence number,
/// exactly once (``SaveLedger``), with the history's retention applied in the same
/// transaction. No socket: it returns what each save is answered and the events to publish.
///
/// Several saves are applied in one go first; when one of them fails (a unique constraint, a
/// link to an object another client deleted, an object that does not exist), the transaction
/// is rolled back and the turn applied again with each save in its own savepoint, so that the
/// failing one fails alone (two statements a save spared in the usual case, where none
/// fails); a turn of one save that fails is rolled back whole. A save whose client and save
/// number were applied before is not applied again: it is answered with the sequence it got
/// the first time (an older save number than the client's last is looked up in the history).
struct GroupCommit {
    /// A save of the turn: a change set, a batch operation, or (at ``commit(_:resetting:in:)``'s
    /// `resetting` index) a `deleteAll`.
    struct Save {
        var identity: Data
        var requestID: UInt64
        var clientID: UUID
        var saveNumber: UInt64
        var changes: ChangeSet
        /// A batch operation instead of a change set.
        var batch: BatchOperation? = nil
        /// When it arrived (for its latency in `skyros status` and the metrics).
        var received = ContinuousClock.now
        /// The session's projection (an earlier schema version): its reply is translated.
        var projection: SchemaProjection? = nil
        /// The saver's name (the author of its event); nil for a connection with no session.
        var author: String? = nil
        /// The saver's event topic; nil for a connection with no session.
        var topic: UInt8? = nil
        /// A change set of a checkpoint from the sync server: not queued for upload, and not
        /// a client's save (no exactly-once decision).
        var fromSync = false
        /// What it records in the same transaction (for a checkpoint: the checkpoint itself,
        /// rejected change sets).
        var alsoRecord: ((SQLiteStore.Transaction) throws -> Void)? = nil
        /// Instead of a change set: writes made by SQL (a snapshot checkpoint's staged rows),
        /// returning how many objects they changed. Its event names no object (kind `batch`,
        /// empty lists: a receiver refreshes everything it holds).
        var appliesBySQL: ((SQLiteStore.Transaction) throws -> Int)? = nil
        /// An event kind added within protocol version 4 (5 and up) and its extension bytes,
        /// for the event of this change set (`syncRejected`).
        var extensionKind: (kind: UInt8, bytes: [UInt8])? = nil
    }

    /// What a save of the turn is answered when it succeeded.
    enum Answer: Equatable {
        case saved(UInt64)
        case batch(affected: Int, event: ChangeEvent)
    }

    /// What a commit did.
    struct Outcome {
        /// One result per save, in order.
        var results: [Result<Answer, SkyrosError>]
        /// The change sets committed, to publish.
        var events: [EventPublisher.Committed] = []
        /// Whether the transaction committed (false: nothing of the turn is stored).
        var committed = false
        /// History removed by the retention inside the transaction.
        var pruned = Journal.Pruned()
        /// Lines for the daemon's log: the reset, or why the commit failed.
        var log: [String] = []
    }

    /// The last sequence number given.
    private(set) var sequence: UInt64
    /// Exactly-once decisions: the records of the history (read when the store opened), kept
    /// with every commit; `skyros_saves` is read for the clients it does not know.
    private(set) var ledger = SaveLedger()
    /// How much history is kept.
    let retention: Journal.Retention
    private var lastPrune = Date.distantPast
    /// No history row is left below this sequence (see ``Journal/prune(_:current:byAge:goneBelow:removing:in:)``).
    private var historyGoneBelow: UInt64 = 0
    /// Whether committed change sets are queued for upload (``UploadQueue``): the group syncs.
    var queuesUploads = false
    /// The number of the last change set queued for upload (0: none since the queue began).
    private(set) var lastQueued: Int64 = 0
    /// The change sets queued by the turns since ``takeRecentlyQueued()``, handed to the
    /// uploader in memory (it reads them from the store otherwise).
    private var recentlyQueued: [(number: Int64, changes: QueuedChangeSet)] = []

    /// The change sets queued since the last call, oldest first.
    mutating func takeRecentlyQueued() -> [(number: Int64, changes: QueuedChangeSet)] {
        defer { recentlyQueued = [] }
        return recentlyQueued
    }

    /// A group commit going on from `sequence`, the last one the store's journal gave, whose
    /// history records `saves` (``Journal/Opened/saves``).
    init(sequence: UInt64, retention: Journal.Retention, saves: [(client: UUID, record: Journal.SaveRecord)]) {
        self.sequence = sequence
        self.retention = retention
        ledger = SaveLedger(history: saves)
    }

    /// The store was replaced (migrated, or made by a hello): its journal goes on from
    /// `sequence`, and the ledger knows the saves its history records.
    mutating func restart(sequence: UInt64, saves: [(client: UUID, record: Journal.SaveRecord)]) {
        self.sequence = sequence
        ledger = SaveLedger(history: saves)
    }

    /// Queue committed change sets for upload from now on, numbered after `lastQueued`.
    mutating func startQueueing(after lastQueued: Int64) {
        queuesUploads = true
        self.lastQueued = lastQueued
    }

    /// Commits the saves of one turn in one transaction of `store` (see the type's overview).
    ///
    /// - Parameter resetting: the index of a `deleteAll` among `saves` (the store is emptied there).
    mutating func commit(_ saves: [Save], resetting: Int? = nil, in store: SQLiteStore, now: Date = Date()) -> Outcome {
        var attempt = self.attempt(saves, resetting: resetting, isolated: false, store, now)
        if case .refused = attempt, saves.count > 1 {
            attempt = self.attempt(saves, resetting: resetting, isolated: true, store, now)
        }
        switch attempt {
        case .committed(let outcome):
            return outcome
        case .refused(let error):
            return Outcome(results: [.failure(error)])
        case .failed(let error):
            // The commit itself failed (I/O, disk full): nothing of this turn is stored.
            let wrapped = SkyrosError.wrap(error)
            return Outcome(
                results: Array(repeating: .failure(wrapped), count: saves.count),
                log: ["group commit of \(saves.count) change sets failed: \(error)"])
        }
    }

    /// How one attempt at a turn's transaction ended.
    private enum Attempt {
        case committed(Outcome)
        /// A save applied without a savepoint failed: the transaction was rolled back.
        case refused(SkyrosError)
        /// The transaction failed for another reason.
        case failed(any Error)
    }

    /// One attempt at the turn's transaction; `isolated`: each save in a savepoint.
    private mutating func attempt(
        _ saves: [Save], resetting: Int?, isolated: Bool, _ store: SQLiteStore, _ now: Date
    ) -> Attempt {
        var outcome = Outcome(results: [])
        var next = sequence
        var queued = lastQueued
        var handed: [(number: Int64, changes: QueuedChangeSet)] = []
        let queues = queuesUploads
        var refusal: SkyrosError?
        // A turn of sync checkpoints only is not waited on by the disk: the server has it, and
        // a power loss that takes it takes the checkpoint's cursor too, so it is read again.
        let durability: Durability = saves.allSatisfy(\.fromSync) ? .normal : .full
        do {
            try store.transaction(durability: durability) { transaction in
                for (index, save) in saves.enumerated() {
                    do {
                        if !save.fromSync, let answer = try previousAnswer(save, transaction) {
                            outcome.results.append(.success(answer))
                            continue
                        }
                        let apply = {
                            try Self.apply(
                                save, sequence: next + 1, reset: index == resetting, queue: queues, store.schema,
                                transaction)
                        }
                        let applied = try isolated ? transaction.savepoint(apply) : apply()
                        next = applied.event.sequence
                        if let entry = applied.queued {
                            queued = entry.number
                            handed.append(entry)
                        }
                        ledger.applied(client: save.clientID, save: save.saveNumber, sequence: next)
                        outcome.events.append(
                            EventPublisher.Committed(event: applied.event, encoded: applied.encoded, topic: save.topic))
                        outcome.results.append(
                            .success(
                                applied.affected.map { .batch(affected: $0, event: applied.event) } ?? .saved(next)))
                        if let line = applied.resetLog { outcome.log.append(line) }
                    } catch {
                        // Without a savepoint, a failed save rolls the transaction back (and,
                        // among several, makes the turn start again, a savepoint each).
                        guard isolated else {
                            refusal = SkyrosError.wrap(error)
                            throw error
                        }
                        outcome.results.append(.failure(SkyrosError.wrap(error)))
                    }
                }
                outcome.pruned = try prune(next, now, transaction)
            }
        } catch {
            ledger.abandon()
            if let refusal { return .refused(refusal) }
            return .failed(error)
        }
        sequence = next
        lastQueued = queued
        recentlyQueued += handed
        ledger.commit()
        outcome.committed = true
        return .committed(outcome)
    }

    /// The answer to a save applied before (a retry), from the ledger or the store's records;
    /// nil for a save to apply.
    private mutating func previousAnswer(_ save: Save, _ transaction: SQLiteStore.Transaction) throws -> Answer? {
        var decision = ledger.decide(client: save.clientID, save: save.saveNumber)
        if decision == .readStore {
            let stored = try Journal.lastSave(of: save.clientID, in: transaction)
            decision = ledger.decide(client: save.clientID, save: save.saveNumber, stored: .some(stored))
        }
        switch decision {
        case .answer(let sequence):
            return try Self.answer(save, sequence: sequence, transaction)
        case .answerFromHistory:
            let first = try Journal.sequence(ofSave: save.saveNumber, by: save.clientID, in: transaction)
            return try Self.answer(save, sequence: first ?? 0, transaction)
        case .refuseSkipped(let expected):
            throw SkyrosError(
                .saveNumberSkipped,
                "save \(save.saveNumber) of client \(save.clientID) skips ahead: its last applied save is \(expected - 1), so the next one is \(expected); it was not applied"
            )
        case .apply, .readStore:
            return nil
        }
    }

    /// A save applied: its event, the event's bytes as recorded, the objects a batch
    /// affected, and the log line of a reset.
    private struct Applied {
        var event: ChangeEvent
        var encoded: [UInt8]
        var affected: Int?
        var resetLog: String?
        /// Its number in the upload queue and what was queued, when it was.
        var queued: (number: Int64, changes: QueuedChangeSet)? = nil
    }

    /// Applies one save with sequence number `sequence` and records it in the journal.
    private static func apply(
        _ save: Save, sequence: UInt64, reset: Bool, queue: Bool, _ schema: Schema,
        _ transaction: SQLiteStore.Transaction
    ) throws -> Applied {
        var event = ChangeEvent(
            sequence: sequence, kind: reset ? .reset : .changes, authorID: save.clientID, author: save.author ?? "")
        var deletedObjects: Int?
        var affected: Int?
        // What is uploaded: the event, or for a batch too large to be published whole, every object.
        var uploaded: ChangeEvent?
        if let write = save.appliesBySQL {
            affected = try write(transaction)
            event.kind = .batch
        } else if let batch = save.batch {
            let limit = WireProtocol.maximumBatchEventObjects
            let outcome = try transaction.batch(batch, naming: queue ? .all : .upTo(limit))
            affected = outcome.count
            event = batchEvent(outcome, batch, schema, event)
            if queue && event.updated.count + event.deleted.count > limit {
                uploaded = event
                (event.updated, event.deleted) = ([], [])
            }
        } else if reset {
            deletedObjects = try objectCount(of: schema, in: transaction)
            try transaction.deleteAll()
        } else {
            // The event carries the values as stored (conformed to their types), not as sent.
            // A checkpoint's objects may exchange unique values (the server wrote them in one
            // transaction): the values are moved out of the way first.
            let applied = try transaction.applyConformed(save.changes, vacatingUniqueValues: save.fromSync)
            event.inserted = applied.changes.inserted.map { Snapshot(id: $0.id, values: $0.values, version: 1) }
            event.updated = applied.updates.map {
                ChangeEvent.Update(id: $0.id, version: $0.version, values: $0.changes)
            }
            event.deleted = applied.changes.deleted
        }
        if let (kind, bytes) = save.extensionKind {
            event.unknownKind = kind
            event.extensionBytes = bytes
        }
        let encoded = try Journal.record(event, save: save.saveNumber, affected: affected, in: transaction)
        var queued: (number: Int64, changes: QueuedChangeSet)?
        if let record = save.alsoRecord { try record(transaction) }
        if save.fromSync {
            // From the server: nothing to upload.
        } else if queue, let changes = UploadQueue.changeSet(of: uploaded ?? event, schema: schema) {
            if let number = try DebugDefects.enqueue(changes, sequence: Int64(event.sequence), in: transaction) {
                queued = (number, changes)
            }
        }
        let resetLog = deletedObjects.map { deleted in
            """
            reset (deleteAll) by \(DaemonTurn.describe(save.author)) (client \(save.clientID), \
            save \(save.saveNumber)): deleted \(deleted) object\(deleted == 1 ? "" : "s"), \
            sequence \(event.sequence)
            """
        }
        return Applied(event: event, encoded: encoded, affected: affected, resetLog: resetLog, queued: queued)
    }

    /// The answer to a save applied before (a retry): its sequence, or for a batch its change
    /// set from the history (when the history no longer has it: a batch event with empty
    /// lists, which makes the client refresh what it holds, and 0 objects).
    private static func answer(_ save: Save, sequence: UInt64, _ transaction: SQLiteStore.Transaction) throws -> Answer
    {
        guard save.batch != nil else { return .saved(sequence) }
        if sequence > 0, let recorded = try Journal.batch(at: sequence, in: transaction) {
            return .batch(affected: recorded.affected, event: recorded.event)
        }
        return .batch(
            affected: 0, event: ChangeEvent(sequence: sequence, kind: .batch, authorID: save.clientID, author: ""))
    }

    /// The change event of a batch operation: its objects with their new values, or empty
    /// lists when the outcome does not name them (too many); a batch that selected nothing is
    /// an empty change set.
    static func batchEvent(_ outcome: BatchOutcome, _ operation: BatchOperation, _ schema: Schema, _ base: ChangeEvent)
        -> ChangeEvent
    {
        var event = base
        guard outcome.count > 0 || !outcome.deleted.isEmpty else { return event }
        event.kind = .batch
        guard outcome.isListed else { return event }
        event.deleted = SQLiteStore.inKeyOrder(outcome.deleted)
        event.updated = outcome.updatedValues.map { id, update in
            ChangeEvent.Update(id: id, version: update.version, values: update.values)
        }.sorted { SQLiteStore.keyOrder($0.id, $1.id) }
        return event
    }

    /// Applies the history retention inside a commit: by count in every commit, by age at
    /// most once a second.
    private mutating func prune(_ current: UInt64, _ now: Date, _ transaction: SQLiteStore.Transaction) throws
        -> Journal.Pruned
    {
        let byAge = now.timeIntervalSince(lastPrune) >= 1
        if byAge { lastPrune = now }
        let pruned = try Journal.prune(
            retention, current: current, byAge: byAge, goneBelow: historyGoneBelow,
            removing: { below in
                // A client's last save leaving the history keeps its record in skyros_saves.
                for sequence in ledger.leaving(below: below) {
                    try Journal.keepRecord(ofSequence: sequence, in: transaction)
                }
            }, in: transaction)
        // Were the transaction rolled back, a later prune's DELETE removes these rows too (the
        // history may hold a few more change sets than its count until then).
        historyGoneBelow = max(historyGoneBelow, UInt64(clamping: retention.keepFrom(current: current)))
        return pruned
    }

    /// The number of objects in the store, counted inside a transaction.
    private static func objectCount(of schema: Schema, in transaction: SQLiteStore.Transaction) throws -> Int {
        var total = 0
        for entity in schema.entities {
            let table = SQLIdentifier.quote(entity.name)
            if case .integer(let count)? = try transaction.rows("SELECT count(*) FROM \(table)").first?.first {
                total += Int(count)
            }
        }
        return total
    }
}
