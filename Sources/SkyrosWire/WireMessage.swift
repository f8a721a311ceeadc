import Foundation
import Skyros

/// One change of a committed change set, as published to every client.
public struct ObjectChange: Sendable, Hashable {
    public enum Kind: UInt8, Sendable, Hashable {
        case inserted = 0
        case updated = 1
        case deleted = 2
    }
    public var id: ObjectID
    public var kind: Kind
    /// For updates: the names of the properties that changed.
    public var properties: [String]

    public init(id: ObjectID, kind: Kind, properties: [String] = []) {
        self.id = id
        self.kind = kind
        self.properties = properties
    }
}

/// A committed change set as the daemon publishes it: its sequence number, its author, and
/// what changed.
public struct ChangeEvent: Sendable, Hashable {
    public var sequence: UInt64
    public var author: String
    /// The store was emptied (`nuke`): every object is gone.
    public var isReset: Bool
    public var changes: [ObjectChange]

    public init(sequence: UInt64, author: String, isReset: Bool = false, changes: [ObjectChange]) {
        self.sequence = sequence
        self.author = author
        self.isReset = isReset
        self.changes = changes
    }
}

/// A message of the client–daemon protocol (docs/PROTOCOL.md): a request, a reply, or a
/// published change event.
public struct WireMessage: Sendable, Hashable {
    /// The protocol version this build speaks.
    public static let protocolVersion: UInt8 = 3
    /// The topic of the events every client receives: heartbeats, and `changes` messages of
    /// change sets saved on several connections. The events of change sets saved on one
    /// connection are published under the topic it got in its welcome, which that client
    /// does not subscribe to: it knows its own saves from their replies.
    public static let broadcastTopic: UInt8 = 0
    /// The largest encoded message either side accepts (16 MiB).
    public static let maximumSize = 16 * 1_048_576

    public enum Body: Sendable, Hashable {
        // Requests
        /// `schemaDescription` is the JSON of the client's `SchemaDescription`: a daemon whose
        /// group has no store yet creates it from it.
        case hello(protocolVersion: UInt64, schemaFingerprint: String, clientName: String, schemaDescription: [UInt8])
        case fetch(StoreRequest)
        case fetchIdentifiers(StoreRequest)
        case count(StoreRequest)
        case snapshots([ObjectID])
        case save(clientID: String, saveNumber: UInt64, changes: ChangeSet)
        case changesSince(UInt64)
        /// Empties the store (`nuke`).
        case deleteAll(clientID: String)
        // Replies
        /// `eventTopic`: the first frame of the events of this connection's saves (1–255).
        case welcome(protocolVersion: UInt64, sequence: UInt64, eventTopic: UInt8)
        case snapshotsReply([Snapshot])
        case identifiersReply([ObjectID])
        case countReply(Int)
        case saved(sequence: UInt64)
        case error(code: String, message: String)
        case changes([ChangeEvent])
        /// A save refused under the `.error` merge policy: every conflicting object.
        case conflicts(message: String, [MergeConflict])
        // Published on the event socket
        case event(ChangeEvent)

        var type: UInt8 {
            switch self {
            case .hello: 1
            case .fetch: 2
            case .fetchIdentifiers: 3
            case .count: 4
            case .snapshots: 5
            case .save: 6
            case .changesSince: 7
            case .deleteAll: 8
            case .welcome: 64
            case .snapshotsReply: 65
            case .identifiersReply: 66
            case .countReply: 67
            case .saved: 68
            case .error: 69
            case .changes: 70
            case .conflicts: 71
            case .event: 96
            }
        }
    }

    /// Chosen by the requester, echoed by the reply (0 for events).
    public var requestID: UInt64
    public var body: Body

    public init(requestID: UInt64, body: Body) {
        self.requestID = requestID
        self.body = body
    }

    /// `[version][type][requestID varint][body]`.
    public func encoded() -> [UInt8] {
        var writer = WireWriter()
        writer.byte(Self.protocolVersion)
        writer.byte(body.type)
        writer.uvarint(requestID)
        switch body {
        case .hello(let version, let fingerprint, let name, let description):
            writer.uvarint(version)
            writer.string(fingerprint)
            writer.string(name)
            writer.data(description)
        case .fetch(let request), .fetchIdentifiers(let request), .count(let request):
            writer.request(request)
        case .snapshots(let ids):
            writer.uvarint(UInt64(ids.count))
            for id in ids { writer.objectID(id) }
        case .save(let clientID, let number, let changes):
            writer.string(clientID)
            writer.uvarint(number)
            writer.changeSet(changes)
        case .changesSince(let sequence):
            writer.uvarint(sequence)
        case .deleteAll(let clientID):
            writer.string(clientID)
        case .welcome(let version, let sequence, let topic):
            writer.uvarint(version)
            writer.uvarint(sequence)
            writer.byte(topic)
        case .snapshotsReply(let snapshots):
            writer.uvarint(UInt64(snapshots.count))
            for snapshot in snapshots { writer.snapshot(snapshot) }
        case .identifiersReply(let ids):
            writer.uvarint(UInt64(ids.count))
            for id in ids { writer.objectID(id) }
        case .countReply(let count):
            writer.uvarint(UInt64(count))
        case .saved(let sequence):
            writer.uvarint(sequence)
        case .error(let code, let message):
            writer.string(code)
            writer.string(message)
        case .changes(let events):
            writer.uvarint(UInt64(events.count))
            for event in events { writer.event(event) }
        case .conflicts(let message, let conflicts):
            writer.string(message)
            writer.uvarint(UInt64(conflicts.count))
            for conflict in conflicts { writer.conflict(conflict) }
        case .event(let event):
            writer.event(event)
        }
        return writer.bytes
    }

