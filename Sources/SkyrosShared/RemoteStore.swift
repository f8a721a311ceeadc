import Foundation
import Skyros
import SkyrosWire
import SkyrosZeroMQ

/// The store of a shared stack: the group's daemon, reached over ZeroMQ (docs/PROTOCOL.md).
///
/// Requests are answered from the daemon's committed state. Change events of other clients
/// are received on a background thread and handed to ``onChange``. A call that gets no
/// answer within ``timeout`` reconnects once and then fails with
/// ``SkyrosError/Code/daemonUnavailable``: no call ever waits forever.
public final class RemoteStore: PersistentStore, @unchecked Sendable {
    public let schema: Schema
    public let container: GroupContainer
    /// This client's identity in the group (also the author of its change events).
    public let clientID: String
    /// How long a request waits for the daemon.
    public let timeout: TimeInterval

    private let zmq: ZeroMQContext
    private let lock = NSLock()
    private var dealer: ZeroMQSocket
    private var nextRequestID: UInt64 = 1
    private var saveNumber: UInt64 = 0
    private let events: ZeroMQSocket
    private let eventsLock = NSLock()
    private var _onChange: (@Sendable (ChangeEvent) -> Void)?
    private var _onRestart: (@Sendable () -> Void)?
    private var helloMessage: WireMessage.Body?
    private var stopped = false
    private let eventsFinished = DispatchSemaphore(value: 0)
    private var eventThreadStarted = false
    /// The sequence of the last change set merged (or known to be this client's own).
    public private(set) var sequence: UInt64 = 0

    /// Connects to the daemon of `container` and says hello.
    ///
    /// - Throws: ``SkyrosError/Code/schemaMismatch`` when the group's store has another
    ///   schema, ``SkyrosError/Code/permissionDenied`` when this user may not use the group,
    ///   ``SkyrosError/Code/daemonUnavailable`` when no daemon answers in `timeout`.
    public init(schema: Schema, container: GroupContainer, clientName: String? = nil, timeout: TimeInterval = 5) throws {
        try schema.validate()
        self.schema = schema
        self.container = container
        self.timeout = timeout
        let name = clientName ?? ProcessInfo.processInfo.processName
        self.clientID = "\(UUID().uuidString.prefix(8)) \(name)"
        try container.checkAccess()
        zmq = try ZeroMQContext()
        // Subscribe first, then ask for the state (ZeroMQ guide, Clone pattern).
        events = try ZeroMQSocket(context: zmq, kind: .subscriber)
        try events.setMaximumMessageSize(Int64(WireMessage.maximumSize))
        try events.subscribe()
        try events.connect(container.eventsEndpoint)
        dealer = try Self.makeDealer(zmq, container)
        let description = Array(try JSONEncoder().encode(schema.schemaDescription))
        let hello = WireMessage.Body.hello(
            protocolVersion: UInt64(WireMessage.protocolVersion), schemaFingerprint: schema.fingerprint,
            clientName: name, schemaDescription: description)
        let reply = try request(hello)
        helloMessage = hello
        guard case .welcome(_, let current) = reply else {
            throw SkyrosError(.malformedMessage, "the daemon answered hello with \(reply)")
        }
        sequence = current
    }

    deinit {
        eventsLock.withLock { stopped = true }
        if eventThreadStarted { _ = eventsFinished.wait(timeout: .now() + 2) }
    }

    private static func makeDealer(_ zmq: ZeroMQContext, _ container: GroupContainer) throws -> ZeroMQSocket {
        let socket = try ZeroMQSocket(context: zmq, kind: .dealer)
        try socket.setMaximumMessageSize(Int64(WireMessage.maximumSize))
        try socket.connect(container.requestsEndpoint)
        return socket
    }

    /// Called on a background thread with each change event of another client, in order.
    /// Setting it starts listening.
    public var onChange: (@Sendable (ChangeEvent) -> Void)? {
        get { eventsLock.withLock { _onChange } }
        set {
            let start = eventsLock.withLock { () -> Bool in
                _onChange = newValue
                defer { eventThreadStarted = true }
                return !eventThreadStarted
            }
            if start { startEventThread() }
        }
    }

    private func startEventThread() {
        let thread = Thread { [weak self] in
            while let self, !self.eventsLock.withLock({ self.stopped }) {
                do {
                    guard try self.events.waitForInput(milliseconds: 50) else { continue }
                    let frames = try self.events.receive(dontWait: true)
                    guard let frame = frames.first, case .event(let event) = try WireMessage.decode([UInt8](frame)).body
                    else { continue }
                    self.deliver(event)
                } catch {
                    continue
                }
            }
            self?.eventsFinished.signal()
        }
        thread.name = "skyros.events"
        thread.start()
    }

