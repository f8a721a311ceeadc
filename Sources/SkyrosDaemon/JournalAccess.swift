import Foundation
import Skyros
import SkyrosSync
import SkyrosWire

/// The change log of a store, for the operating tool and admin sessions: read its entries,
/// and record change sets written without a daemon (`skyros import --store`) so that the
/// history stays gap-free and clients of the group see them.
package enum JournalAccess {
    /// Whether the store has a change log (a group's store; an embedded store has none).
    package static func hasJournal(_ store: SQLiteStore) throws -> Bool {
        try !store.rows("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'skyros_history'").isEmpty
    }

    /// The last sequence given (0 without a change log).
    package static func sequence(of store: SQLiteStore) throws -> UInt64 {
        guard try hasJournal(store) else { return 0 }
        guard case .integer(let value)? = try store.rows("SELECT max(sequence) FROM skyros_history").first?.first else {
            return 0
        }
        return UInt64(max(0, value))
    }

    /// The change sets after `since`, oldest first, at most `limit` (0: 1,000); `more` when
    /// newer ones are left.
    package static func history(since: UInt64, limit: UInt64, in store: SQLiteStore) throws
        -> (entries: [AdminMessage.HistoryEntry], more: Bool)
    {
        guard try hasJournal(store) else { return ([], false) }
        let page = Int64(limit == 0 ? 1_000 : min(limit, 100_000))
        let rows = try store.rows(
            "SELECT sequence, client, process, timestamp, event FROM skyros_history WHERE sequence > ? ORDER BY sequence LIMIT ?",
            [.integer(Int64(clamping: since)), .integer(page + 1)])
        var entries: [AdminMessage.HistoryEntry] = []
        for row in rows.prefix(Int(page)) {
            guard case .integer(let sequence) = row[0], case .real(let timestamp) = row[3] else { continue }
            var entry = AdminMessage.HistoryEntry(
                sequence: UInt64(sequence), kind: .changes, authorID: ChangeEvent.noAuthor, author: "",
                timestamp: timestamp,
                inserted: 0, updated: 0, deleted: 0)
            if case .text(let client) = row[1], let id = UUID(uuidString: client) { entry.authorID = id }
            if case .text(let process) = row[2] { entry.author = process }
            if case .blob(let data) = row[4], case .event(let event)? = try? WireMessage.decode([UInt8](data)).body {
                entry.kind = event.kind
                entry.inserted = event.inserted.count
                entry.updated = event.updated.count
                entry.deleted = event.deleted.count
            }
            entries.append(entry)
        }
        return (entries, rows.count > Int(page))
    }

    /// Applies a change set in `transaction` and, when the store has a change log, records
    /// it there with the next sequence; a store that has synced (a machine id) also queues it
    /// for upload. Returns that sequence (0 without a change log).
    package static func apply(
        _ changes: ChangeSet, author: String, authorID: UUID, save: UInt64, journal: Bool,
        in transaction: SQLiteStore.Transaction
    ) throws -> UInt64 {
        let applied = try transaction.applyConformed(changes)
        var next: UInt64 = 0
        if journal {
            next = 1
            if case .integer(let value)? = try transaction.rows("SELECT max(sequence) FROM skyros_history").first?
                .first
            {
                next = UInt64(max(0, value)) + 1
            }
        }
        let event = ChangeEvent(
            sequence: next, kind: .changes, authorID: authorID, author: author,
            inserted: applied.changes.inserted.map { Snapshot(id: $0.id, values: $0.values, version: 1) },
            updated: applied.updates.map { ChangeEvent.Update(id: $0.id, version: $0.version, values: $0.changes) },
            deleted: applied.changes.deleted)
        // A store that has synced queues what is written to it, as the daemon does: uploaded
        // when its daemon next syncs (`skyros import --store` on a synced store).
        if try SyncTables.machine(in: transaction) != nil,
            let queued = UploadQueue.changeSet(of: event, schema: transaction.schema)
        {
            try SyncTables.create(in: transaction)
            try SyncTables.enqueue(queued, sequence: Int64(next), in: transaction)
        }
        guard journal else { return 0 }
        _ = try Journal.record(event, save: save, in: transaction)
        return next
    }
}
