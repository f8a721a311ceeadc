import Foundation
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOWebSocket
import Skyros
import Synchronization

/// The ``SyncServer`` that is a sync gateway (DESIGN §10): a WebSocket over TLS to
/// `wss://host:port/G`, the machine's token (read from its file at every connection) and its
/// machine id in a hello, then the engine's requests as ``GatewayMessage``s, each answered in
/// ``SyncEngine/Settings/statementTimeout`` or the connection is dropped.
package struct GatewaySyncServer: SyncServer {
    let endpoint: GatewayEndpoint
    let statementTimeout: Duration
    let executor: SyncExecutor

    /// The gateway of `endpoint`; its connections on `executor`'s event loop.
    package init(endpoint: GatewayEndpoint, statementTimeout: Duration, executor: SyncExecutor) {
        self.endpoint = endpoint
        self.statementTimeout = statementTimeout
        self.executor = executor
    }

    package var redacted: String { endpoint.url }

    package func connect(machine: UUID, closed: @escaping @Sendable () -> Void) async throws
        -> any SyncServerConnection
    {
        let link = try await GatewayLink.open(
            endpoint, machine: machine, timeout: statementTimeout, eventLoop: executor.eventLoop)
        link.channel.channel.closeFuture.whenComplete { _ in closed() }
        return GatewaySyncConnection(link: link, machine: machine)
    }

    package func listen(machine: UUID, _ notify: @escaping @Sendable (UInt64?) -> Void) async throws {
        let link = try await GatewayLink.open(
            endpoint, machine: machine, timeout: statementTimeout, eventLoop: executor.eventLoop)
        defer { link.close() }
        _ = try await link.request(.listen)
        notify(nil)  // whatever happened while it was not listening
        var silent = false
        while true {
            // The gateway tells this connection by the buckets of its hello's token.
            try link.checkToken()
            // A ping after a silence of two statement timeouts; a second silence as long (no
            // pong, no message) fails the listen: a gateway that stopped answering.
            guard let message = try await link.next(within: statementTimeout * 2, pinging: true) else {
                if silent { throw GatewayLink.Failed(needsOperator: false, message: "the gateway stopped answering") }
                silent = true
                continue
            }
            silent = false
            if case .notify(let transaction) = message.message { notify(transaction) }
        }
    }

    package func classify(_ error: any Error) -> (SyncEngine.Status.State, String) {
        if let refused = error as? GatewayLink.Closed {
            return (refused.needsOperator ? .error : .offline, refused.description)
        }
        if let failure = error as? GatewayLink.Failed {
            return (failure.needsOperator ? .error : .offline, failure.message)
        }
        if let error = error as? SkyrosError, error.code == .syncConfiguration { return (.error, error.message) }
        if let certificate = ServerErrors.certificateRefusal(error) {
            let roots =
                endpoint.rootCertificate.map { "the CA certificate \($0) (sslrootcert)" }
                ?? "the system's CA certificates"
            return (
                .error,
                "the gateway's TLS certificate was not accepted: \(certificate); it must be signed by \(roots) and name the host \(endpoint.host)"
            )
        }
        return (.offline, "the gateway \(endpoint.url) cannot be reached: \(error)")
    }

    package func probe() async -> Bool {
        let bootstrap = ClientBootstrap(group: executor.eventLoop).connectTimeout(.milliseconds(200))
        guard let channel = try? await bootstrap.connect(host: endpoint.host, port: endpoint.port).get() else {
            return false
        }
        channel.close(promise: nil)
        return true
    }
}

/// One engine connection through a gateway.
final class GatewaySyncConnection: SyncServerConnection {
    let link: GatewayLink
    let machine: UUID
    var serverName: String? { nil }

    init(link: GatewayLink, machine: UUID) {
        self.link = link
        self.machine = machine
    }

    /// The connection is bound to the machine id of its hello, and to its token: another id
    /// (the store was given a new one), or another token in the file, needs a new connection.
    private func check(_ requested: UUID) throws {
        guard requested == machine else {
            throw GatewayLink.Failed(needsOperator: false, message: "the machine id changed: connecting again")
        }
        try link.checkToken()
    }

    func prepare(_ schema: ServerSchema) async throws {
        _ = try await link.request(.prepare(schemaJSON: try schema.source.canonicalBytes(), version: schema.version))
    }

    func uploadedThrough(machine: UUID) async throws -> Int64 {
        try check(machine)
        guard case .number(let number) = try await link.request(.uploadedThrough) else { throw link.unexpected() }
        return number
    }

    func digests(machine: UUID, numbers: [Int64]) async throws -> [Int64: Int64] {
        try check(machine)
        guard case .recordedDigests(let digests) = try await link.request(.digests(numbers: numbers)) else {
            throw link.unexpected()
        }
        return digests
    }

