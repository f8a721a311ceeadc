import Foundation

// The canonical JSON of a schema description, written and read without Foundation's
// JSONEncoder and JSONDecoder. Opening a store whose schema changed reads the recorded
// description and records the new one, and every hello carries one: through the Codable
// machinery these two cost more than the rest of a lightweight migration's own work
// (`skyros-bench profile-schema-json`).
//
// The bytes written are exactly JSONEncoder's with `[.sortedKeys, .withoutEscapingSlashes]`
// (keys in UTF-8 byte order, absent optionals left out, `"` `\` and control characters
// escaped as JSONEncoder escapes them, doubles as their shortest description without a
// trailing ".0", data as base64): stores written before this writer existed, and
// docs/PROTOCOL.md's worked example, hold those bytes, and a test compares the two writers.
// The reader accepts any JSON with the description's keys and types (whitespace, key order,
// escapes, unknown keys ignored), as JSONDecoder did.

extension SchemaDescription {
    /// The canonical bytes (see ``canonicalJSON()``).
    package func canonicalBytes() throws -> [UInt8] {
        var writer = CanonicalJSONWriter()
        writer.bytes.reserveCapacity(256 * entities.reduce(1) { $0 + $1.properties.count })
        writer.raw("{\"entities\":[")
        for (index, entity) in entities.enumerated() {
            if index > 0 { writer.raw(",") }
            writer.raw("{\"indexes\":[")
            for (position, index) in entity.indexes.enumerated() {
                if position > 0 { writer.raw(",") }
                writer.raw("[")
                for (column, name) in index.enumerated() {
                    if column > 0 { writer.raw(",") }
                    writer.string(name)
                }
                writer.raw("]")
            }
            writer.raw("],\"name\":")
            writer.string(entity.name)
            if let originalName = entity.originalName {
                writer.raw(",\"originalName\":")
                writer.string(originalName)
            }
            writer.raw(",\"properties\":[")
            for (position, property) in entity.properties.enumerated() {
                if position > 0 { writer.raw(",") }
                try writer.property(property)
            }
            writer.raw("]")
            if let subentities = entity.subentities {
                writer.raw(",\"subentities\":[")
                for (position, subentity) in subentities.enumerated() {
                    if position > 0 { writer.raw(",") }
                    writer.raw("{\"name\":")
                    writer.string(subentity.name)
                    if let nonOptional = subentity.nonOptional {
                        writer.raw(",\"nonOptional\":[")
                        for (column, name) in nonOptional.enumerated() {
                            if column > 0 { writer.raw(",") }
                            writer.string(name)
                        }
                        writer.raw("]")
                    }
                    if let originalName = subentity.originalName {
                        writer.raw(",\"originalName\":")
                        writer.string(originalName)
                    }
                    writer.raw(",\"parent\":")
                    writer.string(subentity.parent)
                    writer.raw(",\"properties\":[")
                    for (column, name) in subentity.properties.enumerated() {
                        if column > 0 { writer.raw(",") }
                        writer.string(name)
                    }
                    writer.raw("]}")
                }
                writer.raw("]")
            }
            writer.raw("}")
        }
        writer.raw("]}")
        return writer.bytes
    }

    /// The canonical JSON as text: what a store records, and an admin session describes.
    package func canonicalText() throws -> String {
        String(decoding: try canonicalBytes(), as: UTF8.self)
    }

