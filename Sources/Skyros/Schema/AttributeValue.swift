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
    /// The type's own name (`String(describing:)`): a conforming type of an application keeps
    /// this default unless it wants another name in the schema fingerprint.
    public static var schemaTypeName: String { String(describing: Self.self) }
}

extension String: AttributeValue {
    /// `string`.
    public static var schemaTypeName: String { "string" }
    /// Strings are stored as TEXT, compared byte by byte ("#" < "1" < "A" < "a").
    public static var storageType: StorageType { .text }
    /// Reads TEXT as is, and an INTEGER or REAL as its decimal digits; nil for NULL and blobs.
    public init?(storedValue: StoredValue) {
        switch storedValue {
        case .text(let value): self = value
        case .integer(let value): self = String(value)
        case .real(let value): self = String(value)
        default: return nil
        }
    }
    /// The string as TEXT.
    public var storedValue: StoredValue { .text(self) }
}

extension BinaryInteger where Self: AttributeValue {
    /// Integers are stored as INTEGER (64 bits).
    public static var storageType: StorageType { .integer }
    /// Reads an INTEGER, truncated to the type's width, or a REAL rounded toward zero; nil otherwise.
    public init?(storedValue: StoredValue) {
        switch storedValue {
        case .integer(let value): self.init(truncatingIfNeeded: value)
        case .real(let value): self.init(Int64(value))
        default: return nil
        }
    }
    /// The integer as a 64-bit INTEGER.
    public var storedValue: StoredValue { .integer(Int64(truncatingIfNeeded: self)) }
}

extension Int: AttributeValue {
    /// `int`.
    public static var schemaTypeName: String { "int" }
}
extension Int64: AttributeValue {
    /// `int64`.
    public static var schemaTypeName: String { "int64" }
}
extension Int32: AttributeValue {
    /// `int32`.
    public static var schemaTypeName: String { "int32" }
}
extension Int16: AttributeValue {
    /// `int16`.
    public static var schemaTypeName: String { "int16" }
}
extension Int8: AttributeValue {
    /// `int8`.
    public static var schemaTypeName: String { "int8" }
}

extension Double: AttributeValue {
    /// `double`.
    public static var schemaTypeName: String { "double" }
    /// Doubles are stored as REAL.
    public static var storageType: StorageType { .real }
    /// Reads a REAL, or an INTEGER converted; nil otherwise.
    public init?(storedValue: StoredValue) {
        switch storedValue {
        case .real(let value): self = value
        case .integer(let value): self = Double(value)
        default: return nil
        }
    }
    /// The number as REAL.
    public var storedValue: StoredValue { .real(self) }
}

extension Float: AttributeValue {
    /// `float`.
    public static var schemaTypeName: String { "float" }
    /// Floats are stored as REAL (widened to a `Double`).
    public static var storageType: StorageType { .real }
    /// Reads what `Double(storedValue:)` reads, narrowed to a `Float`.
    public init?(storedValue: StoredValue) {
        guard let value = Double(storedValue: storedValue) else { return nil }
        self = Float(value)
    }
    /// The number widened to a `Double`, as REAL.
    public var storedValue: StoredValue { .real(Double(self)) }
}

extension Bool: AttributeValue {
    /// `bool`.
    public static var schemaTypeName: String { "bool" }
    /// Booleans are stored as INTEGER 0 or 1, as SQLite has no boolean type.
    public static var storageType: StorageType { .integer }
    /// Reads an INTEGER: 0 is false, anything else true; nil otherwise.
    public init?(storedValue: StoredValue) {
        guard case .integer(let value) = storedValue else { return nil }
        self = value != 0
    }
    /// 1 for true, 0 for false.
    public var storedValue: StoredValue { .integer(self ? 1 : 0) }
}

/// Dates are stored as seconds since 1970 (REAL), so they sort and compare in SQL.
extension Date: AttributeValue {
    /// `date`.
    public static var schemaTypeName: String { "date" }
    /// REAL: seconds since 1970-01-01 00:00 UTC.
    public static var storageType: StorageType { .real }
    /// Reads seconds since 1970 from a REAL or an INTEGER; nil otherwise.
    public init?(storedValue: StoredValue) {
        guard let seconds = Double(storedValue: storedValue) else { return nil }
        self.init(timeIntervalSince1970: seconds)
    }
    /// `timeIntervalSince1970` as REAL.
    public var storedValue: StoredValue { .real(timeIntervalSince1970) }
}

extension Data: AttributeValue {
    /// `data`.
    public static var schemaTypeName: String { "data" }
    /// Data is stored as a BLOB.
    public static var storageType: StorageType { .blob }
    /// Reads a BLOB, or TEXT as its UTF-8 bytes; nil otherwise.
    public init?(storedValue: StoredValue) {
        switch storedValue {
        case .blob(let value): self = value
        case .text(let value): self = Data(value.utf8)
        default: return nil
        }
    }
    /// The bytes as a BLOB.
    public var storedValue: StoredValue { .blob(self) }
}

/// UUIDs are stored as 16-byte blobs.
extension UUID: AttributeValue {
    /// `uuid`.
    public static var schemaTypeName: String { "uuid" }
    /// A BLOB of the UUID's 16 bytes, which sort as SQLite compares blobs.
    public static var storageType: StorageType { .blob }
    /// Reads a 16-byte BLOB; nil for anything else.
    public init?(storedValue: StoredValue) {
        guard case .blob(let data) = storedValue, data.count == 16 else { return nil }
        var bytes: uuid_t = (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)
        withUnsafeMutableBytes(of: &bytes) { $0.copyBytes(from: data) }
        self.init(uuid: bytes)
    }
    /// The 16 bytes as a BLOB.
    public var storedValue: StoredValue {
        .blob(withUnsafeBytes(of: uuid) { Data($0) })
    }
}

/// URLs are stored as their absolute string.
extension URL: AttributeValue {
    /// `url`.
    public static var schemaTypeName: String { "url" }
    /// URLs are stored as TEXT.
    public static var storageType: StorageType { .text }
    /// Parses TEXT with `URL(string:)`; nil when it is not a URL or not TEXT.
    public init?(storedValue: StoredValue) {
        guard case .text(let value) = storedValue else { return nil }
        self.init(string: value)
    }
    /// `absoluteString` as TEXT.
    public var storedValue: StoredValue { .text(absoluteString) }
}

/// Decimals are stored as text, exactly, in a form whose byte order is the numeric order
/// (see ``OrderedDecimal``): SQL sorts and compares them as numbers.
extension Decimal: AttributeValue {
    /// `decimal`.
    public static var schemaTypeName: String { "decimal" }
    /// TEXT in the ordered form of ``OrderedDecimal``.
    public static var storageType: StorageType { .text }
    /// Reads TEXT in the ordered form (or the POSIX notation of stores written before it), or an
    /// INTEGER or REAL converted; nil otherwise.
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
    /// The ordered form as TEXT; NaN, which has none, as the text `NaN`, which the attribute's
    /// codec refuses at save (``SkyrosError/Code/valueNotStorable``).
    public var storedValue: StoredValue {
        // NaN has no ordered form: "NaN" is what the codec refuses (valueNotStorable).
        .text(OrderedDecimal.encode(self) ?? "NaN")
    }
}
