import Foundation
import Skyros

/// A committed change set as the daemon publishes it and keeps it in its history: its
/// sequence number, who saved it, and what changed, with the values — a receiver merges it
/// without asking the daemon for anything.
package struct ChangeEvent: Sendable, Hashable {
    /// What an event says.
    package enum Kind: UInt8, Sendable, Hashable {
        /// A change set (a save).
        case changes = 0
        /// The store was emptied (`nuke`): every object is gone.
        case reset = 1
        /// No change: the daemon's current sequence, published every
        /// ``WireProtocol/heartbeatInterval`` so that clients notice gaps and silence.
        case heartbeat = 2
        /// The store's schema changed (a client of a newer version made the daemon migrate it):
        /// the lists are empty, ``ChangeEvent/schemaVersion`` is the new version, and the
        /// history before it is gone. A receiver refreshes everything it holds.
        case schemaChanged = 3
        /// A batch update or delete (``WireMessage/Body/batch(clientID:saveNumber:operation:)``):
        /// its updated and deleted objects, or empty lists when it affected more than
        /// ``WireProtocol/maximumBatchEventObjects`` (a receiver refreshes everything it holds).
        case batch = 4
    }

    /// An updated object: its version after the change, and the values of the properties
    /// that changed, by property index.
    package struct Update: Sendable, Hashable {
        /// The updated object.
        package var id: ObjectID
        /// Its version after the update.
        package var version: Int64
        /// The new values of the properties that changed, by property index.
        package var values: [Int: StoredValue]

        /// An updated object as an event carries it.
        package init(id: ObjectID, version: Int64, values: [Int: StoredValue]) {
            self.id = id
            self.version = version
            self.values = values
        }
    }

    /// The change set's sequence number (for a heartbeat: the daemon's current sequence).
    package var sequence: UInt64
    /// What the event says.
    package var kind: Kind
    /// The client ID of the saver (all zeros for heartbeats).
    package var authorID: UUID
    /// The process name of the saver, as its hello said.
    package var author: String
    /// Inserted objects with all their values (version 1).
    package var inserted: [Snapshot]
    /// Updated objects, with their changed values.
    package var updated: [Update]
    /// Deleted objects.
    package var deleted: [ObjectID]
    /// For ``Kind/schemaChanged``: the store's new schema version (on the wire after the
    /// lists, for that kind only); 0 for the other kinds.
    package var schemaVersion: UInt64
    /// For a kind this client does not know (5 and up, added within protocol version 4): its
    /// tag. The event is then read as a change set (``Kind/changes``) of its common fields,
    /// and its sequence counts; nil for the known kinds.
    package var unknownKind: Optional<UInt8>
    /// For an unknown kind: its extension field (`bytes` after the common fields), kept as is.
    package var extensionBytes: [UInt8]
    /// Inserted objects whose values are still encoded, when the message was decoded keeping
    /// them so (``WireMessage/decodeReply(_:keepingInsertedValuesEncoded:)``): then they are
    /// here rather than in ``inserted``.
    package var encodedInserted: Optional<EncodedRows>

    /// An event; a change set by default. `encodedInserted`: more inserted objects, their
    /// values still encoded.
    package init(
        sequence: UInt64, kind: Kind = .changes, authorID: UUID = ChangeEvent.noAuthor, author: String = "",
        inserted: [Snapshot] = [], encodedInserted: EncodedRows? = nil, updated: [Update] = [],
        deleted: [ObjectID] = [],
        schemaVersion: UInt64 = 0
    ) {
        self.schemaVersion = kind == .schemaChanged ? schemaVersion : 0
        self.sequence = sequence
        self.kind = kind
        self.authorID = authorID
        self.author = author
        self.inserted = inserted
        self.encodedInserted = encodedInserted
        self.updated = updated
        self.deleted = deleted
        // Every field assigned here, none defaulted in its declaration: with defaults the
        // optimizer builds the event twice and copies it (the event thread makes one per
        // change set), as it does when an initializer delegates and then sets a field.
        self.unknownKind = nil
        self.extensionBytes = []
    }

    /// The first event kind added within protocol version 4 after kinds 0–4: every kind from
    /// it on is the common fields then one `bytes` extension, which a client that does not
    /// know the kind skips (docs/PROTOCOL.md, "Compatibility within version 4").
    package static let firstExtensionKind: UInt8 = 5

    /// Kind 5, `syncRejected`: the change set a machine applied from its sync server when
    /// the server refused change sets this machine uploaded. Its lists bring the refused
    /// objects back to the server's values; its extension is the JSON
    /// `{"rejected":[{"reason":"…","objects":["Entity/UUID",…]},…]}` (docs/PROTOCOL.md).
    package static let syncRejectedKind: UInt8 = 5

    /// For a `syncRejected` event: each refused change set's reason and objects.
    package var syncRejections: [(reason: String, objects: [ObjectID], number: Int64?)]? {
        guard unknownKind == Self.syncRejectedKind,
            let root = try? JSONSerialization.jsonObject(with: Data(extensionBytes)) as? [String: Any],
            let list = root["rejected"] as? [[String: Any]]
        else { return nil }
        return list.map { entry in
            let objects = (entry["objects"] as? [String] ?? []).compactMap { ObjectID(description: $0) }
            return (entry["reason"] as? String ?? "", objects, (entry["number"] as? NSNumber)?.int64Value)
        }
    }

    /// The extension bytes of a `syncRejected` event.
    package static func syncRejectedExtension(_ rejections: [SyncRejection]) -> [UInt8] {
        let list: [[String: Any]] = rejections.map { rejection in
            [
                "number": rejection.number, "reason": rejection.reason,
                "objects": rejection.objectIDs.map { "\($0.entityName)/\($0.uuid.uuidString)" },
            ]
        }
        let data =
            (try? JSONSerialization.data(
                withJSONObject: ["rejected": list], options: [.sortedKeys, .withoutEscapingSlashes])) ?? Data()
        return [UInt8](data)
    }

    /// The author ID of heartbeats: all zeros.
    package static let noAuthor = UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))

    /// The heartbeat of a daemon at `sequence`.
    package static func heartbeat(_ sequence: UInt64) -> ChangeEvent {
        ChangeEvent(sequence: sequence, kind: .heartbeat)
    }

    /// Whether this is a change set with a sequence of its own (not a heartbeat).
    package var isChangeSet: Bool { kind != .heartbeat }

    /// Every object the event names.
    package var objectIDs: [ObjectID] { inserted.map(\.id) + updated.map(\.id) + deleted }
}