    /// Decodes a message, refusing anything malformed with a ``WireError``: never a crash,
    /// never an allocation larger than the message itself.
    public static func decode(_ bytes: [UInt8], maximumSize: Int = WireMessage.maximumSize) throws(WireError)
        -> WireMessage
    {
        guard bytes.count <= maximumSize else { throw .tooLarge(bytes.count) }
        var reader = WireReader(bytes)
        let version = try reader.byte()
        guard version == protocolVersion else { throw .unsupportedVersion(version) }
        let type = try reader.byte()
        let requestID = try reader.uvarint()
        let body: Body
        switch type {
        case 1:
            let version = try reader.uvarint()
            let fingerprint = try reader.string()
            let name = try reader.string()
            body = .hello(
                protocolVersion: version, schemaFingerprint: fingerprint, clientName: name,
                schemaDescription: try reader.data())
        case 2: body = .fetch(try reader.request())
        case 3: body = .fetchIdentifiers(try reader.request())
        case 4: body = .count(try reader.request())
        case 5:
            var ids: [ObjectID] = []
            for _ in 0..<(try reader.count(minimumSize: 17)) { ids.append(try reader.objectID()) }
            body = .snapshots(ids)
        case 6:
            let clientID = try reader.string()
            let number = try reader.uvarint()
            body = .save(clientID: clientID, saveNumber: number, changes: try reader.changeSet())
        case 7: body = .changesSince(try reader.uvarint())
        case 8: body = .deleteAll(clientID: try reader.string())
        case 64:
            let version = try reader.uvarint()
            let sequence = try reader.uvarint()
            body = .welcome(protocolVersion: version, sequence: sequence, eventTopic: try reader.byte())
        case 65:
            var snapshots: [Snapshot] = []
            for _ in 0..<(try reader.count(minimumSize: 18)) { snapshots.append(try reader.snapshot()) }
            body = .snapshotsReply(snapshots)
        case 66:
            var ids: [ObjectID] = []
            for _ in 0..<(try reader.count(minimumSize: 17)) { ids.append(try reader.objectID()) }
            body = .identifiersReply(ids)
        case 67: body = .countReply(try reader.int())
        case 68: body = .saved(sequence: try reader.uvarint())
        case 69:
            let code = try reader.string()
            body = .error(code: code, message: try reader.string())
        case 70:
            var events: [ChangeEvent] = []
            for _ in 0..<(try reader.count(minimumSize: 4)) { events.append(try reader.event()) }
            body = .changes(events)
        case 71:
            let message = try reader.string()
            var conflicts: [MergeConflict] = []
            for _ in 0..<(try reader.count(minimumSize: 20)) { conflicts.append(try reader.conflict()) }
            body = .conflicts(message: message, conflicts)
        case 96: body = .event(try reader.event())
        default: throw .unknownMessageType(type)
        }
        guard reader.remaining == 0 else { throw .trailingBytes(reader.remaining) }
        return WireMessage(requestID: requestID, body: body)
    }
}

extension WireWriter {
    public mutating func event(_ event: ChangeEvent) {
        uvarint(event.sequence)
        string(event.author)
        bool(event.isReset)
        uvarint(UInt64(event.changes.count))
        for change in event.changes {
            objectID(change.id)
            byte(change.kind.rawValue)
            uvarint(UInt64(change.properties.count))
            for name in change.properties { string(name) }
        }
    }
}

extension WireReader {
    public mutating func event() throws(WireError) -> ChangeEvent {
        let sequence = try uvarint()
        let author = try string()
        let isReset = try bool()
        var changes: [ObjectChange] = []
        for _ in 0..<(try count(minimumSize: 19)) {
            let id = try objectID()
            guard let kind = ObjectChange.Kind(rawValue: try byte()) else { throw .invalidValue("change kind") }
            var properties: [String] = []
            for _ in 0..<(try count()) { properties.append(try string()) }
            changes.append(ObjectChange(id: id, kind: kind, properties: properties))
        }
        return ChangeEvent(sequence: sequence, author: author, isReset: isReset, changes: changes)
    }
}