    /// A description read from JSON: a recorded one or a hello's. Any JSON text with the
    /// description's keys and value types is accepted; throws a `DecodingError` naming the
    /// place of the first problem otherwise.
    package init(json: some Collection<UInt8>) throws {
        var reader = JSONReader(Array(json))
        let root = try reader.document()
        let path = JSONPath()
        let entities = try root.array(for: "entities", path)
        self.init(
            entities: try entities.enumerated().map { index, value in
                let path = path.appending("entities[\(index)]")
                let properties = try value.array(for: "properties", path)
                return Entity(
                    name: try value.string(for: "name", path),
                    properties: try properties.enumerated().map { index, value in
                        try Property(json: value, path.appending("properties[\(index)]"))
                    },
                    indexes: try value.array(for: "indexes", path).enumerated().map { index, value in
                        guard case .array(let names) = value else {
                            throw path.mismatch("indexes[\(index)]", "an array")
                        }
                        return try names.map { name in
                            guard case .string(let text) = name else {
                                throw path.mismatch("indexes[\(index)]", "strings")
                            }
                            return text
                        }
                    },
                    originalName: try value.optionalString(for: "originalName", path),
                    subentities: try value.member("subentities", path).map { _ in
                        try value.array(for: "subentities", path).enumerated().map { index, subentity in
                            let path = path.appending("subentities[\(index)]")
                            return Subentity(
                                name: try subentity.string(for: "name", path),
                                parent: try subentity.string(for: "parent", path),
                                properties: try subentity.array(for: "properties", path).map { name in
                                    guard case .string(let text) = name else {
                                        throw path.mismatch("properties", "strings")
                                    }
                                    return text
                                },
                                nonOptional: try subentity.member("nonOptional", path).map { _ in
                                    try subentity.array(for: "nonOptional", path).map { name in
                                        guard case .string(let text) = name else {
                                            throw path.mismatch("nonOptional", "strings")
                                        }
                                        return text
                                    }
                                },
                                originalName: try subentity.optionalString(for: "originalName", path))
                        }
                    })
            })
    }
}

extension SchemaDescription.Property {
    fileprivate init(json value: JSONReader.Value, _ path: JSONPath) throws {
        guard let storageType = StorageType(rawValue: try value.string(for: "storageType", path)) else {
            throw path.corrupted("storageType is not one of INTEGER, REAL, TEXT, BLOB")
        }
        guard let deleteRule = DeleteRule(rawValue: try value.string(for: "deleteRule", path)) else {
            throw path.corrupted("deleteRule is not one of nullify, cascade, deny")
        }
        self.init(
            name: try value.string(for: "name", path), kind: try value.string(for: "kind", path),
            storageType: storageType, isOptional: try value.bool(for: "isOptional", path),
            typeName: try value.string(for: "typeName", path), isUnique: try value.bool(for: "isUnique", path),
            isIndexed: try value.bool(for: "isIndexed", path),
            originalName: try value.optionalString(for: "originalName", path),
            destination: try value.optionalString(for: "destination", path), deleteRule: deleteRule,
            inverse: try value.optionalString(for: "inverse", path),
            isRequired: try value.bool(for: "isRequired", path),
            isOrdered: try value.member("isOrdered", path).map { _ in try value.bool(for: "isOrdered", path) } ?? false)
        // Set after the initializer, which leaves out a null default: an explicit one is kept as read.
        defaultValue = try value.member("defaultValue", path).map {
            try SchemaDescription.DefaultValue(json: $0, path.appending("defaultValue"))
        }
    }
}

extension SchemaDescription.DefaultValue {
    fileprivate init(json value: JSONReader.Value, _ path: JSONPath) throws {
        // The same precedence as the Codable decoding: integer, real, text, blob.
        if let number = try value.member("integer", path) {
            self.init(.integer(try number.int64(path.appending("integer"))))
        } else if let number = try value.member("real", path) {
            self.init(.real(try number.double(path.appending("real"))))
        } else if let text = try value.member("text", path) {
            guard case .string(let text) = text else { throw path.mismatch("text", "a string") }
            self.init(.text(text))
        } else if let blob = try value.member("blob", path) {
            guard case .string(let text) = blob, let data = Data(base64Encoded: text) else {
                throw path.mismatch("blob", "a base64 string")
            }
            self.init(.blob(data))
        } else {
            throw path.corrupted("a default value is one of integer, real, text, blob")
        }
    }
}

/// Writes JSON as JSONEncoder does with `[.sortedKeys, .withoutEscapingSlashes]`.
private struct CanonicalJSONWriter {
    var bytes: [UInt8] = []

    /// Text written as is (keys and punctuation, already sorted and escaped).
    mutating func raw(_ text: StaticString) {
        text.withUTF8Buffer { bytes.append(contentsOf: $0) }
    }

    mutating func bool(_ flag: Bool) {
        flag ? raw("true") : raw("false")
    }

