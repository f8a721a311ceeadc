import Foundation
import PostgresNIO
import SkyrosWire

/// Where and how a group's daemon syncs with PostgreSQL (DESIGN §9): the server, the role,
/// the schema that holds the group's tables, TLS. Made from `--sync URL`, `SKYROS_SYNC_URL`
/// or the container's `sync.conf`; the password never comes from the command line.
package struct SyncConfiguration: Sendable, Equatable {
    /// How the connection is encrypted (the URL's `sslmode`).
    package enum TLSMode: String, Sendable, Equatable {
        /// No TLS (`sslmode=disable`).
        case disable
        /// TLS when the server offers it (`sslmode=prefer`, the default).
        case prefer
        /// TLS or no connection, without checking the certificate (`sslmode=require`).
        case require
        /// TLS with the server's certificate checked against the CA (`sslmode=verify-full`).
        case verifyFull = "verify-full"
    }

    /// The server's host name or address (`127.0.0.1`).
    package var host: String
    /// The server's port (5432 by default).
    package var port: Int
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
    /// The CA certificate file for ``TLSMode/verifyFull`` (`sslrootcert`); nil: the system's.
    package var rootCertificate: String?
    /// How long the server keeps its change log (seconds): a machine away for longer
    /// re-syncs from a snapshot.
    package var retention: TimeInterval

    /// A configuration; see the properties.
    package init(
        host: String, port: Int = 5432, username: String, password: String? = nil, database: String, schema: String,
        tls: TLSMode = .prefer, rootCertificate: String? = nil, retention: TimeInterval = 7 * 86_400
    ) {
        self.host = host
        self.port = port
        self.username = username
        self.password = password
        self.database = database
        self.schema = schema
        self.tls = tls
        self.rootCertificate = rootCertificate
        self.retention = retention
    }

    /// The server schema of a group: its id lowercased, every character outside `[a-z0-9_]`
    /// made `_` (`com.example.todo` → `com_example_todo`).
    package static func schemaName(forGroup group: String) -> String {
        String(group.lowercased().map { ($0.isASCII && ($0.isLetter || $0.isNumber)) || $0 == "_" ? $0 : "_" })
    }

    /// The server as a log shows it: `postgresql://user@host:port/db` (schema s), never the password.
    package var redacted: String { "postgresql://\(username)@\(host):\(port)/\(database) (schema \(schema))" }
}