    func upload(_ batch: [QueuedEntry], machine: UUID) async throws -> (
        outcomes: [ServerSession.UploadOutcome], transactions: [UInt64]?
    ) {
        try check(machine)
        let answer = try await link.request(.upload(batch.map { ($0.number, [UInt8]($0.changes.encoded())) }))
        guard case .outcomes(let outcomes, let transactions) = answer, outcomes.count == batch.count else {
            throw link.unexpected()
        }
        return (outcomes, transactions)
    }

    func readCheckpoint(
        after previous: String?, rejectedAfter: Int64, machine: UUID, pageSize: Int,
        stage: @escaping @Sendable (SnapshotPage) async -> String?
    ) async throws -> Checkpoint {
        try check(machine)
        let id = link.send(.readCheckpoint(previous: previous, rejectedAfter: rejectedAfter, pageSize: pageSize))
        while true {
            let answer = try await link.answer(to: id)
            switch answer {
            case .page(let page):
                let failure = await stage(page)
                // Written before anything else is sent: the gateway takes the next message for it.
                try await link.write(.staged(failure: failure), id: id)
                if let failure { throw Checkpoint.StagingFailed(reason: failure) }
            case .checkpoint(let checkpoint):
                return checkpoint
            default:
                throw link.unexpected()
            }
        }
    }

    func compact(retention: TimeInterval) async throws {
        _ = try await link.request(.compact(retention: retention))
    }

    func close() { link.close() }
}

/// The channel of a connection being opened, for its handshake's deadline.
private final class OpenedChannel: Sendable {
    private let state = Mutex<(channel: (any Channel)?, closed: Bool)>((nil, false))

    func set(_ channel: any Channel) {
        let closed = state.withLock { state in
            state.channel = channel
            return state.closed
        }
        if closed { channel.close(promise: nil) }
    }

    func close() {
        let channel = state.withLock { state in
            state.closed = true
            return state.channel
        }
        channel?.close(promise: nil)
    }
}

