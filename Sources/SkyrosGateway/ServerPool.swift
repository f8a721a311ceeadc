import Foundation
import Logging
import NIOCore
import PostgresNIO
import Skyros
import SkyrosSync
import Synchronization

/// The gateway's few connections to PostgreSQL, shared by every machine it serves: a request
/// (an upload, a checkpoint read) leases one for its statements and gives it back. At most
/// `size` are open; a request beyond waits for one.
package actor ServerPool {
    /// A connection of the pool, its prepared statements and its watchdog.
    package final class Pooled: Sendable {
        package let connection: PostgresConnection
        package let statements = PreparedStatements()
        package let watchdog: Watchdog
        /// Whether its waits are bounded yet (``ServerSession/limitWaits(statementTimeout:)``).
        let waitsLimited = Mutex(false)

        init(connection: PostgresConnection) {
            self.connection = connection
            watchdog = Watchdog(connection)
        }
    }

    private let configuration: SyncConfiguration
    private let size: Int
    private let eventLoop: any EventLoop
    private let statementTimeout: Duration
    private let logger: Logger
    private var idle: [Pooled] = []
    private var open = 0
    private var waiters: [CheckedContinuation<Pooled?, Never>] = []

    /// A pool of at most `size` connections of `configuration`.
    package init(
        configuration: SyncConfiguration, size: Int, eventLoop: any EventLoop, statementTimeout: Duration,
        logger: Logger
    ) {
        self.configuration = configuration
        self.size = max(1, size)
        self.eventLoop = eventLoop
        self.statementTimeout = statementTimeout
        self.logger = logger
    }

    /// The connections open now.
    package var openCount: Int { open }

    /// Runs `body` with a session of `schema` (and `scope`) on a connection of the pool.
    package func withSession<T: Sendable>(
        _ schema: ServerSchema, scope: (any SyncScope)?, _ body: @Sendable (ServerSession) async throws -> T
    ) async throws -> T {
        let pooled = try await lease()
        var session = ServerSession(
            connection: pooled.connection, schema: schema, logger: logger, watchdog: pooled.watchdog,
            timeout: statementTimeout, statements: pooled.statements)
        session.scope = scope
        do {
            if !pooled.waitsLimited.withLock({ $0 }) {
                try await session.limitWaits(statementTimeout: statementTimeout)
                pooled.waitsLimited.withLock { $0 = true }
            }
            let value = try await body(session)
            release(pooled)
            return value
        } catch {
            // A statement that failed inside a transaction left it rolled back (inTransaction);
            // a connection that broke is dropped.
            release(pooled)
            throw error
        }
    }

    private func lease() async throws -> Pooled {
        if let pooled = idle.popLast() { return pooled }
        if open >= size {
            if let handed = await withCheckedContinuation({ waiters.append($0) }) { return handed }
            // A connection closed: this request opens its replacement.
        }
        open += 1
        do {
            var configuration = self.configuration
            configuration.rereadPassword()
            let (connection, _) = try await configuration.connect(
                on: eventLoop, id: Int.random(in: 1...Int.max), logger: logger)
            return Pooled(connection: connection)
        } catch {
            open -= 1
            if !waiters.isEmpty { waiters.removeFirst().resume(returning: nil) }
            throw error
        }
    }

    private func release(_ pooled: Pooled) {
        if pooled.connection.isClosed {
            open -= 1
            if !waiters.isEmpty { waiters.removeFirst().resume(returning: nil) }
            return
        }
        if !waiters.isEmpty {
            waiters.removeFirst().resume(returning: pooled)
        } else {
            idle.append(pooled)
        }
    }

    /// Closes the idle connections (the gateway is stopping).
    package func close() async {
        for pooled in idle { try? await pooled.connection.close() }
        open -= idle.count
        idle = []
    }
}
