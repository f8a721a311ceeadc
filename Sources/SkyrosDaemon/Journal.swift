import Foundation
import Skyros
import SkyrosWire

/// What the daemon keeps in the group's store next to the objects, always written in the
/// same transaction as the change set it describes:
///
/// - `skyros_history`: one row per committed change set — its sequence number (gap-free,
///   continuing across restarts), author (client id and process name), time, the save
///   number it answered, and the published event. Pruning always keeps the newest row: it carries the last sequence
///   number given;
/// - `skyros_saves`: per client whose last save the history no longer has, that save's number
///   and the sequence it got (a history row carries its client and save number: it is the
///   record while the history keeps it), so a save that is sent again is acknowledged again
///   instead of applied twice.
///
/// A commit of one change set writes one row besides its objects (the history's) and reads
/// nothing: the daemon keeps the records in memory (``SaveLedger``), read from the history
/// when it opens the store.
struct Journal {
    /// How much history is kept: by count and by age, whichever is shorter.
    struct Retention: Sendable {
        var count: Int
        var age: TimeInterval

        /// The first sequence the count keeps when the last one is `current`.
        func keepFrom(current: UInt64) -> Int64 { Int64(current) - Int64(count) + 1 }
    }

    static let tables = [
        """
        CREATE TABLE IF NOT EXISTS skyros_history (sequence INTEGER PRIMARY KEY NOT NULL, client TEXT NOT NULL, \
        process TEXT NOT NULL, timestamp REAL NOT NULL, event BLOB NOT NULL, save INTEGER, affected INTEGER) STRICT
        """,
        """
        CREATE TABLE IF NOT EXISTS skyros_saves (client TEXT PRIMARY KEY NOT NULL, save INTEGER NOT NULL, \
        sequence INTEGER NOT NULL, timestamp REAL NOT NULL) STRICT, WITHOUT ROWID
        """,
    ]

    /// What ``open(_:)`` finds in a store.
    struct Opened: Sendable {
        /// The last sequence number given.
        var sequence: UInt64
        /// The store's identity, made with it (see ``WireMessage/Welcome/storeEpoch``).
        var epoch: UUID
        /// The store's schema version (the one it was created with, or migrated to).
        var schemaVersion: UInt64
        /// The event recorded because the store was migrated since its history was written
        /// (by this daemon, or by an embedded stack): to publish.
        var schemaChanged: ChangeEvent?
        /// The saves the history records, oldest first (``SaveLedger/init(history:)``).
        var saves: [(client: UUID, record: SaveRecord)] = []
    }