    mutating func string(_ text: String) {
        bytes.append(UInt8(ascii: "\""))
        for byte in text.utf8 {
            switch byte {
            case UInt8(ascii: "\""): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\"")])
            case UInt8(ascii: "\\"): bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "\\")])
            case 0x08: bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "b")])
            case 0x0C: bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "f")])
            case 0x0A: bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "n")])
            case 0x0D: bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "r")])
            case 0x09: bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "t")])
            case 0x00...0x1F:
                let hex = Array("0123456789abcdef".utf8)
                bytes.append(contentsOf: [UInt8(ascii: "\\"), UInt8(ascii: "u"), UInt8(ascii: "0"), UInt8(ascii: "0")])
                bytes.append(contentsOf: [hex[Int(byte >> 4)], hex[Int(byte & 0xF)]])
            default: bytes.append(byte)
            }
        }
        bytes.append(UInt8(ascii: "\""))
    }

    mutating func number(_ value: Double) throws {
        guard value.isFinite else {
            throw EncodingError.invalidValue(
                value, .init(codingPath: [], debugDescription: "a default value of \(value) is not a JSON number"))
        }
        var text = value.description
        if text.hasSuffix(".0") { text.removeLast(2) }
        bytes.append(contentsOf: text.utf8)
    }

    mutating func property(_ property: SchemaDescription.Property) throws {
        raw("{")
        if let value = property.defaultValue?.value {
            raw("\"defaultValue\":{")
            switch value {
            case .null: break
            case .integer(let number):
                raw("\"integer\":")
                bytes.append(contentsOf: String(number).utf8)
            case .real(let number):
                raw("\"real\":")
                try self.number(number)
            case .text(let text):
                raw("\"text\":")
                string(text)
            case .blob(let data):
                raw("\"blob\":")
                string(data.base64EncodedString())
            }
            raw("},")
        }
        raw("\"deleteRule\":")
        string(property.deleteRule.rawValue)
        if let destination = property.destination {
            raw(",\"destination\":")
            string(destination)
        }
        if let inverse = property.inverse {
            raw(",\"inverse\":")
            string(inverse)
        }
        raw(",\"isIndexed\":")
        bool(property.isIndexed)
        raw(",\"isOptional\":")
        bool(property.isOptional)
        if property.isOrdered == true {
            raw(",\"isOrdered\":true")
        }
        raw(",\"isRequired\":")
        bool(property.isRequired)
        raw(",\"isUnique\":")
        bool(property.isUnique)
        raw(",\"kind\":")
        string(property.kind)
        raw(",\"name\":")
        string(property.name)
        if let originalName = property.originalName {
            raw(",\"originalName\":")
            string(originalName)
        }
        raw(",\"storageType\":")
        string(property.storageType.rawValue)
        raw(",\"typeName\":")
        string(property.typeName)
        raw("}")
    }
}

/// Where in a description a value is, for error messages: `entities[0].properties[2]`.
private struct JSONPath {
    var text = ""

    func appending(_ component: String) -> JSONPath {
        JSONPath(text: text.isEmpty ? component : text + "." + component)
    }

    func corrupted(_ problem: String) -> DecodingError {
        .dataCorrupted(.init(codingPath: [], debugDescription: text.isEmpty ? problem : "\(text): \(problem)"))
    }

    func mismatch(_ key: String, _ expected: String) -> DecodingError {
        appending(key).corrupted("expected \(expected)")
    }
}

/// A strict JSON reader (RFC 8259) over UTF-8 bytes, with a bounded nesting depth: a
/// description is at most a few levels deep, and a hello comes from outside the process.
private struct JSONReader {
    enum Value {
        case null
        case bool(Bool)
        /// The number's text, converted when its type is known.
        case number(String)
        case string(String)
        case array([Value])
        /// The members in their order; a key written twice counts with its last value.
        case object([(key: String, value: Value)])

        /// The member `key` of an object, nil when absent or null.
        func member(_ key: String, _ path: JSONPath) throws -> Value? {
            guard case .object(let members) = self else { throw path.corrupted("expected an object") }
            guard let member = members.last(where: { $0.key == key }) else { return nil }
            if case .null = member.value { return nil }
            return member.value
        }

        func required(_ key: String, _ path: JSONPath) throws -> Value {
            guard let value = try member(key, path) else { throw path.corrupted("the key \"\(key)\" is missing") }
            return value
        }

        func string(for key: String, _ path: JSONPath) throws -> String {
            guard case .string(let text) = try required(key, path) else { throw path.mismatch(key, "a string") }
            return text
        }

        func optionalString(for key: String, _ path: JSONPath) throws -> String? {
            guard let value = try member(key, path) else { return nil }
            guard case .string(let text) = value else { throw path.mismatch(key, "a string") }
            return text
        }

        func bool(for key: String, _ path: JSONPath) throws -> Bool {
            guard case .bool(let flag) = try required(key, path) else { throw path.mismatch(key, "true or false") }
            return flag
        }

