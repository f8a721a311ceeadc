import Foundation
import GRDB
import Skyros

/// Every statement on the store's sync tables, in one place: the upload queue
/// (`skyros_sync_queue`), the rejected log (`skyros_sync_rejected`) and sync's keys in
/// `skyros_metadata` (the machine's id, the last checkpoint). The daemon and the engine call
/// these; no other file names the tables.
///
/// The queue is numbered by SQLite's `AUTOINCREMENT` (never reused, so (machine, number)
/// names a change set once for good); a change set is queued in the same transaction as its
/// commit (``enqueue(_:sequence:in:)``) and dropped once the server has it (``drop(through:in:)``).
package enum SyncTables {
    /// The queue's table.
    static let queueTableSQL = """
        CREATE TABLE IF NOT EXISTS skyros_sync_queue (number INTEGER PRIMARY KEY AUTOINCREMENT, \
        sequence INTEGER NOT NULL, timestamp REAL NOT NULL, changes BLOB NOT NULL)
        """

    /// What the rejected log keeps: a change set the server refused, with its reason.
    static let rejectedTableSQL = """
        CREATE TABLE IF NOT EXISTS skyros_sync_rejected (number INTEGER PRIMARY KEY, timestamp REAL NOT NULL, \
        reason TEXT NOT NULL, objects TEXT NOT NULL, changes BLOB)
        """

    // MARK: - The daemon's side

    /// Creates the queue and the rejected log, when the store lacks them.
    package static func create(in transaction: SQLiteStore.Transaction) throws {
        try transaction.execute(queueTableSQL)
        try transaction.execute(rejectedTableSQL)
    }

    /// Queues a change set (`sequence`: the change event's; 0 for objects queued when sync was
    /// turned on); its number in the queue.
    @discardableResult
    package static func enqueue(_ changes: QueuedChangeSet, sequence: Int64, in transaction: SQLiteStore.Transaction)
        throws -> Int64?
    {
        try transaction.execute(
            "INSERT INTO skyros_sync_queue (sequence, timestamp, changes) VALUES (?, ?, ?)",
            [.integer(sequence), .real(Date().timeIntervalSince1970), .blob(changes.encoded())])
        guard case .integer(let number)? = try transaction.rows("SELECT last_insert_rowid()").first?.first else {
            return nil
        }
        return number
    }

    /// The highest number the queue ever had (0: none).
    package static func highestNumber(in transaction: SQLiteStore.Transaction) throws -> Int64 {
        guard
            case .integer(let number)? = try transaction.rows(
                "SELECT seq FROM sqlite_sequence WHERE name = 'skyros_sync_queue'"
            ).first?.first
        else { return 0 }
        return number
    }

    /// How many change sets are queued.
    package static func count(in transaction: SQLiteStore.Transaction) throws -> Int {
        guard case .integer(let count)? = try transaction.rows("SELECT count(*) FROM skyros_sync_queue").first?.first
        else { return 0 }
        return Int(count)
    }

    /// How many change sets are queued after `number`.
    package static func queued(after number: Int64, in transaction: SQLiteStore.Transaction) throws -> Int {
        guard
            case .integer(let count)? = try transaction.rows(
                "SELECT count(*) FROM skyros_sync_queue WHERE number > ?", [.integer(number)]
            ).first?.first
        else { return 0 }
        return Int(count)
    }

    /// Drops the change sets through `number` (the server has them), keeping the number and
    /// digest of the last one (``lastUploaded(in:)``): what the server's record of that number
    /// must match, or the store was restored or copied.
    package static func drop(through number: Int64, in transaction: SQLiteStore.Transaction) throws {
        if case .blob(let data)? = try transaction.rows(
            "SELECT changes FROM skyros_sync_queue WHERE number = ?", [.integer(number)]
        ).first?.first, let changes = try? QueuedChangeSet.decode(data) {
            try transaction.execute(
                "INSERT OR REPLACE INTO skyros_metadata (key, value) VALUES ('syncLastUploaded', ?)",
                [.text("\(number):\(changes.digest)")])
        }
        try transaction.execute("DELETE FROM skyros_sync_queue WHERE number <= ?", [.integer(number)])
    }

    /// Gives the store a new machine id (it was restored or copied: see
    /// ``SyncHost/reidentify(as:dropping:reason:)``): the change sets `dropping` are dropped
    /// (the server has them), the others stay queued for the new id, and the refusals are read
    /// from the new id's first upload on.
    package static func reidentify(
        as machine: UUID, dropping: [Int64], in transaction: SQLiteStore.Transaction
    ) throws {
        try setMachine(machine, in: transaction)
        for number in dropping {
            try transaction.execute("DELETE FROM skyros_sync_queue WHERE number = ?", [.integer(number)])
        }
        // The next checkpoint is a snapshot (``CheckpointStateMachine/reidentified()``), after a
        // restart too.
        try transaction.execute(
            "DELETE FROM skyros_metadata WHERE key IN ('syncLastUploaded', 'syncRejectedThrough', 'syncCheckpoint')")
    }

    /// The change sets queued after `number` (how many, and the oldest one's time), and the
    /// number of change sets in the rejected log, for `skyros status`.
    package static func status(after number: Int64, in store: SQLiteStore) throws -> (
        queued: Int, oldest: Date?, rejected: Int
    ) {
        var result: (queued: Int, oldest: Date?, rejected: Int) = (0, nil, 0)
        if let row = try store.rows(
            "SELECT count(*), min(timestamp) FROM skyros_sync_queue WHERE number > ?", [.integer(number)]
        ).first {
            if case .integer(let count) = row[0] { result.queued = Int(count) }
            if case .real(let time) = row[1] { result.oldest = Date(timeIntervalSince1970: time) }
        }
        if case .integer(let count)? = try store.rows("SELECT count(*) FROM skyros_sync_rejected").first?.first {
            result.rejected = Int(count)
        }
        return result
    }

    /// Records change sets the server refused, with their reasons and the objects they named.
    package static func recordRejections(_ rejections: [Checkpoint.Rejection], in transaction: SQLiteStore.Transaction)
        throws
    {
        for rejection in rejections {
            try transaction.execute(
                "INSERT OR REPLACE INTO skyros_sync_rejected (number, timestamp, reason, objects, changes) VALUES (?, ?, ?, ?, NULL)",
                [
                    .integer(rejection.number), .real(Date().timeIntervalSince1970), .text(rejection.reason),
                    .text(rejection.objects.map(\.description).joined(separator: " ")),
                ])
        }
    }

    /// The change sets in the rejected log (refused by the server, not yet acknowledged by an
    /// app), oldest first; none when the store never synced.
    package static func rejections(in store: SQLiteStore) throws -> [SyncRejection] {
        // On the writer connection, like the turn's other work: with this read on the store's
        // reader pool from the turn's thread, the store's WAL outlived a daemon stopped by
        // SIGTERM (DaemonProcessTests.sigtermKeepsAcknowledgedSaves, every run).
        try store.transaction { transaction in try rejections(in: transaction) }
    }

    /// ``rejections(in:)`` in an open transaction.
    static func rejections(in transaction: SQLiteStore.Transaction) throws -> [SyncRejection] {
        guard try transaction.rows("SELECT 1 FROM sqlite_master WHERE name = 'skyros_sync_rejected'").first != nil
        else {
            return []
        }
        return try transaction.rows(
            "SELECT number, timestamp, reason, objects FROM skyros_sync_rejected ORDER BY number"
        )
        .compactMap { row in
            guard case .integer(let number) = row[0] else { return nil }
            let time: Double =
                switch row[1] {
                case .real(let time): time
                case .integer(let time): Double(time)
                default: 0
                }
            guard case .text(let reason) = row[2], case .text(let objects) = row[3] else { return nil }
            return SyncRejection(
                number: number, date: Date(timeIntervalSince1970: time), reason: reason,
                objectIDs: objects.split(separator: " ").compactMap { ObjectID(description: $0) })
        }
    }

    /// Removes the refusals numbered `numbers` from the rejected log (an app dealt with them);
    /// how many it removed.
    package static func acknowledge(_ numbers: [Int64], in transaction: SQLiteStore.Transaction) throws -> Int {
        guard try transaction.rows("SELECT 1 FROM sqlite_master WHERE name = 'skyros_sync_rejected'").first != nil
        else { return 0 }
        var removed = 0
        for number in Set(numbers) {
            try transaction.execute("DELETE FROM skyros_sync_rejected WHERE number = ?", [.integer(number)])
            if case .integer(let count)? = try transaction.rows("SELECT changes()").first?.first {
                removed += Int(count)
            }
        }
        return removed
    }

    /// The upload number through which the store recorded the server's refusals (the last
    /// checkpoint applied's `uploadedThrough`; 0: none yet, or a store of an older version,
    /// whose refusals are then all read once more).
    package static func rejectedThrough(in transaction: SQLiteStore.Transaction) throws -> Int64 {
        guard
            case .text(let text)? = try transaction.rows(
                "SELECT value FROM skyros_metadata WHERE key = 'syncRejectedThrough'"
            ).first?.first
        else { return 0 }
        return Int64(text) ?? 0
    }

    /// The machine's id on the server (nil: never synced).
    package static func machine(in transaction: SQLiteStore.Transaction) throws -> UUID? {
        guard
            case .text(let text)? = try transaction.rows("SELECT value FROM skyros_metadata WHERE key = 'syncMachine'")
                .first?.first
        else { return nil }
        return UUID(uuidString: text)
    }

    /// Gives the machine its id on the server.
    package static func setMachine(_ machine: UUID, in transaction: SQLiteStore.Transaction) throws {
        try transaction.execute(
            "INSERT OR REPLACE INTO skyros_metadata (key, value) VALUES ('syncMachine', ?)", [.text(machine.uuidString)]
        )
    }

    /// The last checkpoint applied (a `pg_snapshot` text; nil: none).
    package static func checkpoint(in transaction: SQLiteStore.Transaction) throws -> String? {
        guard
            case .text(let text)? = try transaction.rows(
                "SELECT value FROM skyros_metadata WHERE key = 'syncCheckpoint'"
            ).first?.first
        else { return nil }
        return text
    }

    /// Records the last checkpoint applied, and the upload number through which its refusals
    /// are recorded (``rejectedThrough(in:)``).
    package static func recordCheckpoint(
        _ snapshot: String, rejectedThrough: Int64, in transaction: SQLiteStore.Transaction
    ) throws {
        try transaction.execute(
            "INSERT OR REPLACE INTO skyros_metadata (key, value) VALUES ('syncCheckpoint', ?)", [.text(snapshot)])
        try transaction.execute(
            "INSERT OR REPLACE INTO skyros_metadata (key, value) VALUES ('syncRejectedThrough', ?)",
            [.text(String(rejectedThrough))])
    }

    // MARK: - The engine's side

    /// A read-only connection to the store at `path`, for the engine's reads of the queue.
    package static func reader(of path: String) throws -> DatabaseQueue {
        var options = GRDB.Configuration()
        options.readonly = true
        options.busyMode = .timeout(5)
        return try DatabaseQueue(path: path, configuration: options)
    }

    /// Queued change sets after `number`, oldest first: at most `limit`, and no more than
    /// about `bytes` of them (at least one), read through `queue` (``reader(of:)``), on the
    /// caller's thread (a read of the local file: short).
    package static func batch(after number: Int64, limit: Int, bytes: Int, from queue: DatabaseQueue) throws
        -> [QueuedEntry]
    {
        try queue.read { try batch(after: number, limit: limit, bytes: bytes, in: $0) }
    }

    /// What the store knows of its uploads, to tell whether the server's record of this machine
    /// is its own: the highest number the queue ever had, the digests of the change sets still
    /// queued through `number`, and the last uploaded change set's number and digest.
    package static func identity(through number: Int64, from queue: DatabaseQueue) throws -> (
        highest: Int64, queued: [Int64: Int64], lastUploaded: (number: Int64, digest: Int64)?
    ) {
        try queue.read { db in
            let highest =
                try Int64.fetchOne(db, sql: "SELECT seq FROM sqlite_sequence WHERE name = 'skyros_sync_queue'") ?? 0
            var queued: [Int64: Int64] = [:]
            let rows = try Row.fetchCursor(
                db, sql: "SELECT number, changes FROM skyros_sync_queue WHERE number <= ? ORDER BY number",
                arguments: [number])
            while let row = try rows.next() {
                let data: Data = row["changes"]
                queued[row["number"]] = try QueuedChangeSet.decode(data).digest
            }
            var last: (Int64, Int64)?
            // (A queue without the store's metadata, as the engine's tests make, has none.)
            if let text = try? String.fetchOne(
                db, sql: "SELECT value FROM skyros_metadata WHERE key = 'syncLastUploaded'")
            {
                let parts = text.split(separator: ":")
                if parts.count == 2, let number = Int64(parts[0]), let digest = Int64(parts[1]) {
                    last = (number, digest)
                }
            }
            return (highest, queued, last)
        }
    }

    /// ``batch(after:limit:bytes:from:)`` in an open read.
    static func batch(after number: Int64, limit: Int, bytes: Int, in db: Database) throws -> [QueuedEntry] {
        var batch: [QueuedEntry] = []
        var total = 0
        let rows = try Row.fetchCursor(
            db, sql: "SELECT number, changes FROM skyros_sync_queue WHERE number > ? ORDER BY number LIMIT ?",
            arguments: [number, limit])
        while let row = try rows.next() {
            let data: Data = row["changes"]
            if !batch.isEmpty && total + data.count > bytes { break }
            total += data.count
            batch.append((row["number"], try QueuedChangeSet.decode(data)))
        }
        return batch
    }
}