    /// Creates the tables when missing (and the `save` and `affected` columns of a history
    /// made before them), gives the store its epoch the first time, and returns the last sequence
    /// number given.
    ///
    /// The history is in the schema version its events were written in
    /// (`historySchemaVersion` in `skyros_metadata`). When the store has another version now
    /// (it was migrated), the history before is dropped (its values are positional in the
    /// earlier schema) and a ``ChangeEvent/Kind/schemaChanged`` event takes the next sequence:
    /// a client catching up from before it is told `historyExpired` and refreshes everything.
    static func open(_ store: SQLiteStore, author: String = "") throws -> Opened {
        try store.transaction { transaction in
            for sql in tables { try transaction.execute(sql) }
            let columns = try transaction.rows("SELECT name FROM pragma_table_info('skyros_history')")
            if !columns.contains([.text("save")]) {
                try transaction.execute("ALTER TABLE skyros_history ADD COLUMN save INTEGER")
            }
            if !columns.contains([.text("affected")]) {
                try transaction.execute("ALTER TABLE skyros_history ADD COLUMN affected INTEGER")
            }
            try transaction.execute(
                "INSERT OR IGNORE INTO skyros_metadata (key, value) VALUES ('epoch', ?), ('schemaVersion', ?)",
                [.text(UUID().uuidString), .text(String(store.schema.version))])
            let version = try transaction.rows("SELECT value FROM skyros_metadata WHERE key = 'schemaVersion'").first?
                .first
            guard
                case .text(let text)? = try transaction.rows("SELECT value FROM skyros_metadata WHERE key = 'epoch'")
                    .first?.first,
                let epoch = UUID(uuidString: text)
            else { throw SkyrosError(.storeFailure, "the store's epoch cannot be read") }
            let sequence: UInt64
            if case .integer(let value)? = try transaction.rows("SELECT max(sequence) FROM skyros_history").first?.first
            {
                sequence = UInt64(value)
            } else {
                sequence = 0
            }
            let schemaVersion = if case .text(let text)? = version { UInt64(text) ?? 1 } else { UInt64(1) }
            try transaction.execute(
                "INSERT OR IGNORE INTO skyros_metadata (key, value) VALUES ('historySchemaVersion', ?)",
                [.text(String(schemaVersion))])
            let history = try transaction.rows("SELECT value FROM skyros_metadata WHERE key = 'historySchemaVersion'")
                .first?.first
            guard case .text(let recorded)? = history, recorded != String(schemaVersion) else {
                return Opened(
                    sequence: sequence, epoch: epoch, schemaVersion: schemaVersion,
                    saves: try recordedSaves(in: transaction))
            }
            let event = ChangeEvent(
                sequence: sequence + 1, kind: .schemaChanged, author: author, schemaVersion: schemaVersion)
            // The history goes: each client's last save is kept as its record.
            try transaction.execute(
                Self.keepRecordSQL
                    + "sequence IN (SELECT max(sequence) FROM skyros_history WHERE save IS NOT NULL GROUP BY client)"
                    + Self.keepRecordUpsert)
            try transaction.execute("DELETE FROM skyros_history")
            try transaction.execute(
                "INSERT INTO skyros_history (sequence, client, process, timestamp, event, save, affected) VALUES (?, ?, ?, ?, ?, NULL, NULL)",
                [
                    .integer(Int64(event.sequence)), .text(event.authorID.text), .text(author),
                    .real(Date().timeIntervalSince1970),
                    .blob(Data(WireMessage(requestID: 0, body: .event(event)).encoded())),
                ])
            try transaction.execute(
                "UPDATE skyros_metadata SET value = ? WHERE key = 'historySchemaVersion'",
                [.text(String(schemaVersion))])
            return Opened(sequence: event.sequence, epoch: epoch, schemaVersion: schemaVersion, schemaChanged: event)
        }
    }

    /// The saves the history records (rows with a save number), oldest first.
    static func recordedSaves(in transaction: SQLiteStore.Transaction) throws -> [(client: UUID, record: SaveRecord)] {
        try transaction.rows(
            "SELECT client, save, sequence FROM skyros_history WHERE save IS NOT NULL ORDER BY sequence"
        )
        .compactMap { row in
            guard case .text(let text) = row[0], let client = UUID(uuidString: text), case .integer(let save) = row[1],
                case .integer(let sequence) = row[2]
            else { return nil }
            return (client, SaveRecord(save: UInt64(save), sequence: UInt64(sequence)))
        }
    }

    /// Copies the record of a save from its history row into `skyros_saves` (the row is about
    /// to be pruned, and it is its client's last save: ``SaveLedger/leaving(below:)``).
    static func keepRecord(ofSequence sequence: UInt64, in transaction: SQLiteStore.Transaction) throws {
        try transaction.execute(keepRecordSQL + "sequence = ?" + keepRecordUpsert, [.integer(Int64(sequence))])
    }

    /// The start and end of the statement that copies records from history rows (a later
    /// record already there is kept).
    private static let keepRecordSQL =
        "INSERT INTO skyros_saves (client, save, sequence, timestamp) "
        + "SELECT client, save, sequence, timestamp FROM skyros_history WHERE save IS NOT NULL AND "
    private static let keepRecordUpsert =
        " ON CONFLICT (client) DO UPDATE SET save = excluded.save, sequence = excluded.sequence, "
        + "timestamp = excluded.timestamp WHERE excluded.sequence > skyros_saves.sequence"

    /// The last save number applied for a client and the sequence it got, when `skyros_saves`
    /// has its record (the ledger knows those whose record is a history row).
    static func lastSave(of client: UUID, in transaction: SQLiteStore.Transaction) throws -> SaveRecord? {
        let row = try transaction.rows("SELECT save, sequence FROM skyros_saves WHERE client = ?", [.text(client.text)])
            .first
        guard let row, case .integer(let save) = row[0], case .integer(let sequence) = row[1] else { return nil }
        return SaveRecord(save: UInt64(save), sequence: UInt64(sequence))
    }