        func array(for key: String, _ path: JSONPath) throws -> [Value] {
            guard case .array(let values) = try required(key, path) else { throw path.mismatch(key, "an array") }
            return values
        }

        func int64(_ path: JSONPath) throws -> Int64 {
            guard case .number(let text) = self else { throw path.corrupted("expected an integer") }
            if let number = Int64(text) { return number }
            // An integral number written with a fraction or an exponent (`1.0`, `1e3`).
            guard let number = Double(text), number.rounded() == number, let exact = Int64(exactly: number) else {
                throw path.corrupted("\(text) is not a 64-bit integer")
            }
            return exact
        }

        func double(_ path: JSONPath) throws -> Double {
            guard case .number(let text) = self, let number = Double(text), number.isFinite else {
                throw path.corrupted("expected a number")
            }
            return number
        }
    }

    static let maximumDepth = 32

    let bytes: [UInt8]
    var position = 0

    init(_ bytes: [UInt8]) { self.bytes = bytes }

    /// The one value of the text, with nothing but whitespace around it.
    mutating func document() throws -> Value {
        let value = try self.value(depth: 0)
        skipWhitespace()
        guard position == bytes.count else { throw failure("unexpected text after the JSON value") }
        return value
    }

    private func failure(_ problem: String) -> DecodingError {
        .dataCorrupted(.init(codingPath: [], debugDescription: "invalid JSON at byte \(position): \(problem)"))
    }

    private mutating func skipWhitespace() {
        while position < bytes.count {
            switch bytes[position] {
            case 0x20, 0x0A, 0x0D, 0x09: position += 1
            default: return
            }
        }
    }

    private mutating func expect(_ literal: StaticString, _ value: Value) throws -> Value {
        let count = literal.utf8CodeUnitCount
        guard position + count <= bytes.count,
            literal.withUTF8Buffer({ bytes[position..<position + count].elementsEqual($0) })
        else { throw failure("unexpected characters") }
        position += count
        return value
    }

    private mutating func value(depth: Int) throws -> Value {
        guard depth < Self.maximumDepth else { throw failure("nested more than \(Self.maximumDepth) levels") }
        skipWhitespace()
        guard position < bytes.count else { throw failure("unexpected end of text") }
        switch bytes[position] {
        case UInt8(ascii: "{"):
            position += 1
            var members: [(key: String, value: Value)] = []
            skipWhitespace()
            if position < bytes.count, bytes[position] == UInt8(ascii: "}") {
                position += 1
                return .object(members)
            }
            while true {
                skipWhitespace()
                guard position < bytes.count, bytes[position] == UInt8(ascii: "\"") else {
                    throw failure("expected a key")
                }
                let key = try string()
                skipWhitespace()
                guard position < bytes.count, bytes[position] == UInt8(ascii: ":") else {
                    throw failure("expected ':'")
                }
                position += 1
                members.append((key, try value(depth: depth + 1)))
                skipWhitespace()
                guard position < bytes.count else { throw failure("unexpected end of text") }
                position += 1
                if bytes[position - 1] == UInt8(ascii: "}") { return .object(members) }
                guard bytes[position - 1] == UInt8(ascii: ",") else { throw failure("expected ',' or '}'") }
            }
        case UInt8(ascii: "["):
            position += 1
            var values: [Value] = []
            skipWhitespace()
            if position < bytes.count, bytes[position] == UInt8(ascii: "]") {
                position += 1
                return .array(values)
            }
            while true {
                values.append(try value(depth: depth + 1))
                skipWhitespace()
                guard position < bytes.count else { throw failure("unexpected end of text") }
                position += 1
                if bytes[position - 1] == UInt8(ascii: "]") { return .array(values) }
                guard bytes[position - 1] == UInt8(ascii: ",") else { throw failure("expected ',' or ']'") }
            }
        case UInt8(ascii: "\""): return .string(try string())
        case UInt8(ascii: "t"): return try expect("true", .bool(true))
        case UInt8(ascii: "f"): return try expect("false", .bool(false))
        case UInt8(ascii: "n"): return try expect("null", .null)
        default: return .number(try number())
        }
    }

