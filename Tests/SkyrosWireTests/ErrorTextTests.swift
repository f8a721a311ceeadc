import Foundation
import SkyrosWire
import Testing

/// Every error text the wire codec can send, as a person reads it (issue 33: "invalid a batch
/// selects by predicate").
@Suite("Error texts")
struct ErrorTextTests {
    /// Every text a `WireError` can have, with the arguments the codec gives it.
    static let texts: [(WireError, String)] = [
        (.truncated, "the message ends too early"),
        (.trailingBytes(3), "3 unexpected bytes after the message"),
        (.tooLarge(20_000_000), "the message is 20000000 bytes, more than allowed"),
        (.unsupportedVersion(3), "protocol version 3 is not supported (this side speaks 4)"),
        (.unknownMessageType(200), "unknown message type 200"),
        (.unimplementedMessageType(99), "message type 99 is reserved and not implemented by this daemon"),
        (.invalidTag("bool", 2), "invalid bool tag 2"),
        (.invalidTag("event kind", 9), "invalid event kind tag 9"),
        (.invalidTag("batch operation", 5), "invalid batch operation tag 5"),
        (.invalidTag("value", 7), "invalid value tag 7"),
        (.invalidTag("comparison", 8), "invalid comparison tag 8"),
        (.invalidTag("predicate", 13), "invalid predicate tag 13"),
        (.invalidUTF8, "a string is not valid UTF-8"),
        (.tooDeep, "the predicate is nested too deeply"),
        (.invalidValue("varint"), "invalid varint"),
        (.invalidValue("integer"), "invalid integer"),
        (.invalidValue("version 9223372036854775808"), "invalid version 9223372036854775808"),
        (.invalidValue("merge policy 7"), "invalid merge policy 7"),
        (
            .refused("a batch selects by predicate: no sort keys, limit or offset"),
            "a batch selects by predicate: no sort keys, limit or offset"
        ),
        (.refused("a batch delete has no assignments"), "a batch delete has no assignments"),
        (.refused("a batch update has at least one assignment"), "a batch update has at least one assignment"),
        (.refused("property 3 is given twice"), "property 3 is given twice"),
        (.refused("an entity name is empty"), "an entity name is empty"),
        (.refused("a property path is empty"), "a property path is empty"),
    ]

    @Test("every WireError reads as the list says")
    func wireErrors() {
        for (error, text) in Self.texts { #expect(error.description == text) }
    }

    /// Whether a text reads badly: an article after "invalid", doubled or stray spaces.
    static func readsBadly(_ text: String) -> Bool {
        text.contains("invalid a ") || text.contains("invalid an ") || text.contains("invalid the ")
            || text.contains("  ")
            || text.hasPrefix(" ") || text.hasSuffix(" ") || text.contains(" ,") || text.contains(" :")
    }

    @Test("no error text reads 'invalid a …', none has doubled spaces")
    func proofread() {
        for (error, _) in Self.texts { #expect(!Self.readsBadly(error.description), "\(error.description)") }
    }

    @Test("the sources that build the daemon's error texts hold no such text")
    func sourcesProofread() throws {
        let sources = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("Sources")
        let folders = ["SkyrosWire", "SkyrosDaemon", "Skyros/Store", "Skyros/Facade"]
        var scanned = 0
        for folder in folders {
            let directory = sources.appendingPathComponent(folder)
            for name in try FileManager.default.contentsOfDirectory(atPath: directory.path)
            where name.hasSuffix(".swift") {
                let text = try String(contentsOf: directory.appendingPathComponent(name), encoding: .utf8)
                scanned += 1
                for line in text.split(separator: "\n") {
                    // String literals of errors: .invalidValue("a …") would read "invalid a …".
                    for bad in [".invalidValue(\"a ", ".invalidValue(\"an ", ".invalidValue(\"empty"] {
                        #expect(!line.contains(bad), "\(name): \(line)")
                    }
                    guard line.contains("SkyrosError(") || line.contains("throw ") else { continue }
                    let literal = line.split(separator: "\"", omittingEmptySubsequences: false).enumerated()
                        .filter { $0.offset % 2 == 1 }.map(\.element)
                    // (Pieces between quotes may be code between interpolations: only what a
                    // literal cannot hold is looked for.)
                    for piece in literal {
                        #expect(
                            !piece.contains("invalid a ") && !piece.contains("invalid an ") && !piece.contains("  "),
                            "\(name): \(line)")
                    }
                }
            }
        }
        #expect(scanned > 20)
    }
}
