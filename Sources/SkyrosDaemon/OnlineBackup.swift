import Foundation
import GRDBSQLite
import Skyros
import SkyrosWire

/// A consistent copy of a store file taken while others keep writing to it: SQLite's online
/// backup API (`sqlite3_backup_step`), a few pages at a time.
///
/// The copy is a snapshot: the source connection opens a read transaction first and keeps it
/// for the whole backup, so every step copies pages of the same committed state (in WAL mode
/// a reader never blocks a writer, and a writer's commits never restart the backup). The
/// sequence the copy holds is read in that same transaction. The copy is written to
/// `<destination>.partial`, checked with `PRAGMA integrity_check`, and only then renamed to
/// `destination`: a backup that fails or is abandoned leaves no file that looks complete.
///
/// Used by one thread at a time (Sendable so that the daemon can hand it to its backup
/// thread; the tool steps it in a loop).
package final class OnlineBackup: @unchecked Sendable {
    /// The copy's final path.
    package let destination: URL
    /// The sequence of the last change set the copy holds (0: a store without history).
    package private(set) var sequence: UInt64 = 0
    private var source: OpaquePointer?
    private var target: OpaquePointer?
    private var backup: OpaquePointer?
    private let partial: String
    /// Whether this backup created `partial` (only then does it remove it).
    private var ownsPartial = false
    /// Pages copied so far, and the store's pages (as of the last step).
    package private(set) var copied: UInt64 = 0
    package private(set) var total: UInt64 = 0
    /// Whether every page is copied (``finish()`` then verifies and renames the copy).
    package private(set) var isComplete = false

    /// Starts a backup of the store at `store` to `destination`, which must not exist.
    package init(store: URL, destination: URL) throws {
        self.destination = destination
        partial = destination.path + ".partial"
        func failure(_ what: String, _ db: OpaquePointer?) -> SkyrosError {
            SkyrosError(
                .storeFailure,
                "backup to \(destination.path): \(what)\(db.map { ": " + String(cString: sqlite3_errmsg($0)) } ?? "")")
        }
        guard !FileManager.default.fileExists(atPath: destination.path) else {
            throw SkyrosError(.storeFailure, "backup to \(destination.path): the file exists; choose a new path")
        }
        guard FileManager.default.fileExists(atPath: store.path) else {
            throw SkyrosError(.storeFailure, "there is no store at \(store.path) to back up")
        }
        guard !FileManager.default.fileExists(atPath: partial) else {
            throw SkyrosError(
                .storeFailure,
                "backup to \(destination.path): \(partial) exists (a backup in progress, or one that was interrupted: remove it)"
            )
        }
        do {
            guard sqlite3_open_v2(store.path, &source, SQLITE_OPEN_READONLY, nil) == SQLITE_OK else {
                throw failure("cannot open the store", source)
            }
            sqlite3_busy_timeout(source, 5_000)
            // The snapshot: a read transaction held until the backup ends.
            guard sqlite3_exec(source, "BEGIN", nil, nil, nil) == SQLITE_OK else {
                throw failure("cannot begin", source)
            }
            if Self.integer(source, "SELECT count(*) FROM sqlite_master WHERE name = 'skyros_history'") == 1 {
                sequence = UInt64(
                    max(0, Self.integer(source, "SELECT coalesce(max(sequence), 0) FROM skyros_history") ?? 0))
            } else {
                _ = Self.integer(source, "SELECT count(*) FROM sqlite_master")  // starts the read transaction
            }
            let created = sqlite3_open_v2(partial, &target, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE, nil)
            ownsPartial = FileManager.default.fileExists(atPath: partial)
            guard created == SQLITE_OK else { throw failure("cannot create \(partial)", target) }
            guard let handle = sqlite3_backup_init(target, "main", source, "main") else {
                throw failure("cannot start the backup", target)
            }
            backup = handle
        } catch {
            abandon()
            throw error
        }
    }

    deinit { abandon() }

    /// Copies up to `pages` pages (at least 1). Returns true once every page is copied.
    @discardableResult
    package func step(pages: Int) throws -> Bool {
        guard let backup, !isComplete else { return isComplete }
        let code = sqlite3_backup_step(backup, Int32(max(1, pages)))
        total = UInt64(max(0, sqlite3_backup_pagecount(backup)))
        copied = total - min(total, UInt64(max(0, sqlite3_backup_remaining(backup))))
        switch code {
        case SQLITE_DONE:
            isComplete = true
            return true
        case SQLITE_OK, SQLITE_BUSY, SQLITE_LOCKED:
            return false
        default:
            let message = String(cString: sqlite3_errstr(code))
            throw SkyrosError(.storeFailure, "backup to \(destination.path) failed: \(message)")
        }
    }

    /// Ends a complete backup: checks the copy (`PRAGMA integrity_check`) and moves it to
    /// its path. Returns its size in bytes.
    package func finish() throws -> UInt64 {
        guard isComplete else { throw SkyrosError(.storeFailure, "backup to \(destination.path) is not complete") }
        sqlite3_backup_finish(backup)
        backup = nil
        // The copy is a rollback-journal file of the store's pages; make it WAL like the store.
        sqlite3_exec(target, "PRAGMA journal_mode = WAL", nil, nil, nil)
        let check = Self.text(target, "PRAGMA integrity_check")
        sqlite3_exec(target, "PRAGMA wal_checkpoint(TRUNCATE)", nil, nil, nil)
        close()
        guard check == "ok" else {
            abandon()
            throw SkyrosError(.storeFailure, "the backup copy failed its integrity check: \(check ?? "unreadable")")
        }
        for suffix in ["-wal", "-shm"] { try? FileManager.default.removeItem(atPath: partial + suffix) }
        // link, not rename: a file that appeared at the destination meanwhile is never replaced.
        guard link(partial, destination.path) == 0 else {
            let reason = String(cString: strerror(errno))
            abandon()
            throw SkyrosError(.storeFailure, "cannot move the backup to \(destination.path): \(reason)")
        }
        unlink(partial)
        ownsPartial = false
        var info = stat()
        return stat(destination.path, &info) == 0 ? UInt64(info.st_size) : 0
    }

    /// Abandons the backup: its partial copy is removed.
    package func abandon() {
        close()
        if ownsPartial { try? FileManager.default.removeItem(atPath: partial) }
        ownsPartial = false
    }

    private func close() {
        if let backup { sqlite3_backup_finish(backup) }
        backup = nil
        if let source {
            sqlite3_exec(source, "COMMIT", nil, nil, nil)
            sqlite3_close_v2(source)
        }
        source = nil
        if let target { sqlite3_close_v2(target) }
        target = nil
    }

    /// The progress as an admin reply carries it.
    package var progress: AdminMessage.BackupProgress {
        AdminMessage.BackupProgress(copied: copied, total: total, done: false, sequence: sequence)
    }

    private static func integer(_ db: OpaquePointer?, _ sql: String) -> Int64? {
        var statement: OpaquePointer?
        defer { sqlite3_finalize(statement) }
        guard sqlite3_prepare_v2(db, sql, -1, &statement, nil) == SQLITE_OK, sqlite3_step(statement) == SQLITE_ROW
        else {
            return nil
        }
        return sqlite3_column_int64(statement, 0)
    }

    private static func text(_ db: OpaquePointer?, _ sql: String) -> String? {
        var statement: OpaquePointer?
        defer { sqlite3_finalize(statement) }
        guard sqlite3_prepare_v2(db, sql, -1, &statement, nil) == SQLITE_OK, sqlite3_step(statement) == SQLITE_ROW
        else {
            return nil
        }
        return sqlite3_column_text(statement, 0).map { String(cString: $0) }
    }
}
