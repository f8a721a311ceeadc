import Foundation
import NIOSSL
import PostgresNIO
import Skyros

/// Where and how a group's daemon syncs with PostgreSQL (DESIGN §9): the server, the role,
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
    /// Where the URL came from (`--sync`, `SKYROS_SYNC_URL`, the path of `sync.conf`), for
    /// the log; nil when the configuration was made in code.
    package var source: String?
    /// Where the password came from (`the file /etc/skyros/pw`, `SKYROS_SYNC_PASSWORD`, `the
    /// systemd credential skyros-sync-password`), for the log; nil when there is none.
    package var passwordSource: String?
    /// What the daemon should log about the configuration without refusing it (a password
    /// file that other users can read).
    package var warnings: [String]

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

// MARK: - The URL

extension SyncConfiguration {
    /// The query keys a sync URL may carry.
    package static let urlKeys = ["sslmode", "sslrootcert", "schema", "retention", "target_session_attrs", "port"]

    /// What a sync URL says, before the group and the other sources fill in the rest.
    struct ParsedURL {
        var servers: [Server]
        /// As the query gives it (nil: the default for the number of servers).
        var targetSessionAttributes: TargetSessionAttributes?
        var username: String
        var database: String
        var tls: TLSMode
        var rootCertificate: String?
        var schema: String?
        var retention: TimeInterval?
    }

    /// The configuration a sync URL describes:
    /// `postgresql://user@host:port/db?sslmode=…&sslrootcert=…&schema=…&retention=SECONDS`
    /// (also `postgres://`; see ``SyncConfiguration``), or with several servers
    /// `postgresql://user@host1:port1,host2:port2/db?target_session_attrs=read-write`.
    ///
    /// - Parameters:
    ///   - url: The URL. It must name the user and carry no password.
    ///   - group: The application group, whose ``schemaName(forGroup:)`` is the schema when
    ///     the URL has no `schema=`.
    /// - Throws: ``SkyrosError/Code/syncConfiguration`` naming the problem (never echoing a
    ///   password): not a PostgreSQL URL, a password, no user, a bad host or port (or an empty
    ///   entry in a list of hosts, a `port=` list that does not match the hosts), an unknown
    ///   query key or a bad value, no schema (no `schema=` and no group) or an invalid one.
    package static func parse(url: String, group: String? = nil) throws -> SyncConfiguration {
        let parsed = try parseURL(url)
        let schema: String
        if let named = parsed.schema {
            schema = named
        } else if let group {
            schema = try derivedSchema(forGroup: group)
        } else {
            throw invalid("the sync URL names no schema: add schema=NAME to its query")
        }
        return SyncConfiguration(
            servers: parsed.servers, targetSessionAttributes: parsed.targetSessionAttributes,
            username: parsed.username, database: parsed.database, schema: schema, tls: parsed.tls,
            rootCertificate: parsed.rootCertificate, retention: parsed.retention ?? defaultRetention)
    }

    /// The schema derived from a group id, checked like a configured one.
    static func derivedSchema(forGroup group: String) throws -> String {
        let schema = schemaName(forGroup: group)
        if let problem = schemaNameProblem(schema) {
            throw invalid(
                "the group \(group) gives the server schema name '\(schema)', which \(problem): "
                    + "name the schema with --sync-schema, schema= in the URL, or schema in sync.conf")
        }
        return schema
    }

    /// Why a schema name cannot be used, or nil when it can: it must match
    /// `[a-z_][a-z0-9_]{0,62}` (a PostgreSQL identifier that needs no quotes and is not
    /// truncated) and not start with `pg_` (reserved for the system).
    package static func schemaNameProblem(_ name: String) -> String? {
        guard let first = name.unicodeScalars.first else { return "is empty" }
        guard name.unicodeScalars.count <= 63 else { return "is longer than PostgreSQL's 63 characters" }
        let lower = "abcdefghijklmnopqrstuvwxyz_".unicodeScalars
        let digits = "0123456789".unicodeScalars
        guard lower.contains(first) else { return "does not start with a lowercase letter or '_' ([a-z_][a-z0-9_]*)" }
        guard name.unicodeScalars.allSatisfy({ lower.contains($0) || digits.contains($0) }) else {
            return "has characters outside [a-z0-9_]"
        }
        if name.hasPrefix("pg_") { return "starts with pg_, which PostgreSQL reserves for its own schemas" }
        return nil
    }

