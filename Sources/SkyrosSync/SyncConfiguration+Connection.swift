import Foundation
import NIOSSL
import PostgresNIO

extension SyncConfiguration {
    /// The postgres-nio configuration of one connection to the server, as
    /// ``clientConfiguration()`` makes a pool's: the Unix socket or host and port, TLS as
    /// ``tls`` asks (``tlsSettings()``), the connect timeout.
    ///
    /// The sync engine holds its connections itself (one for its exchanges, one for LISTEN):
    /// it uploads in order on one connection, and its state machine must see each failure to
    /// go offline and back (a pool retries behind the caller's back).
    package func connectionConfiguration() throws -> PostgresConnection.Configuration {
        var result: PostgresConnection.Configuration
        if let socketPath {
            result = PostgresConnection.Configuration(
                unixSocketPath: socketPath, username: username, password: password, database: database)
        } else {
            var mode = PostgresConnection.Configuration.TLS.disable
            if let settings = try tlsSettings() {
                let context = try NIOSSLContext(configuration: settings)
                mode = tls == .prefer ? .prefer(context) : .require(context)
            }
            result = PostgresConnection.Configuration(
                host: host, port: port, username: username, password: password, database: database, tls: mode)
        }
        result.options.connectTimeout = .seconds(Int64(Self.connectTimeout.components.seconds))
        return result
    }
}
