// Stored values as JSON and back, by the property's type name (docs/PROTOCOL.md, "Type
// names"): what `dump` prints and `import` reads.
import Foundation
import Skyros

enum ValueJSON {
    /// The JSON of a stored value of `property`: strings, numbers, booleans, ISO 8601 dates,
    /// base64 data, UUID strings, decimals as strings, `json` attributes as their JSON, a
    /// to-one as its destination's object-ID string (`Entity/UUID`).
    static func json(_ value: StoredValue, of property: SchemaDescription.Property) -> JSONValue {
        if case .null = value { return .null }
        if property.kind == "toOne", case .blob(let bytes) = value, let uuid = UUID(bytes: bytes) {
            return .string("\(property.destination ?? "")/\(uuid.uuidString)")
        }
        switch (property.typeName, value) {
        case ("bool", .integer(let number)): return .bool(number != 0)
        case ("date", .real(let seconds)): return .string(Output.date(seconds: seconds))
        case ("uuid", .blob(let bytes)):
            if let uuid = UUID(bytes: bytes) { return .string(uuid.uuidString) }
        case ("decimal", .text(let text)):
            if let decimal = OrderedDecimal.decode(text) { return .string("\(decimal)") }
        case ("json", .blob(let bytes)):
            if let object = try? JSONValue.parse(bytes) { return object }
        default: break
        }
        return plain(value)
    }

    /// A value as its storage class says (when the type name does not say more).
    static func plain(_ value: StoredValue) -> JSONValue {
        switch value {
        case .null: .null
        case .integer(let number): .integer(number)
        case .real(let number): .number(number)
        case .text(let text): .string(text)
        case .blob(let bytes): .string(bytes.base64EncodedString())
        }
    }

    /// The stored value of `property` from its JSON (what ``json(_:of:)`` makes, and the
    /// obvious alternatives: a date as seconds since 1970, a to-one as a bare UUID).
    static func stored(_ json: JSONValue, of property: SchemaDescription.Property) throws(ToolFailure) -> StoredValue {
        func refuse(_ expected: String) -> ToolFailure {
            ToolFailure(ToolExit.failure, "\(property.name): expected \(expected), found \(json.text)")
        }
        if json == .null { return .null }
        if property.kind == "toMany" { return .null }
        if property.kind == "toOne" {
            guard let text = json.stringValue,
                let uuid = UUID(uuidString: String(text.split(separator: "/").last ?? ""))
            else { throw refuse("an object ID (Entity/UUID)") }
            return uuid.stored
        }
        switch property.typeName {
        case "bool":
            switch json {
            case .bool(let flag): return .integer(flag ? 1 : 0)
            case .integer(let number) where number == 0 || number == 1: return .integer(number)
            default: throw refuse("true or false")
            }
        case "date":
            if let text = json.stringValue {
                guard
                    let date = (try? Date.ISO8601FormatStyle(includingFractionalSeconds: true).parse(text))
                        ?? (try? Date.ISO8601FormatStyle().parse(text))
                else { throw refuse("an ISO 8601 date") }
                return .real(date.timeIntervalSince1970)
            }
            if let seconds = json.doubleValue { return .real(seconds) }
            throw refuse("an ISO 8601 date")
        case "uuid":
            guard let text = json.stringValue, let uuid = UUID(uuidString: text) else { throw refuse("a UUID string") }
            return uuid.stored
        case "decimal":
            let text: String? =
                switch json {
                case .string(let text): text
                case .integer(let integer): String(integer)
                case .number(let number): String(number)
                default: nil
                }
            guard let text, let encoded = OrderedDecimal.encode(plain: text) else { throw refuse("a decimal number") }
            return .text(encoded)
        case "json":
            return .blob(Data(json.text.utf8))
        default:
            break
        }
        switch (property.storageType, json) {
        case (.integer, .integer(let integer)): return .integer(integer)
        case (.integer, .bool(let flag)): return .integer(flag ? 1 : 0)
        case (.integer, _): throw refuse("an integer")
        case (.real, _):
            guard let number = json.doubleValue else { throw refuse("a number") }
            return .real(number)
        case (.text, .string(let text)): return .text(text)
        case (.text, _): throw refuse("a string")
        case (.blob, .string(let text)):
            guard let data = Data(base64Encoded: text) else { throw refuse("base64 data") }
            return .blob(data)
        case (.blob, _): throw refuse("base64 data")
        }
    }
}

extension UUID {
    /// A UUID from 16 bytes.
    init?(bytes: Data) {
        guard bytes.count == 16 else { return nil }
        let b = [UInt8](bytes)
        self.init(
            uuid: (b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15])
        )
    }

    /// The UUID as the store keeps it: a 16-byte blob.
    var stored: StoredValue { .blob(withUnsafeBytes(of: uuid) { Data($0) }) }
}
