import Foundation
import GRDBSQLite
import Skyros

/// The baseline: the SQLite C API, prepared statements, no Skyros layer.
final class RawSQLite {
    let db: OpaquePointer

    init(path: String, synchronous: String = "FULL") {
        var handle: OpaquePointer?
        guard sqlite3_open(path, &handle) == SQLITE_OK, let handle else { fatalError("cannot open \(path)") }
        db = handle
        execute("PRAGMA journal_mode = WAL")
        execute("PRAGMA synchronous = \(synchronous)")
    }

    private var isOpen = true

    /// Closes the connection now rather than when the last reference goes (SQLite then deletes
    /// the WAL and shared-memory files): a thread's captured connection is released only
    /// after the thread has finished, while its folder may already be being removed.
    func close() {
        guard isOpen else { return }
        sqlite3_close(db)
        isOpen = false
    }

    deinit { close() }

    func execute(_ sql: String) {
        var error: UnsafeMutablePointer<CChar>?
        if sqlite3_exec(db, sql, nil, nil, &error) != SQLITE_OK {
            fatalError("\(sql): \(String(cString: error!))")
        }
    }

    func prepare(_ sql: String) -> OpaquePointer {
        var statement: OpaquePointer?
        guard sqlite3_prepare_v2(db, sql, -1, &statement, nil) == SQLITE_OK, let statement else {
            fatalError("\(sql): \(String(cString: sqlite3_errmsg(db)))")
        }
        return statement
    }

    func step(_ statement: OpaquePointer) {
        let code = sqlite3_step(statement)
        guard code == SQLITE_DONE || code == SQLITE_ROW else { fatalError(String(cString: sqlite3_errmsg(db))) }
    }

    /// The same table layout as Skyros' (16-byte identifiers, STRICT, WITHOUT ROWID, an
    /// index on `value`), so that the baseline does the same work minus Skyros' layers.
    func createItemTable() {
        execute(
            "CREATE TABLE item (id BLOB PRIMARY KEY NOT NULL, name TEXT NOT NULL, value INTEGER NOT NULL, score REAL NOT NULL, flag INTEGER NOT NULL, created REAL NOT NULL) STRICT, WITHOUT ROWID"
        )
        execute("CREATE INDEX item_value ON item (value)")
    }

    /// Inserts rows 0..<count in one transaction, as "insert" does.
    @inline(never)  // one symbol for profilers
    func insertItems(_ count: Int) {
        execute("BEGIN IMMEDIATE")
        let statement = prepare(Self.insertItemSQL)
        for index in 0..<count { insertItem(statement, index) }
        sqlite3_finalize(statement)
        execute("COMMIT")
    }

    static let insertItemSQL = "INSERT INTO item (id, name, value, score, flag, created) VALUES (?, ?, ?, ?, ?, ?)"

    /// Inserts the row number `index`, with the values `EmbeddedBenchmark` gives an `Item`.
    func insertItem(_ statement: OpaquePointer, _ index: Int) {
        sqlite3_reset(statement)
        bindID(statement, 1, index)
        bind(statement, 2, "item \(index)")
        sqlite3_bind_int64(statement, 3, Int64(index % 100))
        sqlite3_bind_double(statement, 4, Double(index) * 0.5)
        sqlite3_bind_int64(statement, 5, index % 2 == 0 ? 1 : 0)
        sqlite3_bind_double(statement, 6, Double(index))
        step(statement)
    }

    /// `PRAGMA user_version`: the version a hand-written migration checks and records.
    func userVersion() -> Int32 {
        let statement = prepare("PRAGMA user_version")
        defer { sqlite3_finalize(statement) }
        guard sqlite3_step(statement) == SQLITE_ROW else {
            fatalError("PRAGMA user_version: \(String(cString: sqlite3_errmsg(db)))")
        }
        return sqlite3_column_int(statement, 0)
    }

    /// A new Skyros store at `url` whose `Item` table holds rows 0..<count with the values of
    /// ``insertItem(_:_:)``, written by raw SQL (setup of the read benchmarks, not measured).
    static func fillStore(at url: URL, rows count: Int) throws {
        try (Skyros(sqliteStack: benchSchema, at: url, savesOnStop: false).store as? SQLiteStore)?.close()
        let raw = RawSQLite(path: url.path, synchronous: "OFF")
        raw.execute("BEGIN")
        let insert = raw.prepare(
            "INSERT INTO \"Item\" (\"_id\", name, value, score, flag, created) VALUES (?, ?, ?, ?, ?, ?)")
        for index in 0..<count { raw.insertItem(insert, index) }
        sqlite3_finalize(insert)
        raw.execute("COMMIT")
    }

    /// Binds a 16-byte, time-ordered identifier made from `index` (like a UUIDv7).
    func bindID(_ statement: OpaquePointer, _ position: Int32, _ index: Int) {
        var id = [UInt8](repeating: 0, count: 16)
        withUnsafeBytes(of: UInt64(index).bigEndian) { id.replaceSubrange(8..<16, with: $0) }
        id[6] = 0x70
        sqlite3_bind_blob(statement, position, id, 16, Self.transient)
    }

    static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    func bind(_ statement: OpaquePointer, _ index: Int32, _ text: String) {
        sqlite3_bind_text(statement, index, text, -1, Self.transient)
    }

    /// Reads every item row and every column, as "fetch all" does; returns a checksum of them.
    @inline(never)  // one symbol for profilers
    func readAllItems() -> Double {
        var checksum = 0.0
        let statement = prepare("SELECT id, name, value, score, flag, created FROM item")
        while sqlite3_step(statement) == SQLITE_ROW {
            let name = text(statement, 1)
            let value = Int(sqlite3_column_int64(statement, 2))
            let score = sqlite3_column_double(statement, 3)
            let flag = sqlite3_column_int64(statement, 4) != 0
            let created = Date(timeIntervalSince1970: sqlite3_column_double(statement, 5))
            checksum += Double(name.utf8.count + value) + score + (flag ? 1 : 0) + created.timeIntervalSince1970
        }
        sqlite3_finalize(statement)
        return checksum
    }

    func text(_ statement: OpaquePointer, _ column: Int32) -> String {
        let count = Int(sqlite3_column_bytes(statement, column))
        guard let pointer = sqlite3_column_text(statement, column) else { return "" }
        return String(decoding: UnsafeBufferPointer(start: pointer, count: count), as: UTF8.self)
    }
}
