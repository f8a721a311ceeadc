import Foundation
import Skyros
import SkyrosWire

extension Journal {
    /// A schema version recorded in the store (`skyros_schema`): its number, the fingerprint it
    /// was recorded with, and its description.
    struct RecordedSchema {
        var version: Int
        var fingerprint: String
        var description: SchemaDescription
    }

    /// The schema versions recorded in the store from `version` up to, not including,
    /// `below`, oldest first (none when they cannot be read); throws
    /// ``SkyrosError/Code/storeFailure`` for a recorded version whose row is damaged.
    static func recordedSchemas(from version: UInt64, below: UInt64, in store: SQLiteStore) throws -> [RecordedSchema] {
        let rows =
            (try? store.rows(
                "SELECT version, fingerprint, description FROM skyros_schema WHERE version >= ? AND version < ? ORDER BY version",
                [.integer(Int64(clamping: version)), .integer(Int64(clamping: below))])) ?? []
        return try rows.map { row in
            guard case .integer(let number) = row[0], case .text(let recorded) = row[1], case .text(let json) = row[2],
                let description = try? SchemaDescription(json: json.utf8).upgradingLegacyTypeNames()
            else { throw SkyrosError(.storeFailure, "a recorded schema version of the store cannot be read") }
            return RecordedSchema(version: Int(number), fingerprint: recorded, description: description)
        }
    }

    /// How a client of an earlier schema version sees the store, which is at `storeVersion`:
    /// `version` must be recorded in the store (`skyros_schema`) with the client's
    /// `fingerprint`, or the client's model must be the store's; throws
    /// ``SkyrosError/Code/schemaMismatch`` with the reason otherwise. A nil `fingerprint`
    /// (a session projected anew after a migration) takes the recorded one.
    static func projection(
        version: UInt64, fingerprint: String?, storeVersion: UInt64, in store: SQLiteStore
    ) throws -> SchemaProjection {
        let current = store.schema.schemaDescription
        var chain: [(version: Int, description: SchemaDescription)] = []
        for recorded in try recordedSchemas(from: version, below: storeVersion, in: store) {
            if chain.isEmpty, let fingerprint, UInt64(recorded.version) == version {
                let rebuilt = try? Schema(description: recorded.description, version: recorded.version).fingerprint
                guard fingerprint == recorded.fingerprint || fingerprint == rebuilt else {
                    throw SkyrosError(
                        .schemaMismatch,
                        "schema version \(version) of the group's store was recorded with fingerprint \(recorded.fingerprint); the client has \(fingerprint): a changed model needs a higher version than the store's (\(storeVersion))"
                    )
                }
            }
            chain.append((recorded.version, recorded.description))
        }
        if chain.first.map({ UInt64($0.version) != version }) ?? true {
            guard fingerprint == store.schema.fingerprint else {
                throw SkyrosError(
                    .schemaMismatch,
                    "schema version \(version) is not recorded in the group's store (its schema is at version \(storeVersion)): a client of that version cannot be served"
                )
            }
            chain.insert((Int(clamping: version), current), at: 0)  // the same model under an earlier number
        }
        chain.append((Int(clamping: storeVersion), current))
        return try SchemaProjection(chain: chain)
    }
}
