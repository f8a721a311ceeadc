import Foundation
import NIOSSL
import PostgresNIO
import Skyros

// MARK: - postgres-nio

extension SyncConfiguration {
    /// The configuration of a postgres-nio client (a pool) for the first server: host and
    /// port (or the Unix socket), role, password, database; TLS as ``tls`` says (`prefer` and `require`
    /// without checking the certificate, `verify-ca` against the CA, `verify-full` against the
    /// CA and the host name or IP address; the CA is ``rootCertificate`` or the system's); a
    /// short connect timeout (``connectTimeout``) and a keep-alive query on idle connections
    /// (``keepAliveFrequency``).
    ///
    /// - Throws: ``SkyrosError/Code/syncConfiguration`` when the root certificate file
    ///   cannot be read.
    package func clientConfiguration() throws -> PostgresClient.Configuration {
        var configuration: PostgresClient.Configuration
        if let socketPath {
            configuration = PostgresClient.Configuration(
                unixSocketPath: socketPath, username: username, password: password, database: database)
        } else {
            configuration = PostgresClient.Configuration(
                host: host, port: port, username: username, password: password, database: database, tls: try clientTLS()
            )
        }
        configuration.options.connectTimeout = Self.connectTimeout
        configuration.options.keepAliveBehavior = .init(frequency: Self.keepAliveFrequency)
        return configuration
    }

    /// postgres-nio's TLS for ``tls``.
    private func clientTLS() throws -> PostgresClient.Configuration.TLS {
        guard let settings = try tlsSettings() else { return .disable }
        return tls == .prefer ? .prefer(settings) : .require(settings)
    }

    /// The TLS settings ``tls`` asks for (nil: no TLS): `prefer` and `require` without checking
    /// the certificate, `verify-ca` against the CA, `verify-full` against the CA and the host
    /// name; the CA is ``rootCertificate`` or the system's.
    ///
    /// - Throws: ``SkyrosError/Code/syncConfiguration`` when the root certificate cannot be read.
    package func tlsSettings() throws -> TLSConfiguration? {
        var tlsConfiguration = TLSConfiguration.makeClientConfiguration()
        switch tls {
        case .disable:
            return nil
        case .prefer, .require:
            tlsConfiguration.certificateVerification = .none
        case .verifyCA, .verifyFull:
            tlsConfiguration.certificateVerification = tls == .verifyFull ? .fullVerification : .noHostnameVerification
            if let rootCertificate {
                guard access(rootCertificate, R_OK) == 0 else {
                    throw Self.invalid(
                        "cannot read the CA certificate \(rootCertificate) (sslrootcert): \(String(cString: strerror(errno)))"
                    )
                }
                tlsConfiguration.trustRoots = .file(rootCertificate)
            }
        }
        return tlsConfiguration
    }
}