    /// A configured schema name, or the error that says why it cannot be used.
    static func checkedSchema(_ name: String, from source: String) throws -> String {
        if let problem = schemaNameProblem(name) {
            throw invalid("\(source): the schema name '\(name)' \(problem); use [a-z_][a-z0-9_]{0,62}")
        }
        return name
    }

    /// A retention in seconds, or the error that says why it is not one.
    static func checkedRetention(_ text: String, from source: String) throws -> TimeInterval {
        guard let seconds = Double(text), seconds.isFinite, seconds > 0 else {
            throw invalid(
                "\(source): the retention '\(text)' is not a number of seconds greater than 0 (604800 is 7 days)")
        }
        return seconds
    }

    /// Splits and checks a sync URL. No message echoes the URL or its user part, so none can
    /// show a password.
    static func parseURL(_ text: String) throws -> ParsedURL {
        let example = "postgresql://user@host:5432/database"
        guard let separator = text.range(of: "://") else {
            throw invalid("the sync URL does not start with postgresql:// (as \(example))")
        }
        let scheme = text[..<separator.lowerBound]
        guard ["postgresql", "postgres"].contains(scheme.lowercased()) else {
            let shown = scheme.count <= 20 && scheme.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber) }
            throw invalid(
                "the sync URL starts with \(shown ? "\(scheme)://" : "something else") instead of postgresql:// (as \(example))"
            )
        }
        let rest = text[separator.upperBound...]
        let authorityEnd = rest.firstIndex { $0 == "/" || $0 == "?" || $0 == "#" } ?? rest.endIndex
        let authority = rest[..<authorityEnd]
        guard let at = authority.lastIndex(of: "@") else {
            if rest.contains("@") {
                // An unencoded '/', '?' or '#' in the user part (or in a password): say nothing of it.
                throw invalid(
                    "the user part of the sync URL is malformed: a '/', '?', '#', '@' or ':' in a user name is "
                        + "percent-encoded, and the URL never carries a password: \(passwordAdvice)")
            }
            throw invalid("the sync URL names no user: give the role as \(example)")
        }
        let userInfo = authority[..<at]
        if userInfo.contains(":") {
            throw invalid(
                "the sync URL carries a password, and a password never goes in a URL, on the command line "
                    + "or in a log: remove it from the URL (\(example)) and \(passwordAdvice)")
        }
        guard let username = userInfo.removingPercentEncoding, !username.isEmpty else {
            throw invalid(
                userInfo.isEmpty
                    ? "the sync URL names no user: give the role as \(example)"
                    : "the user name in the sync URL has a malformed percent-encoding (%XX)")
        }
        let hosts = try parseHosts(authority[authority.index(after: at)...])

        var pathAndQuery = rest[authorityEnd...]
        if pathAndQuery.contains("#") {
            throw invalid(
                "the sync URL has a fragment (#…), which means nothing here: remove it, or percent-encode '#' as %23")
        }
        var database = username
        let queryStart = pathAndQuery.firstIndex(of: "?")
        let path = pathAndQuery[..<(queryStart ?? pathAndQuery.endIndex)]
        if path.hasPrefix("/") {
            let name = path.dropFirst()
            if name.contains("/") {
                throw invalid(
                    "the sync URL's path has more than a database name: a '/' in a database name is written %2F")
            }
            guard let decoded = name.removingPercentEncoding else {
                throw invalid("the database name in the sync URL has a malformed percent-encoding (%XX)")
            }
            if !decoded.isEmpty { database = decoded }
        }
        var parsed = ParsedURL(
            servers: hosts.map { Server(host: $0.host, port: $0.port ?? defaultPort) }, username: username,
            database: database, tls: .prefer)
        if let queryStart {
            pathAndQuery = pathAndQuery[pathAndQuery.index(after: queryStart)...]
            if let ports = try parseQuery(pathAndQuery, into: &parsed) {
                try apply(ports: ports, explicit: hosts.map { $0.port != nil }, to: &parsed.servers)
            }
        }
        if parsed.rootCertificate != nil, !parsed.tls.verifiesCertificate {
            throw invalid(
                "the sync URL gives sslrootcert but sslmode=\(parsed.tls.rawValue), which checks no certificate: "
                    + "add sslmode=verify-full (or verify-ca), or remove sslrootcert")
        }
        let sockets = parsed.servers.filter { $0.socketPath != nil }
        if !sockets.isEmpty, parsed.tls != .prefer, parsed.tls != .disable {
            throw invalid(
                "the sync URL's host\(parsed.servers.count > 1 ? " \(sockets[0])" : "") is a Unix socket directory, "
                    + "where there is no TLS: remove sslmode=\(parsed.tls.rawValue), or give a host name or address")
        }
        if sockets.count == parsed.servers.count { parsed.tls = .disable }
        return parsed
    }

    /// The servers of a URL's authority (what follows the `@`): one host, or a list as libpq
    /// writes it, `host1:port1,host2,[::1]:port3`; a port is nil where the URL gives none.
    static func parseHosts(_ text: Substring) throws -> [(host: String, port: Int?)] {
        let entries = text.split(separator: ",", omittingEmptySubsequences: false)
        guard entries.count > 1 else { return [try parseHostPort(text)] }
        return try entries.enumerated().map { item throws -> (host: String, port: Int?) in
            let (index, entry) = item
            let place = "host \(index + 1) of \(entries.count)"
            guard !entry.isEmpty else {
                throw invalid(
                    "the sync URL's list of hosts has an empty entry (\(place)): write host1:port1,host2:port2 "
                        + "with no empty entry and no space")
            }
            do {
                return try parseHostPort(entry)
            } catch let error as SkyrosError {
                throw invalid("the sync URL's \(place): \(error.message)")
            }
        }
    }

    /// The URL's `port=` list (libpq's: one port for every host, or one per host, an empty
    /// entry standing for 5432), into `servers`; `explicit` tells which hosts gave their own.
    static func apply(ports text: String, explicit: [Bool], to servers: inout [Server]) throws {
        if explicit.contains(true) {
            throw invalid(
                "the sync URL gives ports both after its hosts and in port=: give each port once, "
                    + "after its host (host1:port1,host2:port2) or in port= (port=port1,port2)")
        }
        let entries = text.split(separator: ",", omittingEmptySubsequences: false)
        guard entries.count == 1 || entries.count == servers.count else {
            throw invalid(
                "the sync URL's port= has \(entries.count) ports for \(servers.count) "
                    + "host\(servers.count == 1 ? "" : "s"): give one port for every host, or one per host in the hosts' order")
        }
        for index in servers.indices {
            let entry = entries.count == 1 ? entries[0] : entries[index]
            servers[index].port = entry.isEmpty ? defaultPort : try checkedPort(entry, from: "port= of the sync URL")
        }
    }

    /// A port number from 1 to 65535, or the error that says why `text` is not one.
    static func checkedPort(_ text: Substring, from source: String) throws -> Int {
        guard !text.isEmpty, text.count <= 5, text.allSatisfy({ $0.isASCII && $0.isNumber }),
            let number = Int(text), (1...65_535).contains(number)
        else {
            throw invalid("the \(source), '\(text)', is not a number from 1 to 65535")
        }
        return number
    }

    /// A host and its port (nil when it has none), one server of a URL's authority.
    static func parseHostPort(_ text: Substring) throws -> (host: String, port: Int?) {
        let host: Substring
        let portText: Substring?
        if text.hasPrefix("[") {
            guard let close = text.firstIndex(of: "]") else {
                throw invalid(
                    "the host of the sync URL opens a '[' that no ']' closes (an IPv6 address is written [::1])")
            }
            host = text[text.index(after: text.startIndex)..<close]
            let after = text[text.index(after: close)...]
            if after.isEmpty {
                portText = nil
            } else if after.hasPrefix(":") {
                portText = after.dropFirst()
            } else {
                throw invalid("the sync URL has '\(after)' after its IPv6 address: only ':PORT' may follow ']'")
            }
            guard !host.isEmpty, host.allSatisfy({ $0.isHexDigit || $0 == ":" || $0 == "." || $0 == "%" }),
                host.contains(":")
            else {
                throw invalid("the sync URL's host [\(host)] is not an IPv6 address")
            }
        } else {
            let colons = text.filter { $0 == ":" }.count
            if colons > 1 {
                throw invalid(
                    "the sync URL's host has several ':': an IPv6 address is written in brackets, as [::1]:5432")
            }
            if let colon = text.firstIndex(of: ":") {
                host = text[..<colon]
                portText = text[text.index(after: colon)...]
            } else {
                host = text
                portText = nil
            }
        }
        guard !host.isEmpty else {
            throw invalid(
                "the sync URL names no host: give a host name or address (postgresql://user@host/db), "
                    + "or a Unix socket directory percent-encoded (postgresql://user@%2Fvar%2Frun%2Fpostgresql/db)")
        }
        guard let decodedHost = host.removingPercentEncoding, !decodedHost.isEmpty else {
            throw invalid("the host in the sync URL has a malformed percent-encoding (%XX)")
        }
        if decodedHost.contains("/"), !decodedHost.hasPrefix("/") {
            throw invalid(
                "the sync URL's host has a '/': a Unix socket directory is an absolute path (%2Fvar%2Frun%2Fpostgresql)"
            )
        }
        return (decodedHost, try portText.map { try checkedPort($0, from: "port of the sync URL") })
    }

    /// The query of a sync URL (`key=value&…`), into `parsed`; returns its `port=` list, for
    /// the caller to match with the hosts.
    static func parseQuery(_ query: Substring, into parsed: inout ParsedURL) throws -> String? {
        var ports: String?
        var seen: Set<String> = []
        for item in query.split(separator: "&", omittingEmptySubsequences: true) {
            guard let equals = item.firstIndex(of: "=") else {
                throw invalid("the sync URL's query has '\(item)' without a value: write key=value")
            }
            guard let key = item[..<equals].removingPercentEncoding,
                let value = item[item.index(after: equals)...].removingPercentEncoding
            else {
                throw invalid("the sync URL's query has a malformed percent-encoding (%XX)")
            }
            if key == "password" {
                throw invalid(
                    "the sync URL carries a password (password=), which never goes in a URL: remove it and \(passwordAdvice)"
                )
            }
            guard seen.insert(key).inserted else { throw invalid("the sync URL's query gives \(key) twice") }
            switch key {
            case "sslmode":
                guard let mode = TLSMode(rawValue: value) else {
                    throw invalid(
                        "the sync URL's sslmode=\(value) is not one of "
                            + TLSMode.allCases.map(\.rawValue).joined(separator: ", "))
                }
                parsed.tls = mode
            case "sslrootcert":
                guard value.hasPrefix("/") else {
                    throw invalid(
                        "the sync URL's sslrootcert is not an absolute path: give the CA file as /path/to/ca.pem")
                }
                parsed.rootCertificate = value
            case "schema":
                parsed.schema = try checkedSchema(value, from: "the sync URL's schema=")
            case "retention":
                parsed.retention = try checkedRetention(value, from: "the sync URL's retention=")
            case "target_session_attrs":
                guard let attributes = TargetSessionAttributes(rawValue: value) else {
                    let known = TargetSessionAttributes.allCases.map(\.rawValue).joined(separator: ", ")
                    let why =
                        ["read-only", "standby", "prefer-standby"].contains(value)
                        ? ", since the daemon writes to the server (a standby cannot take its uploads)" : ""
                    throw invalid("the sync URL's target_session_attrs=\(value) is not one of \(known)\(why)")
                }
                parsed.targetSessionAttributes = attributes
            case "port":
                ports = value
            case "user", "dbname", "host":
                throw invalid(
                    "the sync URL's query gives \(key), which goes in the URL itself: postgresql://user@host:port/dbname"
                )
            default:
                let shown =
                    key.count <= 40
                    && key.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_" || $0 == "-") }
                throw invalid(
                    "the sync URL's query has an unknown key\(shown ? " '\(key)'" : ""): the known ones are "
                        + urlKeys.joined(separator: ", "))
            }
        }
        return ports
    }
}

