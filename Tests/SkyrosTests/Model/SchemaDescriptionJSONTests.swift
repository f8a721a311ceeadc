import Foundation
import Skyros
import Testing

/// The canonical description is written and read without JSONEncoder and JSONDecoder; the
/// bytes must stay JSONEncoder's (stores and docs/PROTOCOL.md hold them), and the reader
/// must take any JSON a client in another language sends.
@Suite("schema description JSON")
struct SchemaDescriptionJSONTests {
    static func foundationBytes(_ description: SchemaDescription) throws -> [UInt8] {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return Array(try encoder.encode(description))
    }

    /// Text that JSON must escape, or that a naive writer would: quotes, backslashes,
    /// slashes, every control character, DEL, non-ASCII, astral plane, separators.
    static let awkward: [String] = [
        "", "plain", "with \"quotes\"", "back\\slash", "a/b//c", "tab\there", "line\nbreak\r\n",
        String((0..<32).map { Character(Unicode.Scalar(UInt8($0))) }), "del\u{7F}", "é ü ß 漢字",
        "emoji 😀👩‍👩‍👧", "separators \u{2028}\u{2029}", "nul\u{0}inside", "ends with backslash\\",
    ]

    static let doubles: [Double] = [
        0, -0.0, 1, -1, 1.5, 0.1, 100, 1e15, 1e16, 1e20, 1e22, 1e-7, 123456789.123, -2.5e-5,
        .leastNonzeroMagnitude, .greatestFiniteMagnitude, .leastNormalMagnitude, 3.141592653589793, 1.0 / 3,
    ]

    static func description(seed: Int) -> SchemaDescription {
        var generator = SplitMix64(seed: UInt64(seed))
        func text() -> String { awkward[Int(generator.next() % UInt64(awkward.count))] }
        func flag() -> Bool { generator.next() % 2 == 0 }
        func maybe(_ value: String) -> String? { flag() ? value : nil }
        let defaults: [StoredValue?] = [
            nil, .null, .integer(0), .integer(.min), .integer(.max), .integer(-42),
            .real(doubles[Int(generator.next() % UInt64(doubles.count))]), .text(text()),
            .blob(Data((0..<Int(generator.next() % 40)).map { _ in UInt8(truncatingIfNeeded: generator.next()) })),
        ]
        let entities = (0..<Int(1 + generator.next() % 3)).map { entity in
            SchemaDescription.Entity(
                name: "E\(entity)\(text())",
                properties: (0..<Int(generator.next() % 6)).map { index in
                    SchemaDescription.Property(
                        name: "p\(index)\(text())", kind: ["attribute", "toOne", "toMany"][Int(generator.next() % 3)],
                        storageType: [.integer, .real, .text, .blob][Int(generator.next() % 4)], isOptional: flag(),
                        typeName: text(), isUnique: flag(), isIndexed: flag(), originalName: maybe(text()),
                        destination: maybe(text()), deleteRule: [.nullify, .cascade, .deny][Int(generator.next() % 3)],
                        inverse: maybe(text()), isRequired: flag(),
                        defaultValue: defaults[Int(generator.next() % UInt64(defaults.count))])
                },
                indexes: (0..<Int(generator.next() % 3)).map { _ in
                    (0..<Int(1 + generator.next() % 2)).map { _ in text() }
                },
                originalName: maybe(text()))
        }
        return SchemaDescription(entities: entities)
    }

