import Foundation

/// A type stored natively in a column.
///
/// Skyros conforms String, the integer types, Double, Float, Bool, Date, Data, UUID, URL
/// and Decimal. RawRepresentable enums (String or Int raw values) and Codable structs work
/// as attributes without conforming: they are stored as their raw value, or encoded as JSON.
public protocol AttributeValue {
    /// The column type the value is stored in.
    static var storageType: StorageType { get }
    /// Decodes a stored value; nil when it does not hold a value of this type.
    init?(storedValue: StoredValue)
    /// The value as stored.
    var storedValue: StoredValue { get }
    /// The type's name in a ``SchemaDescription`` and the schema fingerprint: the same on
    /// every platform (never a runtime name such as `Foundation.Date`). Skyros' types use
    /// `string`, `int`, `int64`, `int32`, `int16`, `int8`, `double`, `float`, `bool`,
    /// `date`, `data`, `uuid`, `url` and `decimal`; the default is the type's own name.
    static var schemaTypeName: String { get }
}

extension AttributeValue {
    public static var schemaTypeName: String { String(describing: Self.self) }
}

extension String: AttributeValue {
    public static var schemaTypeName: String { "string" }
    public static var storageType: StorageType { .text }
    public init?(storedValue: StoredValue) {
        switch storedValue {
        case .text(let value): self = value
        case .integer(let value): self = String(value)
        case .real(let value): self = String(value)
        default: return nil
        }
    }
    public var storedValue: StoredValue { .text(self) }
}

extension BinaryInteger where Self: AttributeValue {
    public static var storageType: StorageType { .integer }
    public init?(storedValue: StoredValue) {
        switch storedValue {
        case .integer(let value): self.init(truncatingIfNeeded: value)
        case .real(let value): self.init(Int64(value))
        default: return nil
        }
    }
    public var storedValue: StoredValue { .integer(Int64(truncatingIfNeeded: self)) }
}

extension Int: AttributeValue {
    public static var schemaTypeName: String { "int" }
}
extension Int64: AttributeValue {
    public static var schemaTypeName: String { "int64" }
}
extension Int32: AttributeValue {
    public static var schemaTypeName: String { "int32" }
}
extension Int16: AttributeValue {
    public static var schemaTypeName: String { "int16" }
}
extension Int8: AttributeValue {
    public static var schemaTypeName: String { "int8" }
}

extension Double: AttributeValue {
    public static var schemaTypeName: String { "double" }
    public static var storageType: StorageType { .real }
    public init?(storedValue: StoredValue) {
        switch storedValue {
        case .real(let value): self = value
        case .integer(let value): self = Double(value)
        default: return nil
        }
    }
    public var storedValue: StoredValue { .real(self) }
}

extension Float: AttributeValue {
    public static var schemaTypeName: String { "float" }
    public static var storageType: StorageType { .real }
    public init?(storedValue: StoredValue) {
        guard let value = Double(storedValue: storedValue) else { return nil }
        self = Float(value)
    }
    public var storedValue: StoredValue { .real(Double(self)) }
}

extension Bool: AttributeValue {
    public static var schemaTypeName: String { "bool" }
    public static var storageType: StorageType { .integer }
    public init?(storedValue: StoredValue) {
        guard case .integer(let value) = storedValue else { return nil }
        self = value != 0
    }
    public var storedValue: StoredValue { .integer(self ? 1 : 0) }
}

/// Dates are stored as seconds since 1970 (REAL), so they sort and compare in SQL.
extension Date: AttributeValue {
    public static var schemaTypeName: String { "date" }
    public static var storageType: StorageType { .real }
    public init?(storedValue: StoredValue) {
        guard let seconds = Double(storedValue: storedValue) else { return nil }
        self.init(timeIntervalSince1970: seconds)
    }
    public var storedValue: StoredValue { .real(timeIntervalSince1970) }
}

extension Data: AttributeValue {
    public static var schemaTypeName: String { "data" }
    public static var storageType: StorageType { .blob }
    public init?(storedValue: StoredValue) {
        switch storedValue {
        case .blob(let value): self = value
        case .text(let value): self = Data(value.utf8)
        default: return nil
        }
    }
    public var storedValue: StoredValue { .blob(self) }
}

/// UUIDs are stored as 16-byte blobs.
extension UUID: AttributeValue {
    public static var schemaTypeName: String { "uuid" }
    public static var storageType: StorageType { .blob }
    public init?(storedValue: StoredValue) {
        guard case .blob(let data) = storedValue, data.count == 16 else { return nil }
        var bytes: uuid_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        withUnsafeMutableBytes(of: &bytes) { $0.copyBytes(from: data) }
        self.init(uuid: bytes)
    }
    public var storedValue: StoredValue {
        .blob(withUnsafeBytes(of: uuid) { Data($0) })
    }
}

/// URLs are stored as their absolute string.
extension URL: AttributeValue {
    public static var schemaTypeName: String { "url" }
    public static var storageType: StorageType { .text }
    public init?(storedValue: StoredValue) {
        guard case .text(let value) = storedValue else { return nil }
        self.init(string: value)
    }
    public var storedValue: StoredValue { .text(absoluteString) }
}

/// Decimals are stored as text, exactly, in a form whose byte order is the numeric order
/// (see ``OrderedDecimal``): SQL sorts and compares them as numbers.
extension Decimal: AttributeValue {
    public static var schemaTypeName: String { "decimal" }
    public static var storageType: StorageType { .text }
    public init?(storedValue: StoredValue) {
        switch storedValue {
        case .text(let value):
            if OrderedDecimal.looksEncoded(value) {
                guard let decoded = OrderedDecimal.decode(value) else { return nil }
                self = decoded
            } else {
                // The POSIX notation stored before the ordered form.
                self.init(string: value, locale: Locale(identifier: "en_US_POSIX"))
            }
        case .integer(let value): self.init(value)
        case .real(let value): self.init(value)
        default: return nil
        }
    }
    public var storedValue: StoredValue {
        // NaN has no ordered form: "NaN" is what the codec refuses (valueNotStorable).
        .text(OrderedDecimal.encode(self) ?? "NaN")
    }
}
