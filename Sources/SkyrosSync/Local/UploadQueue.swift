import Foundation
import Skyros
import SkyrosWire

/// The upload queue in the group's store: every change set the daemon commits is queued in
/// the same SQLite transaction (``enqueue(_:in:)``), numbered by SQLite's `AUTOINCREMENT`
/// (never reused, so (machine, number) names a change set once for good), and uploaded in
/// that order. A queued change set names entities and properties (not positions), so a
/// migration of the store while offline does not change what it means.
package enum UploadQueue {
    /// The change set of an event, by name; nil for an event that changes no object (a schema
    /// change, an empty save).
    package static func changeSet(of event: ChangeEvent, schema: Schema) -> QueuedChangeSet? {
        var queued = QueuedChangeSet()
        func row(_ id: ObjectID, _ values: [Int: StoredValue]) -> QueuedChangeSet.Row? {
            guard let entity = schema.entity(named: id.entityName) else { return nil }
            var named: [String: StoredValue] = [:]
            for (index, value) in values
            where index < entity.properties.count && entity.properties[index].kind != .toMany {
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
        queued.nonce = UInt64.random(in: 1...UInt64.max)
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
    /// A random number drawn when the change set was queued (nil: queued before there was
    /// one), part of its bytes and so of its ``digest``: two change sets with the same content
    /// (the same value saved again on the same object) are still told apart. A store restored
    /// from a backup numbers its next change sets as the original did; one of them that saved
    /// what the original's change set of that number saved was taken for it, dropped as
    /// "on the server already", and lost (a to-do checked again after the restore, unchecked
    /// on the server since).
    package var nonce: UInt64?

    /// Every object the change set names.
    package var objects: [Reference] {
        inserted.map { Reference(entity: $0.entity, id: $0.id) }
            + updated.map { Reference(entity: $0.entity, id: $0.id) }
            + deleted
    }

    /// Its bytes in the queue: a compact binary form (``QueuedChangeSet/binaryFormat``), a
    /// few times faster to make and read than JSON, which the daemon pays on every commit
    /// and the uploader on every change set. Written with the wire protocol's primitives
    /// (``WireWriter``).
    package func encoded() -> Data {
        var writer = WireWriter(capacity: 256)
        writer.byte(Self.binaryFormat)
        writer.byte((reset ? 1 : 0) | (nonce != nil ? 2 : 0))
        if let nonce { writer.fixed64(nonce) }
        writer.uvarint(UInt64(inserted.count))
        for row in inserted { writer.row(row) }
        writer.uvarint(UInt64(updated.count))
        for row in updated { writer.row(row) }
        writer.uvarint(UInt64(deleted.count))
        for reference in deleted {
            writer.string(reference.entity)
            writer.uuid(reference.id)
        }
        return Data(writer.bytes)
    }

    /// A digest of the change set (FNV-1a, 64 bits, of its binary form, whose properties are
    /// in name order): recorded on the server with its upload, so that a store restored from
    /// a backup or copied to another machine, whose change sets under one number differ from
    /// the server's, is told apart (docs/SYNC.md, "One machine id per store").
    package var digest: Int64 {
        var hash: UInt64 = 0xcbf2_9ce4_8422_2325
        for byte in encoded() {
            hash ^= UInt64(byte)
            hash &*= 0x0000_0100_0000_01b3
        }
        return Int64(bitPattern: hash)
    }

    /// A queued change set from its bytes: the binary form, or JSON (what queues written
    /// before the binary form hold).
    ///
    /// - Throws: ``SkyrosError/Code/storeFailure`` for bytes that are neither.
    package static func decode(_ data: Data) throws -> QueuedChangeSet {
        if data.first == UInt8(ascii: "{") { return try JSONDecoder().decode(Self.self, from: data) }
        var reader = WireReader([UInt8](data))
        do {
            guard try reader.byte() == binaryFormat else {
                throw SkyrosError(.storeFailure, "a change set in the upload queue has an unknown format")
            }
            var changes = QueuedChangeSet()
            let flags = try reader.byte()
            changes.reset = flags & 1 != 0
            if flags & 2 != 0 { changes.nonce = try reader.fixed64() }
            for _ in 0..<(try reader.count(minimumSize: 18)) { changes.inserted.append(try reader.row()) }
            for _ in 0..<(try reader.count(minimumSize: 18)) { changes.updated.append(try reader.row()) }
            for _ in 0..<(try reader.count(minimumSize: 17)) {
                changes.deleted.append(Reference(entity: try reader.string(), id: try reader.uuid()))
            }
            guard reader.remaining == 0 else {
                throw SkyrosError(.storeFailure, "a change set in the upload queue has trailing bytes")
            }
            return changes
        } catch let error as WireError {
            throw SkyrosError(.storeFailure, "a change set in the upload queue cannot be read: \(error)")
        }
    }

    /// The first byte of the binary form (JSON starts with `{`). After it: a flags byte (1:
    /// reset, 2: a nonce follows), the nonce when there is one (8 bytes little-endian), then the inserted rows, the updated rows and the deleted references, each list
    /// a count and its items. A row is its entity, its id (16 bytes) and a count of (property
    /// name, value) pairs; a value is a tag (0 null, 1 integer, 2 real, 3 text, 4 blob) and
    /// its payload (8 bytes little-endian for numbers, a length and bytes for text and blobs).
    /// Counts and lengths are LEB128 varints; strings UTF-8.
    package static let binaryFormat: UInt8 = 1
}

extension WireWriter {
    /// A queued change set's row: its entity, its id (16 bytes) and a count of (property name,
    /// value) pairs; a value is the wire's (``value(_:fixedIntegers:)``) with its integers in
    /// eight bytes.
    fileprivate mutating func row(_ row: QueuedChangeSet.Row) {
        string(row.entity)
        uuid(row.id)
        uvarint(UInt64(row.values.count))
        // In name order: the same change set is the same bytes in every process (its digest).
        for (name, value) in row.values.sorted(by: { $0.key < $1.key }) {
            string(name)
            self.value(value, fixedIntegers: true)
        }
    }
}

extension WireReader {
    /// A row written by ``WireWriter/row(_:)``.
    fileprivate mutating func row() throws -> QueuedChangeSet.Row {
        let entity = try string()
        let id = try uuid()
        let count = try count(minimumSize: 2)
        var values: [String: StoredValue] = [:]
        values.reserveCapacity(count)
        for _ in 0..<count {
            let name = try string()
            values[name] = try value(fixedIntegers: true)
        }
        return QueuedChangeSet.Row(entity: entity, id: id, values: values)
    }
}
