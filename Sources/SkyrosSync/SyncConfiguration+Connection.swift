import Foundation
import NIOSSL
import PostgresNIO

extension SyncConfiguration {
    /// The postgres-nio configuration of one connection to the server, as
    /// ``clientConfiguration()`` makes a pool's: the Unix socket or host and port, TLS as
    /// ``tls`` asks (`verify-ca`/`verify-full` check the certificate against
    /// ``rootCertificate`` or the system's roots), the connect timeout.
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
            var tlsConfiguration = TLSConfiguration.makeClientConfiguration()
            let tlsMode: PostgresConnection.Configuration.TLS
            switch tls {
            case .disable:
                tlsMode = .disable
            case .prefer, .require:
                tlsConfiguration.certificateVerification = .none
                let context = try NIOSSLContext(configuration: tlsConfiguration)
                tlsMode = tls == .prefer ? .prefer(context) : .require(context)
            case .verifyCA, .verifyFull:
                tlsConfiguration.certificateVerification = tls == .verifyFull ? .fullVerification : .noHostnameVerification
                if let rootCertificate { tlsConfiguration.trustRoots = .file(rootCertificate) }
                tlsMode = .require(try NIOSSLContext(configuration: tlsConfiguration))
            }
            result = PostgresConnection.Configuration(
                host: host, port: port, username: username, password: password, database: database, tls: tlsMode)
        }
        result.options.connectTimeout = .seconds(Int64(Self.connectTimeout.components.seconds))
        return result
    }
}
