import Foundation
import NIOSSL
import PostgresNIO

extension SyncConfiguration {
    /// The postgres-nio configuration of one connection to the server: TLS as ``tls`` asks
    /// (`verify-full` checks the certificate against ``rootCertificate`` or the system's
    /// roots), a connection timeout of 5 seconds.
    package func connectionConfiguration() throws -> PostgresConnection.Configuration {
        let tlsMode: PostgresConnection.Configuration.TLS
        switch tls {
        case .disable:
            tlsMode = .disable
        case .prefer, .require:
            var tlsConfiguration = TLSConfiguration.makeClientConfiguration()
            tlsConfiguration.certificateVerification = .none
            let context = try NIOSSLContext(configuration: tlsConfiguration)
            tlsMode = tls == .prefer ? .prefer(context) : .require(context)
        case .verifyFull:
            var tlsConfiguration = TLSConfiguration.makeClientConfiguration()
            tlsConfiguration.certificateVerification = .fullVerification
            if let rootCertificate { tlsConfiguration.trustRoots = .file(rootCertificate) }
            tlsMode = .require(try NIOSSLContext(configuration: tlsConfiguration))
        }
        var result = PostgresConnection.Configuration(
            host: host, port: port, username: username, password: password, database: database, tls: tlsMode)
        result.options.connectTimeout = .seconds(5)
        return result
    }
}
