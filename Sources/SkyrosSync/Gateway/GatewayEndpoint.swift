import Foundation
import Skyros

/// A sync gateway a machine syncs through (DESIGN §10): `wss://host[:port]/G[?sslrootcert=/abs/ca.pem]`
/// and the file holding the machine's token.
package struct GatewayEndpoint: Sendable, Equatable {
    /// The gateway's host name or address.
    package var host: String
    /// Its port (443 unless the URL gives one).
    package var port: Int
    /// The group, the URL's path.
    package var group: String
    /// The CA certificate the gateway's certificate must be signed by (nil: the system's).
    package var rootCertificate: String?
    /// The file holding the token, read at every connection (a renewed token is used at the
    /// next one).
    package var tokenFile: String?
    /// Where the token file was named (for the log).
    package var tokenSource: String?

    /// An endpoint; see the properties.
    package init(
        host: String, port: Int, group: String, rootCertificate: String? = nil, tokenFile: String? = nil,
        tokenSource: String? = nil
    ) {
        self.host = host
        self.port = port
        self.group = group
        self.rootCertificate = rootCertificate
        self.tokenFile = tokenFile
        self.tokenSource = tokenSource
    }

    /// The URL as a log shows it (a URL holds no secret).
    package var url: String {
        "wss://\(host.contains(":") ? "[\(host)]" : host):\(port)/\(group)"
            + (rootCertificate.map { "?sslrootcert=\($0)" } ?? "")
    }

    /// The query keys a gateway URL may carry.
    package static let urlKeys = ["sslrootcert"]

    /// The endpoint a `wss://` URL names.
    ///
    /// - Throws: ``SkyrosError/Code/syncConfiguration`` naming the problem: a user or password in
    ///   it, no host, a bad port, no group, an unknown query key, a relative `sslrootcert`.
    package static func parse(_ text: String) throws -> GatewayEndpoint {
        guard text.hasPrefix("wss://") else {
            throw SkyrosError(.syncConfiguration, "a gateway URL starts with wss:// (TLS is required)")
        }
        var rest = Substring(text.dropFirst("wss://".count))
        var query: Substring = ""
        if let mark = rest.firstIndex(of: "?") {
            query = rest[rest.index(after: mark)...]
            rest = rest[..<mark]
        }
        guard let slash = rest.firstIndex(of: "/") else {
            throw SkyrosError(.syncConfiguration, "the gateway URL \(text) names no group: wss://host:port/GROUP")
        }
        let authority = rest[..<slash]
        let group = String(rest[rest.index(after: slash)...])
        guard !authority.contains("@") else {
            throw SkyrosError(
                .syncConfiguration,
                "a gateway URL carries no user or password: the machine's token is in a file (--sync-token-file, token-file in sync.conf, SKYROS_SYNC_TOKEN_FILE)"
            )
        }
        guard !group.isEmpty, !group.contains("/") else {
            throw SkyrosError(.syncConfiguration, "the gateway URL \(text) names no group: wss://host:port/GROUP")
        }
        let (host, port) = try SyncConfiguration.parseHostPort(authority)
        guard !host.isEmpty else { throw SkyrosError(.syncConfiguration, "the gateway URL \(text) has no host") }
        var endpoint = GatewayEndpoint(host: host, port: port ?? 443, group: group)
        for pair in query.split(separator: "&") where !pair.isEmpty {
            let parts = pair.split(separator: "=", maxSplits: 1)
            let key = String(parts[0])
            let value = parts.count > 1 ? String(parts[1]).removingPercentEncoding ?? String(parts[1]) : ""
            guard key == "sslrootcert" else {
                throw SkyrosError(
                    .syncConfiguration,
                    "the gateway URL has an unknown query key '\(key)' (known: \(urlKeys.joined(separator: ", ")))")
            }
            guard value.hasPrefix("/") else {
                throw SkyrosError(
                    .syncConfiguration, "sslrootcert in the gateway URL must be an absolute path, not '\(value)'")
            }
            endpoint.rootCertificate = value
        }
        return endpoint
    }

    /// The token, read from ``tokenFile`` now (trailing newlines dropped).
    ///
    /// - Throws: ``SkyrosError/Code/syncConfiguration`` when there is no token file, or it
    ///   cannot be read or is empty.
    package func readToken() throws -> String {
        guard let tokenFile else {
            throw SkyrosError(
                .syncConfiguration,
                "no token for the gateway: give its file with --sync-token-file, token-file in sync.conf, SKYROS_SYNC_TOKEN_FILE, or the systemd credential skyros-sync-token"
            )
        }
        guard var text = try? String(contentsOfFile: tokenFile, encoding: .utf8) else {
            throw SkyrosError(.syncConfiguration, "the token file \(tokenFile) cannot be read")
        }
        while text.hasSuffix("\n") || text.hasSuffix("\r") || text.hasSuffix(" ") { text.removeLast() }
        guard !text.isEmpty else { throw SkyrosError(.syncConfiguration, "the token file \(tokenFile) is empty") }
        return text
    }
}
