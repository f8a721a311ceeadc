import Foundation
import NIOCore
import NIOWebSocket
import Skyros
import SkyrosWire

/// The messages between a machine's sync engine and a sync gateway (docs/PROTOCOL.md, "The sync
/// gateway"): one per binary WebSocket message, in SkyrosWire's primitives (LEB128 varints,
/// length-prefixed UTF-8 strings, 16-byte UUIDs, tagged values).
///
/// Every message is `version` (``GatewayMessage/version``), a type byte, a request id
/// (uvarint) and the type's body. A machine's request carries an id of its choosing; the
/// gateway's answer carries the same id. A notification (``Kind/notify``) carries id 0.
package enum GatewayMessage: Sendable {
    // MARK: A machine's requests

    /// The first message of a connection: the machine's token and its machine id. Answered by
    /// ``welcome(subject:buckets:)``, or the connection is closed with a reason
    /// (``GatewayClose``).
    case hello(token: String, machine: UUID)
    /// The machine's schema (``ServerSchema/source``, canonical JSON) and its version: the
    /// gateway checks the server's tables hold it. Answered by ``done``.
    case prepare(schemaJSON: [UInt8], version: UInt64)
    /// The highest number of this machine's change sets the server has. Answered by ``number(_:)``.
    case uploadedThrough
    /// The digests the server recorded for these numbers. Answered by ``recordedDigests(_:)``.
    case digests(numbers: [Int64])
    /// Change sets to apply in order, exactly once: each its number and its bytes
    /// (``QueuedChangeSet/encoded()``). Answered by ``outcomes(_:transactions:)``.
    case upload([(number: Int64, changes: [UInt8])])
    /// The checkpoint after `previous`. Answered by ``page(_:)`` messages (each acknowledged
    /// by ``staged(failure:)``) and then ``checkpoint(_:)``.
    case readCheckpoint(previous: String?, rejectedAfter: Int64, pageSize: Int)
    /// The answer to a ``page(_:)``: nil when staged, else why not (the read then stops).
    case staged(failure: String?)
    /// Compact the server's log keeping `retention` seconds. Answered by ``done``.
    case compact(retention: Double)
    /// Tell this connection of every change of the group (``notify(transaction:)``).
    /// Answered by ``done``.
    case listen

    // MARK: The gateway's answers

    /// The token was accepted: its subject, and how many bucket instances it holds.
    case welcome(subject: String, buckets: Int)
    /// Done, nothing to say.
    case done
    /// A request failed: whether an operator must act (else: try again later), and why.
    case failure(needsOperator: Bool, message: String)
    /// A number (``uploadedThrough``).
    case number(Int64)
    /// Recorded digests by number.
    case recordedDigests([Int64: Int64])
    /// One outcome per uploaded change set, and the server transactions that applied them.
    case outcomes([ServerSession.UploadOutcome], transactions: [UInt64]?)
    /// A page of a snapshot, restricted to the machine's buckets.
    case page(SnapshotPage)
    /// A checkpoint, restricted to the machine's buckets.
    case checkpoint(Checkpoint)
    /// The group changed on the server (the transaction's id; nil: it may be anything).
    case notify(transaction: UInt64?)

    /// The protocol's version byte, first in every message.
    package static let version: UInt8 = 1
    /// The largest message either side accepts (bytes): a larger frame closes the connection
    /// with the WebSocket's own code 1009 (message too big).
    package static let maximumSize = 16 << 20

    /// The type byte of each message.
    package enum Kind: UInt8, Sendable {
        case hello = 1, prepare, uploadedThrough, digests, upload, readCheckpoint, staged, compact, listen
        case welcome = 64, done, failure, number, recordedDigests, outcomes, page, checkpoint, notify
    }
}