/// A message of the client–daemon protocol (docs/PROTOCOL.md): a request, a reply, or a
/// published change event. Tags, limits and defaults are in ``WireProtocol``.
package struct WireMessage: Sendable, Hashable {
    /// What a client says first on a connection.
    package struct Hello: Sendable, Hashable {
        /// The protocol version the client speaks (``WireProtocol/version``).
        package var protocolVersion: UInt64
        /// The ``Skyros/Schema/fingerprint`` of the client's schema.
        package var schemaFingerprint: String
        /// The client's ``Skyros/Schema/version``.
        package var schemaVersion: UInt64
        /// The client's process name: at most ``WireProtocol/maximumClientNameBytes`` bytes.
        package var clientName: String
        /// The client's process ID (for operators; peer credentials are what the daemon trusts).
        package var pid: UInt64
        /// The JSON of the client's ``Skyros/SchemaDescription``: a daemon whose group has no
        /// store yet creates it from it.
        package var schemaDescription: [UInt8]

        /// A hello with every field given.
        package init(
            protocolVersion: UInt64 = UInt64(WireProtocol.version), schemaFingerprint: String, schemaVersion: UInt64,
            clientName: String, pid: UInt64, schemaDescription: [UInt8]
        ) {
            self.protocolVersion = protocolVersion
            self.schemaFingerprint = schemaFingerprint
            self.schemaVersion = schemaVersion
            self.clientName = clientName
            self.pid = pid
            self.schemaDescription = schemaDescription
        }

        /// The hello of this process for `schema`.
        package init(schema: Schema, clientName: String) throws {
            self.init(
                schemaFingerprint: schema.fingerprint, schemaVersion: UInt64(schema.version), clientName: clientName,
                pid: UInt64(ProcessInfo.processInfo.processIdentifier),
                schemaDescription: try schema.schemaDescription.canonicalBytes())
        }
    }

    /// The daemon's answer to a hello.
    package struct Welcome: Sendable, Hashable {
        /// The protocol version the daemon speaks.
        package var protocolVersion: UInt64
        /// The sequence of the last committed change set.
        package var sequence: UInt64
        /// The first frame of the events of this connection's saves (1–255).
        package var eventTopic: UInt8
        /// The identity of the store: made when the store was created, kept across daemon
        /// restarts. A client that sees another one starts over (refreshes everything).
        package var storeEpoch: UUID
        /// The store's schema version.
        package var schemaVersion: UInt64

        /// A welcome with every field given.
        package init(
            protocolVersion: UInt64 = UInt64(WireProtocol.version), sequence: UInt64, eventTopic: UInt8,
            storeEpoch: UUID, schemaVersion: UInt64
        ) {
            self.protocolVersion = protocolVersion
            self.sequence = sequence
            self.eventTopic = eventTopic
            self.storeEpoch = storeEpoch
            self.schemaVersion = schemaVersion
        }
    }

    /// What a message says: one case per kind of ``WireProtocol/Kind`` this build implements.
    package enum Body: Sendable, Hashable {
        // Requests
        case hello(Hello)
        case fetch(StoreRequest)
        case fetchIdentifiers(StoreRequest)
        case count(StoreRequest)
        case snapshots([ObjectID])
        /// A change set, with the client's ID and the number of this save (see PROTOCOL.md,
        /// "Saves: exactly once").
        case save(clientID: UUID, saveNumber: UInt64, changes: ChangeSet)
        /// The change sets after a sequence, at most `limit` of them (0: the daemon's
        /// maximum, ``WireProtocol/maximumChangesPage``).
        case changesSince(UInt64, limit: UInt64)
        /// Empties the store (`nuke`); exactly-once like a save.
        case deleteAll(clientID: UUID, saveNumber: UInt64)
        /// A batch update or delete by predicate: one change set, exactly-once like a save.
        case batch(clientID: UUID, saveNumber: UInt64, operation: BatchOperation)
        /// The refusals of the group's sync server still in the rejected log (docs/SYNC.md).
        case syncRejections
        /// Removes these refusals (by number) from the rejected log; answered by how many it removed.
        case acknowledgeRejections([UInt64])
        // Replies
        case welcome(Welcome)
        case snapshotsReply([Snapshot])
        case identifiersReply([ObjectID])
        case countReply(Int)
        case saved(sequence: UInt64)
        case error(code: String, message: String)
        /// Change sets in sequence order; `more`: the daemon has newer ones than the last
        /// of this page (ask again from it).
        case changes([ChangeEvent], more: Bool)
        /// A save refused under the `.error` merge policy: every conflicting object.
        case conflicts(message: String, [MergeConflict])
        /// The reply to a `batch`: how many objects it affected, and its change set as published
        /// (the author merges it as its own).
        case batchDone(affected: Int, event: ChangeEvent)
        /// The reply to `syncRejections`, oldest first.
        case rejectionsReply([SyncRejection])
        // Published on the event socket
        case event(ChangeEvent)

        /// The kind of the message (its tag on the wire).
        package var kind: WireProtocol.Kind {
            switch self {
            case .hello: .hello
            case .fetch: .fetch
            case .fetchIdentifiers: .fetchIdentifiers
            case .count: .count
            case .snapshots: .snapshots
            case .save: .save
            case .changesSince: .changesSince
            case .deleteAll: .deleteAll
            case .batch: .batch
            case .syncRejections: .syncRejections
            case .acknowledgeRejections: .acknowledgeRejections
            case .welcome: .welcome
            case .snapshotsReply: .snapshotsReply
            case .identifiersReply: .identifiersReply
            case .countReply: .countReply
            case .saved: .saved
            case .error: .error
            case .changes: .changes
            case .conflicts: .conflicts
            case .batchDone: .batchDone
            case .rejectionsReply: .rejectionsReply
            case .event: .event
            }
        }
    }

    /// Chosen by the requester, echoed by the reply (0 for events).
    package var requestID: UInt64
    /// What the message says.
    package var body: Body

    /// A message with its request ID (0 for events).
    package init(requestID: UInt64, body: Body) {
        self.requestID = requestID
        self.body = body
    }

    /// `[version][kind][requestID uvarint][body]`.
    package func encoded() -> [UInt8] {
        var writer = WireWriter(capacity: 256)  // most requests and replies fit: no regrowth
        writer.byte(WireProtocol.version)
        writer.byte(body.kind.rawValue)
        writer.uvarint(requestID)
        switch body {
        case .hello(let hello):
            writer.uvarint(hello.protocolVersion)
            writer.string(hello.schemaFingerprint)
            writer.uvarint(hello.schemaVersion)
            writer.string(hello.clientName)
            writer.uvarint(hello.pid)
            writer.data(hello.schemaDescription)
        case .fetch(let request), .fetchIdentifiers(let request), .count(let request):
            writer.request(request)
        case .snapshots(let ids), .identifiersReply(let ids):
            writer.list(ids) { $0.objectID($1) }
        case .save(let clientID, let number, let changes):
            writer.uuid(clientID)
            writer.uvarint(number)
            writer.changeSet(changes)
        case .changesSince(let sequence, let limit):
            writer.uvarint(sequence)
            writer.uvarint(limit)
        case .deleteAll(let clientID, let number):
            writer.uuid(clientID)
            writer.uvarint(number)
        case .batch(let clientID, let number, let operation):
            writer.uuid(clientID)
            writer.uvarint(number)
            switch operation {
            case .delete(let request):
                writer.byte(0)
                writer.request(request)
                writer.propertyValues([:])
            case .update(let request, let assignments):
                writer.byte(1)
                writer.request(request)
                writer.propertyValues(assignments)
            }
        case .welcome(let welcome):
            writer.uvarint(welcome.protocolVersion)
            writer.uvarint(welcome.sequence)
            writer.byte(welcome.eventTopic)
            writer.uuid(welcome.storeEpoch)
            writer.uvarint(welcome.schemaVersion)
        case .snapshotsReply(let snapshots):
            writer.list(snapshots) { $0.snapshot($1) }
        case .countReply(let count):
            writer.uvarint(UInt64(count))
        case .saved(let sequence):
            writer.uvarint(sequence)
        case .error(let code, let message):
            writer.string(code)
            writer.string(message)
        case .changes(let events, let more):
            writer.list(events) { $0.event($1) }
            writer.bool(more)
        case .conflicts(let message, let conflicts):
            writer.string(message)
            writer.list(conflicts) { $0.conflict($1) }
        case .batchDone(let affected, let event):
            writer.uvarint(UInt64(affected))
            writer.event(event)
        case .syncRejections:
            break
        case .acknowledgeRejections(let numbers):
            writer.list(numbers) { $0.uvarint($1) }
        case .rejectionsReply(let rejections):
            writer.list(rejections) { writer, rejection in
                writer.uvarint(UInt64(max(0, rejection.number)))
                writer.double(rejection.date.timeIntervalSince1970)
                writer.string(rejection.reason)
                writer.list(rejection.objectIDs) { $0.objectID($1) }
            }
        case .event(let event):
            writer.event(event)
        }
        return writer.bytes
    }

    /// Decodes a message as a client does: bytes after the fields it knows in a reply or an
    /// event are ignored (they are fields added within protocol version 4).
    ///
    /// With `keepingInsertedValuesEncoded`, the inserted objects of its change events are
    /// read as far as their identifiers and versions, their values checked (what the eager
    /// decoding refuses, this refuses) and decoded when read (``ChangeEvent/encodedInserted``):
    /// a shared stack's event thread, whose main context keeps most of them unread.
    package static func decodeReply(_ bytes: [UInt8], keepingInsertedValuesEncoded: Bool = false) throws(WireError)
        -> WireMessage
    {
        try decodeMessage(
            bytes, maximumSize: WireProtocol.maximumMessageSize, ignoringTrailingBytesOfReplies: true,
            keepingInsertedValuesEncoded: keepingInsertedValuesEncoded)
    }

    /// Decodes a message, refusing anything malformed with a ``WireError``: never a crash,
    /// never an allocation larger than the message itself. Bytes after the fields of a complete
    /// message are refused: the daemon's rule for requests (a client reads replies and events
    /// with ``decodeReply(_:keepingInsertedValuesEncoded:)``).
    package static func decode(_ bytes: [UInt8], maximumSize: Int = WireProtocol.maximumMessageSize) throws(WireError)
        -> WireMessage
    {
        try decodeMessage(bytes, maximumSize: maximumSize, ignoringTrailingBytesOfReplies: false)
    }

    /// Decodes a message; with `ignoringTrailingBytesOfReplies`, bytes after the fields of a
    /// reply or an event (kind 64 and up) are ignored, as fields added within protocol
    /// version 4 come at the end (docs/PROTOCOL.md, "Compatibility within version 4").
    private static func decodeMessage(
        _ bytes: [UInt8], maximumSize: Int, ignoringTrailingBytesOfReplies: Bool,
        keepingInsertedValuesEncoded: Bool = false
    ) throws(WireError) -> WireMessage {
        guard bytes.count <= maximumSize else { throw .tooLarge(bytes.count) }
        var reader = WireReader(bytes)
        if keepingInsertedValuesEncoded {
            reader.encodedRows = EncodedRows.Source(bytes: bytes) { bytes, offset, count in
                var reader = WireReader(bytes, at: offset)
                return try? reader.values(count: count)
            }
        }
        let version = try reader.byte()
        guard version == WireProtocol.version else { throw .unsupportedVersion(version) }
        let tag = try reader.byte()
        let requestID = try reader.uvarint()
        guard let kind = WireProtocol.Kind(rawValue: tag) else { throw .unknownMessageType(tag) }
        let body: Body
        switch kind {
        case .hello:
            let version = try reader.uvarint()
            let fingerprint = try reader.string()
            let schemaVersion = try reader.uvarint()
            let name = try reader.string()
            let pid = try reader.uvarint()
            body = .hello(
                Hello(
                    protocolVersion: version, schemaFingerprint: fingerprint, schemaVersion: schemaVersion,
                    clientName: name,
                    pid: pid, schemaDescription: try reader.data()))
        case .fetch: body = .fetch(try reader.request())
        case .fetchIdentifiers: body = .fetchIdentifiers(try reader.request())
        case .count: body = .count(try reader.request())
        case .snapshots:
            body = .snapshots(try reader.list(minimumSize: 17) { reader throws(WireError) in try reader.objectID() })
        case .save:
            let clientID = try reader.uuid()
            let number = try reader.uvarint()
            body = .save(clientID: clientID, saveNumber: number, changes: try reader.changeSet())
        case .changesSince:
            let sequence = try reader.uvarint()
            body = .changesSince(sequence, limit: try reader.uvarint())
        case .deleteAll:
            let clientID = try reader.uuid()
            body = .deleteAll(clientID: clientID, saveNumber: try reader.uvarint())
        case .welcome:
            let version = try reader.uvarint()
            let sequence = try reader.uvarint()
            let topic = try reader.byte()
            let epoch = try reader.uuid()
            body = .welcome(
                Welcome(
                    protocolVersion: version, sequence: sequence, eventTopic: topic, storeEpoch: epoch,
                    schemaVersion: try reader.uvarint()))
        case .snapshotsReply:
            body = .snapshotsReply(
                try reader.list(minimumSize: 18) { reader throws(WireError) in try reader.snapshot() })
        case .identifiersReply:
            body = .identifiersReply(
                try reader.list(minimumSize: 17) { reader throws(WireError) in try reader.objectID() })
        case .countReply: body = .countReply(try reader.int())
        case .saved: body = .saved(sequence: try reader.uvarint())
        case .error:
            let code = try reader.string()
            body = .error(code: code, message: try reader.string())
        case .changes:
            let events = try reader.list(minimumSize: 21) { reader throws(WireError) in try reader.event() }
            body = .changes(events, more: try reader.bool())
        case .conflicts:
            let message = try reader.string()
            body = .conflicts(
                message: message, try reader.list(minimumSize: 20) { reader throws(WireError) in try reader.conflict() }
            )
        case .batch:
            let clientID = try reader.uuid()
            let number = try reader.uvarint()
            let operation = try reader.byte()
            let request = try reader.request()
            let assignments = try reader.propertyValues()
            guard request.sortKeys.isEmpty, request.limit == nil, request.offset == 0 else {
                throw .refused("a batch selects by predicate: no sort keys, limit or offset")
            }
            switch operation {
            case 0:
                guard assignments.isEmpty else { throw .refused("a batch delete has no assignments") }
                body = .batch(clientID: clientID, saveNumber: number, operation: .delete(request))
            case 1:
                guard !assignments.isEmpty else { throw .refused("a batch update has at least one assignment") }
                body = .batch(
                    clientID: clientID, saveNumber: number, operation: .update(request, assignments: assignments))
            default:
                throw .invalidTag("batch operation", operation)
            }
        case .batchDone:
            let affected = try reader.int()
            body = .batchDone(affected: affected, event: try reader.event())
        case .syncRejections: body = .syncRejections
        case .acknowledgeRejections:
            body = .acknowledgeRejections(
                try reader.list(minimumSize: 1) { reader throws(WireError) in try reader.uvarint() })
        case .rejectionsReply:
            body = .rejectionsReply(
                try reader.list(minimumSize: 11) { reader throws(WireError) in
                    let number = try reader.uvarint()
                    let time = try reader.double()
                    let reason = try reader.string()
                    let objects = try reader.list(minimumSize: 17) { reader throws(WireError) in try reader.objectID() }
                    return SyncRejection(
                        number: Int64(clamping: number), date: Date(timeIntervalSince1970: time), reason: reason,
                        objectIDs: objects)
                })
        case .event: body = .event(try reader.event())
        default: throw .unimplementedMessageType(tag)
        }
        guard reader.remaining == 0 || (ignoringTrailingBytesOfReplies && tag >= WireProtocol.firstReplyKind) else {
            throw .trailingBytes(reader.remaining)
        }
        return WireMessage(requestID: requestID, body: body)
    }
}