// MARK: - sync.conf

extension SyncConfiguration {
    /// The file in a group container that configures its sync: `sync.conf`.
    package static let fileName = "sync.conf"

    /// A `sync.conf`: `key = value` lines, blank lines and whole-line `#` comments. The keys
    /// are `url`, `schema`, `password-file` (relative to the container unless absolute) and
    /// `retention` (seconds); it holds no secret itself.
    ///
    /// ```
    /// # The group's PostgreSQL server
    /// url = postgresql://skyros@db.example.com/skyros?sslmode=verify-full
    /// password-file = /etc/skyros/todo.password
    /// ```
    ///
    /// Several servers (a primary and its standbys) go in the URL, as libpq writes them:
    /// `url = postgresql://skyros@db1.example.com,db2.example.com/skyros?target_session_attrs=read-write`.
    package struct File: Sendable, Equatable {
        /// The keys a `sync.conf` may have.
        package static let keys = ["url", "schema", "password-file", "retention"]

        /// The path the file was read from, which messages name.
        package var path: String
        /// `url`: the sync URL.
        package var url: String?
        /// `schema`: the server schema, checked.
        package var schema: String?
        /// `password-file`: the file holding the role's password, as written.
        package var passwordFile: String?
        /// `retention`: how long the server keeps its change log, in seconds.
        package var retention: TimeInterval?

        /// Parses the text of a `sync.conf` read from `path`.
        ///
        /// - Throws: ``SkyrosError/Code/syncConfiguration`` naming the file and the line: a
        ///   line without `=`, an unknown key (a value is never echoed, in case it is a
        ///   secret), a key given twice, an empty value, a bad schema or retention.
        package init(parsing text: String, path: String) throws {
            self.path = path
            var seen: Set<String> = []
            for (index, rawLine) in text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline)
                .enumerated()
            {
                let line = rawLine.trimmingCharacters(in: .whitespaces.union(CharacterSet(charactersIn: "\r")))
                if line.isEmpty || line.hasPrefix("#") { continue }
                let place = "\(path) line \(index + 1)"
                guard let equals = line.firstIndex(of: "=") else {
                    throw invalid(
                        "\(place): expected key = value (keys: \(Self.keys.joined(separator: ", ")); # starts a comment)"
                    )
                }
                let key = line[..<equals].trimmingCharacters(in: .whitespaces)
                let value = line[line.index(after: equals)...].trimmingCharacters(in: .whitespaces)
                guard Self.keys.contains(key) else {
                    if key == "password" {
                        throw invalid(
                            "\(place): sync.conf holds no password itself: \(passwordAdvice); remove this line")
                    }
                    if ["host", "port"].contains(key) {
                        throw invalid(
                            "\(place): hosts and ports go in the url "
                                + "(url = postgresql://user@host1:port1,host2:port2/db)")
                    }
                    if ["sslmode", "sslrootcert", "target_session_attrs"].contains(key) {
                        throw invalid(
                            "\(place): \(key) goes in the url's query (url = postgresql://user@host/db?\(key)=…)")
                    }
                    let shown =
                        key.count <= 40
                        && key.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_" || $0 == "-") }
                    throw invalid(
                        "\(place): unknown key\(shown ? " '\(key)'" : ""); the keys are \(Self.keys.joined(separator: ", "))"
                    )
                }
                guard seen.insert(key).inserted else { throw invalid("\(place): \(key) is given a second time") }
                guard !value.isEmpty else { throw invalid("\(place): \(key) has no value") }
                switch key {
                case "url": url = value
                case "schema": schema = try checkedSchema(value, from: place)
                case "password-file": passwordFile = value
                default: retention = try checkedRetention(value, from: place)
                }
            }
        }