/// The close codes of a gateway's WebSocket connections, with a reason text beside each. A
/// connection whose handshake (TLS, the upgrade, the hello) is not done within the gateway's
/// bound is dropped without a close frame (it may not even speak WebSocket yet).
package enum GatewayClose: UInt16, Sendable {
    /// A message the gateway cannot read, or one out of order (a request before ``GatewayMessage/hello(token:machine:)``).
    case protocolError = 4400
    /// The token was refused; the reason names why (expired, forged, …).
    case unauthorized = 4401
    /// The machine id is another subject's (uploads are bound to the token's `sub`).
    case forbidden = 4403
    /// The group in the URL is not the gateway's.
    case unknownGroup = 4404
    /// The gateway is stopping: connect again (to it or another).
    case goingAway = 1001
}

extension GatewayMessage {
    /// A WebSocket channel of the protocol, on either side, once upgraded: fragmented messages
    /// put together up to ``maximumSize``, wrapped for async use. On the channel's event loop.
    package static func messageChannel(_ channel: any Channel) throws -> NIOAsyncChannel<WebSocketFrame, WebSocketFrame>
    {
        try channel.pipeline.syncOperations.addHandler(
            NIOWebSocketFrameAggregator(
                minNonFinalFragmentSize: 0, maxAccumulatedFrameCount: 4096, maxAccumulatedFrameSize: maximumSize))
        return try NIOAsyncChannel<WebSocketFrame, WebSocketFrame>(wrappingChannelSynchronously: channel)
    }
}

// MARK: - Encoding

extension GatewayMessage {
    /// The message's bytes with request id `id`.
    package func encoded(id: UInt64) -> [UInt8] {
        var writer = WireWriter(capacity: 64)
        writer.byte(Self.version)
        writer.byte(kind.rawValue)
        writer.uvarint(id)
        switch self {
        case .hello(let token, let machine):
            writer.string(token)
            writer.uuid(machine)
        case .prepare(let json, let version):
            writer.data(json)
            writer.uvarint(version)
        case .uploadedThrough, .listen, .done:
            break
        case .digests(let numbers):
            writer.uvarint(UInt64(numbers.count))
            for number in numbers { writer.varint(number) }
        case .upload(let batch):
            writer.uvarint(UInt64(batch.count))
            for (number, changes) in batch {
                writer.varint(number)
                writer.data(changes)
            }
        case .readCheckpoint(let previous, let rejectedAfter, let pageSize):
            writer.optionalString(previous)
            writer.varint(rejectedAfter)
            writer.uvarint(UInt64(pageSize))
        case .staged(let failure):
            writer.optionalString(failure)
        case .compact(let retention):
            writer.double(retention)
        case .welcome(let subject, let buckets):
            writer.string(subject)
            writer.uvarint(UInt64(buckets))
        case .failure(let needsOperator, let message):
            writer.bool(needsOperator)
            writer.string(message)
        case .number(let number):
            writer.varint(number)
        case .recordedDigests(let digests):
            writer.uvarint(UInt64(digests.count))
            for (number, digest) in digests.sorted(by: { $0.key < $1.key }) {
                writer.varint(number)
                writer.varint(digest)
            }
        case .outcomes(let outcomes, let transactions):
            writer.uvarint(UInt64(outcomes.count))
            for outcome in outcomes {
                switch outcome {
                case .applied: writer.byte(0)
                case .alreadyApplied: writer.byte(1)
                case .rejected(let reason):
                    writer.byte(2)
                    writer.string(reason)
                }
            }
            writer.bool(transactions != nil)
            if let transactions {
                writer.uvarint(UInt64(transactions.count))
                for transaction in transactions { writer.uvarint(transaction) }
            }
        case .page(let page):
            writer.string(page.snapshot)
            writer.bool(page.isFirst)
            writer.string(page.entity)
            writer.uvarint(UInt64(page.rows.count))
            for row in page.rows {
                writer.uuid(row.id)
                writer.storedValues(row.values)
            }
            writer.strings(page.unreadable)
        case .checkpoint(let checkpoint):
            writer.string(checkpoint.snapshot)
            writer.uvarint(checkpoint.number)
            writer.bool(checkpoint.isSnapshot)
            writer.varint(checkpoint.uploadedThrough)
            writer.uvarint(UInt64(checkpoint.objects.count))
            for (id, values) in checkpoint.objects.sorted(by: {
                ($0.key.entityName, $0.key.uuid.uuidString) < ($1.key.entityName, $1.key.uuid.uuidString)
            }) {
                writer.string(id.entityName)
                writer.uuid(id.uuid)
                writer.bool(values != nil)
                if let values { writer.storedValues(values) }
            }
            writer.strings(checkpoint.unreadable)
            writer.uvarint(UInt64(checkpoint.rejected.count))
            for rejection in checkpoint.rejected {
                writer.varint(rejection.number)
                writer.string(rejection.reason)
                writer.uvarint(UInt64(rejection.objects.count))
                for object in rejection.objects {
                    writer.string(object.entityName)
                    writer.uuid(object.uuid)
                }
            }
            writer.varint(Int64(checkpoint.lagMilliseconds))
        case .notify(let transaction):
            writer.bool(transaction != nil)
            if let transaction { writer.uvarint(transaction) }
        }
        return writer.bytes
    }

