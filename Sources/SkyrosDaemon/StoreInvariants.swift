import Foundation
import Skyros

/// Skyros' own invariants of a store, beyond SQLite's integrity check (`skyros check`):
/// the history is gap-free, every object's row is well-formed (an identifier of 16 bytes, a
/// version of 1 or more, every value of its property's storage class, required values
/// present), and no to-one points to an object that does not exist.
package enum StoreInvariants {
    /// The most examples one finding names.
    static let examples = 5

    /// What is wrong with `store`; empty when nothing is.
    package static func findings(in store: SQLiteStore, description: SchemaDescription) throws -> [String] {
        var findings: [String] = []
        func count(_ sql: String) throws -> Int64 {
            if case .integer(let value)? = try store.rows(sql).first?.first { return value }
            return 0
        }
        if try JournalAccess.hasJournal(store) {
            let row = try store.rows(
                "SELECT count(*), coalesce(min(sequence), 0), coalesce(max(sequence), 0) FROM skyros_history"
            ).first
            if let row, case .integer(let rows) = row[0], case .integer(let first) = row[1],
                case .integer(let last) = row[2],
                rows > 0, rows != last - first + 1
            {
                let gaps = try store.rows(
                    """
                    SELECT sequence + 1 FROM skyros_history h WHERE sequence < \(last) AND NOT EXISTS \
                    (SELECT 1 FROM skyros_history n WHERE n.sequence = h.sequence + 1) ORDER BY sequence LIMIT \(examples)
                    """
                ).compactMap { row -> String? in if case .integer(let value) = row[0] { "\(value)" } else { nil } }
                findings.append(
                    "the history has gaps: \(rows) change sets between \(first) and \(last), \(last - first + 1 - rows) missing (first missing: \(gaps.joined(separator: ", ")))"
                )
            }
            let ahead = try count(
                "SELECT count(*) FROM skyros_saves WHERE sequence > (SELECT coalesce(max(sequence), 0) FROM skyros_history)"
            )
            if ahead > 0 {
                findings.append("\(ahead) exactly-once records name a sequence past the history's last")
            }
        }
        let entities = Set(description.entities.map(\.name))
        for entity in description.entities {
            let table = quote(entity.name)
            let bad = try count(
                "SELECT count(*) FROM \(table) WHERE typeof(_id) != 'blob' OR length(_id) != 16 OR _version < 1")
            if bad > 0 { findings.append("\(entity.name): \(bad) rows with a malformed identifier or version") }
            for property in entity.properties where property.kind != "toMany" {
                let column = quote(property.name)
                let expected = property.kind == "toOne" ? "blob" : property.storageType.rawValue.lowercased()
                var allowed = ["'\(expected)'"]
                if property.isOptional || property.kind == "toOne" { allowed.append("'null'") }
                var condition = "typeof(\(column)) NOT IN (\(allowed.joined(separator: ", ")))"
                if property.kind == "toOne" || property.typeName == "uuid" {
                    condition += " OR (\(column) IS NOT NULL AND length(\(column)) != 16)"
                }
                if property.kind == "toOne" && property.isRequired { condition += " OR \(column) IS NULL" }
                let malformed = try count("SELECT count(*) FROM \(table) WHERE \(condition)")
                if malformed > 0 {
                    findings.append(
                        "\(entity.name).\(property.name): \(malformed) rows whose value is not \(property.isOptional ? "null or " : "")\(property.kind == "toOne" ? "an identifier of 16 bytes" : "of type \(property.typeName) (\(expected))")"
                    )
                }
                guard property.kind == "toOne", let destination = property.destination else { continue }
                guard entities.contains(destination) else {
                    findings.append(
                        "\(entity.name).\(property.name): its destination \(destination) is not in the schema")
                    continue
                }
                let dangling = try count(
                    """
                    SELECT count(*) FROM \(table) s WHERE s.\(column) IS NOT NULL AND NOT EXISTS \
                    (SELECT 1 FROM \(quote(destination)) d WHERE d._id = s.\(column))
                    """)
                if dangling > 0 {
                    findings.append(
                        "\(entity.name).\(property.name): \(dangling) rows point to a \(destination) that does not exist"
                    )
                }
            }
        }
        return findings
    }

    private static func quote(_ name: String) -> String {
        SQLIdentifier.quote(name)
    }
}
