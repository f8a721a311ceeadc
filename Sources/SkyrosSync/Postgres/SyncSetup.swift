import Foundation
import Logging
import NIOPosix
import PostgresNIO
import Skyros

/// `skyrosd --group G --sync URL --sync-setup`: creates or migrates the group's server schema
/// once, with a role that may (for daemons given DML only), and returns.
package enum SyncSetup {
    /// Creates or migrates the server schema of `schema` (the group's store's) at
    /// `configuration`: the group's tables, their constraints, indexes and triggers, and the
    /// sync tables, in one transaction. Additive only: nothing is dropped.
    package static func run(
        _ configuration: SyncConfiguration, schema: Schema, log: @escaping @Sendable (String) -> Void
    ) async throws {
        var logger = Logger(label: "skyros.sync.setup")
        logger.logLevel = .critical
        let (connection, _) = try await configuration.connect(
            on: MultiThreadedEventLoopGroup.singleton.any(), id: 1, logger: logger)
        do {
            let server = ServerSchema(schema, name: configuration.schema)
            let session = ServerSession(connection: connection, schema: server, logger: logger)
            try await session.ensureSchema()
            if let group = configuration.group { try await session.claimGroup(group) }
            log(
                "sync setup: the schema \(configuration.schema) at \(configuration.redacted) has the tables of schema version \(schema.version)"
            )
        } catch {
            try? await connection.close()
            throw error
        }
        try await connection.close()
    }
}
