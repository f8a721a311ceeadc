// What the operating commands read and do, whether through a group's daemon (an admin
// session) or on a store file directly.
import Foundation
import Skyros
import SkyrosDaemon
import SkyrosWire

/// The store's schema as `inspect` shows it.
struct SchemaInfo {
    var description: SchemaDescription
    var fingerprint: String
    var version: UInt64
    /// Every version the store has had (`skyros_schema`), oldest first; empty when not known
    /// (through a daemon).
    var versions: [RecordedVersion] = []

    struct RecordedVersion {
        var version: Int64
        var fingerprint: String
        /// When the store took it, ISO 8601 as recorded.
        var date: String
    }
}

/// A store to operate on.
protocol OperatedStore: AnyObject {
    /// The status, as one JSON object with the keys docs/OPERATING.md lists.
    func status() throws -> JSONValue
    func schema() throws -> SchemaInfo
    func history(since: UInt64, limit: UInt64) throws -> (entries: [AdminMessage.HistoryEntry], more: Bool)
    /// Calls `body` with every object of `entity` the predicate selects, in identifier order.
    func forEachObject(_ entity: String, predicate: PredicateNode?, _ body: (Snapshot) throws -> Void) throws
    /// Backs the store up to `destination`; `progress` gets pages copied and total.
    func backup(to destination: URL, progress: (UInt64, UInt64) -> Void) throws -> (bytes: UInt64, sequence: UInt64)
    /// Saves imported change sets; returns the last sequence (0: a store without history).
    func importChanges(_ changes: [ChangeSet], progress: (Int) -> Void) throws -> UInt64
    /// Ids among `ids` that exist (for `import --upsert`).
    func existing(_ ids: [ObjectID]) throws -> Set<ObjectID>
}

/// How `import` is recorded in the history.
enum ImportAuthor {
    static let name = "skyros import"
}

extension StoreFile: OperatedStore {
    func status() throws -> JSONValue {
        var objects: [String: JSONValue] = [:]
        for entity in description.entities {
            objects[entity.name] = .integer(Int64(try store.count(StoreRequest(entityName: entity.name))))
        }
        var historyBytes: Int64 = 0
        if hasJournal,
            case .integer(let bytes)? = try store.rows("SELECT coalesce(sum(length(event)), 0) FROM skyros_history")
                .first?.first
        {
            historyBytes = bytes
        }
        return [
            "path": .string(url.path),
            "pid": JSONValue(servingDaemon.map { Int($0) }),
            "uptimeSeconds": .null,
            "protocolVersion": .integer(Int64(WireProtocol.version)),
            "schemaVersion": .integer(Int64(metadata("schemaVersion").flatMap { Int64($0) } ?? 1)),
            "fingerprint": JSONValue(metadata("fingerprint")),
            "sequence": JSONValue(try JournalAccess.sequence(of: store)),
            "clients": [],
            "savesPerSecond": .null,
            "saveLatencyP50Micros": .null,
            "saveLatencyP99Micros": .null,
            "storeBytes": .integer(fileSize(url.path)),
            "walBytes": .integer(fileSize(url.path + "-wal")),
            "historyBytes": .integer(historyBytes),
            "objects": .object(objects),
        ]
    }

    func schema() throws -> SchemaInfo {
        var info = SchemaInfo(
            description: description, fingerprint: metadata("fingerprint") ?? store.schema.fingerprint,
            version: UInt64(metadata("schemaVersion") ?? "1") ?? 1)
        // A store made before versions were recorded has no such table: no versions to show.
        let rows = (try? store.rows("SELECT version, fingerprint, date FROM skyros_schema ORDER BY version")) ?? []
        info.versions = rows.compactMap { row in
            guard row.count == 3, case .integer(let version) = row[0], case .text(let fingerprint) = row[1] else {
                return nil
            }
            let date: String
            switch row[2] {
            case .text(let text): date = text
            case .real(let seconds): date = ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: seconds))
            case .integer(let seconds):
                date = ISO8601DateFormatter().string(from: Date(timeIntervalSince1970: Double(seconds)))
            default: date = ""
            }
            return SchemaInfo.RecordedVersion(version: version, fingerprint: fingerprint, date: date)
        }
        return info
    }

    func history(since: UInt64, limit: UInt64) throws -> (entries: [AdminMessage.HistoryEntry], more: Bool) {
        try JournalAccess.history(since: since, limit: limit, in: store)
    }

    func forEachObject(_ entity: String, predicate: PredicateNode?, _ body: (Snapshot) throws -> Void) throws {
        try store.forEachSnapshot(StoreRequest(entityName: entity, predicate: predicate)) { id, values, version in
            try body(Snapshot(id: id, values: values, version: version))
        }
    }

    func backup(to destination: URL, progress: (UInt64, UInt64) -> Void) throws -> (bytes: UInt64, sequence: UInt64) {
        let backup = try OnlineBackup(store: url, destination: destination)
        while try !backup.step(pages: 1_024) { progress(backup.copied, backup.total) }
        progress(backup.copied, backup.total)
        return (try backup.finish(), backup.sequence)
    }

    func importChanges(_ changes: [ChangeSet], progress: (Int) -> Void) throws -> UInt64 {
        let author = UUID()
        var sequence: UInt64 = 0
        // One transaction: relationships may point to objects of a later chunk (the store's
        // foreign keys are checked at commit).
        try store.transaction { transaction in
            for (index, chunk) in changes.enumerated() {
                sequence = try JournalAccess.apply(
                    chunk, author: ImportAuthor.name, authorID: author, save: UInt64(index + 1), journal: hasJournal,
                    in: transaction)
                progress(index + 1)
            }
        }
        return sequence
    }

    func existing(_ ids: [ObjectID]) throws -> Set<ObjectID> {
        Set(try store.snapshots(for: ids).map(\.id))
    }
}