extension WireWriter {
    /// `uvarint` count, then each element.
    package mutating func list<Element>(_ elements: [Element], _ write: (inout WireWriter, Element) -> Void) {
        uvarint(UInt64(elements.count))
        for element in elements { write(&self, element) }
    }

    /// `ChangeEvent` (docs/PROTOCOL.md).
    package mutating func event(_ event: ChangeEvent) {
        uvarint(event.sequence)
        byte(event.unknownKind ?? event.kind.rawValue)
        uuid(event.authorID)
        string(event.author)
        list(event.inserted) { $0.snapshot($1) }
        list(event.updated) { writer, update in
            writer.objectID(update.id)
            writer.uvarint(UInt64(max(0, update.version)))
            writer.propertyValues(update.values)
        }
        list(event.deleted) { $0.objectID($1) }
        if event.kind == .schemaChanged { uvarint(event.schemaVersion) }
        if event.unknownKind != nil { data(event.extensionBytes) }
    }

    /// `list<uvarint property index + Value>`, by increasing index.
    mutating func propertyValues(_ values: [Int: StoredValue]) {
        list(values.sorted { $0.key < $1.key }) { writer, entry in
            writer.uvarint(UInt64(entry.key))
            writer.value(entry.value)
        }
    }
}

extension WireReader {
    /// `uvarint` count of elements of at least `minimumSize` bytes each, then the elements.
    package mutating func list<Element>(minimumSize: Int = 1, _ read: (inout WireReader) throws(WireError) -> Element)
        throws(WireError) -> [Element]
    {
        let count = try count(minimumSize: minimumSize)
        var elements: [Element] = []
        if count > 0 { elements.reserveCapacity(count) }  // most events' updated and deleted lists are empty
        for _ in 0..<count { elements.append(try read(&self)) }
        return elements
    }

