import Foundation
import Skyros
import SkyrosWire

/// The upload queue in the group's store: every change set the daemon commits is queued in
/// the same SQLite transaction (``enqueue(_:in:)``), numbered by SQLite's `AUTOINCREMENT`
/// (never reused, so (machine, number) names a change set once for good), and uploaded in
/// that order. A queued change set names entities and properties (not positions), so a
/// migration of the store while offline does not change what it means.
package enum UploadQueue {
    /// The queue's table, created with the store's other tables by the daemon.
    package static let tableSQL = """
        CREATE TABLE IF NOT EXISTS skyros_sync_queue (number INTEGER PRIMARY KEY AUTOINCREMENT, \
        sequence INTEGER NOT NULL, timestamp REAL NOT NULL, changes BLOB NOT NULL)
        """

    /// What the rejected log keeps: a change set the server refused, with its reason.
    package static let rejectedTableSQL = """
        CREATE TABLE IF NOT EXISTS skyros_sync_rejected (number INTEGER PRIMARY KEY, timestamp REAL NOT NULL, \
        reason TEXT NOT NULL, objects TEXT NOT NULL, changes BLOB)
        """

    /// The change set of an event, by name; nil for an event that changes no object (a schema
    /// change, an empty save).
    package static func changeSet(of event: ChangeEvent, schema: Schema) -> QueuedChangeSet? {
        var queued = QueuedChangeSet()
        func row(_ id: ObjectID, _ values: [Int: StoredValue]) -> QueuedChangeSet.Row? {
            guard let entity = schema.entity(named: id.entityName) else { return nil }
            var named: [String: StoredValue] = [:]
            for (index, value) in values where index < entity.properties.count && entity.properties[index].kind != .toMany {
                named[entity.properties[index].name] = value
            }
            return QueuedChangeSet.Row(entity: id.entityName, id: id.uuid, values: named)
        }
        switch event.kind {
        case .schemaChanged, .heartbeat: return nil
        case .reset: queued.reset = true
        default: break
        }
        queued.inserted = event.inserted.compactMap { snapshot in
            row(snapshot.id, Dictionary(uniqueKeysWithValues: snapshot.values.enumerated().map { ($0, $1) }))
        }
        queued.updated = event.updated.compactMap { row($0.id, $0.values) }
        queued.deleted = event.deleted.map { QueuedChangeSet.Reference(entity: $0.entityName, id: $0.uuid) }
        if !queued.reset && queued.inserted.isEmpty && queued.updated.isEmpty && queued.deleted.isEmpty { return nil }
        return queued
    }
}

/// A change set as queued for upload: rows by entity and property name.
package struct QueuedChangeSet: Codable, Sendable, Equatable {
    /// An object and some of its values, by property name.
    package struct Row: Codable, Sendable, Equatable {
        package var entity: String
        package var id: UUID
        package var values: [String: StoredValue]

        /// An object of `entity` and some of its values.
        package init(entity: String, id: UUID, values: [String: StoredValue]) {
            self.entity = entity
            self.id = id
            self.values = values
        }
    }

    /// An object.
    package struct Reference: Codable, Sendable, Equatable, Hashable {
        package var entity: String
        package var id: UUID

        /// An object of `entity`.
        package init(entity: String, id: UUID) {
            self.entity = entity
            self.id = id
        }
    }

    /// An empty change set.
    package init() {}

    /// Inserted objects with all their values.
    package var inserted: [Row] = []
    /// Updated objects with the values they changed.
    package var updated: [Row] = []
    /// Deleted objects.
    package var deleted: [Reference] = []
    /// The store was emptied first (`deleteAll`).
    package var reset = false

    /// Every object the change set names.
    package var objects: [Reference] {
        inserted.map { Reference(entity: $0.entity, id: $0.id) } + updated.map { Reference(entity: $0.entity, id: $0.id) }
            + deleted
    }

    /// Its bytes in the queue.
    package func encoded() throws -> Data { try JSONEncoder().encode(self) }

    /// A queued change set from its bytes.
    package static func decode(_ data: Data) throws -> QueuedChangeSet { try JSONDecoder().decode(Self.self, from: data) }
}
