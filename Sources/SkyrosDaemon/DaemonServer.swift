import Foundation
import Skyros
import SkyrosWire
import SkyrosZeroMQ

/// The daemon of one application group, as a library: it owns the group's store, answers
/// requests on `requests.ipc` and publishes committed changes on `events.ipc`
/// (docs/PROTOCOL.md). `skyrosd` wraps it with arguments, signals and logging.
///
/// Bad input never stops it: every malformed or invalid request gets an error reply and the
/// server goes on with the next one.
public final class DaemonServer: @unchecked Sendable {
    public struct Configuration: Sendable {
        public var container: GroupContainer
        public var durability: Durability
        public var maximumMessageSize: Int
        /// Where the server writes what it does (one line per call).
        public var log: @Sendable (String) -> Void

        public init(
            container: GroupContainer, durability: Durability = .full,
            maximumMessageSize: Int = WireMessage.maximumSize, log: @escaping @Sendable (String) -> Void = { _ in }
        ) {
            self.container = container
            self.durability = durability
            self.maximumMessageSize = maximumMessageSize
            self.log = log
        }
    }

    public let configuration: Configuration
    private let lock: GroupLock
    private let zmq: ZeroMQContext
    private let requests: ZeroMQSocket
    private let events: ZeroMQSocket
    private var store: SQLiteStore?
    private var sequence: UInt64 = 0
    private var acceptedPeers: Set<Data> = []
    /// The latest committed change sets, for clients catching up (oldest first).
    private var history: [ChangeEvent] = []
    /// How many change sets the in-memory history keeps.
    public static let historyLimit = 100_000
    private var lastHeartbeat = Date.distantPast
    private let state = NSLock()
    private var stopRequested = false

    /// Prepares the container, takes the group's lock (before binding: a second daemon is
    /// refused and never steals the sockets), opens the store if it exists, and binds.
    public init(configuration: Configuration) throws {
        self.configuration = configuration
        let container = configuration.container
        try container.prepare()
        lock = try GroupLock(container)
        if let description = try SQLiteStore.storedSchemaDescription(at: container.store) {
            store = try SQLiteStore(
                schema: try Schema(description: description), url: container.store, durability: configuration.durability)
        }
        zmq = try ZeroMQContext()
        requests = try ZeroMQSocket(context: zmq, kind: .router)
        try requests.setMaximumMessageSize(Int64(configuration.maximumMessageSize))
        events = try ZeroMQSocket(context: zmq, kind: .publisher)
        for path in container.sockets where FileManager.default.fileExists(atPath: path) {
            // A socket file left by a daemon that died is stale: the lock proves nobody serves it.
            try? FileManager.default.removeItem(atPath: path)
        }
        try requests.bind(container.requestsEndpoint)
        try events.bind(container.eventsEndpoint)
        for path in container.sockets { chmod(path, 0o770) }
        configuration.log("serving \(container.url.path)\(store == nil ? " (no store yet)" : "")")
    }

    /// Serves until ``stop()`` is called; checks for it every `pollInterval` milliseconds.
    public func serve(pollInterval: Int = 100) {
        while !isStopRequested {
            heartbeatIfDue(every: Double(pollInterval) / 1000)
            do {
                guard try requests.waitForInput(milliseconds: pollInterval) else { continue }
                handle(try requests.receive(dontWait: true))
            } catch let error as ZeroMQError where error.isTimeout || error.code == EINTR {
                continue
            } catch {
                configuration.log("receive failed: \(error)")
            }
        }
    }

    /// Asks ``serve(pollInterval:)`` to return once the request in progress is answered.
    public func stop() { state.withLock { stopRequested = true } }

    private var isStopRequested: Bool { state.withLock { stopRequested } }

    /// Closes the sockets and checkpoints and closes the store.
    public func close() {
        requests.close()
        events.close()
        try? store?.close()
        for path in configuration.container.sockets { try? FileManager.default.removeItem(atPath: path) }
        configuration.log("stopped")
    }

    // MARK: - Requests

    private func handle(_ frames: [Data]) {
        guard frames.count == 2 else {
            if frames.count > 2 || frames.count == 1 {
                reply(to: frames[0], WireMessage(requestID: 0, body: .error(
                    code: SkyrosError.Code.malformedMessage.rawValue,
                    message: "a request is exactly one frame, not \(frames.count - 1)")))
            }
            return
        }
        let identity = frames[0]
        let message: WireMessage
        do {
            message = try WireMessage.decode([UInt8](frames[1]), maximumSize: configuration.maximumMessageSize)
        } catch {
            let code: SkyrosError.Code =
                if case .unsupportedVersion = error { .unsupportedProtocolVersion } else { .malformedMessage }
            reply(to: identity, WireMessage(requestID: 0, body: .error(code: code.rawValue, message: error.description)))
            return
        }
        let body: WireMessage.Body
        do {
            body = try respond(to: message.body, from: identity)
        } catch {
            let error = SkyrosError.wrap(error)
            body = .error(code: error.code.rawValue, message: error.message)
        }
        reply(to: identity, WireMessage(requestID: message.requestID, body: body))
    }