    /// The sequence an earlier save of a client got, from the history; nil when the history
    /// no longer keeps it.
    static func sequence(ofSave save: UInt64, by client: UUID, in transaction: SQLiteStore.Transaction) throws
        -> UInt64?
    {
        let row = try transaction.rows(
            "SELECT sequence FROM skyros_history WHERE client = ? AND save = ?",
            [.text(client.text), .integer(Int64(save))]
        ).first
        guard case .integer(let sequence)? = row?.first else { return nil }
        return UInt64(sequence)
    }

    /// A client's last applied save: its number and the sequence it got.
    struct SaveRecord: Sendable, Equatable {
        var save: UInt64
        var sequence: UInt64
    }

    /// A batch operation's change set from the history, with the number of objects it
    /// affected (nil when the history no longer has it).
    static func batch(at sequence: UInt64, in transaction: SQLiteStore.Transaction) throws -> (
        affected: Int, event: ChangeEvent
    )? {
        let row = try transaction.rows(
            "SELECT affected, event FROM skyros_history WHERE sequence = ?", [.integer(Int64(sequence))]
        ).first
        guard let row, case .blob(let bytes) = row[1],
            case .event(let event)? = try? WireMessage.decode([UInt8](bytes)).body
        else { return nil }
        let affected = if case .integer(let count) = row[0] { Int(count) } else { 0 }
        return (affected, event)
    }

    /// Records a committed change set: its history row, with the client's save number (its
    /// exactly-once record while the history keeps it); `affected`: the number of objects of
    /// a batch operation. Returns the event as published (the bytes of the history row).
    static func record(
        _ event: ChangeEvent, save: UInt64, affected: Int? = nil, in transaction: SQLiteStore.Transaction
    ) throws -> [UInt8] {
        let now = Date().timeIntervalSince1970
        let sequence = StoredValue.integer(Int64(event.sequence))
        let client = StoredValue.text(event.authorID.text)
        let encoded = WireMessage(requestID: 0, body: .event(event)).encoded()
        try transaction.execute(
            "INSERT INTO skyros_history (sequence, client, process, timestamp, event, save, affected) VALUES (?, ?, ?, ?, ?, ?, ?)",
            [
                sequence, client, .text(event.author), .real(now), .blob(Data(encoded)), .integer(Int64(save)),
                affected.map { .integer(Int64($0)) } ?? .null,
            ])
        return encoded
    }

    /// What ``prune(_:current:byAge:goneBelow:removing:in:)`` removed.
    struct Pruned: Sendable, Equatable {
        /// History rows (change sets).
        var changeSets = 0
        /// Exactly-once records of clients silent for longer than the retention age.
        var saveRecords = 0

        var isEmpty: Bool { changeSets == 0 && saveRecords == 0 }

        static func + (left: Pruned, right: Pruned) -> Pruned {
            Pruned(changeSets: left.changeSets + right.changeSets, saveRecords: left.saveRecords + right.saveRecords)
        }
    }

