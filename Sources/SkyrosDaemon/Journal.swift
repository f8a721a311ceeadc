import Foundation
import Skyros
import SkyrosWire

/// What the daemon keeps in the group's store next to the objects, always written in the
/// same transaction as the change set it describes:
///
/// - `skyros_history`: one row per committed change set — its sequence number (gap-free,
///   continuing across restarts), author (client id and process name), time, and the
///   published event. Pruning always keeps the newest row: it carries the last sequence
///   number given;
/// - `skyros_saves`: per client, the last save number applied and the sequence it got, so a
///   save that is sent again is acknowledged again instead of applied twice.
///
/// A commit of one change set writes two rows besides its objects (history and save record)
/// and reads nothing: the daemon keeps the save records it has seen in memory.
struct Journal {
    /// How much history is kept: by count and by age, whichever is shorter.
    struct Retention: Sendable {
        var count: Int
        var age: TimeInterval
    }

    static let tables = [
        """
        CREATE TABLE IF NOT EXISTS skyros_history (sequence INTEGER PRIMARY KEY NOT NULL, client TEXT NOT NULL, \
        process TEXT NOT NULL, timestamp REAL NOT NULL, event BLOB NOT NULL) STRICT
        """,
        """
        CREATE TABLE IF NOT EXISTS skyros_saves (client TEXT PRIMARY KEY NOT NULL, save INTEGER NOT NULL, \
        sequence INTEGER NOT NULL, timestamp REAL NOT NULL) STRICT, WITHOUT ROWID
        """,
    ]

    /// Creates the tables when missing and returns the last sequence number given.
    static func open(_ store: SQLiteStore) throws -> UInt64 {
        try store.transaction { transaction in
            for sql in tables { try transaction.execute(sql) }
            guard case .integer(let value)? = try transaction.rows("SELECT max(sequence) FROM skyros_history").first?.first
            else { return 0 }
            return UInt64(value)
        }
    }

    /// The last save number applied for a client and the sequence it got, when the client
    /// has a record.
    static func lastSave(of client: String, in transaction: SQLiteStore.Transaction) throws -> SaveRecord? {
        let row = try transaction.rows("SELECT save, sequence FROM skyros_saves WHERE client = ?", [.text(client)]).first
        guard let row, case .integer(let save) = row[0], case .integer(let sequence) = row[1] else { return nil }
        return SaveRecord(save: UInt64(save), sequence: UInt64(sequence))
    }

    /// A client's last applied save: its number and the sequence it got.
    struct SaveRecord: Sendable, Equatable {
        var save: UInt64
        var sequence: UInt64
    }

    /// Records a committed change set: its history row and, for a save, the client's save
    /// number. Returns the event as published (the bytes of the history row).
    static func record(
        _ event: ChangeEvent, process: String, save: UInt64?, in transaction: SQLiteStore.Transaction
    ) throws -> [UInt8] {
        let now = Date().timeIntervalSince1970
        let sequence = StoredValue.integer(Int64(event.sequence))
        let encoded = WireMessage(requestID: 0, body: .event(event)).encoded()
        try transaction.execute(
            "INSERT INTO skyros_history (sequence, client, process, timestamp, event) VALUES (?, ?, ?, ?, ?)",
            [sequence, .text(event.author), .text(process), .real(now), .blob(Data(encoded))])
        if let save {
            try transaction.execute(
                "INSERT OR REPLACE INTO skyros_saves (client, save, sequence, timestamp) VALUES (?, ?, ?, ?)",
                [.text(event.author), .integer(Int64(save)), sequence, .real(now)])
        }
        return encoded
    }

    /// Drops history past the retention count and, when `byAge`, past the retention age, with
    /// exactly-once records older than that age (a client silent for so long has long stopped
    /// resending). The newest row is always kept: it carries the last sequence number.
    static func prune(
        _ retention: Retention, current: UInt64, byAge: Bool, in transaction: SQLiteStore.Transaction
    ) throws {
        let keepFrom = Int64(current) - Int64(retention.count) + 1
        try transaction.execute("DELETE FROM skyros_history WHERE sequence < ?", [.integer(keepFrom)])
        guard byAge else { return }
        let cutoff = Date().timeIntervalSince1970 - retention.age
        // Timestamps grow with sequence numbers: the first row young enough bounds the range.
        try transaction.execute(
            """
            DELETE FROM skyros_history WHERE sequence < coalesce((SELECT sequence FROM skyros_history \
            WHERE timestamp >= ? ORDER BY sequence LIMIT 1), ?)
            """, [.real(cutoff), .integer(Int64(current))])
        try transaction.execute("DELETE FROM skyros_saves WHERE timestamp < ?", [.real(cutoff)])
    }

    /// The change sets after `sequence`, oldest first, at most `limit` of them; throws
    /// ``SkyrosError/Code/historyExpired`` when some of them are no longer kept.
    static func changes(since sequence: UInt64, current: UInt64, limit: Int, in store: SQLiteStore) throws -> [ChangeEvent] {
        guard sequence < current else { return [] }
        let rows = try store.rows(
            "SELECT sequence, event FROM skyros_history WHERE sequence > ? ORDER BY sequence LIMIT ?",
            [.integer(Int64(sequence)), .integer(Int64(limit))])
        guard case .integer(let first)? = rows.first?[0], UInt64(first) == sequence + 1 else {
            throw SkyrosError(
                .historyExpired,
                "the changes after \(sequence) are no longer kept; refresh everything and go on from \(current)")
        }
        var events: [ChangeEvent] = []
        var bytes = 0
        for row in rows {
            guard case .blob(let data) = row[1], case .event(let event) = try WireMessage.decode([UInt8](data)).body else {
                throw SkyrosError(.storeFailure, "a history row of the store cannot be read")
            }
            bytes += data.count
            // Stay well under the maximum message size: the client asks again for the rest.
            if !events.isEmpty && bytes > WireMessage.maximumSize / 2 { break }
            events.append(event)
        }
        return events
    }
}
