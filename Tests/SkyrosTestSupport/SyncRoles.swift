import Foundation
import Skyros
import SkyrosSync

/// A database of a private ``PostgresServer`` set up for daemons given DML only, as
/// docs/SYNC.md "Security" says: an owner role (`CREATE` on the database, nothing else) runs
/// `--sync-setup` (``SyncSetup``) for each group's schema and grants a daemon role of that
/// group exactly the privileges sync uses.
///
/// Roles are the cluster's, not a database's: use a server of the test's own.
package struct SyncRoles: Sendable {
    /// The server; its TCP clients authenticate with passwords when it was made with one.
    package let postgres: PostgresServer
    /// The database every group's schema is in.
    package let database: String
    /// The role that owns the groups' schemas.
    package let owner = "skyros_owner"
    /// Every role's password (it matters only over TCP on a server made with a password).
    package static let ownerPassword = "owner secret"

    /// Makes a database and the owner role, with `CREATE` on the database only.
    package init(_ postgres: PostgresServer) throws {
        self.postgres = postgres
        database = try postgres.createUniqueDatabase(prefix: "roles")
        try postgres.psql(
            """
            CREATE ROLE \(owner) LOGIN PASSWORD '\(Self.ownerPassword)';
            GRANT CREATE ON DATABASE \(PostgresServer.quoteIdentifier(database)) TO \(owner);
            """)
    }

    /// The sync configuration of a daemon (or of `--sync-setup`) connecting as `role`.
    package func configuration(
        role: String, password: String?, schema: String, tls: SyncConfiguration.TLSMode = .disable,
        rootCertificate: String? = nil, retention: TimeInterval = 7 * 86_400
    ) -> SyncConfiguration {
        SyncConfiguration(
            host: postgres.host, port: postgres.port, username: role, password: password, database: database,
            schema: schema,
            tls: tls, rootCertificate: rootCertificate, retention: retention)
    }

    /// Creates or migrates `schema` for the models of `models` as the owner (`--sync-setup`).
    package func setUp(schema: String, models: Schema) async throws {
        try await SyncSetup.run(
            configuration(role: owner, password: Self.ownerPassword, schema: schema), schema: models, log: { _ in })
    }

    /// Creates a daemon role that may log in (and nothing else).
    package func createDaemonRole(_ role: String, password: String) throws {
        try postgres.psql("CREATE ROLE \(PostgresServer.quoteIdentifier(role)) LOGIN PASSWORD '\(password)'")
    }

    /// Grants `role` what a DML-only daemon of `schema` needs, run as the owner: the
    /// statements of docs/SYNC.md "Security", word for word, for every entity of `models`.
    package func grant(_ role: String, schema: String, models: Schema) throws {
        try postgres.psql(
            Self.grants(role: role, schema: schema, entities: models.entities.map(\.name)), database: database,
            user: owner)
    }

    /// The grants of docs/SYNC.md "Security" for a DML-only daemon role.
    package static func grants(role: String, schema: String, entities: [String]) -> String {
        let role = PostgresServer.quoteIdentifier(role)
        let schema = PostgresServer.quoteIdentifier(schema)
        var sql = "GRANT USAGE ON SCHEMA \(schema) TO \(role);\n"
        for entity in entities {
            sql +=
                "GRANT SELECT, INSERT, UPDATE, DELETE ON \(schema).\(PostgresServer.quoteIdentifier(entity)) TO \(role);\n"
        }
        sql += """
            GRANT SELECT, INSERT, DELETE ON \(schema)._skyros_log TO \(role);
            GRANT SELECT, INSERT ON \(schema)._skyros_uploads TO \(role);
            GRANT SELECT, UPDATE ON \(schema)._skyros_meta TO \(role);

            """
        return sql
    }

    /// Runs `sql` in the database as `user` (the owner by default), through the Unix socket.
    @discardableResult
    package func psql(_ sql: String, as user: String? = nil) throws -> String {
        try postgres.psql(sql, database: database, user: user ?? owner)
    }
}