    /// Drops history past the retention count and, when `byAge`, past the retention age, with
    /// exactly-once records older than that age (a client silent for so long has long stopped
    /// resending). The newest row is always kept: it carries the last sequence number.
    /// `removing` is called with the sequence below which rows go, before they go: the
    /// exactly-once records among them are copied into `skyros_saves` there
    /// (``SaveLedger/leaving(below:)``).
    ///
    /// `goneBelow`: no row below this sequence is left (a previous prune removed them): the
    /// count's `DELETE`, a statement per commit, is skipped while it would remove nothing.
    ///
    /// - Returns: how many rows it removed.
    @discardableResult
    static func prune(
        _ retention: Retention, current: UInt64, byAge: Bool, goneBelow: UInt64 = 0,
        removing: (_ below: UInt64) throws -> Void, in transaction: SQLiteStore.Transaction
    ) throws -> Pruned {
        // The rows the last statement removed (counted by SQLite on this connection).
        func removed() throws -> Int {
            guard case .integer(let count)? = try transaction.rows("SELECT changes()").first?.first else { return 0 }
            return Int(count)
        }
        var pruned = Pruned()
        let keepFrom = retention.keepFrom(current: current)
        if keepFrom > Int64(clamping: goneBelow) {
            try removing(UInt64(keepFrom))
            try transaction.execute("DELETE FROM skyros_history WHERE sequence < ?", [.integer(keepFrom)])
            pruned.changeSets += try removed()
        }
        guard byAge else { return pruned }
        let cutoff = Date().timeIntervalSince1970 - retention.age
        // Timestamps grow with sequence numbers: the first row young enough bounds the range.
        let young = try transaction.rows(
            "SELECT sequence FROM skyros_history WHERE timestamp >= ? ORDER BY sequence LIMIT 1", [.real(cutoff)]
        ).first?.first
        let bound = if case .integer(let sequence)? = young { sequence } else { Int64(current) }
        if bound > 0 {
            try removing(UInt64(bound))
            try transaction.execute("DELETE FROM skyros_history WHERE sequence < ?", [.integer(bound)])
            pruned.changeSets += try removed()
        }
        try transaction.execute("DELETE FROM skyros_saves WHERE timestamp < ?", [.real(cutoff)])
        pruned.saveRecords += try removed()
        return pruned
    }

    /// A page of the change sets after `sequence`, oldest first: at most `limit` of them
    /// (0 or more than ``WireProtocol/maximumChangesPage``: that maximum) and about
    /// ``WireProtocol/maximumChangesPageBytes``; `more` when newer ones are left. Throws
    /// ``SkyrosError/Code/historyExpired`` when some of them are no longer kept (or were
    /// recorded by a daemon of an earlier protocol, whose events this one cannot publish).
    static func changes(since sequence: UInt64, current: UInt64, limit: UInt64, in store: SQLiteStore) throws
        -> (events: [ChangeEvent], more: Bool)
    {
        guard sequence < current else { return ([], false) }
        let page =
            limit == 0 ? WireProtocol.maximumChangesPage : Int(min(limit, UInt64(WireProtocol.maximumChangesPage)))
        let rows = try store.rows(
            "SELECT sequence, event FROM skyros_history WHERE sequence > ? ORDER BY sequence LIMIT ?",
            [.integer(Int64(sequence)), .integer(Int64(page))])
        let expired = SkyrosError(
            .historyExpired,
            "the changes after \(sequence) are no longer kept; refresh everything and go on from \(current)")
        guard case .integer(let first)? = rows.first?[0], UInt64(first) == sequence + 1 else { throw expired }
        var events: [ChangeEvent] = []
        var bytes = 0
        for row in rows {
            guard case .blob(let data) = row[1] else {
                throw SkyrosError(.storeFailure, "a history row of the store cannot be read")
            }
            guard case .event(let event)? = try? WireMessage.decode([UInt8](data)).body else { throw expired }
            bytes += data.count
            if !events.isEmpty && bytes > WireProtocol.maximumChangesPageBytes { break }
            events.append(event)
        }
        return (events, (events.last?.sequence ?? current) < current)
    }
}

extension UUID {
    /// ``uuidString`` (upper-case hexadecimal in 8-4-4-4-12 groups), formatted here: Foundation
    /// formats it through `snprintf`, some 2,000 instructions, and every commit writes the
    /// client of each save as this text.
    var text: String {
        withUnsafeBytes(of: uuid) { bytes in
            String(unsafeUninitializedCapacity: 36) { buffer in
                let digits: (UInt8) -> UInt8 = { $0 < 10 ? 0x30 + $0 : 0x37 + $0 }  // 0-9, A-F
                var out = 0
                for (index, byte) in bytes.enumerated() {
                    if index == 4 || index == 6 || index == 8 || index == 10 {
                        buffer[out] = 0x2D  // -
                        out += 1
                    }
                    buffer[out] = digits(byte >> 4)
                    buffer[out + 1] = digits(byte & 0x0F)
                    out += 2
                }
                return out
            }
        }
    }
}
