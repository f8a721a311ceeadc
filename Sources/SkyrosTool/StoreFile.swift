// `--store FILE`: a store file opened directly by the tool.
import Foundation
import Skyros
import SkyrosDaemon
import SkyrosWire

/// A store file the tool works on directly: checked first (a damaged file exits 65), its
/// schema read from the file itself (no application code needed).
final class StoreFile {
    let url: URL
    let description: SchemaDescription
    let store: SQLiteStore
    let hasJournal: Bool
    /// The lock held while writing (a daemon cannot start meanwhile).
    private var lockDescriptor: Int32 = -1

    /// Opens the store at `path`. With `writing`, refuses a store a daemon serves (its
    /// container's `daemon.lock` is held) and holds that lock until ``close()``.
    init(_ path: String, writing: Bool = false) throws {
        url = URL(fileURLWithPath: path).standardizedFileURL
        guard FileManager.default.fileExists(atPath: url.path) else {
            throw ToolFailure(ToolExit.failure, "there is no store at \(url.path)")
        }
        do {
            try StoreCheck.verify(url, depth: .quick)
        } catch let error as SkyrosError {
            throw ToolFailure(ToolExit.damaged, error.message)
        }
        if writing {
            let lockPath = url.deletingLastPathComponent().appendingPathComponent("daemon.lock").path
            if FileManager.default.fileExists(atPath: lockPath) {
                let fd = open(lockPath, O_RDONLY | O_CLOEXEC)
                if fd >= 0 && flock(fd, LOCK_EX | LOCK_NB) != 0 {
                    Foundation.close(fd)
                    let pid = (try? String(contentsOfFile: lockPath, encoding: .utf8))?.trimmingCharacters(
                        in: .whitespacesAndNewlines)
                    throw ToolFailure(
                        ToolExit.failure,
                        "skyrosd\(pid.map { " (pid \($0))" } ?? "") serves the store at \(url.path): writing to it directly would bypass its clients; use --group ID to go through the daemon, or stop the daemon first"
                    )
                }
                lockDescriptor = fd
            }
        }
        do {
            guard let description = try SQLiteStore.storedSchemaDescription(at: url) else {
                throw ToolFailure(ToolExit.damaged, "the store at \(url.path) has no Skyros schema")
            }
            self.description = description
            // At the version the store records: a store that migrated is opened as it is, not
            // refused as newer than version 1 (an older application).
            let version = try SQLiteStore.storedSchemaVersion(at: url) ?? 1
            store = try SQLiteStore(
                schema: try Schema(description: description, version: version), url: url, serialAccess: true)
            hasJournal = try JournalAccess.hasJournal(store)
        } catch let error as SkyrosError {
            if lockDescriptor >= 0 { Foundation.close(lockDescriptor) }
            throw ToolFailure(error.code == .storeFailure ? ToolExit.damaged : ToolExit.failure, error.message)
        }
    }

    deinit { close() }

    private var isClosed = false

    func close() {
        guard !isClosed else { return }
        isClosed = true
        try? store.close()
        if lockDescriptor >= 0 {
            flock(lockDescriptor, LOCK_UN)
            Foundation.close(lockDescriptor)
            lockDescriptor = -1
        }
    }

    /// The entity named `name`, or a usage failure listing the entities.
    func entity(_ name: String) throws -> SchemaDescription.Entity {
        try Self.entity(name, in: description)
    }

    static func entity(_ name: String, in description: SchemaDescription) throws -> SchemaDescription.Entity {
        guard let entity = description.entities.first(where: { $0.name == name }) else {
            throw ToolFailure(
                ToolExit.usage,
                "the store has no entity \(name) (it has: \(description.userEntityNames.joined(separator: ", ")))")
        }
        return entity
    }

    /// A value of `skyros_metadata`.
    func metadata(_ key: String) -> String? {
        guard
            case .text(let value)? = try? store.rows("SELECT value FROM skyros_metadata WHERE key = ?", [.text(key)])
                .first?.first
        else { return nil }
        return value
    }

    /// The pid in the container's lock file when a daemon holds the lock.
    var servingDaemon: Int32? {
        let lockPath = url.deletingLastPathComponent().appendingPathComponent("daemon.lock").path
        let fd = open(lockPath, O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { Foundation.close(fd) }
        guard lockDescriptor < 0 else { return nil }  // this process holds it
        if flock(fd, LOCK_SH | LOCK_NB) == 0 {
            flock(fd, LOCK_UN)
            return nil
        }
        return (try? String(contentsOfFile: lockPath, encoding: .utf8)).flatMap {
            Int32($0.trimmingCharacters(in: .whitespacesAndNewlines))
        }
    }
}

extension SchemaDescription {
    /// The entities a user declared, by name: not the tables the store keeps for its own use
    /// (a many-to-many relationship's link table, `_Entity_relationship`).
    var userEntityNames: [String] { entities.map(\.name).filter { !$0.hasPrefix("_") } }
}
