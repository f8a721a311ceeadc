import Foundation
import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import Synchronization

/// The ``SyncServer`` that is PostgreSQL itself (docs/SYNC.md): connections of postgres-nio on the
/// engine's event loop, every statement bounded by a ``Watchdog``, the upload and checkpoint
/// statements of ``ServerSession``, LISTEN/NOTIFY on a connection of its own.
package struct PostgresSyncServer: SyncServer {
    let configuration: SyncConfiguration
    /// The longest one statement may wait for its answer (``SyncEngine/Settings/statementTimeout``).
    let statementTimeout: Duration
    /// Whether the role may create and migrate the group's tables.
    let createsSchema: Bool
    let executor: SyncExecutor
    let logger: Logger

    /// The server of `configuration`, its statements bounded by `statementTimeout`, its
    /// connections on `executor`'s event loop.
    package init(
        configuration: SyncConfiguration, statementTimeout: Duration, createsSchema: Bool, executor: SyncExecutor
    ) {
        self.configuration = configuration
        self.statementTimeout = statementTimeout
        self.createsSchema = createsSchema
        self.executor = executor
        var logger = Logger(label: "skyros.sync")
        logger.logLevel = .critical
        self.logger = logger
    }

    package var redacted: String { configuration.redacted }

    package func connect(machine: UUID, closed: @escaping @Sendable () -> Void) async throws -> any SyncServerConnection
    {
        let (connection, server) = try await open()
        connection.closeFuture.whenComplete { _ in closed() }
        let watchdog = Watchdog(connection, executor: executor)
        return PostgresSyncConnection(
            connection: connection, serverName: configuration.servers.count > 1 ? "\(server)" : nil, watchdog: watchdog,
            server: self)
    }

    /// A connection to the configuration's first server that qualifies, in order (see
    /// ``SyncConfiguration/connect(on:id:logger:)``): every connection, after any failure,
    /// starts again at the first server, so both of the engine's find the primary of the moment.
    ///
    /// The password is read again from its file (``SyncConfiguration/passwordFilePath``) at
    /// every connection: a corrected password file is used at the next retry, without a restart.
    func open() async throws -> (connection: PostgresConnection, server: SyncConfiguration.Server) {
        var configuration = self.configuration
        configuration.rereadPassword()
        return try await configuration.connect(
            on: executor.eventLoop, id: Int.random(in: 1...Int.max), logger: logger)
    }

    /// Whether one of the configuration's servers accepts a TCP (or Unix socket) connection
    /// within ``probeTimeout``: the connection is closed at once, nothing sent (no backend
    /// does any work for it beyond its start).
    package func probe() async -> Bool {
        for server in configuration.servers {
            let bootstrap = ClientBootstrap(group: executor.eventLoop).connectTimeout(Self.probeTimeout)
            let channel: any Channel
            do {
                if let path = server.socketPath {
                    channel = try await bootstrap.connect(unixDomainSocketPath: path).get()
                } else {
                    channel = try await bootstrap.connect(host: server.host, port: server.port).get()
                }
            } catch {
                continue
            }
            channel.close(promise: nil)
            return true
        }
        return false
    }

    /// How long a probe's connection may take to be accepted.
    static let probeTimeout = TimeAmount.milliseconds(200)

    /// Keeps a LISTEN connection open, calling `notify` at each notification. The connection
    /// is pinged every second statement timeout: one that stopped answering fails the listen.
    package func listen(machine: UUID, _ notify: @escaping @Sendable (UInt64?) -> Void) async throws {
        let (connection, _) = try await open()
        defer { connection.closeInBackground() }
        let watchdog = Watchdog(connection, executor: executor)
        let ping = statementTimeout
        let channel = ServerSchema.channel(ofSchema: configuration.schema)
        try await withThrowingTaskGroup(of: Void.self) { group in
            group.addTask {
                try await connection.listen(on: channel) { notifications in
                    notify(nil)  // whatever happened while it was not listening
                    for try await notification in notifications {
                        // The payload is the transaction's id (empty from a server set up by an older version).
                        notify(UInt64(notification.payload))
                    }
                }
            }
            group.addTask { [logger] in
                while !Task.isCancelled {
                    try await Task.sleep(for: ping * 2)
                    _ = try await watchdog.bounded(ping) {
                        try await connection.query("SELECT 1", logger: logger).collect().count
                    }
                }
            }
            try await group.next()
            group.cancelAll()
        }
    }

    package func classify(_ error: any Error) -> (SyncEngine.Status.State, String) {
        ServerErrors.classify(error, configuration: configuration)
    }
}

