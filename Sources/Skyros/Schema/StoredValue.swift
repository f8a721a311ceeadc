import Foundation

/// A value as the store keeps it: one of SQLite's five storage classes.
///
/// Attribute values are converted to a `StoredValue` when they are set and back when they
/// are read. Comparisons follow SQLite's rules, so that predicates evaluated in memory on
/// pending changes give the same results as the SQL the store runs: `NULL` sorts first,
/// then numbers (compared numerically), then text (compared byte by byte, like Core Data:
/// "#" < "1" < "A" < "a"), then blobs.
public enum StoredValue: Sendable, Hashable, Codable, CustomStringConvertible {
    /// SQL NULL: a nil optional, or a to-one without destination.
    case null
    /// A 64-bit signed integer (integers, booleans).
    case integer(Int64)
    /// A double (doubles, floats, dates).
    case real(Double)
    /// UTF-8 text (strings, URLs, decimals, raw values of string enums, JSON of Codable values).
    case text(String)
    /// Bytes (data, UUIDs, object identifiers of to-ones).
    case blob(Data)

    /// Whether the value is ``null``.
    public var isNull: Bool {
        if case .null = self { return true }
        return false
    }

    /// The value as SQL would write it: `NULL`, `42`, `1.5`, `'text'`, `<16 bytes>`.
    public var description: String {
        switch self {
        case .null: "NULL"
        case .integer(let value): "\(value)"
        case .real(let value): "\(value)"
        case .text(let value): "'\(value)'"
        case .blob(let value): "<\(value.count) bytes>"
        }
    }

    /// The storage class and, for short values, the value: for error messages (text is cut
    /// at 32 characters, so a huge value never ends up whole in a log).
    public var typeDescription: String {
        switch self {
        case .null: "null"
        case .integer(let value): "the integer \(value)"
        case .real(let value): "the real \(value)"
        case .text(let value): "the text \(value.count > 32 ? "'\(value.prefix(32))…'" : "'\(value)'")"
        case .blob(let value): "a blob of \(value.count) bytes"
        }
    }

    /// True when SQLite would consider the value true in a `WHERE` clause.
    var isTruthy: Bool {
        switch self {
        case .null: false
        case .integer(let value): value != 0
        case .real(let value): value != 0
        case .text(let value): (Double(value) ?? 0) != 0
        case .blob: false
        }
    }

    private var classRank: Int {
        switch self {
        case .null: 0
        case .integer, .real: 1
        case .text: 2
        case .blob: 3
        }
    }

    /// Orders two values the way SQLite's `ORDER BY` (BINARY collation) does.
    public static func compare(_ lhs: StoredValue, _ rhs: StoredValue) -> ComparisonResult {
        switch (lhs, rhs) {
        case (.integer(let a), .integer(let b)):
            return a < b ? .orderedAscending : (a == b ? .orderedSame : .orderedDescending)
        case (.integer(let a), .real(let b)):
            return compareDoubles(Double(a), b)
        case (.real(let a), .integer(let b)):
            return compareDoubles(a, Double(b))
        case (.real(let a), .real(let b)):
            return compareDoubles(a, b)
        case (.text(let a), .text(let b)):
            return compareBytes(a.utf8, b.utf8)
        case (.blob(let a), .blob(let b)):
            return compareBytes(a, b)
        default:
            let (a, b) = (lhs.classRank, rhs.classRank)
            return a < b ? .orderedAscending : (a == b ? .orderedSame : .orderedDescending)
        }
    }

    /// SQLite's `IS`: equality where NULL equals NULL.
    static func isIdentical(_ lhs: StoredValue, _ rhs: StoredValue) -> Bool {
        if lhs.isNull || rhs.isNull { return lhs.isNull && rhs.isNull }
        return compare(lhs, rhs) == .orderedSame
    }

    private static func compareDoubles(_ a: Double, _ b: Double) -> ComparisonResult {
        a < b ? .orderedAscending : (a == b ? .orderedSame : .orderedDescending)
    }

    private static func compareBytes<C: Collection>(_ a: C, _ b: C) -> ComparisonResult
    where C.Element == UInt8 {
        var i = a.makeIterator()
        var j = b.makeIterator()
        while true {
            switch (i.next(), j.next()) {
            case (nil, nil): return .orderedSame
            case (nil, _): return .orderedAscending
            case (_, nil): return .orderedDescending
            case (let x?, let y?):
                if x != y { return x < y ? .orderedAscending : .orderedDescending }
            }
        }
    }
}

/// The SQLite column type an attribute is stored in.
public enum StorageType: String, Sendable, Codable {
    case integer = "INTEGER"
    case real = "REAL"
    case text = "TEXT"
    case blob = "BLOB"
}
