import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import NIOWebSocket
import PostgresNIO
import Skyros
import SkyrosSync
import Synchronization

/// A sync gateway's configuration (DESIGN §10): the group and its database, the rules, the
/// token keys, where it listens and its TLS certificate.
package struct GatewayConfiguration: Sendable {
    /// The application group (a machine's URL path is `/<group>`).
    package var group: String
    /// The group's database; its ``SyncConfiguration/schema`` is the group's tables.
    package var database: SyncConfiguration
    /// The sync rules.
    package var rules: SyncRules
    /// The token keys.
    package var verifier: SyncTokenVerifier
    /// The address it listens on.
    package var host: String
    /// The port (0: any free one, see ``GatewayServer/port``).
    package var port: Int
    /// The TLS certificate chain (PEM) and its private key (PEM).
    package var certificate: String
    package var key: String
    /// How long a connection may take from its TCP accept to its accepted hello (TLS, the
    /// WebSocket upgrade, the token): past it, it is closed.
    package var handshakeTimeout: Duration = .seconds(10)
    /// The most PostgreSQL connections for machines' requests (the LISTEN connection is one more).
    package var poolSize = 3
    /// The longest one statement may wait for its answer.
    package var statementTimeout: Duration = .seconds(10)
    /// How often the gateway compacts the server's change log (machines do not, through it).
    package var compactionInterval: Duration = .seconds(600)

    /// A configuration; see the properties.
    package init(
        group: String, database: SyncConfiguration, rules: SyncRules, verifier: SyncTokenVerifier, host: String,
        port: Int, certificate: String, key: String
    ) {
        self.group = group
        self.database = database
        self.rules = rules
        self.verifier = verifier
        self.host = host
        self.port = port
        self.certificate = certificate
        self.key = key
    }
}