    @Test("the canonical bytes are JSONEncoder's, for awkward names and every kind of default")
    func bytesMatchFoundation() throws {
        for seed in 0..<400 {
            let description = Self.description(seed: seed)
            let bytes = Array(try description.canonicalJSON())
            #expect(bytes == (try Self.foundationBytes(description)), "seed \(seed)")
            #expect(try SchemaDescription(json: bytes) == description, "seed \(seed)")
        }
        for value in Self.doubles {
            let description = SchemaDescription(entities: [
                .init(
                    name: "E",
                    properties: [
                        .init(
                            name: "d", kind: "attribute", storageType: .real, isOptional: false, typeName: "double",
                            defaultValue: .real(value))
                    ])
            ])
            #expect(Array(try description.canonicalJSON()) == (try Self.foundationBytes(description)), "\(value)")
            #expect(
                try SchemaDescription(json: description.canonicalJSON()).entities[0].properties[0].defaultValue?.value
                    == .real(value))
        }
    }

    @Test("a default that is not a finite number is refused as JSONEncoder refuses it")
    func nonFiniteDefault() throws {
        for value in [Double.nan, .infinity, -.infinity] {
            let description = SchemaDescription(entities: [
                .init(
                    name: "E",
                    properties: [
                        .init(
                            name: "d", kind: "attribute", storageType: .real, isOptional: false, typeName: "double",
                            defaultValue: .real(value))
                    ])
            ])
            #expect(throws: EncodingError.self) { try description.canonicalJSON() }
            #expect(throws: EncodingError.self) { try Self.foundationBytes(description) }
        }
    }

    @Test("any JSON form of a description reads the same: whitespace, key order, escapes, unknown keys")
    func readsAnyForm() throws {
        let description = Self.description(seed: 7)
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.prettyPrinted]  // unsorted, indented, slashes escaped
        #expect(try SchemaDescription(json: encoder.encode(description)) == description)
        let written = """
             { "extra": [1, 2.5e3, {"nested": null}, true, false, "x"],
               "entities" : [ { "name" : "T\\u00e9\\ud83d\\ude00\\/\\t", "properties": [
                 {"name":"n","kind":"attribute","storageType":"INTEGER","isOptional":false,"typeName":"int",
                  "isUnique":false,"isIndexed":true,"deleteRule":"nullify","isRequired":false,
                  "originalName":null,"defaultValue":{"integer":7.0}},
                 {"name":"r","kind":"attribute","storageType":"REAL","isOptional":true,"typeName":"double",
                  "isUnique":false,"isIndexed":false,"deleteRule":"nullify","isRequired":false,"defaultValue":{"real":2}}
               ], "indexes": [["n"]] } ] }
            """
        let read = try SchemaDescription(json: Array(written.utf8))
        #expect(read.entities[0].name == "Té😀/\t")
        #expect(read.entities[0].properties[0].defaultValue?.value == .integer(7))
        #expect(read.entities[0].properties[0].originalName == nil)
        #expect(read.entities[0].properties[1].defaultValue?.value == .real(2))
        #expect(read.entities[0].indexes == [["n"]])
        #expect(read == (try JSONDecoder().decode(SchemaDescription.self, from: Data(written.utf8))))
    }

    @Test("malformed or mistyped JSON is a DecodingError naming the problem, never a crash")
    func refusesMalformed() throws {
        let valid = String(decoding: try Self.description(seed: 3).canonicalJSON(), as: UTF8.self)
        let cases: [(String, String)] = [
            ("", "end of text"),
            ("{", "expected a key"),
            (valid + " x", "after the JSON value"),
            (String(valid.dropLast()), "end of text"),
            ("{\"entities\": 1}", "entities: expected an array"),
            ("{}", "\"entities\" is missing"),
            ("{\"entities\": [{\"name\": \"E\", \"indexes\": [], \"properties\": [{}]}]}", "is missing"),
            ("{\"entities\": [{\"name\": 5, \"indexes\": [], \"properties\": []}]}", "name: expected a string"),
            ("{\"entities\": [{\"name\": \"E\", \"indexes\": [[1]], \"properties\": []}]}", "indexes[0]"),
            ("{\"entities\": [], \"x\": 01}", "invalid number"),
            ("{\"entities\": [], \"x\": -}", "invalid number"),
            ("{\"entities\": [], \"x\": 1.}", "invalid number"),
            ("{\"entities\": [], \"x\": \"\\ud800\"}", "lone surrogate"),
            ("{\"entities\": [], \"x\": \"\\q\"}", "invalid escape"),
            ("{\"entities\": [], \"x\": \"a\nb\"}", "control character"),
            ("{\"entities\": [], \"x\": tru}", "unexpected characters"),
            ("{\"entities\": [] \"x\": 1}", "expected ',' or '}'"),
            (String(repeating: "[", count: 100_000), "nested more than"),
        ]
        for (text, problem) in cases {
            do {
                _ = try SchemaDescription(json: Array(text.utf8))
                Issue.record("accepted: \(text.prefix(80))")
            } catch let error as DecodingError {
                #expect("\(error)".contains(problem), "\(text.prefix(80)): \(error)")
            }
        }
        // Invalid UTF-8 inside a string.
        var bytes = Array("{\"entities\": [], \"x\": \"ab\"}".utf8)
        bytes[bytes.count - 3] = 0xFF
        #expect(throws: DecodingError.self) { try SchemaDescription(json: bytes) }
        // A default out of range for its type.
        let huge = valid.replacingOccurrences(of: "\"integer\":", with: "\"integer\":1e30,\"was\":")
        if huge != valid { #expect(throws: DecodingError.self) { try SchemaDescription(json: Array(huge.utf8)) } }
    }
}
