import Foundation
import GRDBSQLite

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

    deinit { sqlite3_close(db) }

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

    static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    func bind(_ statement: OpaquePointer, _ index: Int32, _ text: String) {
        sqlite3_bind_text(statement, index, text, -1, Self.transient)
    }

    func text(_ statement: OpaquePointer, _ column: Int32) -> String {
        let count = Int(sqlite3_column_bytes(statement, column))
        guard let pointer = sqlite3_column_text(statement, column) else { return "" }
        return String(decoding: UnsafeBufferPointer(start: pointer, count: count), as: UTF8.self)
    }
}