/// The sync gateway: machines' WebSocket connections over TLS, each bound to its token's
/// subject and buckets, their requests answered with a few shared PostgreSQL connections, and
/// the group's notifications fanned out from one LISTEN connection. It keeps no state of its
/// own: a machine's cursor is a position of the server's log.
package final class GatewayServer: Sendable {
    package let configuration: GatewayConfiguration
    let logger: Logger
    let pool: ServerPool
    let eventLoopGroup: MultiThreadedEventLoopGroup
    package let metrics: GatewayMetrics
    /// The machines that asked for notifications, by connection.
    let listeners = Mutex<[ObjectIdentifier: MachineConnection]>([:])
    private let state = Mutex<(channel: (any Channel)?, tasks: [Task<Void, Never>], port: Int)>((nil, [], 0))
    /// The machines' connections, closed with code 1001 at ``stop()``.
    let sessions = Mutex<[ObjectIdentifier: MachineConnection]>([:])
    /// Whether the machines' binding table exists (made once at the first hello).
    let bindingsReady = Mutex(false)
    /// The change feeds, one per schema the machines have (machines upgraded one by one have two).
    private let feeds = Mutex<[FeedKey: ChangeFeed]>([:])
    /// Whether a machine was refused a feed (past ``maximumFeeds``): every change is then told
    /// to every machine.
    private let feedRefused = Mutex(false)
    /// The turns of ``tell(_:_:)``'s catching up.
    private let catchUp = Mutex(CatchUpTurns())

    /// The most schemas the gateway keeps a change feed for (a fleet upgraded one machine at a
    /// time has two or three).
    static let maximumFeeds = 8

    private struct FeedKey: Hashable {
        var version: UInt64
        var source: SchemaDescription
    }

    /// The change feed of machines of `schema`; nil past ``maximumFeeds`` (those machines
    /// read their own: a machine describes its schema itself, and must not make the gateway
    /// keep a chain of reads for each description it makes up).
    func feed(for schema: ServerSchema) -> ChangeFeed? {
        feeds.withLock { feeds in
            let key = FeedKey(version: schema.version, source: schema.source)
            if let feed = feeds[key] { return feed }
            guard feeds.count < Self.maximumFeeds else {
                feedRefused.withLock { $0 = true }
                return nil
            }
            let feed = ChangeFeed(schema: schema, rules: configuration.rules, pool: pool)
            feeds[key] = feed
            return feed
        }
    }

    /// The reads the change feeds made.
    package func feedReads() async -> Int {
        var total = 0
        for feed in feeds.withLock({ Array($0.values) }) { total += await feed.reads }
        return total
    }

    /// A gateway of `configuration`, not yet listening (``start()``).
    package init(configuration: GatewayConfiguration, logger: Logger = Logger(label: "skyros.gateway")) {
        self.configuration = configuration
        self.logger = logger
        eventLoopGroup = MultiThreadedEventLoopGroup.singleton
        var quiet = Logger(label: "skyros.gateway.postgres")
        quiet.logLevel = .critical
        pool = ServerPool(
            configuration: configuration.database, size: configuration.poolSize, eventLoop: eventLoopGroup.next(),
            statementTimeout: configuration.statementTimeout, logger: quiet)
        metrics = GatewayMetrics()
    }

    /// The port it listens on (after ``start()``).
    package var port: Int { state.withLock { $0.port } }

    /// The group's tables' PostgreSQL schema.
    var schemaName: String { configuration.database.schema }

    /// Binds and starts serving; returns once it listens.
    ///
    /// - Throws: when the certificate or key cannot be read, or the address cannot be bound.
    package func start() async throws {
        let tls = try NIOSSLContext(
            configuration: .makeServerConfiguration(
                certificateChain: try NIOSSLCertificate.fromPEMFile(configuration.certificate).map { .certificate($0) },
                privateKey: .privateKey(try NIOSSLPrivateKey(file: configuration.key, format: .pem))))
        let timeout = TimeAmount(configuration.handshakeTimeout)
        let channel: NIOAsyncChannel<EventLoopFuture<Upgrade>, Never> = try await ServerBootstrap(
            group: eventLoopGroup
        )
        .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
        .serverChannelOption(.backlog, value: 4096)
        .bind(host: configuration.host, port: configuration.port) { channel in
            channel.eventLoop.makeCompletedFuture {
                // Closed unless its hello is accepted in time (cancelled then): a connection that
                // never finishes its handshake costs a socket for a bound time only.
                let deadline = channel.eventLoop.scheduleTask(in: timeout) { channel.close(promise: nil) }
                try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tls))
                let upgrader = NIOTypedWebSocketServerUpgrader<Upgrade>(
                    maxFrameSize: GatewayMessage.maximumSize,
                    shouldUpgrade: { channel, _ in channel.eventLoop.makeSucceededFuture(HTTPHeaders()) },
                    upgradePipelineHandler: { channel, head in
                        channel.eventLoop.makeCompletedFuture {
                            let wrapped = try GatewayMessage.messageChannel(channel)
                            return Upgrade.websocket(wrapped, path: head.uri, deadline: deadline)
                        }
                    })
                let configuration = NIOTypedHTTPServerUpgradeConfiguration(
                    upgraders: [upgrader],
                    notUpgradingCompletionHandler: { channel in
                        channel.eventLoop.makeCompletedFuture {
                            let wrapped = try NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>(
                                wrappingChannelSynchronously: channel)
                            return Upgrade.http(wrapped)
                        }
                    })
                return try channel.pipeline.syncOperations.configureUpgradableHTTPServerPipeline(
                    configuration: .init(upgradeConfiguration: configuration))
            }
        }
        let port = channel.channel.localAddress?.port ?? configuration.port
        // Every task of the gateway runs on SwiftNIO's event loops, not Swift's cooperative pool:
        // a process that embeds a gateway (a test, a service) may block that pool's few threads
        // for seconds, and machines' requests must not wait for it (the daemon's sync engine
        // does the same, SyncExecutor). A machine's connection runs on its channel's loop.
        let serving = Task<Void, Never>(executorPreference: SyncExecutor(eventLoop: eventLoopGroup.next())) {
            await withDiscardingTaskGroup { group in
                try? await channel.executeThenClose { inbound in
                    for try await upgrade in inbound {
                        group.addTask { await self.serve(upgrade) }
                    }
                }
            }
        }
        let listening = Task(executorPreference: SyncExecutor(eventLoop: eventLoopGroup.next())) {
            await self.listen()
        }
        let compacting = Task(executorPreference: SyncExecutor(eventLoop: eventLoopGroup.next())) {
            await self.compactPeriodically()
        }
        state.withLock {
            $0.channel = channel.channel
            $0.tasks = [serving, listening, compacting]
            $0.port = port
        }
        logger.info(
            "skyros-gateway: group \(configuration.group) on \(configuration.host):\(port), database \(configuration.database.redacted)"
        )
    }

    /// Stops listening, closes every machine's connection (code 1001: they connect again,
    /// to another instance), and the server connections.
    package func stop() async {
        let (channel, tasks) = state.withLock { ($0.channel, $0.tasks) }
        try? await channel?.close()
        for task in tasks { task.cancel() }
        let open = sessions.withLock { Array($0.values) }
        await withTaskGroup(of: Void.self) { group in
            for connection in open {
                group.addTask { await connection.close(.goingAway, "the gateway is stopping: connect again") }
            }
        }
        for task in tasks { await task.value }
        await pool.close()
    }

    /// What a connection became after its HTTP request.
    enum Upgrade: Sendable {
        case websocket(NIOAsyncChannel<WebSocketFrame, WebSocketFrame>, path: String, deadline: Scheduled<Void>)
        case http(NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>)
    }

    private func serve(_ upgrade: EventLoopFuture<Upgrade>) async {
        do {
            switch try await upgrade.get() {
            case .websocket(let channel, let path, let deadline):
                let connection = MachineConnection(gateway: self, channel: channel, path: path, deadline: deadline)
                await connection.run()
            case .http(let channel):
                await serveHTTP(channel)
            }
        } catch {
            // A connection that failed its TLS handshake or its request: nothing to keep.
        }
    }

    /// A plain HTTPS request (not an upgrade): `/metrics`, or 404.
    private func serveHTTP(_ channel: NIOAsyncChannel<HTTPServerRequestPart, HTTPServerResponsePart>) async {
        try? await channel.executeThenClose { inbound, outbound in
            for try await part in inbound {
                guard case .head(let head) = part else { continue }
                let (status, body): (HTTPResponseStatus, String) =
                    head.uri == "/metrics"
                    ? (.ok, await metrics.text(gateway: self))
                    : (.notFound, "a sync gateway: machines connect with a WebSocket to /\(configuration.group)\n")
                var headers = HTTPHeaders()
                headers.add(name: "Content-Type", value: "text/plain; version=0.0.4; charset=utf-8")
                headers.add(name: "Content-Length", value: String(body.utf8.count))
                headers.add(name: "Connection", value: "close")
                try await outbound.write(
                    .head(HTTPResponseHead(version: head.version, status: status, headers: headers)))
                try await outbound.write(.body(.byteBuffer(ByteBuffer(string: body))))
                try await outbound.write(.end(nil))
                return
            }
        }
    }

    /// One LISTEN connection for the group: every notification goes to every machine that
    /// listens (each reads its checkpoint then). Reconnects a second after a failure; each
    /// (re)connection tells every machine that anything may have changed.
    private func listen() async {
        let channelName = ServerSchema.channel(ofSchema: schemaName)
        var logger = Logger(label: "skyros.gateway.listen")
        logger.logLevel = .critical
        while !Task.isCancelled {
            do {
                var database = configuration.database
                database.rereadPassword()
                let (connection, _) = try await database.connect(
                    on: eventLoopGroup.next(), id: Int.random(in: 1...Int.max), logger: logger)
                metrics.listening.withLock { $0 = true }
                defer { connection.closeInBackground() }
                // Pinged every second statement timeout: a connection that stopped answering (a
                // partition that sends no reset) fails the listen, which connects again.
                let watchdog = Watchdog(connection)
                let ping = configuration.statementTimeout
                let quiet = logger
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask {
                        try await connection.listen(on: channelName) { notifications in
                            self.fanOut(nil)
                            for try await notification in notifications {
                                self.fanOut(UInt64(notification.payload))
                            }
                        }
                    }
                    group.addTask {
                        while !Task.isCancelled {
                            try await Task.sleep(for: ping * 2)
                            _ = try await watchdog.bounded(ping) {
                                try await connection.query("SELECT 1", logger: quiet).collect().count
                            }
                        }
                    }
                    try await group.next()
                    group.cancelAll()
                }
            } catch {
                if Task.isCancelled { break }
                self.logger.warning(
                    "skyros-gateway: listening for the group's changes failed: \(String(describing: error))")
            }
            metrics.listening.withLock { $0 = false }
            try? await Task.sleep(for: .seconds(1))
        }
    }

    /// Tells the listening machines a change concerns of it: once the feeds read it, the
    /// machines holding a bucket instance it touched (``ChangeFeed/untold()``); every machine
    /// when there is no feed yet, or a machine was refused one (it reads its own, and must be
    /// told of everything).
    func fanOut(_ transaction: UInt64?) {
        let feeds = self.feeds.withLock { Array($0.values) }
        let everyone = feeds.isEmpty || feedRefused.withLock { $0 }
        for feed in feeds { feed.changed() }
        metrics.notified()
        guard !everyone else { return tell(.all, GatewayMessage.notify(transaction: transaction).encoded(id: 0)) }
        Task(executorPreference: SyncExecutor(eventLoop: eventLoopGroup.next())) {
            var touched = ChangeFeed.Touched()
            for feed in feeds { touched.formUnion(await feed.untold()) }
            // Without the transaction's id: what the machines are told of is whatever the reads
            // since the last tell found, which may be another transaction than this one (a
            // machine skips a notification of its own upload's transaction, or one it has).
            self.tell(touched, GatewayMessage.notify(transaction: nil).encoded(id: 0))
        }
    }

    /// Sends `bytes` to the listening machines `touched` concerns, and to those not told for
    /// ``CatchUpTurns/rounds`` changes when their turn comes (``CatchUpTurns``): every machine
    /// is told at least once in twice that many changes, whatever its buckets, so that none falls behind the feeds' chains of reads (it would read its own from
    /// the server), and the catching up is spread over the changes (telling every machine at
    /// once, every 128 reads, cost about a second of the gateway's cores at 10,000 machines,
    /// which a write meanwhile waited for).
    private func tell(_ touched: ChangeFeed.Touched, _ bytes: [UInt8]) {
        let (machines, turn) = listeners.withLock { listeners -> ([MachineConnection], CatchUpTurns.Turn) in
            let machines = Array(listeners.values)
            return (machines, catchUp.withLock { $0.next(count: machines.count) })
        }
        var told = 0
        for (index, machine) in machines.enumerated() {
            guard
                machine.isConcerned(by: touched)
                    || (turn.includes(index) && machine.lastTold.withLock { turn.isDue(toldAt: $0) })
            else { continue }
            machine.lastTold.withLock { $0 = turn.change }
            machine.send(bytes)
            told += 1
        }
        metrics.told(told)
    }

    /// The changes told so far, for a listening machine's ``MachineConnection/lastTold``.
    var changesTold: Int { catchUp.withLock { $0.change } }

    /// Compacts the server's change log every ``GatewayConfiguration/compactionInterval``,
    /// keeping the database configuration's retention.
    private func compactPeriodically() async {
        let schema = ServerSchema(SchemaDescription(entities: []), version: 0, name: schemaName)
        while !Task.isCancelled {
            try? await Task.sleep(for: configuration.compactionInterval)
            if Task.isCancelled { break }
            _ = try? await pool.withSession(schema, scope: nil) { session in
                try await session.compact(retention: self.configuration.database.retention)
            }
        }
    }
}

