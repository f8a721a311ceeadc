import Foundation
import Skyros
import Testing
import TodoModel

/// docs/PROTOCOL.md's rules for turning a Swift model into its schema description, its
/// canonical JSON and its fingerprint, held against the code. The fingerprint is computed here
/// from the document's algorithm, over a description written out by hand: a client in another
/// language has nothing more.
@Suite("docs/PROTOCOL.md: schema descriptions")
struct SchemaDocumentTests {
    /// examples/Todo's model as the document's rules describe it, written out by hand.
    static let todoDescription = #"""
        {"entities":[{"indexes":[],"name":"TodoItem","properties":[\#
        {"defaultValue":{"text":""},"deleteRule":"nullify","isIndexed":false,"isOptional":false,"isRequired":false,"isUnique":false,"kind":"attribute","name":"title","storageType":"TEXT","typeName":"string"},\#
        {"defaultValue":{"integer":0},"deleteRule":"nullify","isIndexed":false,"isOptional":false,"isRequired":false,"isUnique":false,"kind":"attribute","name":"isDone","storageType":"INTEGER","typeName":"bool"},\#
        {"defaultValue":{"text":""},"deleteRule":"nullify","isIndexed":false,"isOptional":false,"isRequired":false,"isUnique":false,"kind":"attribute","name":"author","storageType":"TEXT","typeName":"string"},\#
        {"deleteRule":"nullify","isIndexed":false,"isOptional":false,"isRequired":false,"isUnique":false,"kind":"attribute","name":"created","storageType":"REAL","typeName":"date"}]}]}
        """#

    /// The document's fingerprint text of a description (its "Schema fingerprint" section),
    /// from the JSON alone.
    static func fingerprintText(ofJSON json: String) throws -> String {
        let root = try #require(try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any])
        let entities = try #require(root["entities"] as? [[String: Any]])
        var text = "skyros-schema-2\n"
        let sorted = entities.sorted {
            Array(($0["name"] as? String ?? "").utf8).lexicographicallyPrecedes(
                Array(($1["name"] as? String ?? "").utf8))
        }
        for entity in sorted {
            text += "entity \(entity["name"] as? String ?? "")\n"
            for (index, property) in (entity["properties"] as? [[String: Any]] ?? []).enumerated() {
                let kind = property["kind"] as? String ?? ""
                text +=
                    "  \(index) \(property["name"] as? String ?? "") \(kind) \(property["storageType"] as? String ?? "")"
                text += property["isOptional"] as? Bool == true ? "?" : "!"
                if kind == "attribute" { text += " \(property["typeName"] as? String ?? "")" }
                if property["isUnique"] as? Bool == true { text += " unique" }
                if property["isIndexed"] as? Bool == true { text += " indexed" }
                if let destination = property["destination"] as? String {
                    text += " -> \(destination) \(property["deleteRule"] as? String ?? "")"
                    if let inverse = property["inverse"] as? String { text += " inverse \(inverse)" }
                    if property["isRequired"] as? Bool == true { text += " required" }
                }
                text += "\n"
            }
            for index in entity["indexes"] as? [[String]] ?? [] { text += "  index \(index.joined(separator: ","))\n" }
        }
        return text
    }

    /// The document's hash: two FNV-1a lanes, the second over each byte XOR 0x5a.
    static func fingerprint(ofText text: String) -> String {
        var (a, b): (UInt64, UInt64) = (0xcbf2_9ce4_8422_2325, 0x6c62_272e_07bb_0142)
        for byte in text.utf8 {
            a = (a ^ UInt64(byte)) &* 0x0000_0100_0000_01b3
            b = (b ^ UInt64(byte ^ 0x5a)) &* 0x0000_0100_0000_01b3
        }
        func hex(_ lane: UInt64) -> String {
            let digits = String(lane, radix: 16)
            return String(repeating: "0", count: 16 - digits.count) + digits
        }
        return hex(a) + hex(b)
    }

    @Test("examples/Todo's fingerprint, from a description written by hand and the document's algorithm")
    func todoFingerprint() throws {
        #expect(Array(try todoSchema.schemaDescription.canonicalJSON()) == Array(Self.todoDescription.utf8))
        let text = try Self.fingerprintText(ofJSON: Self.todoDescription)
        #expect(text == todoSchema.fingerprintText)
        #expect(Self.fingerprint(ofText: text) == todoSchema.fingerprint)
        #expect(todoSchema.fingerprint == "4114692f289af5a057e456e0618af537")
    }

    @Test("a default made from the clock (Date()) is never taken for a constant: one fingerprint over 500 descriptions")
    func clockDefaultIsNotConstant() throws {
        var fingerprints: Set<String> = []
        for _ in 0..<500 {
            let schema = Schema([Folder.self, Note.self])
            fingerprints.insert(schema.fingerprint)
            let created = schema.schemaDescription.entities.first { $0.name == "Note" }?.properties.first {
                $0.name == "created"
            }
            #expect(created?.defaultValue == nil)
        }
        #expect(fingerprints.count == 1)
    }

    @Test("the second worked example: a Swift model with defaults and an inferred inverse gives the document's bytes")
    func defaultsExample() throws {
        let json = ProtocolDocumentTests.example("defaults-description")
        #expect(json.utf8.count == 1671)
        let schema = Schema([Folder.self, Note.self])
        #expect(Array(try schema.schemaDescription.canonicalJSON()) == Array(json.utf8))
        let text = try Self.fingerprintText(ofJSON: json)
        #expect(text == ProtocolDocumentTests.example("defaults-fingerprint-text") + "\n")
        #expect(text == schema.fingerprintText)
        #expect(Self.fingerprint(ofText: text) == ProtocolDocumentTests.example("defaults-fingerprint"))
        #expect(schema.fingerprint == ProtocolDocumentTests.example("defaults-fingerprint"))
    }

    @Test("the first worked example's fingerprint, by the document's algorithm alone")
    func firstExampleByTheDocument() throws {
        let text = try Self.fingerprintText(ofJSON: ProtocolDocumentTests.example("description"))
        #expect(text == ProtocolDocumentTests.example("fingerprint-text") + "\n")
        #expect(Self.fingerprint(ofText: text) == ProtocolDocumentTests.example("fingerprint"))
    }

    @Test(
        "canonical JSON writes reals and strings as the document says",
        arguments: [
            ("1", "1"), ("-0", "-0"), ("100", "100"), ("0.5", "0.5"), ("0.0001", "0.0001"), ("0.00001", "1e-05"),
            ("9007199254740992", "9007199254740992"), ("1.5e16", "1.5e+16"), ("1e16", "1e+16"),
            ("1.7976931348623157e308", "1.7976931348623157e+308"), ("0.1", "0.1"),
        ])
    func canonicalReals(written: String, canonical: String) throws {
        let description = try SchemaDescription(json: Array(Self.description(default: #"{"real":\#(written)}"#).utf8))
        #expect(
            String(decoding: try description.canonicalJSON(), as: UTF8.self)
                == Self.description(default: #"{"real":\#(canonical)}"#))
    }

    @Test("canonical JSON escapes quotes, backslashes and control characters only")
    func canonicalStrings() throws {
        let written = #"{"text":"a\u001fb\n\t\"\\\/é\u007f\u0008\u000c\r\u0000"}"#
        let canonical = #"{"text":"a\u001fb\n\t\"\\/é"# + "\u{7f}" + #"\b\f\r\u0000"}"#
        let description = try SchemaDescription(json: Array(Self.description(default: written).utf8))
        #expect(
            String(decoding: try description.canonicalJSON(), as: UTF8.self) == Self.description(default: canonical))
    }

    @Test("a blob default is standard base64 with padding")
    func canonicalBlob() throws {
        let bytes = Data([0xfb, 0xff, 0xfe, 0x00])
        let written = #"{"blob":"\#(bytes.base64EncodedString())"}"#
        #expect(written == #"{"blob":"+//+AA=="}"#)
        let description = try SchemaDescription(json: Array(Self.description(default: written).utf8))
        #expect(String(decoding: try description.canonicalJSON(), as: UTF8.self) == Self.description(default: written))
    }

    /// A one-entity description whose one attribute has the given default (JSON).
    static func description(default value: String) -> String {
        #"{"entities":[{"indexes":[],"name":"E","properties":[{"defaultValue":\#(value),"deleteRule":"nullify","isIndexed":false,"isOptional":false,"isRequired":false,"isUnique":false,"kind":"attribute","name":"p","storageType":"BLOB","typeName":"data"}]}]}"#
    }
}

/// The second worked example's model (docs/PROTOCOL.md, "From a Swift model to its description").
@Entity final class Folder {
    var name: String = "Inbox"
    var weight: Double = 0.5
    @Relationship(deleteRule: .cascade) var notes: [Note] = []
}

@Entity final class Note {
    var title: String = ""
    var isPinned: Bool = false
    var due: Date? = nil
    var created: Date = Date()
    var folder: Folder? = nil
}