/// One engine connection to PostgreSQL: a ``ServerSession`` of the current schema on it.
final class PostgresSyncConnection: SyncServerConnection {
    let connection: PostgresConnection
    let serverName: String?
    let watchdog: Watchdog
    let server: PostgresSyncServer
    /// The connection's prepared statements, kept across migrations of the schema.
    let statements = PreparedStatements()
    private let current: Mutex<ServerSession?> = Mutex(nil)
    /// Whether the session's waits are bounded yet (``ServerSession/limitWaits(statementTimeout:)``).
    private let waitsLimited = Mutex(false)

    init(connection: PostgresConnection, serverName: String?, watchdog: Watchdog, server: PostgresSyncServer) {
        self.connection = connection
        self.serverName = serverName
        self.watchdog = watchdog
        self.server = server
    }

    private func session(_ schema: ServerSchema? = nil) throws -> ServerSession {
        if let schema {
            let made = ServerSession(
                connection: connection, schema: schema, logger: server.logger, watchdog: watchdog,
                timeout: server.statementTimeout,
                statements: statements)
            current.withLock { $0 = made }
            return made
        }
        guard let session = current.withLock({ $0 }) else {
            throw SyncServerNotPrepared()
        }
        return session
    }

    /// A statement before ``prepare(_:)``: a defect of the engine.
    struct SyncServerNotPrepared: Error, CustomStringConvertible {
        var description: String { "the sync connection was used before its schema was prepared" }
    }

    /// Creates or migrates the server's tables, or checks them when the role may not; the
    /// first time, bounds the waits of this connection's statements first
    /// (``ServerSession/limitWaits(statementTimeout:)``).
    func prepare(_ schema: ServerSchema) async throws {
        let session = try session(schema)
        if !waitsLimited.withLock({ $0 }) {
            try await session.limitWaits(statementTimeout: server.statementTimeout)
            waitsLimited.withLock { $0 = true }
        }
        if server.createsSchema {
            do {
                try await session.ensureSchema()
                if let group = server.configuration.group { try await session.claimGroup(group) }
                return
            } catch let error as PSQLError where error.serverInfo?[.sqlState] == "42501" {
                // Insufficient privilege: an operator set the schema up (--sync-setup).
            }
        }
        let missing = try await session.missingTablesAndColumns()
        guard missing.isEmpty else {
            // Tables this role may not even see (another group's schema) are not missing.
            if try await session.schemaExistsWithoutUsage() {
                throw ServerErrors.NoSchemaUsage(role: server.configuration.username, schema: schema.name)
            }
            throw ServerErrors.SetupNeeded(missing: missing, schema: schema.name)
        }
        if let group = server.configuration.group { try await session.claimGroup(group) }
    }

    func uploadedThrough(machine: UUID) async throws -> Int64 {
        try await session().uploadedThrough(machine: machine)
    }

    func digests(machine: UUID, numbers: [Int64]) async throws -> [Int64: Int64] {
        try await session().digests(machine: machine, numbers: numbers)
    }

    func upload(_ batch: [QueuedEntry], machine: UUID) async throws -> (
        outcomes: [ServerSession.UploadOutcome], transactions: [UInt64]?
    ) {
        try await session().uploadReportingTransactions(batch, machine: machine)
    }

    func readCheckpoint(
        after previous: String?, rejectedAfter: Int64, machine: UUID, pageSize: Int,
        stage: @escaping @Sendable (SnapshotPage) async -> String?
    ) async throws -> Checkpoint {
        try await session().readCheckpoint(
            after: previous, rejectedAfter: rejectedAfter, machine: machine, pageSize: pageSize, stage: stage)
    }

    func compact(retention: TimeInterval) async throws {
        try await session().compact(retention: retention)
    }

    func close() {
        connection.closeInBackground()
    }
}
