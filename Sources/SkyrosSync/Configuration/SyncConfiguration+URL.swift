import Foundation
import NIOSSL
import PostgresNIO
import Skyros

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
                    + "host\(servers.count == 1 ? "" : "s"): give one port for every host, or one per host in the hosts' order"
            )
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
