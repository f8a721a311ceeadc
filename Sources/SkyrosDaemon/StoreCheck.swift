import Foundation
import GRDBSQLite
import Skyros

/// The check of a group's store file before the daemon serves it (`PRAGMA quick_check`, at
/// every start) or on demand (`skyrosd --check`: `PRAGMA integrity_check`).
///
/// The check never writes to the file: it reads it through its own read-only SQLite
/// connection, as immutable when there is no `-wal` file (a plain read-only connection to a
/// WAL database would create the `-wal` and `-shm` files), and as a plain read-only
/// connection when there is one (the committed transactions it holds are part of the store;
/// a read-only connection never checkpoints them into the file).
///
/// The daemon creates the store itself when the file is absent, so any file is either a
/// Skyros store or damage: an empty file, a file that is not an SQLite database, an SQLite
/// database without Skyros' metadata, or a database the check finds errors in is refused
/// with ``SkyrosError/Code/storeFailure``, a message naming the file and the problem, and the
/// file left as it was.
package enum StoreCheck {
    /// How thorough a check is.
    package enum Depth: Sendable {
        /// `PRAGMA quick_check`: the structure of every page, without comparing indexes to
        /// their tables (the daemon's check at start).
        case quick
        /// `PRAGMA integrity_check`: `quick_check`, and every index against its table.
        case full

        var pragma: String {
            switch self {
            case .quick: "quick_check"
            case .full: "integrity_check"
            }
        }
    }

    /// The most findings of the pragma a refusal lists.
    static let listedFindings = 10

    /// Checks the store file at `url` without writing to it.
    ///
    /// - Returns: false when there is no file (the daemon creates the store on the first
    ///   client's hello), true when the file is a Skyros store the check finds no error in.
    /// - Throws: ``SkyrosError/Code/storeFailure`` naming the file and the problem otherwise.
    @discardableResult
    package static func verify(_ url: URL, depth: Depth) throws -> Bool {
        let path = url.path
        func refusal(_ problem: String) -> SkyrosError {
            SkyrosError(.storeFailure, "the store at \(path) \(problem); the file was left untouched")
        }
        var status = stat()
        guard stat(path, &status) == 0 else {
            if errno == ENOENT { return false }
            throw refusal("cannot be read: \(String(cString: strerror(errno)))")
        }
        guard status.st_mode & S_IFMT == S_IFREG else { throw refusal("is not a regular file") }
        guard status.st_size > 0 else {
            throw refusal(
                "is empty (0 bytes): the daemon creates the store itself when the file is absent, so an empty file is damage (a truncated store), not a new store; restore it from a backup, or remove it to start an empty store"
            )
        }

        var components = URLComponents()
        components.scheme = "file"
        components.path = path
        let walExists = FileManager.default.fileExists(atPath: path + "-wal")
        components.queryItems = [URLQueryItem(name: "mode", value: "ro")]
        if !walExists { components.queryItems?.append(URLQueryItem(name: "immutable", value: "1")) }
        var db: OpaquePointer?
        defer { sqlite3_close_v2(db) }
        guard let uri = components.string,
            sqlite3_open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nil) == SQLITE_OK, let db
        else { throw refusal("cannot be opened: \(db.map { String(cString: sqlite3_errmsg($0)) } ?? "out of memory")") }

        let findings: [String]
        do {
            findings = try rows(db, "PRAGMA \(depth.pragma)(\(listedFindings + 1))")
        } catch let error as SQLiteFailure {
            switch error.code & 0xff {
            case SQLITE_NOTADB: throw refusal("is not a Skyros store: it is not an SQLite database (\(error.message))")
            case SQLITE_CORRUPT: throw refusal("is damaged: \(error.message)")
            default: throw refusal("cannot be checked: \(error.message)")
            }
        }
        if findings != ["ok"] {
            // One line of the message: a row may hold several findings, one a line, after a
            // line naming the database.
            let lines = findings.flatMap { $0.split(separator: "\n").map(String.init) }
                .filter { !$0.hasPrefix("*** in database") }
            var listed = lines.prefix(listedFindings).joined(separator: "; ")
            if lines.count > listedFindings { listed += "; …" }
            throw refusal("is damaged: PRAGMA \(depth.pragma) found: \(listed)")
        }

        do {
            let tables = try rows(
                db, "SELECT name FROM sqlite_master WHERE type = 'table' AND name = 'skyros_metadata'")
            guard !tables.isEmpty else {
                throw refusal(
                    "is not a Skyros store: it is an SQLite database without Skyros' metadata table (skyros_metadata)")
            }
            let schema = try rows(db, "SELECT typeof(value) FROM skyros_metadata WHERE key = 'schema'")
            guard schema == ["text"] else {
                throw refusal("is not a Skyros store: its metadata table (skyros_metadata) has no schema")
            }
        } catch let error as SQLiteFailure {
            throw refusal("cannot be checked: \(error.message)")
        }
        return true
    }

    /// An SQLite error of the check's connection.
    private struct SQLiteFailure: Error {
        var code: Int32
        var message: String
    }

    /// The first column of every row of `sql`, as text.
    private static func rows(_ db: OpaquePointer, _ sql: String) throws -> [String] {
        func failure(_ code: Int32) -> SQLiteFailure {
            SQLiteFailure(code: code, message: String(cString: sqlite3_errmsg(db)))
        }
        var statement: OpaquePointer?
        defer { sqlite3_finalize(statement) }
        let prepared = sqlite3_prepare_v2(db, sql, -1, &statement, nil)
        guard prepared == SQLITE_OK, let statement else { throw failure(prepared) }
        var result: [String] = []
        while true {
            let code = sqlite3_step(statement)
            if code == SQLITE_DONE { return result }
            guard code == SQLITE_ROW else { throw failure(code) }
            result.append(sqlite3_column_text(statement, 0).map { String(cString: $0) } ?? "")
        }
    }
}
