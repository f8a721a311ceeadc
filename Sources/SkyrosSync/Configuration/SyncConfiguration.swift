import Foundation
import NIOSSL
import PostgresNIO
import Skyros

/// Where and how a group's daemon syncs with PostgreSQL (docs/SYNC.md): the server, the role,
/// the schema that holds the group's tables, TLS. Made from `--sync URL`, `SKYROS_SYNC_URL`
/// or the container's `sync.conf` (see ``resolve(group:container:url:passwordFile:schema:environment:)``);
/// the password never comes from the command line, and no description of a configuration
/// (``redacted``, `description`, a mirror) contains it.
///
/// The URL is libpq's, restricted to what a daemon needs:
///
/// ```
/// postgresql://user@host:port/database?sslmode=verify-full&sslrootcert=/etc/ssl/ca.pem&schema=todo&retention=604800
/// ```
///
/// `postgres://` is accepted too; the port defaults to 5432 and the database to the user's
/// name; an IPv6 address goes in brackets (`[::1]`); a host that is a directory,
/// percent-encoded (`%2Fvar%2Frun%2Fpostgresql`), is the directory of PostgreSQL's Unix
/// socket (peer authentication, no TLS).
///
/// Several servers (a primary and its standbys) are written as libpq writes them, and tried
/// in order until one accepts the session ``targetSessionAttributes`` asks for (see
/// ``connect(on:id:logger:)``):
///
/// ```
/// postgresql://user@db1:5432,db2:5433/database?target_session_attrs=read-write
/// ```
package struct SyncConfiguration: Sendable, Equatable {
    /// One server of a configuration: a host name or address and a port, or the directory of
    /// a Unix socket.
    package struct Server: Sendable, Equatable, CustomStringConvertible {
        /// The host name or address (`127.0.0.1`, `::1` without brackets), or the directory of
        /// the server's Unix socket when it starts with `/` (see ``socketPath``).
        package var host: String
        /// The port (5432 by default); with a Unix socket, the number in its file name.
        package var port: Int

        /// A server at `host` and `port`.
        package init(host: String, port: Int = SyncConfiguration.defaultPort) {
            self.host = host
            self.port = port
        }

        /// The path of the server's Unix socket when ``host`` is a directory (libpq's
        /// `<directory>/.s.PGSQL.<port>`); nil for a TCP connection.
        package var socketPath: String? {
            host.hasPrefix("/") ? "\(host.hasSuffix("/") ? String(host.dropLast()) : host)/.s.PGSQL.\(port)" : nil
        }

        /// The server as a URL writes it: `host:port`, `[::1]:port`, `%2Fvar%2Frun%2Fpostgresql:port`.
        package var description: String {
            let shown =
                socketPath != nil
                ? host.replacingOccurrences(of: "/", with: "%2F") : host.contains(":") ? "[\(host)]" : host
            return "\(shown):\(port)"
        }
    }

    /// Which session a server must give to be used (the URL's `target_session_attrs`, libpq's
    /// parameter, restricted to the values a daemon that writes can use).
    package enum TargetSessionAttributes: String, Sendable, Equatable, CaseIterable {
        /// Any server that accepts the connection (libpq's default; the default with one host).
        case any
        /// A server whose sessions may write (`transaction_read_only` is off): a primary, not a
        /// standby nor a server made read-only by `default_transaction_read_only`. The default
        /// with several hosts, since the daemon uploads.
        case readWrite = "read-write"
        /// A server that is not in recovery (`pg_is_in_recovery()` is false): a primary.
        case primary
    }

    /// How the connection is encrypted (the URL's `sslmode`).
    package enum TLSMode: String, Sendable, Equatable, CaseIterable {
        /// No TLS (`sslmode=disable`).
        case disable
        /// TLS when the server offers it, the certificate not checked (`sslmode=prefer`, the default).
        case prefer
        /// TLS or no connection, without checking the certificate (`sslmode=require`).
        case require
        /// TLS with the server's certificate checked against the CA, but not its host name
        /// (`sslmode=verify-ca`).
        case verifyCA = "verify-ca"
        /// TLS with the server's certificate checked against the CA, and its host name (or
        /// IP address) against the certificate (`sslmode=verify-full`).
        case verifyFull = "verify-full"

        /// Whether the server's certificate is checked against a CA.
        package var verifiesCertificate: Bool { self == .verifyCA || self == .verifyFull }
    }

    /// The servers, tried in order (at least one).
    package var servers: [Server]
    /// Which session a server must give to be used: ``TargetSessionAttributes/any`` with one
    /// server and ``TargetSessionAttributes/readWrite`` with several, unless the URL says.
    package var targetSessionAttributes: TargetSessionAttributes
    /// The first server's host name or address, or its Unix socket directory (see ``Server/host``).
    package var host: String { servers[0].host }
    /// The first server's port.
    package var port: Int { servers[0].port }
    /// The role the daemon logs in as.
    package var username: String
    /// The role's password, when the server asks for one (never logged).
    package var password: String?
    /// The database.
    package var database: String
    /// The PostgreSQL schema of the group's tables (by default derived from the group id,
    /// see ``schemaName(forGroup:)``).
    package var schema: String
    /// TLS.
    package var tls: TLSMode
    /// The CA certificate file for ``TLSMode/verifyFull`` and ``TLSMode/verifyCA``
    /// (`sslrootcert`); nil: the system's.
    package var rootCertificate: String?
    /// How long the server keeps its change log (seconds): a machine away for longer
    /// re-syncs from a snapshot.
    package var retention: TimeInterval
    /// The group id the daemon serves (from ``resolve(group:container:url:passwordFile:schema:environment:)``;
    /// nil when the configuration was made in code): recorded in the server schema by the first
    /// daemon or `--sync-setup`, so that another group whose id maps to the same schema name is
    /// refused instead of sharing its rows.
    package var group: String?
    /// Where the URL came from (`--sync`, `SKYROS_SYNC_URL`, the path of `sync.conf`), for
    /// the log; nil when the configuration was made in code.
    package var source: String?
    /// Where the password came from (`the file /etc/skyros/pw`, `SKYROS_SYNC_PASSWORD`, `the
    /// systemd credential skyros-sync-password`), for the log; nil when there is none.
    package var passwordSource: String?
    /// The file the password was read from (resolved), read again at every connection
    /// (nil: the password came from the URL or the environment, or there is none).
    package var passwordFilePath: String?
    /// What the daemon should log about the configuration without refusing it (a password
    /// file that other users can read).
    package var warnings: [String]
    /// The sync gateway the machine syncs through (a `wss://` URL, DESIGN §10); nil: PostgreSQL
    /// itself (the other properties then say which server).
    package var gateway: GatewayEndpoint?

    /// How long the server keeps its change log unless configured: 7 days.
    package static let defaultRetention: TimeInterval = 7 * 86_400
    /// PostgreSQL's port unless the URL gives one.
    package static let defaultPort = 5432
    /// How long connecting to the server may take before the attempt fails (and is retried
    /// later): short, so that an unreachable server makes the daemon offline quickly.
    package static let connectTimeout: Duration = .seconds(5)
    /// How often an idle connection checks the server is still there (`SELECT 1`).
    package static let keepAliveFrequency: Duration = .seconds(30)

    /// A configuration of one server; see the properties.
    package init(
        host: String, port: Int = 5432, username: String, password: String? = nil, database: String, schema: String,
        tls: TLSMode = .prefer, rootCertificate: String? = nil, retention: TimeInterval = 7 * 86_400,
        source: String? = nil, passwordSource: String? = nil, warnings: [String] = []
    ) {
        self.init(
            servers: [Server(host: host, port: port)], username: username, password: password, database: database,
            schema: schema, tls: tls, rootCertificate: rootCertificate, retention: retention, source: source,
            passwordSource: passwordSource, warnings: warnings)
    }

    /// A configuration of several servers, tried in order; see the properties.
    ///
    /// - Parameter targetSessionAttributes: nil: ``TargetSessionAttributes/any`` with one
    ///   server, ``TargetSessionAttributes/readWrite`` with several.
    /// - Precondition: `servers` is not empty.
    package init(
        servers: [Server], targetSessionAttributes: TargetSessionAttributes? = nil, username: String,
        password: String? = nil, database: String, schema: String, tls: TLSMode = .prefer,
        rootCertificate: String? = nil, retention: TimeInterval = 7 * 86_400, source: String? = nil,
        passwordSource: String? = nil, warnings: [String] = []
    ) {
        precondition(!servers.isEmpty, "a sync configuration names at least one server")
        self.servers = servers
        self.targetSessionAttributes = targetSessionAttributes ?? (servers.count > 1 ? .readWrite : .any)
        self.username = username
        self.password = password
        self.database = database
        self.schema = schema
        self.tls = tls
        self.rootCertificate = rootCertificate
        self.retention = retention
        self.source = source
        self.passwordSource = passwordSource
        self.warnings = warnings
    }

    /// The server schema of a group: its id lowercased, every character outside `[a-z0-9_]`
    /// made `_` (`com.example.todo` → `com_example_todo`).
    package static func schemaName(forGroup group: String) -> String {
        String(group.lowercased().map { ($0.isASCII && ($0.isLetter || $0.isNumber)) || $0 == "_" ? $0 : "_" })
    }

    /// The path of the first server's Unix socket when its host is a directory (libpq's
    /// `<directory>/.s.PGSQL.<port>`); nil for a TCP connection. See ``Server/socketPath``.
    package var socketPath: String? { servers[0].socketPath }

    /// The server as a log shows it, never the password:
    /// `postgresql://user@host:port/db (schema s, sslmode=prefer, password from SKYROS_SYNC_PASSWORD, from --sync)`;
    /// several servers as `host1:port1,host2:port2`, with `target_session_attrs=…` among the
    /// details unless it is `any`.
    package var redacted: String {
        if let gateway {
            var details = ["token from \(gateway.tokenSource ?? "nowhere")"]
            if let source { details.append("from \(source)") }
            return "\(gateway.url) (\(details.joined(separator: ", ")))"
        }
        let hosts = servers.map(\.description).joined(separator: ",")
        var details = ["schema \(schema)", "sslmode=\(tls.rawValue)"]
        if targetSessionAttributes != .any {
            details.append("target_session_attrs=\(targetSessionAttributes.rawValue)")
        }
        if let rootCertificate { details.append("sslrootcert=\(rootCertificate)") }
        if retention != Self.defaultRetention { details.append("retention \(Self.seconds(retention)) s") }
        details.append(passwordSource.map { "password from \($0)" } ?? "no password")
        if let source { details.append("from \(source)") }
        return "postgresql://\(username)@\(hosts)/\(database) (\(details.joined(separator: ", ")))"
    }

    /// A number of seconds without a useless `.0`.
    private static func seconds(_ value: TimeInterval) -> String {
        value == value.rounded() && abs(value) < 1e15 ? String(Int64(value)) : String(value)
    }
}

extension SyncConfiguration: CustomStringConvertible, CustomReflectable {
    /// ``redacted``: interpolating a configuration into a message never shows the password.
    package var description: String { redacted }

    /// The properties, the password replaced by `<redacted>`: `dump` and the debugger never
    /// show it either.
    package var customMirror: Mirror {
        Mirror(
            self,
            children: [
                "servers": servers.map(\.description), "targetSessionAttributes": targetSessionAttributes,
                "username": username,
                "password": password == nil ? "nil" : "<redacted>", "database": database, "schema": schema,
                "tls": tls, "rootCertificate": rootCertificate as Any, "retention": retention,
                "source": source as Any, "passwordSource": passwordSource as Any, "warnings": warnings,
            ], displayStyle: .struct)
    }
}

// MARK: - Errors

extension SyncConfiguration {
    /// What to do with a password, in every message that refuses one where it does not belong.
    package static let passwordAdvice =
        "put the password in a file given by --sync-password-file (or password-file in sync.conf), "
        + "SKYROS_SYNC_PASSWORD, or the systemd credential skyros-sync-password"

    /// A ``SkyrosError/Code/syncConfiguration`` error.
    static func invalid(_ message: String) -> SkyrosError { SkyrosError(.syncConfiguration, message) }
}