    /// `ChangeEvent` (docs/PROTOCOL.md).
    package mutating func event() throws(WireError) -> ChangeEvent {
        let sequence = try uvarint()
        let tag = try byte()
        // A kind added after this client (5 and up): its common fields, then one `bytes` extension.
        let kind = ChangeEvent.Kind(rawValue: tag) ?? .changes
        guard kind.rawValue == tag || tag >= ChangeEvent.firstExtensionKind else {
            throw .invalidTag("event kind", tag)
        }
        let authorID = try uuid()
        let author = try string()
        var inserted: [Snapshot] = []
        var encodedInserted: EncodedRows?
        if let source = encodedRows {
            let start = source.rowCount
            for _ in 0..<(try count(minimumSize: 18)) { try encodedSnapshot(into: source) }
            if source.rowCount > start { encodedInserted = EncodedRows(source: source, range: start..<source.rowCount) }
        } else {
            inserted = try list(minimumSize: 18) { reader throws(WireError) in try reader.snapshot() }
        }
        let updated = try list(minimumSize: 19) { reader throws(WireError) in
            let id = try reader.objectID()
            let version = try reader.version()
            return ChangeEvent.Update(id: id, version: version, values: try reader.propertyValues())
        }
        let deleted = try list(minimumSize: 17) { reader throws(WireError) in try reader.objectID() }
        let schemaVersion = kind == .schemaChanged ? try uvarint() : 0
        guard kind.rawValue != tag else {  // a known kind: made once, not copied to be changed
            return ChangeEvent(
                sequence: sequence, kind: kind, authorID: authorID, author: author, inserted: inserted,
                encodedInserted: encodedInserted, updated: updated, deleted: deleted, schemaVersion: schemaVersion)
        }
        var event = ChangeEvent(
            sequence: sequence, kind: kind, authorID: authorID, author: author, inserted: inserted,
            encodedInserted: encodedInserted, updated: updated, deleted: deleted, schemaVersion: schemaVersion)
        event.unknownKind = tag
        event.extensionBytes = try data()
        return event
    }

    /// `list<uvarint property index + Value>`; an index given twice is refused.
    mutating func propertyValues() throws(WireError) -> [Int: StoredValue] {
        var values: [Int: StoredValue] = [:]
        for _ in 0..<(try count(minimumSize: 2)) {
            let index = try int()
            guard values.updateValue(try value(), forKey: index) == nil else {
                throw .refused("property \(index) is given twice")
            }
        }
        return values
    }
}