        /// The `sync.conf` of a container, or nil when it has none.
        ///
        /// - Throws: ``SkyrosError/Code/syncConfiguration`` when it exists but cannot be read
        ///   or is invalid.
        package static func read(in container: URL) throws -> File? {
            let path = container.appendingPathComponent(SyncConfiguration.fileName).path
            guard FileManager.default.fileExists(atPath: path) else { return nil }
            let text = try readText(path, what: "the sync configuration")
            return try File(parsing: text, path: path)
        }
    }

    /// The text of a file, or an error naming it and the reason (as `strerror` says it).
    static func readText(_ path: String, what: String) throws -> String {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else {
            let reason = String(cString: strerror(errno))
            throw invalid("cannot read \(path) (\(what)): \(reason)")
        }
        defer { close(descriptor) }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = read(descriptor, &buffer, buffer.count)
            if count < 0 {
                if errno == EINTR { continue }
                throw invalid("cannot read \(path) (\(what)): \(String(cString: strerror(errno)))")
            }
            if count == 0 { break }
            data.append(contentsOf: buffer[0..<count])
            if data.count > 1 << 20 { throw invalid("\(path) (\(what)) is larger than 1 MiB: is it the right file?") }
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw invalid("\(path) (\(what)) is not UTF-8 text")
        }
        return text
    }
}

