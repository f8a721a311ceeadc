import Foundation
import Logging
import NIOCore
import NIOSSL
import PostgresNIO

extension SyncConfiguration {
    /// The postgres-nio configuration of one connection to the first server, as
    /// ``clientConfiguration()`` makes a pool's: the Unix socket or host and port, TLS as
    /// ``tls`` asks (``tlsSettings()``), the connect timeout. See ``connectionConfiguration(to:)``.
    package func connectionConfiguration() throws -> PostgresConnection.Configuration {
        try connectionConfiguration(to: servers[0])
    }

    /// The postgres-nio configuration of one connection to `server`: its Unix socket or host and
    /// port, TLS as ``tls`` asks (``tlsSettings()``), the connect timeout.
    ///
    /// The sync engine holds its connections itself (one for its exchanges, one for LISTEN):
    /// it uploads in order on one connection, and its state machine must see each failure to
    /// go offline and back (a pool retries behind the caller's back).
    ///
    /// - Throws: ``SkyrosError/Code/syncConfiguration`` when the root certificate file
    ///   cannot be read.
    package func connectionConfiguration(to server: Server) throws -> PostgresConnection.Configuration {
        connectionConfiguration(to: server, tls: server.socketPath == nil ? try connectionTLS() : .disable)
    }

    /// postgres-nio's TLS for a TCP connection, as ``tls`` asks.
    private func connectionTLS() throws -> PostgresConnection.Configuration.TLS {
        guard let settings = try tlsSettings() else { return .disable }
        let context = try NIOSSLContext(configuration: settings)
        return tls == .prefer ? .prefer(context) : .require(context)
    }

    private func connectionConfiguration(to server: Server, tls: PostgresConnection.Configuration.TLS)
        -> PostgresConnection.Configuration
    {
        var result: PostgresConnection.Configuration
        if let socketPath = server.socketPath {
            result = PostgresConnection.Configuration(
                unixSocketPath: socketPath, username: username, password: password, database: database)
        } else {
            result = PostgresConnection.Configuration(
                host: server.host, port: server.port, username: username, password: password, database: database,
                tls: tls)
        }
        result.options.connectTimeout = .seconds(Int64(Self.connectTimeout.components.seconds))
        return result
    }

    /// A connection to the first server, in ``servers``' order, that accepts one and gives
    /// the session ``targetSessionAttributes`` asks for, as libpq chooses: each server is
    /// given ``connectTimeout`` to connect; with ``TargetSessionAttributes/readWrite`` or
    /// ``TargetSessionAttributes/primary`` the new session is asked (within the same time)
    /// whether the server is in recovery and whether its transactions are read-only, and a
    /// standby (or a read-only server) is closed and the next server tried. Every call starts
    /// again at the first server, so a daemon that lost its connection finds whichever server
    /// is the primary now.
    ///
    /// - Parameters:
    ///   - eventLoop: The event loop the connection runs on.
    ///   - id: The connection's id in postgres-nio's logs.
    ///   - logger: postgres-nio's logger.
    /// - Returns: The connection and the server it is to.
    /// - Throws: with one server and ``TargetSessionAttributes/any``, the error of the
    ///   connection as postgres-nio reports it; otherwise ``NoServerAvailable`` naming each
    ///   server and why it was not used. ``SkyrosError/Code/syncConfiguration`` when the root
    ///   certificate cannot be read.
    package func connect(on eventLoop: any EventLoop, id: Int, logger: Logger) async throws
        -> (connection: PostgresConnection, server: Server)
    {
        let tls = servers.contains { $0.socketPath == nil } ? try connectionTLS() : .disable
        var attempts: [NoServerAvailable.Attempt] = []
        for server in servers {
            let connection: PostgresConnection
            do {
                connection = try await PostgresConnection.connect(
                    on: eventLoop,
                    configuration: connectionConfiguration(to: server, tls: server.socketPath == nil ? tls : .disable),
                    id: id, logger: logger)
            } catch {
                if servers.count == 1 && targetSessionAttributes == .any { throw error }
                attempts.append(NoServerAvailable.Attempt(server: server, error: error))
                continue
            }
            if targetSessionAttributes == .any { return (connection, server) }
            do {
                guard let refusal = try await refusal(of: connection, logger: logger) else {
                    return (connection, server)
                }
                attempts.append(NoServerAvailable.Attempt(server: server, refusal: refusal))
            } catch {
                attempts.append(NoServerAvailable.Attempt(server: server, error: error))
            }
            try? await connection.close()
        }
        throw NoServerAvailable(attempts: attempts, target: targetSessionAttributes)
    }