/// Which listening machines are told of a change whatever it touched: those not told for
/// ``rounds`` changes, when their turn comes (a ``rounds``-th of the machines, in order, at each
/// change). Every machine is so told at least once in `2 × rounds` changes, and at most
/// `⌈count / rounds⌉` machines per change that it does not concern.
package struct CatchUpTurns: Sendable {
    /// Below an eighth of a feed's chain (256 reads): a machine told in its turn still reads
    /// from the chain.
    package var rounds = 32
    /// The changes so far.
    package private(set) var change = 0
    private var start = 0

    /// A change's turn: its number, and the machines (by index) whose turn it is.
    package struct Turn: Sendable {
        package let change: Int
        package let rounds: Int
        package let indexes: Range<Int>
        package let count: Int

        /// Whether it is machine `index`'s turn.
        package func includes(_ index: Int) -> Bool { indexes.contains(index) || indexes.contains(index + count) }

        /// Whether a machine last told at change `told` is due.
        package func isDue(toldAt told: Int) -> Bool { change - told >= rounds }
    }

    package init(rounds: Int = 32) { self.rounds = rounds }

    /// The next change's turn among `count` machines.
    package mutating func next(count: Int) -> Turn {
        change += 1
        guard count > 0 else { return Turn(change: change, rounds: rounds, indexes: 0..<0, count: 0) }
        let share = (count + rounds - 1) / rounds
        let first = start % count
        start = (first + share) % count
        return Turn(change: change, rounds: rounds, indexes: first..<(first + share), count: count)
    }
}