// MARK: - Resolution

extension SyncConfiguration {
    /// The systemd credential (`LoadCredential=skyros-sync-password:…` in the unit) that
    /// holds the password, in `$CREDENTIALS_DIRECTORY`.
    package static let credentialName = "skyros-sync-password"

    /// How a group's daemon syncs, from its flags, its environment and its container, or nil
    /// when nothing asks it to (this machine only).
    ///
    /// The URL is the first of: `url` (`--sync`), `SKYROS_SYNC_URL`, `url` in the container's
    /// `sync.conf`. The schema: `schema` (`--sync-schema`), the URL's `schema=`, `schema` in
    /// `sync.conf`, ``schemaName(forGroup:)``. The retention: the URL's `retention=`, then
    /// `sync.conf`'s. The password is the first of: the file `passwordFile`
    /// (`--sync-password-file`, relative to the working directory), the file `password-file`
    /// of `sync.conf` (relative to the container), `SKYROS_SYNC_PASSWORD`, the systemd
    /// credential `$CREDENTIALS_DIRECTORY/skyros-sync-password`; none: no password (trust or
    /// peer authentication). A file's trailing newlines are not part of the password; a file
    /// that other users may read is used, with a warning in ``warnings``.
    ///
    /// - Parameters:
    ///   - group: The application group (validated by the caller).
    ///   - container: The group container, where `sync.conf` may be.
    ///   - url: `--sync`.
    ///   - passwordFile: `--sync-password-file`.
    ///   - schema: `--sync-schema`.
    ///   - environment: The process's environment (`ProcessInfo.processInfo.environment`).
    /// - Throws: ``SkyrosError/Code/syncConfiguration``, the message prefixed by where the
    ///   faulty setting came from: an invalid URL or `sync.conf`, a password file that cannot
    ///   be read or is empty, an invalid schema name, `--sync-password-file`, `--sync-schema`
    ///   or a `sync.conf` without any URL.
    package static func resolve(
        group: String, container: URL, url: String?, passwordFile: String?, schema: String? = nil,
        environment: [String: String]
    ) throws -> SyncConfiguration? {
        let file = try File.read(in: container)
        let given: (text: String, source: String)
        if let url {
            given = (url, "--sync")
        } else if let url = environment["SKYROS_SYNC_URL"], !url.isEmpty {
            given = (url, "SKYROS_SYNC_URL")
        } else if let file, let url = file.url {
            given = (url, file.path)
        } else {
            let settings = [
                passwordFile.map { _ in "--sync-password-file" }, schema.map { _ in "--sync-schema" },
                file.map { "\($0.path) (which has no url)" },
            ].compactMap { $0 }
            if settings.isEmpty { return nil }
            throw invalid(
                "no sync URL for \(settings.joined(separator: " and ")): give it with --sync, SKYROS_SYNC_URL, or "
                    + "url = postgresql://user@host/db in \(container.appendingPathComponent(fileName).path)")
        }
        let parsed: ParsedURL
        do {
            parsed = try parseURL(given.text)
        } catch let error as SkyrosError {
            throw invalid("\(given.source): \(error.message)")
        }
        var configuration = SyncConfiguration(
            servers: parsed.servers, targetSessionAttributes: parsed.targetSessionAttributes,
            username: parsed.username, database: parsed.database, schema: "", tls: parsed.tls,
            rootCertificate: parsed.rootCertificate,
            retention: parsed.retention ?? file?.retention ?? defaultRetention, source: given.source)
        if let schema {
            configuration.schema = try checkedSchema(schema, from: "--sync-schema")
        } else if let named = parsed.schema ?? file?.schema {
            configuration.schema = named
        } else {
            configuration.schema = try derivedSchema(forGroup: group)
        }
        if let passwordFile {
            try configuration.readPassword(from: passwordFile, relativeTo: nil, setting: "--sync-password-file")
        } else if let file, let passwordFile = file.passwordFile {
            try configuration.readPassword(
                from: passwordFile, relativeTo: container, setting: "password-file in \(file.path)")
        } else if let password = environment["SKYROS_SYNC_PASSWORD"], !password.isEmpty {
            configuration.password = password
            configuration.passwordSource = "SKYROS_SYNC_PASSWORD"
        } else if let directory = environment["CREDENTIALS_DIRECTORY"], !directory.isEmpty {
            let path = URL(fileURLWithPath: directory).appendingPathComponent(credentialName).path
            if FileManager.default.fileExists(atPath: path) {
                try configuration.readPassword(
                    from: path, relativeTo: nil, setting: "the systemd credential \(credentialName)", checkMode: false)
                configuration.passwordSource = "the systemd credential \(credentialName)"
            }
        }
        return configuration
    }

    /// Sets ``password`` to the contents of a file, its trailing newlines removed; warns when
    /// other users may read it.
    mutating func readPassword(from path: String, relativeTo base: URL?, setting: String, checkMode: Bool = true) throws
    {
        let resolved = base.map { path.hasPrefix("/") ? path : $0.appendingPathComponent(path).path } ?? path
        var password = try Self.readText(resolved, what: "the password file of \(setting)")
        while password.hasSuffix("\n") || password.hasSuffix("\r") || password.hasSuffix("\r\n") {
            password.removeLast()
        }
        guard !password.isEmpty else {
            throw Self.invalid("the password file \(resolved) (\(setting)) is empty: write the role's password in it")
        }
        self.password = password
        passwordSource = "the file \(resolved)"
        var status = stat()
        if checkMode, stat(resolved, &status) == 0, status.st_mode & 0o077 != 0 {
            warnings.append(
                "the password file \(resolved) may be read by other users (mode \(String(status.st_mode & 0o777, radix: 8))): "
                    + "chmod 600 it, or 640 with a group only the daemon's user is in")
        }
    }
}

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