/// A WebSocket connection to a gateway, past its hello.
package final class GatewayLink: Sendable {
    let channel: NIOAsyncChannel<WebSocketFrame, WebSocketFrame>
    let timeout: Duration
    private let state: State
    private let nextID = Mutex<UInt64>(1)
    private let writer: NIOAsyncChannelOutboundWriter<WebSocketFrame>

    /// What the reading task shares with the requests: the messages, and the close's code and reason.
    private final class State: Sendable {
        let queue: MessageQueue
        let closeReason = Mutex<(code: UInt16, reason: String)?>(nil)
        init(eventLoop: any EventLoop) { queue = MessageQueue(eventLoop: eventLoop) }
    }

    /// Where the link's tasks run: its channel's event loop, like the engine's (never Swift's
    /// cooperative pool, which a process may block: a test's, an app's), in the order they
    /// were made (frames are written in the order sent).
    private var executor: SyncExecutor { SyncExecutor(eventLoop: channel.channel.eventLoop) }

    /// The gateway closed the connection, with its code and reason.
    struct Closed: Error, CustomStringConvertible {
        var code: UInt16
        var reason: String
        /// Refused for a reason an operator must fix (the token, the machine's binding, the group).
        var needsOperator: Bool { [4400, 4401, 4403, 4404].contains(code) }
        var description: String {
            let what: String =
                switch code {
                case 4401: "the gateway refused the token"
                case 4403: "the gateway refused this machine"
                case 4404: "the gateway does not serve this group"
                case 4400: "the gateway found a protocol error"
                case 1009: "the gateway refused a message over its size limit"
                case 1001: "the gateway is stopping"
                default: "the gateway closed the connection (code \(code))"
                }
            // A reason that already says it ("the gateway is stopping: connect again") alone.
            if reason.isEmpty { return what }
            return reason.hasPrefix(what) ? reason : "\(what): \(reason)"
        }
    }

    /// A request the gateway answered with a failure.
    struct Failed: Error, CustomStringConvertible {
        var needsOperator: Bool
        var message: String
        var description: String { message }
    }

    private init(
        channel: NIOAsyncChannel<WebSocketFrame, WebSocketFrame>, timeout: Duration, state: State,
        writer: NIOAsyncChannelOutboundWriter<WebSocketFrame>
    ) {
        self.channel = channel
        self.timeout = timeout
        self.state = state
        self.writer = writer
    }

    /// A link on `channel`: a task of its own reads it (every message to the queue, a close's
    /// reason kept) until it closes.
    private static func start(_ channel: NIOAsyncChannel<WebSocketFrame, WebSocketFrame>, timeout: Duration) async
        -> GatewayLink
    {
        let state = State(eventLoop: channel.channel.eventLoop)
        let writer = await withCheckedContinuation {
            (ready: CheckedContinuation<NIOAsyncChannelOutboundWriter<WebSocketFrame>, Never>) in
            Task(executorPreference: SyncExecutor(eventLoop: channel.channel.eventLoop)) {
                try? await channel.executeThenClose { inbound, outbound in
                    ready.resume(returning: outbound)
                    for try await frame in inbound {
                        switch frame.opcode {
                        case .binary:
                            state.queue.push(Array(buffer: frame.unmaskedData))
                        case .connectionClose:
                            var data = frame.unmaskedData
                            let code = data.readInteger(as: UInt16.self) ?? 1005
                            let reason = data.readString(length: data.readableBytes) ?? ""
                            state.closeReason.withLock { $0 = (code, reason) }
                            return
                        case .ping:
                            try? await outbound.write(
                                WebSocketFrame(fin: true, opcode: .pong, maskKey: .random(), data: frame.unmaskedData))
                        case .pong:
                            state.queue.push(GatewayLink.pong)
                        default:
                            continue
                        }
                    }
                }
                state.queue.finish()
            }
        }
        return GatewayLink(channel: channel, timeout: timeout, state: state, writer: writer)
    }

    /// Connects (TLS, the upgrade to a WebSocket), says hello with the token read from its file
    /// now and `machine`, and returns once welcomed.
    package static func open(_ endpoint: GatewayEndpoint, machine: UUID, timeout: Duration, eventLoop: any EventLoop)
        async throws -> GatewayLink
    {
        let token = try endpoint.readToken()
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.certificateVerification = .fullVerification
        if let root = endpoint.rootCertificate { tls.trustRoots = .file(root) }
        let context = try NIOSSLContext(configuration: tls)
        let isAddress =
            endpoint.host.allSatisfy { $0.isHexDigit || $0 == "." || $0 == ":" }
            && endpoint.host.contains(where: { $0 == "." || $0 == ":" }) && !endpoint.host.contains(where: \.isLetter)
            || endpoint.host.contains(":")
        let hostname = isAddress ? nil : endpoint.host
        enum Upgrade: Sendable {
            case websocket(NIOAsyncChannel<WebSocketFrame, WebSocketFrame>)
            case refused
        }
        // The whole handshake (TLS, the upgrade, the hello) is bounded: the connection is
        // closed at the deadline, which fails whatever waits on it.
        let opened = OpenedChannel()
        let deadline = eventLoop.scheduleTask(in: TimeAmount(timeout)) { opened.close() }
        let upgrade: EventLoopFuture<Upgrade> = try await ClientBootstrap(group: eventLoop)
            .connectTimeout(TimeAmount(timeout))
            .connect(host: endpoint.host, port: endpoint.port) { channel in
                opened.set(channel)
                return channel.eventLoop.makeCompletedFuture {
                    let handler = try NIOSSLClientHandler(context: context, serverHostname: hostname)
                    try channel.pipeline.syncOperations.addHandler(handler)
                    let upgrader = NIOTypedWebSocketClientUpgrader<Upgrade>(
                        maxFrameSize: GatewayMessage.maximumSize,
                        upgradePipelineHandler: { channel, _ in
                            channel.eventLoop.makeCompletedFuture {
                                return .websocket(try GatewayMessage.messageChannel(channel))
                            }
                        })
                    var headers = HTTPHeaders()
                    let host = endpoint.host.contains(":") ? "[\(endpoint.host)]" : endpoint.host
                    headers.add(name: "Host", value: "\(host):\(endpoint.port)")
                    headers.add(name: "Content-Length", value: "0")
                    let head = HTTPRequestHead(
                        version: .http1_1, method: .GET, uri: "/" + endpoint.group, headers: headers)
                    return try channel.pipeline.syncOperations.configureUpgradableHTTPClientPipeline(
                        configuration: .init(
                            upgradeConfiguration: NIOTypedHTTPClientUpgradeConfiguration(
                                upgradeRequestHead: head, upgraders: [upgrader],
                                notUpgradingCompletionHandler: { channel in
                                    channel.eventLoop.makeCompletedFuture { .refused }
                                })))
                }
            }
        guard case .websocket(let channel) = try await upgrade.get() else {
            deadline.cancel()
            throw Failed(needsOperator: true, message: "\(endpoint.url) is not a sync gateway (no WebSocket upgrade)")
        }
        let link = await GatewayLink.start(channel, timeout: timeout)
        do {
            guard case .welcome = try await link.request(.hello(token: token, machine: machine)) else {
                throw link.unexpected()
            }
            deadline.cancel()
            link.watched.withLock { $0 = (endpoint, token, ContinuousClock.now) }
            return link
        } catch {
            deadline.cancel()
            link.close()
            throw error
        }
    }

    /// Sends a message with a new request id (or `id`), returns the id.
    @discardableResult
    package func send(_ message: GatewayMessage, id: UInt64? = nil) -> UInt64 {
        let id =
            id
            ?? nextID.withLock { next in
                defer { next += 1 }
                return next
            }
        let frame = WebSocketFrame(
            fin: true, opcode: .binary, maskKey: .random(), data: ByteBuffer(bytes: message.encoded(id: id)))
        let writer = writer
        Task(executorPreference: executor) { try? await writer.write(frame) }
        return id
    }

    /// Sends a message with request id `id` and returns once it is written.
    package func write(_ message: GatewayMessage, id: UInt64) async throws {
        try await writer.write(
            WebSocketFrame(
                fin: true, opcode: .binary, maskKey: .random(), data: ByteBuffer(bytes: message.encoded(id: id))))
    }

    /// Sends a request and waits for its answer (a failure thrown as ``Failed``).
    package func request(_ message: GatewayMessage) async throws -> GatewayMessage {
        try await answer(to: send(message))
    }

    /// The endpoint whose token file the link said hello with, that token, and when the file
    /// was last read (nil before the hello is answered).
    let watched = Mutex<(endpoint: GatewayEndpoint, token: String, read: ContinuousClock.Instant)?>(nil)

    /// Fails (the engine connects again, and reads the file then) when the token file holds
    /// another token than the one of the hello: a token renewed or replaced by the operator
    /// (other claims, other buckets) is used within a second of a request, not at the old
    /// one's expiry. Read at most once a second; a file that cannot be read, or holds the
    /// same token, changes nothing.
    package func checkToken() throws {
        let changed = watched.withLock { watched -> Bool in
            guard let current = watched, ContinuousClock.now - current.read >= .seconds(1) else { return false }
            watched?.read = .now
            guard let token = try? current.endpoint.readToken() else { return false }
            return token != current.token
        }
        if changed {
            throw Failed(needsOperator: false, message: "the token file changed: connecting again with its token")
        }
    }

    /// The next answer to request `id` (notifications skipped), in ``timeout`` or the
    /// connection is dropped.
    func answer(to id: UInt64) async throws -> GatewayMessage {
        while true {
            guard let next = try await next(within: timeout, pinging: false) else { continue }
            if next.id != id { continue }
            if case .failure(let needsOperator, let message) = next.message {
                throw Failed(needsOperator: needsOperator, message: message)
            }
            return next.message
        }
    }

    /// The next message within `limit`; nil when nothing came in time and `pinging` (a ping was
    /// sent: the next wait fails if the gateway does not answer either). Without `pinging`, a
    /// silent gateway drops the connection.
    package func next(within limit: Duration, pinging: Bool) async throws -> (id: UInt64, message: GatewayMessage)? {
        let queue = state.queue
        let timedOut = Mutex(false)
        let timer = channel.channel.eventLoop.scheduleTask(in: TimeAmount(limit)) {
            timedOut.withLock { $0 = true }
            queue.push([])  // a wake-up, not a message
        }
        defer { timer.cancel() }
        while true {
            guard let bytes = await queue.next() else { throw closedError() }
            if bytes.isEmpty {
                guard timedOut.withLock({ $0 }) else { continue }
                if pinging {
                    let frame = WebSocketFrame(fin: true, opcode: .ping, maskKey: .random(), data: ByteBuffer())
                    try? await writer.write(frame)
                    return nil
                }
                close()
                throw Failed(needsOperator: false, message: "the gateway did not answer within \(limit)")
            }
            if bytes == Self.pong { return nil }  // alive: the caller waits again
            do {
                let decoded = try GatewayMessage.decode(bytes)
                return (decoded.id, decoded.message)
            } catch {
                close()
                throw Failed(
                    needsOperator: false, message: "the gateway sent a message that could not be read: \(error)")
            }
        }
    }

    /// A pong's mark in the queue (no message is one byte long).
    static let pong: [UInt8] = [0]

    private func closedError() -> any Error {
        if let (code, reason) = state.closeReason.withLock({ $0 }) { return Closed(code: code, reason: reason) }
        return Failed(needsOperator: false, message: "the connection to the gateway closed")
    }

    func unexpected() -> Failed {
        close()
        return Failed(needsOperator: false, message: "the gateway answered out of turn")
    }

    package func close() {
        channel.channel.close(promise: nil)
    }
}
