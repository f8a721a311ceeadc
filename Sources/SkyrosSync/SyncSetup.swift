import Foundation
import Skyros

/// `skyrosd --group G --sync URL --sync-setup`: creates or migrates the group's server schema
/// once, with a role that may (for daemons given DML only), and returns.
package enum SyncSetup {
    /// Creates or migrates the server schema of `schema` (the group's store's) at `configuration`.
    package static func run(
        _ configuration: SyncConfiguration, schema: Schema, log: @escaping @Sendable (String) -> Void
    ) async throws {
        throw SkyrosError(.storeFailure, "not implemented yet")
    }
}
