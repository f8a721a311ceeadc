import Foundation

/// SQL identifiers as SQLite and PostgreSQL read them: in double quotes, a quote inside doubled.
/// The one quoting of names in Skyros: the fetch builder, the daemon's statements and the sync
/// server's schema all call it.
package enum SQLIdentifier {
    /// `"name"`, with quotes doubled.
    package static func quote(_ identifier: String) -> String {
        // Names hardly ever hold a quote: Foundation's replacing is skipped for them.
        guard identifier.utf8.contains(UInt8(ascii: "\"")) else { return "\"" + identifier + "\"" }
        return "\"" + identifier.replacingOccurrences(of: "\"", with: "\"\"") + "\""
    }
}
