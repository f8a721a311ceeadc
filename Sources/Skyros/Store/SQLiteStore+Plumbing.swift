import Foundation
import GRDB
import GRDBSQLite

// The raw `sqlite3_*` calls of the store's hot paths: prepared statements stepped, values
// bound and read without GRDB's per-statement bookkeeping, errors translated.
extension SQLiteStore {
    static func query(
        _ db: Database, _ sql: String, _ arguments: [StoredValue], row: (OpaquePointer) throws -> Void
    ) throws {
        let statement = try db.cachedStatement(sql: sql)
        let raw = statement.sqliteStatement
        sqlite3_reset(raw)
        sqlite3_clear_bindings(raw)
        for (position, value) in arguments.enumerated() { bind(raw, Int32(position + 1), value) }
        defer { sqlite3_reset(raw) }
        while true {
            let code = sqlite3_step(raw)
            if code == SQLITE_ROW {
                try row(raw)
            } else if code == SQLITE_DONE {
                return
            } else {
                throw lastError(db, sql: sql)
            }
        }
    }

    /// Runs SQL without arguments directly (`sqlite3_exec`).
    static func exec(_ db: Database, _ sql: String) throws {
        var message: UnsafeMutablePointer<CChar>?
        guard sqlite3_exec(db.sqliteConnection, sql, nil, nil, &message) == SQLITE_OK else {
            defer { sqlite3_free(message) }
            throw DatabaseError(message: message.map { String(cString: $0) } ?? "could not run \(sql)", sql: sql)
        }
    }

    static func stepDone(_ db: Database, _ raw: OpaquePointer) throws {
        let code = sqlite3_step(raw)
        sqlite3_reset(raw)
        if code != SQLITE_DONE { throw lastError(db) }
    }

    /// The error of the connection's last failed call.
    static func lastError(_ db: Database, sql: String? = nil) -> DatabaseError {
        DatabaseError(
            resultCode: ResultCode(rawValue: sqlite3_extended_errcode(db.sqliteConnection)),
            message: String(cString: sqlite3_errmsg(db.sqliteConnection)), sql: sql)
    }

    /// Steps a statement that returns at most one integer (`… RETURNING column`): the integer,
    /// or nil when no row was touched.
    static func stepReturning(_ db: Database, _ raw: OpaquePointer) throws -> Int64? {
        defer { sqlite3_reset(raw) }
        var result: Int64?
        var code = sqlite3_step(raw)
        if code == SQLITE_ROW {
            result = sqlite3_column_int64(raw, 0)
            code = sqlite3_step(raw)
        }
        guard code == SQLITE_DONE else { throw lastError(db) }
        return result
    }

    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    static func bind(_ statement: OpaquePointer, _ position: Int32, _ value: StoredValue) {
        switch value {
        case .null: sqlite3_bind_null(statement, position)
        case .integer(let value): sqlite3_bind_int64(statement, position, value)
        case .real(let value): sqlite3_bind_double(statement, position, value)
        case .text(var value):
            value.withUTF8 { buffer in
                _ = sqlite3_bind_text(
                    statement, position, UnsafeRawPointer(buffer.baseAddress!).assumingMemoryBound(to: CChar.self),
                    Int32(buffer.count), transient)
            }
        case .blob(let data):
            data.withUnsafeBytes { buffer in
                _ = sqlite3_bind_blob(
                    statement, position, buffer.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32(buffer.count),
                    transient)
            }
        }
    }

    /// Binds an object identifier as its 16 bytes, without an intermediate `Data`.
    static func bind(_ statement: OpaquePointer, _ position: Int32, _ uuid: UUID) {
        withUnsafeBytes(of: uuid.uuid) { buffer in
            _ = sqlite3_bind_blob(statement, position, buffer.baseAddress, 16, transient)
        }
    }

    /// A column of the current row whose type is known (NOT NULL in a STRICT table), or asked.
    @inline(__always)
    static func value(_ statement: OpaquePointer, _ column: Int32, _ type: StorageType?) -> StoredValue {
        switch type {
        case .integer?: .integer(sqlite3_column_int64(statement, column))
        case .real?: .real(sqlite3_column_double(statement, column))
        case .text?: text(statement, column)
        case .blob?, nil: value(statement, column)
        }
    }