    private func reply(to identity: Data, _ message: WireMessage) {
        do {
            try requests.send([identity, Data(message.encoded())], dontWait: true)
        } catch {
            configuration.log("could not reply to a client: \(error)")
        }
    }

    private func respond(to body: WireMessage.Body, from identity: Data) throws -> WireMessage.Body {
        if case .hello(let version, let fingerprint, let name, let description) = body {
            return try hello(version: version, fingerprint: fingerprint, name: name, description: description, identity)
        }
        guard acceptedPeers.contains(identity), let store else {
            throw SkyrosError(.helloRequired, "say hello first")
        }
        switch body {
        case .fetch(let request): return .snapshotsReply(try store.fetchSnapshots(request))
        case .fetchIdentifiers(let request): return .identifiersReply(try store.fetchIdentifiers(request))
        case .count(let request): return .countReply(try store.count(request))
        case .snapshots(let ids): return .snapshotsReply(try store.snapshots(for: ids))
        case .save(let clientID, _, let changes):
            try store.save(changes)
            sequence += 1
            publish(ChangeEvent(sequence: sequence, author: clientID, changes: summary(of: changes, in: store.schema)))
            return .saved(sequence: sequence)
        case .deleteAll(let clientID):
            try store.deleteAll()
            sequence += 1
            publish(ChangeEvent(sequence: sequence, author: clientID, isReset: true, changes: []))
            return .saved(sequence: sequence)
        case .changesSince(let since):
            if since >= sequence { return .changes([]) }
            guard let oldest = history.first?.sequence, since + 1 >= oldest else {
                throw SkyrosError(
                    .historyExpired, "changes after \(since) are no longer kept (oldest: \(history.first?.sequence ?? sequence))")
            }
            return .changes(Array(history.drop { $0.sequence <= since }))
        default:
            throw SkyrosError(.malformedMessage, "a client cannot send this message")
        }
    }

    private func hello(
        version: UInt64, fingerprint: String, name: String, description: [UInt8], _ identity: Data
    ) throws -> WireMessage.Body {
        guard version == UInt64(WireMessage.protocolVersion) else {
            throw SkyrosError(
                .unsupportedProtocolVersion, "the daemon speaks protocol \(WireMessage.protocolVersion), not \(version)")
        }
        if store == nil {
            let decoded = try JSONDecoder().decode(SchemaDescription.self, from: Data(description))
            let schema = try Schema(description: decoded)
            guard schema.fingerprint == fingerprint else {
                throw SkyrosError(.schemaMismatch, "the schema description does not have the announced fingerprint")
            }
            store = try SQLiteStore(
                schema: schema, url: configuration.container.store, durability: configuration.durability)
            configuration.log("created the store for schema \(fingerprint)")
        }
        guard let store, store.schema.fingerprint == fingerprint else {
            throw SkyrosError(
                .schemaMismatch,
                "the group's store has schema \(store?.schema.fingerprint ?? "?"), the client \(name) has \(fingerprint)")
        }
        acceptedPeers.insert(identity)
        configuration.log("hello from \(name)")
        return .welcome(protocolVersion: UInt64(WireMessage.protocolVersion), sequence: sequence)
    }

    /// A heartbeat is an event with an empty author and the current sequence: clients learn
    /// that their subscription is live and notice gaps even when nothing is saved.
    private func heartbeatIfDue(every interval: TimeInterval) {
        guard Date().timeIntervalSince(lastHeartbeat) >= interval else { return }
        lastHeartbeat = Date()
        publish(ChangeEvent(sequence: sequence, author: "", changes: []), recording: false)
    }

    private func record(_ event: ChangeEvent) {
        history.append(event)
        if history.count > Self.historyLimit { history.removeFirst(history.count - Self.historyLimit) }
    }

    private func publish(_ event: ChangeEvent, recording: Bool = true) {
        if recording { record(event) }
        do {
            try events.send([Data(WireMessage(requestID: 0, body: .event(event)).encoded())], dontWait: true)
        } catch {
            configuration.log("could not publish change \(event.sequence): \(error)")
        }
    }

    private func summary(of changes: ChangeSet, in schema: Schema) -> [ObjectChange] {
        var result = changes.inserted.map { ObjectChange(id: $0.id, kind: .inserted) }
        for update in changes.updated {
            let names = update.changes.keys.sorted().compactMap { schema.entity(named: update.id.entityName)?.properties[$0].name }
            result.append(ObjectChange(id: update.id, kind: .updated, properties: names))
        }
        result += changes.deleted.map { ObjectChange(id: $0, kind: .deleted) }
        return result
    }
}