    /// The message's type.
    package var kind: Kind {
        switch self {
        case .hello: .hello
        case .prepare: .prepare
        case .uploadedThrough: .uploadedThrough
        case .digests: .digests
        case .upload: .upload
        case .readCheckpoint: .readCheckpoint
        case .staged: .staged
        case .compact: .compact
        case .listen: .listen
        case .welcome: .welcome
        case .done: .done
        case .failure: .failure
        case .number: .number
        case .recordedDigests: .recordedDigests
        case .outcomes: .outcomes
        case .page: .page
        case .checkpoint: .checkpoint
        case .notify: .notify
        }
    }

    /// A message from its bytes, with its request id.
    ///
    /// - Throws: ``WireError`` for bytes that are not a message of this version.
    package static func decode(_ bytes: [UInt8]) throws(WireError) -> (id: UInt64, message: GatewayMessage) {
        guard bytes.count <= maximumSize else { throw .tooLarge(bytes.count) }
        var reader = WireReader(bytes)
        let version = try reader.byte()
        guard version == Self.version else { throw .unsupportedVersion(version) }
        let type = try reader.byte()
        guard let kind = Kind(rawValue: type) else { throw .unknownMessageType(type) }
        let id = try reader.uvarint()
        let message: GatewayMessage
        switch kind {
        case .hello:
            message = .hello(token: try reader.string(remembered: false), machine: try reader.uuid())
        case .prepare:
            message = .prepare(schemaJSON: try reader.data(), version: try reader.uvarint())
        case .uploadedThrough: message = .uploadedThrough
        case .listen: message = .listen
        case .done: message = .done
        case .digests:
            var numbers: [Int64] = []
            for _ in 0..<(try reader.count()) { numbers.append(try reader.varint()) }
            message = .digests(numbers: numbers)
        case .upload:
            var batch: [(number: Int64, changes: [UInt8])] = []
            for _ in 0..<(try reader.count(minimumSize: 2)) {
                batch.append((try reader.varint(), try reader.data()))
            }
            message = .upload(batch)
        case .readCheckpoint:
            let previous = try reader.optionalString()
            let rejectedAfter = try reader.varint()
            let pageSize = try reader.uvarint()
            guard pageSize >= 1, pageSize <= 100_000 else { throw .invalidValue("page size \(pageSize)") }
            message = .readCheckpoint(previous: previous, rejectedAfter: rejectedAfter, pageSize: Int(pageSize))
        case .staged:
            message = .staged(failure: try reader.optionalString())
        case .compact:
            message = .compact(retention: try reader.double())
        case .welcome:
            message = .welcome(subject: try reader.string(), buckets: try reader.int())
        case .failure:
            message = .failure(needsOperator: try reader.bool(), message: try reader.string())
        case .number:
            message = .number(try reader.varint())
        case .recordedDigests:
            var digests: [Int64: Int64] = [:]
            for _ in 0..<(try reader.count(minimumSize: 2)) {
                let number = try reader.varint()
                digests[number] = try reader.varint()
            }
            message = .recordedDigests(digests)
        case .outcomes:
            var outcomes: [ServerSession.UploadOutcome] = []
            for _ in 0..<(try reader.count()) {
                switch try reader.byte() {
                case 0: outcomes.append(.applied)
                case 1: outcomes.append(.alreadyApplied)
                case 2: outcomes.append(.rejected(try reader.string()))
                case let tag: throw .invalidTag("outcome", tag)
                }
            }
            var transactions: [UInt64]?
            if try reader.bool() {
                var list: [UInt64] = []
                for _ in 0..<(try reader.count()) { list.append(try reader.uvarint()) }
                transactions = list
            }
            message = .outcomes(outcomes, transactions: transactions)
        case .page:
            let snapshot = try reader.string()
            let isFirst = try reader.bool()
            let entity = try reader.string()
            var rows: [(id: UUID, values: StoredValues)] = []
            let count = try reader.count(minimumSize: 17)
            rows.reserveCapacity(count)
            for _ in 0..<count {
                let id = try reader.uuid()
                rows.append((id, try reader.storedValues()))
            }
            message = .page(
                SnapshotPage(
                    snapshot: snapshot, isFirst: isFirst, entity: entity, rows: rows, unreadable: try reader.strings()))
        case .checkpoint:
            var checkpoint = Checkpoint(
                snapshot: try reader.string(), number: try reader.uvarint(), isSnapshot: try reader.bool(),
                uploadedThrough: try reader.varint(), objects: [:], unreadable: [], rejected: [], lagMilliseconds: 0)
            for _ in 0..<(try reader.count(minimumSize: 18)) {
                let id = ObjectID(entityName: try reader.string(), uuid: try reader.uuid())
                checkpoint.objects[id] = try reader.bool() ? .some(try reader.storedValues()) : .some(nil)
            }
            checkpoint.unreadable = try reader.strings()
            for _ in 0..<(try reader.count(minimumSize: 3)) {
                let number = try reader.varint()
                let reason = try reader.string()
                var objects: [ObjectID] = []
                for _ in 0..<(try reader.count(minimumSize: 17)) {
                    objects.append(ObjectID(entityName: try reader.string(), uuid: try reader.uuid()))
                }
                checkpoint.rejected.append(Checkpoint.Rejection(number: number, reason: reason, objects: objects))
            }
            checkpoint.lagMilliseconds = Int(clamping: try reader.varint())
            message = .checkpoint(checkpoint)
        case .notify:
            message = .notify(transaction: try reader.bool() ? try reader.uvarint() : nil)
        }
        guard reader.remaining == 0 else { throw .trailingBytes(reader.remaining) }
        return (id, message)
    }
}

extension WireWriter {
    fileprivate mutating func optionalString(_ value: String?) {
        bool(value != nil)
        if let value { string(value) }
    }

    fileprivate mutating func strings(_ values: [String]) {
        uvarint(UInt64(values.count))
        for value in values { string(value) }
    }

    /// A count and the values (the wire's tagged values).
    fileprivate mutating func storedValues(_ values: StoredValues) {
        uvarint(UInt64(values.count))
        for value in values { self.value(value) }
    }
}

extension WireReader {
    fileprivate mutating func optionalString() throws(WireError) -> String? {
        try bool() ? try string() : nil
    }

    fileprivate mutating func strings() throws(WireError) -> [String] {
        var values: [String] = []
        for _ in 0..<(try count()) { values.append(try string()) }
        return values
    }

    fileprivate mutating func storedValues() throws(WireError) -> StoredValues {
        try values(count: try count())
    }
}