    /// Why a new session does not give what ``targetSessionAttributes`` asks (nil: it does):
    /// libpq's checks, in one statement bounded by ``connectTimeout``. The statement's task runs
    /// on the connection's event loop, as the bound's timer does: a caller on Swift's
    /// cooperative pool, which a process embedding the daemon may keep busy for seconds (as a
    /// test run does), cannot make a prompt answer miss its bound.
    private func refusal(of connection: PostgresConnection, logger: Logger) async throws -> String? {
        let watchdog = Watchdog(connection, executor: SyncExecutor(eventLoop: connection.eventLoop))
        let (inRecovery, readOnly) = try await watchdog.bounded(Self.connectTimeout) {
            let rows = try await connection.query(
                "SELECT pg_is_in_recovery(), current_setting('transaction_read_only')", logger: logger)
            for try await (recovery, readOnly) in rows.decode((Bool, String).self) { return (recovery, readOnly) }
            return (false, "off")
        }
        switch targetSessionAttributes {
        case .any:
            return nil
        case .primary:
            return inRecovery ? "a standby (in recovery), not a primary" : nil
        case .readWrite:
            if inRecovery { return "a standby (in recovery), read-only" }
            return readOnly == "on" ? "read-only (transaction_read_only is on)" : nil
        }
    }

    /// None of a configuration's servers could be used: each one could not be reached, refused
    /// the connection, or gave a session other than ``targetSessionAttributes`` asks for (a
    /// standby when a primary is needed). The engine is offline (or in error, when every
    /// server refused it for a reason an operator must fix) and tries again from the first.
    package struct NoServerAvailable: Error, CustomStringConvertible {
        /// One server tried, and why it was not used.
        package struct Attempt: Sendable {
            /// The server.
            package var server: Server
            /// It gave a session of the wrong kind: which (nil when ``error`` says why).
            package var refusal: String?
            /// The connection or the session's check failed: how.
            package var error: (any Error)?

            /// An attempt at `server`, refused for `refusal` or failed with `error`.
            package init(server: Server, refusal: String? = nil, error: (any Error)? = nil) {
                self.server = server
                self.refusal = refusal
                self.error = error
            }
        }

        /// Every server tried, in order.
        package var attempts: [Attempt]
        /// The session they were asked for.
        package var target: TargetSessionAttributes

        /// The failure of `attempts` to give a `target` session.
        package init(attempts: [Attempt], target: TargetSessionAttributes) {
            self.attempts = attempts
            self.target = target
        }

        /// The message, with `reasons` (one per attempt, in order) saying why each server was not
        /// used: `no server of the sync URL could be used (target_session_attrs=read-write):
        /// 10.0.0.1:5432: cannot reach the server (connection refused); 10.0.0.2:5432: a standby …`.
        package func description(reasons: [String]) -> String {
            let target = target == .any ? "" : " (target_session_attrs=\(target.rawValue))"
            let servers = zip(attempts, reasons).map { "\($0.server): \($1)" }.joined(separator: "; ")
            return "no server of the sync URL could be used\(target): \(servers)"
        }

        /// ``description(reasons:)`` with each attempt's ``Attempt/refusal``, or its error in words.
        package var description: String {
            description(
                reasons: attempts.map { attempt in
                    if let refusal = attempt.refusal { return refusal }
                    guard let error = attempt.error else { return "not used" }
                    if ServerSession.serverReport(error) != nil { return ServerSession.describe(error) }
                    if let error = error as? PSQLError {
                        return "cannot reach the server (\(error.underlying.map { "\($0)" } ?? "\(error.code)"))"
                    }
                    return "\(error)"
                })
        }
    }
}