    /// Merges events in sequence order, with no gap and no duplicate: an event (or a
    /// heartbeat, whose author is empty) past the next expected sequence means some were
    /// dropped, and they are fetched with changes-since before going on.
    private func deliver(_ event: ChangeEvent) {
        let last = eventsLock.withLock { sequence }
        guard event.sequence > last else { return }  // known already, or a heartbeat with nothing new
        var events: [ChangeEvent]
        if event.sequence == last + 1 && !event.author.isEmpty {
            events = [event]
        } else {
            guard case .changes(let missed)? = try? request(.changesSince(last)) else { return }  // retried on the next event
            events = missed
        }
        for event in events {
            let handler = eventsLock.withLock { () -> (@Sendable (ChangeEvent) -> Void)? in
                guard event.sequence == sequence + 1 else { return nil }
                sequence = event.sequence
                return event.author == clientID ? nil : _onChange
            }
            handler?(event)
        }
    }

    // MARK: - Requests

    /// Sends a request and waits for its reply; error replies become ``SkyrosError``s.
    ///
    /// When the daemon does not answer in time the request is sent again on a new
    /// connection; when it answers that it does not know this client (it restarted), the
    /// client says hello again and resends. After that: ``SkyrosError/Code/daemonUnavailable``.
    func request(_ body: WireMessage.Body) throws -> WireMessage.Body {
        try lock.withLock {
            var reconnected = false
            var rehelloed = false
            while true {
                do {
                    return try exchange(body)
                } catch let error as SkyrosError where error.code == .helloRequired && !rehelloed {
                    rehelloed = true
                    try sayHelloAgain()
                } catch ExchangeTimeout.timedOut where !reconnected {
                    reconnected = true
                    dealer.close()
                    dealer = try Self.makeDealer(zmq, container)
                } catch ExchangeTimeout.timedOut {
                    throw SkyrosError(
                        .daemonUnavailable,
                        "the daemon of \(container.url.path) did not answer within \(timeout) seconds (is skyrosd running?)")
                }
            }
        }
    }

    private enum ExchangeTimeout: Error { case timedOut }

    /// One request and its reply, on the current connection (called with `lock` held).
    private func exchange(_ body: WireMessage.Body) throws -> WireMessage.Body {
        let id = nextRequestID
        nextRequestID += 1
        try dealer.send([Data(WireMessage(requestID: id, body: body).encoded())])
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            let remaining = max(1, Int(deadline.timeIntervalSinceNow * 1000))
            guard try dealer.waitForInput(milliseconds: remaining) else { break }
            let frames = try dealer.receive(dontWait: true)
            guard let frame = frames.last, let reply = try? WireMessage.decode([UInt8](frame)) else { continue }
            if reply.requestID == 0, case .error(let code, let message) = reply.body {
                throw SkyrosError(SkyrosError.Code(rawValue: code), message)
            }
            guard reply.requestID == id else { continue }  // a late reply to an abandoned request
            if case .error(let code, let message) = reply.body {
                throw SkyrosError(SkyrosError.Code(rawValue: code), message)
            }
            return reply.body
        }
        throw ExchangeTimeout.timedOut
    }

    /// Says hello to a daemon that restarted. Its history starts over, so the sequence
    /// restarts from its welcome, and ``onRestart`` lets the stack refresh what it holds.
    private func sayHelloAgain() throws {
        guard let hello = helloMessage, case .welcome(_, let current) = try exchange(hello) else {
            throw SkyrosError(.malformedMessage, "the daemon did not welcome this client back")
        }
        eventsLock.withLock { sequence = current }
        let handler = eventsLock.withLock { _onRestart }
        handler?()
    }

    /// Called (on the requesting thread) when the daemon restarted and forgot this client.
    public var onRestart: (@Sendable () -> Void)? {
        get { eventsLock.withLock { _onRestart } }
        set { eventsLock.withLock { _onRestart = newValue } }
    }

    // MARK: - ObjectStore

    public func fetchSnapshots(_ request: StoreRequest) throws -> [Snapshot] {
        guard case .snapshotsReply(let rows) = try self.request(.fetch(request)) else { throw unexpected() }
        return rows
    }

    public func fetchIdentifiers(_ request: StoreRequest) throws -> [ObjectID] {
        guard case .identifiersReply(let ids) = try self.request(.fetchIdentifiers(request)) else { throw unexpected() }
        return ids
    }

    public func count(_ request: StoreRequest) throws -> Int {
        guard case .countReply(let count) = try self.request(.count(request)) else { throw unexpected() }
        return count
    }

    public func snapshots(for ids: [ObjectID]) throws -> [Snapshot] {
        guard !ids.isEmpty else { return [] }
        guard case .snapshotsReply(let rows) = try request(.snapshots(ids)) else { throw unexpected() }
        return rows
    }

    /// Sends a change set; returns once the daemon has made it durable.
    public func save(_ changes: ChangeSet) throws {
        let number = lock.withLock { () -> UInt64 in
            saveNumber += 1
            return saveNumber
        }
        guard case .saved = try request(.save(clientID: clientID, saveNumber: number, changes: changes)) else {
            throw unexpected()
        }
    }

    public func deleteAll() throws {
        guard case .saved = try request(.deleteAll(clientID: clientID)) else { throw unexpected() }
    }

    private func unexpected() -> SkyrosError {
        SkyrosError(.malformedMessage, "the daemon sent an unexpected reply")
    }
}
