import Foundation

/// Skyros' own predicate tree: what a Foundation `#Predicate` is translated to.
///
/// It is serialisable (it crosses process boundaries), translated to SQL by the store, and
/// evaluated in memory on pending changes with the same semantics as the SQL (SQLite's
/// comparison rules, null-safe equality).
public indirect enum PredicateNode: Sendable, Codable, Hashable {
    /// A constant.
    case constant(StoredValue)
    /// A property reached from the object bound to `scope` (0: the fetched object; 1, 2, …:
    /// the variables of nested `contains(where:)`), through to-one relationships.
    /// The last element may be an attribute, a to-one, or `_id` (the object's identifier).
    case property(scope: Int, path: [String])
    /// A comparison; `==` and `!=` are null-safe (SQL `IS`, `IS NOT`).
    case compare(ComparisonOperator, PredicateNode, PredicateNode)
    case and(PredicateNode, PredicateNode)
    case or(PredicateNode, PredicateNode)
    case not(PredicateNode)
    /// String containment, case-sensitive, or ASCII case-insensitive.
    case contains(PredicateNode, PredicateNode, caseInsensitive: Bool)
    /// String prefix (`starts(with:)`).
    case startsWith(PredicateNode, PredicateNode)
    /// ASCII lowercase of a string (`localizedLowercase`).
    case lowercased(PredicateNode)
    /// Membership in a list of constants (`[…].contains($0.x)`).
    case isIn(PredicateNode, [StoredValue])
    /// Whether some object of a to-many relationship matches (`contains(where:)`).
    /// `relationship` is the to-many reached from `scope`; `variable` is the scope of its objects.
    case anyMatch(scope: Int, path: [String], variable: Int, PredicateNode)
    /// The number of objects of a to-many relationship (`.count`, and `.isEmpty` as `count == 0`).
    case count(scope: Int, path: [String])

    /// A comparison's operator; its raw value is the SQL operator (`IS` and `IS NOT` for the
    /// nil-safe equality of Swift's `==` and `!=`).
    public enum ComparisonOperator: String, Sendable, Codable, Hashable {
        case equal = "IS"
        case notEqual = "IS NOT"
        case less = "<"
        case lessOrEqual = "<="
        case greater = ">"
        case greaterOrEqual = ">="
    }

    /// The special property name of the object identifier.
    public static let idProperty = "_id"

    /// `$0.<property> == value`, on the fetched object.
    public static func equals(_ property: String, _ value: StoredValue) -> PredicateNode {
        .compare(.equal, .property(scope: 0, path: [property]), .constant(value))
    }
}
