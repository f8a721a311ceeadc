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

    /// Its bytes in the queue: a compact binary form (``QueuedChangeSet/binaryFormat``), a
    /// few times faster to make and read than JSON, which the daemon pays on every commit
    /// and the uploader on every change set.
    package func encoded() throws -> Data {
        var writer = BinaryWriter()
        writer.bytes.append(Self.binaryFormat)
        writer.bytes.append(reset ? 1 : 0)
        writer.count(inserted.count)
        for row in inserted { writer.row(row) }
        writer.count(updated.count)
        for row in updated { writer.row(row) }
        writer.count(deleted.count)
        for reference in deleted {
            writer.string(reference.entity)
            writer.uuid(reference.id)
        }
        return Data(writer.bytes)
    }

    /// A queued change set from its bytes: the binary form, or JSON (what queues written
    /// before the binary form hold).
    ///
    /// - Throws: ``SkyrosError/Code/storeFailure`` for bytes that are neither.
    package static func decode(_ data: Data) throws -> QueuedChangeSet {
        if data.first == UInt8(ascii: "{") { return try JSONDecoder().decode(Self.self, from: data) }
        return try data.withUnsafeBytes { buffer in
            var reader = BinaryReader(bytes: buffer)
            guard try reader.byte() == binaryFormat else {
                throw SkyrosError(.storeFailure, "a change set in skyros_sync_queue has an unknown format")
            }
            var changes = QueuedChangeSet()
            changes.reset = try reader.byte() & 1 != 0
            for _ in 0..<(try reader.count()) { changes.inserted.append(try reader.row()) }
            for _ in 0..<(try reader.count()) { changes.updated.append(try reader.row()) }
            for _ in 0..<(try reader.count()) {
                changes.deleted.append(Reference(entity: try reader.string(), id: try reader.uuid()))
            }
            guard reader.isAtEnd else { throw SkyrosError(.storeFailure, "a change set in skyros_sync_queue has trailing bytes") }
            return changes
        }
    }

    /// The first byte of the binary form (JSON starts with `{`). After it: a flags byte (1:
    /// reset), then the inserted rows, the updated rows and the deleted references, each list
    /// a count and its items. A row is its entity, its id (16 bytes) and a count of (property
    /// name, value) pairs; a value is a tag (0 null, 1 integer, 2 real, 3 text, 4 blob) and
    /// its payload (8 bytes little-endian for numbers, a length and bytes for text and blobs).
    /// Counts and lengths are LEB128 varints; strings UTF-8.
    package static let binaryFormat: UInt8 = 1
}

/// Appends the binary form of a ``QueuedChangeSet``.
private struct BinaryWriter {
    var bytes: [UInt8] = []

    init() { bytes.reserveCapacity(256) }

    mutating func count(_ value: Int) {
        var value = UInt64(value)
        while value >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: value) | 0x80)
            value >>= 7
        }
        bytes.append(UInt8(value))
    }

    mutating func string(_ text: String) {
        var text = text
        text.withUTF8 { utf8 in
            count(utf8.count)
            bytes.append(contentsOf: utf8)
        }
    }

    mutating func uuid(_ id: UUID) {
        withUnsafeBytes(of: id.uuid) { bytes.append(contentsOf: $0) }
    }

    mutating func fixed(_ value: UInt64) {
        withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) }
    }

    mutating func row(_ row: QueuedChangeSet.Row) {
        string(row.entity)
        uuid(row.id)
        count(row.values.count)
        for (name, value) in row.values {
            string(name)
            switch value {
            case .null: bytes.append(0)
            case .integer(let number):
                bytes.append(1)
                fixed(UInt64(bitPattern: number))
            case .real(let number):
                bytes.append(2)
                fixed(number.bitPattern)
            case .text(let text):
                bytes.append(3)
                string(text)
            case .blob(let data):
                bytes.append(4)
                count(data.count)
                bytes.append(contentsOf: data)
            }
        }
    }
}

/// Reads the binary form of a ``QueuedChangeSet``; every read checks the bounds.
private struct BinaryReader {
    let bytes: UnsafeRawBufferPointer
    var position = 0

    var isAtEnd: Bool { position == bytes.count }

    private static func truncated() -> SkyrosError {
        SkyrosError(.storeFailure, "a change set in skyros_sync_queue is truncated")
    }

    mutating func byte() throws -> UInt8 {
        guard position < bytes.count else { throw Self.truncated() }
        defer { position += 1 }
        return bytes[position]
    }

    mutating func count() throws -> Int {
        var value: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            let byte = try byte()
            guard shift < 63 else { throw Self.truncated() }
            value |= UInt64(byte & 0x7F) << shift
            if byte < 0x80 { break }
            shift += 7
        }
        guard value <= UInt64(bytes.count - position) * 8 + 64 else { throw Self.truncated() }
        return Int(value)
    }

    mutating func take(_ length: Int) throws -> UnsafeRawBufferPointer {
        guard length >= 0, length <= bytes.count - position else { throw Self.truncated() }
        defer { position += length }
        return UnsafeRawBufferPointer(rebasing: bytes[position..<position + length])
    }

    mutating func string() throws -> String {
        String(decoding: try take(try count()), as: UTF8.self)
    }

    mutating func uuid() throws -> UUID {
        let raw = try take(16)
        return UUID(uuid: raw.loadUnaligned(as: uuid_t.self))
    }

    mutating func fixed() throws -> UInt64 {
        UInt64(littleEndian: try take(8).loadUnaligned(as: UInt64.self))
    }

    mutating func row() throws -> QueuedChangeSet.Row {
        let entity = try string()
        let id = try uuid()
        let count = try count()
        var values: [String: StoredValue] = [:]
        values.reserveCapacity(count)
        for _ in 0..<count {
            let name = try string()
            switch try byte() {
            case 0: values[name] = .null
            case 1: values[name] = .integer(Int64(bitPattern: try fixed()))
            case 2: values[name] = .real(Double(bitPattern: try fixed()))
            case 3: values[name] = .text(try string())
            case 4: values[name] = .blob(Data(try take(try self.count())))
            default: throw SkyrosError(.storeFailure, "a change set in skyros_sync_queue has a value of an unknown kind")
            }
        }
        return QueuedChangeSet.Row(entity: entity, id: id, values: values)
    }
}
