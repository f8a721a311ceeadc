import Foundation
import NIOCore
import PostgresNIO
import Skyros

/// The PostgreSQL type of an attribute's column, and the conversion of its values both ways.
///
/// Values cross as text: a parameter is bound as text and cast by the statement
/// (``input(_:)``), a value is read as the text of ``output(_:)``. Text in both directions
/// keeps every value exact (a double in its shortest round-trip form, a timestamp's epoch
/// in microseconds, a numeric's digits) and one code path for every type.
package enum ServerType: String, Sendable, Equatable {
    case text, bigint, boolean, double, timestamptz, bytea, uuid, numeric, jsonb

    /// The type of a property of type name `typeName` (`enum:` raw types as their raw
    /// type's) stored as `storage`; an application's own type by its storage class.
    package init(typeName: String, storage: StorageType) {
        let base = typeName.hasPrefix("enum:") ? String(typeName.dropFirst(5)) : typeName
        switch base {
        case "string", "url": self = .text
        case "int", "int64", "int32", "int16", "int8": self = .bigint
        case "bool": self = .boolean
        case "double", "float": self = .double
        case "date": self = .timestamptz
        case "data": self = .bytea
        case "uuid": self = .uuid
        case "decimal": self = .numeric
        case "json": self = .jsonb
        default:
            self =
                switch storage {
                case .integer: .bigint
                case .real: .double
                case .text: .text
                default: .bytea
                }
        }
    }

    /// The column's SQL type.
    package var sqlType: String {
        switch self {
        case .double: "double precision"
        default: rawValue
        }
    }

    /// The SQL expression that turns the text `parameter` (`$3`, or a literal) into a value
    /// of the column's type.
    package func input(_ parameter: String) -> String {
        switch self {
        case .text: parameter
        case .timestamptz: "to_timestamp(\(parameter)::double precision)"
        case .bytea: "decode(\(parameter), 'hex')"
        default: "\(parameter)::\(sqlType)"
        }
    }

    /// The SQL expression that reads `column` (already quoted) as text.
    package func output(_ column: String) -> String {
        switch self {
        case .text: column
        case .timestamptz: "extract(epoch FROM \(column))::text"
        case .bytea: "encode(\(column), 'hex')"
        default: "\(column)::text"
        }
    }

    /// A value as the store keeps it, as text for ``input(_:)``; nil for NULL.
    ///
    /// - Throws: ``SkyrosError/Code/typeMismatch`` when the stored value does not fit the
    ///   column (a store written by hand).
    package func serverText(_ value: StoredValue, typeName: String) throws -> String? {
        switch (self, value) {
        case (_, .null): return nil
        case (.text, .text(let text)): return text
        case (.text, .integer(let number)): return String(number)
        case (.text, .real(let number)): return String(number)
        case (.bigint, .integer(let number)): return String(number)
        case (.boolean, .integer(let number)): return number != 0 ? "true" : "false"
        case (.double, .real(let number)), (.timestamptz, .real(let number)): return Self.text(number)
        case (.double, .integer(let number)), (.timestamptz, .integer(let number)): return String(number)
        case (.bytea, .blob(let data)): return data.map { String(format: "%02x", $0) }.joined()
        case (.bytea, .text(let text)): return Data(text.utf8).map { String(format: "%02x", $0) }.joined()
        case (.uuid, .blob(let data)) where data.count == 16:
            return UUID(uuid: data.withUnsafeBytes { $0.loadUnaligned(as: uuid_t.self) }).uuidString.lowercased()
        case (.numeric, .text(let text)):
            guard let decimal = OrderedDecimal.decode(text) else { break }
            return "\(decimal)"
        case (.jsonb, .blob(let data)):
            guard let text = String(data: data, encoding: .utf8) else { break }
            return text
        case (.jsonb, .text(let text)): return text
        default: break
        }
        throw SkyrosError(.typeMismatch, "\(value.typeDescription) does not fit a \(sqlType) column (\(typeName))")
    }

    /// A double as PostgreSQL reads it: its shortest round-trip digits, `Infinity`, `-Infinity`.
    private static func text(_ number: Double) -> String {
        if number.isInfinite { return number > 0 ? "Infinity" : "-Infinity" }
        return "\(number)"
    }

    /// A value read from the server (the text of ``output(_:)``, nil for NULL) as the store
    /// keeps it; nil when it does not fit the property (a value written by another program
    /// that the attribute's type cannot hold: NaN, an integer out of an `int16`'s range…).
    package func storedValue(_ text: String?, typeName: String) -> StoredValue? {
        guard let text else { return .null }
        switch self {
        case .text:
            return .text(text)
        case .bigint:
            guard let number = Int64(text), Self.inRange(number, typeName: typeName) else { return nil }
            return .integer(number)
        case .boolean:
            switch text {
            case "true", "t": return .integer(1)
            case "false", "f": return .integer(0)
            default: return nil
            }
        case .double, .timestamptz:
            guard let number = Double(text) else { return nil }
            return Self.real(number, typeName: typeName)
        case .bytea:
            guard text.count % 2 == 0 else { return nil }
            var bytes: [UInt8] = []
            bytes.reserveCapacity(text.utf8.count / 2)
            var high: UInt8?
            for character in text.utf8 {
                guard let nibble = Self.nibble(character) else { return nil }
                if let first = high {
                    bytes.append(first << 4 | nibble)
                    high = nil
                } else {
                    high = nibble
                }
            }
            return .blob(Data(bytes))
        case .uuid:
            guard let uuid = UUID(uuidString: text) else { return nil }
            return .blob(withUnsafeBytes(of: uuid.uuid) { Data($0) })
        case .numeric:
            guard let ordered = OrderedDecimal.encode(plain: text) else { return nil }
            return .text(ordered)
        case .jsonb:
            // As the store writes JSON: keys sorted, no escaped slashes.
            guard let object = try? JSONSerialization.jsonObject(with: Data(text.utf8), options: [.fragmentsAllowed]),
                let data = try? JSONSerialization.data(
                    withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes, .fragmentsAllowed])
            else { return nil }
            return .blob(data)
        }
    }

    // MARK: - Binary results

    /// Whether a column the server describes as `formatType` (`format_type`'s text) is of this
    /// type: then its values are read in binary form, else as text.
    package func matches(formatType: String) -> Bool {
        switch self {
        case .double: formatType == "double precision"
        case .timestamptz: formatType == "timestamp with time zone"
        case .numeric: formatType.hasPrefix("numeric")
        default: formatType == rawValue
        }
    }

    /// The SQL expression that reads `column` (already quoted) in the form
    /// ``storedValue(_:typeName:)-(PostgresCell,_)`` decodes from the server's binary results:
    /// the column's own type (a cast that is a no-op on the column the group's tables have),
    /// except for a numeric or a JSON value, read as its text.
    package func binaryOutput(_ column: String) -> String {
        switch self {
        case .numeric, .jsonb: "\(column)::text"
        default: "\(column)::\(sqlType)"
        }
    }

    /// A value of a binary result (a cell of ``binaryOutput(_:)``) as the store keeps it,
    /// exactly as ``storedValue(_:typeName:)-(String?,_)`` makes it from the value's text; nil when it
    /// does not fit the property, or when the cell is not in the form ``binaryOutput(_:)`` asks for.
    ///
    /// A snapshot's rows are read this way: no text is formatted on the server or parsed here
    /// (a `uuid` as 16 bytes, a double as its 8, a timestamp as its microseconds).
    package func storedValue(_ cell: PostgresCell, typeName: String) -> StoredValue? {
        guard var bytes = cell.bytes else { return .null }
        // Text: numeric and JSON always, and a column read as text because the server's
        // column is not of the type this one expects (``binaryOutput(_:)`` was not used).
        if cell.format == .text || self == .numeric || self == .jsonb
            || (self != .text && (cell.dataType == .text || cell.dataType == .varchar))
        {
            return storedValue(bytes.readString(length: bytes.readableBytes), typeName: typeName)
        }
        switch self {
        case .text:
            guard cell.dataType == .text || cell.dataType == .varchar else { return nil }
            return bytes.readString(length: bytes.readableBytes).map(StoredValue.text)
        case .bigint:
            guard cell.dataType == .int8, bytes.readableBytes == 8, let number = bytes.readInteger(as: Int64.self)
            else { return nil }
            return Self.inRange(number, typeName: typeName) ? .integer(number) : nil
        case .boolean:
            guard cell.dataType == .bool, bytes.readableBytes == 1, let byte = bytes.readInteger(as: UInt8.self)
            else { return nil }
            return .integer(byte != 0 ? 1 : 0)
        case .double:
            guard cell.dataType == .float8, bytes.readableBytes == 8, let bits = bytes.readInteger(as: UInt64.self)
            else { return nil }
            return Self.real(Double(bitPattern: bits), typeName: typeName)
        case .timestamptz:
            guard cell.dataType == .timestamptz, bytes.readableBytes == 8,
                let micros = bytes.readInteger(as: Int64.self)
            else { return nil }
            return Self.real(Self.epochSeconds(microsecondsSince2000: micros), typeName: typeName)
        case .bytea:
            guard cell.dataType == .bytea else { return nil }
            return .blob(Data(bytes.readableBytesView))
        case .uuid:
            guard cell.dataType == .uuid, bytes.readableBytes == 16 else { return nil }
            return .blob(Data(bytes.readableBytesView))
        case .numeric, .jsonb:
            return nil  // read as text above
        }
    }

    /// A short text of a binary cell's value, for the reason a row is skipped.
    package static func describe(_ cell: PostgresCell) -> String {
        guard var bytes = cell.bytes else { return "NULL" }
        switch (cell.format, cell.dataType, bytes.readableBytes) {
        case (.binary, .int8, 8): return bytes.readInteger(as: Int64.self).map { String($0) } ?? "a value"
        case (.binary, .float8, 8):
            // As PostgreSQL writes it (`NaN`, not Swift's `nan`).
            return bytes.readInteger(as: UInt64.self).map {
                Double(bitPattern: $0).isNaN ? "NaN" : text(Double(bitPattern: $0))
            }
                ?? "a value"
        case (.binary, .timestamptz, 8):
            return bytes.readInteger(as: Int64.self).map { "\(epochSeconds(microsecondsSince2000: $0)) s" } ?? "a value"
        case (.text, _, _), (_, .text, _), (_, .varchar, _):
            return "'\(String(decoding: bytes.readableBytesView.prefix(32), as: UTF8.self))'"
        default: return "a \(cell.dataType) value"
        }
    }

    /// Seconds since 1970 of a `timestamptz`'s binary value (microseconds since 2000-01-01
    /// UTC; the largest and smallest integers are `infinity` and `-infinity`), the double
    /// nearest to the exact value, as `extract(epoch FROM …)`'s text gives.
    static func epochSeconds(microsecondsSince2000 micros: Int64) -> Double {
        if micros == .max { return .infinity }
        if micros == .min { return -.infinity }
        let (epoch, overflow) = micros.addingReportingOverflow(946_684_800_000_000)
        // Below 2^53 the integer is exact as a double, and one division rounds once.
        if !overflow, epoch.magnitude < 1 << 53 { return Double(epoch) / 1e6 }
        // Past it (before 1685, after 2255), the exact decimal is parsed: the same rounding.
        var whole = micros / 1_000_000
        var fraction = micros % 1_000_000
        if fraction < 0 {
            whole -= 1
            fraction += 1_000_000
        }
        whole += 946_684_800  // seconds + fraction / 10^6, the fraction in 0..<10^6
        let text =
            whole >= 0
            ? "\(whole).\(String(fraction).leftPadded(to: 6))"
            : fraction == 0
                ? "\(whole)" : "-\(-whole - 1).\(String(1_000_000 - fraction).leftPadded(to: 6))"
        return Double(text) ?? Double(whole) + Double(fraction) / 1e6
    }

    /// Whether an integer fits the property's type (an `int32`'s range…).
    private static func inRange(_ number: Int64, typeName: String) -> Bool {
        let base = typeName.hasPrefix("enum:") ? String(typeName.dropFirst(5)) : typeName
        let range: ClosedRange<Int64>? =
            switch base {
            case "int32": Int64(Int32.min)...Int64(Int32.max)
            case "int16": Int64(Int16.min)...Int64(Int16.max)
            case "int8": Int64(Int8.min)...Int64(Int8.max)
            default: nil
            }
        return range.map { $0.contains(number) } ?? true
    }

    /// A double as the store keeps it; nil for NaN, and for a `float` property, a finite
    /// number a `Float` cannot hold.
    private static func real(_ number: Double, typeName: String) -> StoredValue? {
        if number.isNaN { return nil }
        if typeName == "float", number.isFinite, Float(number).isInfinite { return nil }
        return .real(number)
    }

    private static func nibble(_ character: UInt8) -> UInt8? {
        switch character {
        case UInt8(ascii: "0")...UInt8(ascii: "9"): character - UInt8(ascii: "0")
        case UInt8(ascii: "a")...UInt8(ascii: "f"): character - UInt8(ascii: "a") + 10
        case UInt8(ascii: "A")...UInt8(ascii: "F"): character - UInt8(ascii: "A") + 10
        default: nil
        }
    }
}

extension String {
    /// The text with zeros before it up to `width` characters.
    fileprivate func leftPadded(to width: Int) -> String {
        count >= width ? self : String(repeating: "0", count: width - count) + self
    }
}