    static func text(_ statement: OpaquePointer, _ column: Int32) -> StoredValue {
        let count = Int(sqlite3_column_bytes(statement, column))
        guard let pointer = sqlite3_column_text(statement, column) else { return .text("") }
        return .text(String(decoding: UnsafeBufferPointer(start: pointer, count: count), as: UTF8.self))
    }

    static func value(_ statement: OpaquePointer, _ column: Int32) -> StoredValue {
        switch sqlite3_column_type(statement, column) {
        case SQLITE_INTEGER: return .integer(sqlite3_column_int64(statement, column))
        case SQLITE_FLOAT: return .real(sqlite3_column_double(statement, column))
        case SQLITE_TEXT: return text(statement, column)
        case SQLITE_BLOB:
            let count = Int(sqlite3_column_bytes(statement, column))
            guard let pointer = sqlite3_column_blob(statement, column) else { return .blob(Data()) }
            return .blob(Data(bytes: pointer, count: count))
        default: return .null
        }
    }

    static func uuid(_ statement: OpaquePointer, _ column: Int32) -> UUID {
        guard let pointer = sqlite3_column_blob(statement, column), sqlite3_column_bytes(statement, column) == 16 else {
            return UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
        }
        // A UUID is its 16 bytes: loaded as one, without a call to its initializer per row.
        assert(MemoryLayout<UUID>.size == MemoryLayout<uuid_t>.size)
        return pointer.loadUnaligned(as: UUID.self)
    }

    /// Maps SQLite errors to typed Skyros errors.
    static func translate(_ error: any Error) -> SkyrosError {
        if let error = error as? SkyrosError { return error }
        guard let error = error as? DatabaseError else {
            return SkyrosError(.storeFailure, "\(error)", underlying: error)
        }
        let message = error.message ?? "\(error)"
        switch error.extendedResultCode {
        case .SQLITE_CONSTRAINT_UNIQUE, .SQLITE_CONSTRAINT_PRIMARYKEY:
            return SkyrosError(.uniqueConstraintViolation, message, underlying: error)
        case .SQLITE_CONSTRAINT_FOREIGNKEY:
            return SkyrosError(.deleteDenied, "relationship integrity: \(message)", underlying: error)
        case .SQLITE_CONSTRAINT_NOTNULL, .SQLITE_CONSTRAINT_DATATYPE:
            return SkyrosError(.valueNotStorable, message, underlying: error)
        default:
            return SkyrosError(.storeFailure, message, underlying: error)
        }
    }

    /// The rows of a query of an existing file (as text), read through a read-only connection
    /// that writes nothing; nil when a table it reads does not exist. Without a `-wal` file
    /// the database file holds everything committed, and it is read as immutable: a plain
    /// read-only connection to a WAL database would create the `-wal` and `-shm` files.
    static func readOnlyRows(_ sql: String, of url: URL) throws -> [[String?]]? {
        let walExists = FileManager.default.fileExists(atPath: url.path + "-wal")
        var components = URLComponents()
        components.scheme = "file"
        components.path = url.path
        if !walExists { components.queryItems = [URLQueryItem(name: "immutable", value: "1")] }
        let failure = { (reason: String) in
            SkyrosError(.storeFailure, "could not read the metadata of the store at \(url.path): \(reason)")
        }
        var db: OpaquePointer?
        defer { sqlite3_close_v2(db) }
        guard let uri = components.string,
            sqlite3_open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nil) == SQLITE_OK, let db
        else { throw failure(db.map { String(cString: sqlite3_errmsg($0)) } ?? "cannot open") }
        var statement: OpaquePointer?
        defer { sqlite3_finalize(statement) }
        guard sqlite3_prepare_v2(db, sql, -1, &statement, nil) == SQLITE_OK, let statement else {
            let message = String(cString: sqlite3_errmsg(db))
            if message.hasPrefix("no such table") { return nil }
            throw failure(message)
        }
        var rows: [[String?]] = []
        let count = sqlite3_column_count(statement)
        while true {
            let code = sqlite3_step(statement)
            guard code == SQLITE_ROW else {
                guard code == SQLITE_DONE else { throw failure(String(cString: sqlite3_errmsg(db))) }
                break
            }
            rows.append(
                (0..<count).map { column in sqlite3_column_text(statement, column).map { String(cString: $0) } })
        }
        return rows
    }
}