    /// A number's text, checked against JSON's grammar: `-? (0 | [1-9][0-9]*) (.[0-9]+)? ([eE][+-]?[0-9]+)?`.
    private mutating func number() throws -> String {
        let start = position
        func digits() -> Int {
            let first = position
            while position < bytes.count, (UInt8(ascii: "0")...UInt8(ascii: "9")).contains(bytes[position]) {
                position += 1
            }
            return position - first
        }
        if position < bytes.count, bytes[position] == UInt8(ascii: "-") { position += 1 }
        let integer = position
        guard digits() > 0, bytes[integer] != UInt8(ascii: "0") || position == integer + 1 else {
            throw failure("invalid number")
        }
        if position < bytes.count, bytes[position] == UInt8(ascii: ".") {
            position += 1
            guard digits() > 0 else { throw failure("invalid number") }
        }
        if position < bytes.count, bytes[position] == UInt8(ascii: "e") || bytes[position] == UInt8(ascii: "E") {
            position += 1
            if position < bytes.count, bytes[position] == UInt8(ascii: "+") || bytes[position] == UInt8(ascii: "-") {
                position += 1
            }
            guard digits() > 0 else { throw failure("invalid number") }
        }
        return String(decoding: bytes[start..<position], as: UTF8.self)
    }

    /// A string, from its opening quote; its escapes resolved and its UTF-8 checked.
    private mutating func string() throws -> String {
        position += 1  // the opening quote
        // Most strings have no escape: made from their bytes at once.
        let start = position
        while position < bytes.count {
            let byte = bytes[position]
            if byte == UInt8(ascii: "\"") {
                guard let string = String(validating: bytes[start..<position], as: UTF8.self) else {
                    throw failure("a string is not valid UTF-8")
                }
                position += 1
                return string
            }
            if byte == UInt8(ascii: "\\") || byte < 0x20 { break }
            position += 1
        }
        var text = Array(bytes[start..<position])
        while true {
            guard position < bytes.count else { throw failure("unterminated string") }
            let byte = bytes[position]
            position += 1
            switch byte {
            case UInt8(ascii: "\""):
                guard let string = String(validating: text, as: UTF8.self) else {
                    throw failure("a string is not valid UTF-8")
                }
                return string
            case UInt8(ascii: "\\"):
                guard position < bytes.count else { throw failure("unterminated string") }
                let escape = bytes[position]
                position += 1
                switch escape {
                case UInt8(ascii: "\""), UInt8(ascii: "\\"), UInt8(ascii: "/"): text.append(escape)
                case UInt8(ascii: "b"): text.append(0x08)
                case UInt8(ascii: "f"): text.append(0x0C)
                case UInt8(ascii: "n"): text.append(0x0A)
                case UInt8(ascii: "r"): text.append(0x0D)
                case UInt8(ascii: "t"): text.append(0x09)
                case UInt8(ascii: "u"):
                    var scalar = try hex4()
                    if (0xD800..<0xDC00).contains(scalar) {
                        // A high surrogate: its low half must follow as another \u escape.
                        guard position + 1 < bytes.count, bytes[position] == UInt8(ascii: "\\"),
                            bytes[position + 1] == UInt8(ascii: "u")
                        else { throw failure("a lone surrogate in a \\u escape") }
                        position += 2
                        let low = try hex4()
                        guard (0xDC00..<0xE000).contains(low) else { throw failure("a lone surrogate in a \\u escape") }
                        scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                    }
                    guard let unicode = Unicode.Scalar(scalar) else {
                        throw failure("a lone surrogate in a \\u escape")
                    }
                    text.append(contentsOf: String(Character(unicode)).utf8)
                default: throw failure("an invalid escape in a string")
                }
            case 0x00...0x1F: throw failure("a control character in a string")
            default: text.append(byte)
            }
        }
    }

    private mutating func hex4() throws -> UInt32 {
        guard position + 4 <= bytes.count else { throw failure("a short \\u escape") }
        var value: UInt32 = 0
        for byte in bytes[position..<position + 4] {
            let digit: UInt8
            switch byte {
            case UInt8(ascii: "0")...UInt8(ascii: "9"): digit = byte - UInt8(ascii: "0")
            case UInt8(ascii: "a")...UInt8(ascii: "f"): digit = byte - UInt8(ascii: "a") + 10
            case UInt8(ascii: "A")...UInt8(ascii: "F"): digit = byte - UInt8(ascii: "A") + 10
            default: throw failure("an invalid \\u escape")
            }
            value = value << 4 | UInt32(digit)
        }
        position += 4
        return value
    }
}
