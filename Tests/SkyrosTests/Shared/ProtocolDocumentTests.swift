import Foundation
import Skyros
import SkyrosTestSupport
import SkyrosWire
import SkyrosZeroMQ
import Testing
import ZeroMQReference

/// docs/PROTOCOL.md is a contract: its worked example is read from the file itself, checked
/// against the code, and its byte sequences are sent to a real `skyrosd`.
@Suite("docs/PROTOCOL.md", .timeLimit(.minutes(3)))
struct ProtocolDocumentTests {
    static let document: String = {
        let url = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("docs/PROTOCOL.md")
        return (try? String(contentsOf: url, encoding: .utf8)) ?? ""
    }()

    /// The fenced block after `<!-- example:NAME -->`.
    static func example(_ name: String) -> String {
        guard let marker = document.range(of: "<!-- example:\(name) -->"),
            let open = document.range(of: "```", range: marker.upperBound..<document.endIndex),
            let lineEnd = document.range(of: "\n", range: open.upperBound..<document.endIndex),
            let close = document.range(of: "\n```", range: lineEnd.upperBound..<document.endIndex)
        else { return "" }
        return String(document[lineEnd.upperBound..<close.lowerBound])
    }

    /// The bytes of a hex block: on each line, the two-digit hex tokens before the comment.
    static func hex(_ name: String) -> [UInt8] {
        example(name).split(separator: "\n").flatMap { line in
            line.split(separator: " ").prefix { $0.count == 2 && UInt8($0, radix: 16) != nil }.map {
                UInt8($0, radix: 16)!
            }
        }
    }

    @Test("the worked example's description, fingerprint text and fingerprint are the code's")
    func fingerprintExample() throws {
        let json = Array(Self.example("description").utf8)
        #expect(json.count == 1043)
        let description = try JSONDecoder().decode(SchemaDescription.self, from: Data(json))
        #expect(Array(try description.canonicalJSON()) == json)
        let schema = try Schema(description: description)
        #expect(schema.fingerprintText == Self.example("fingerprint-text") + "\n")
        #expect(schema.fingerprint == Self.example("fingerprint"))
    }

    @Test("the document's decimal examples are the code's ordered texts")
    func decimalExamples() throws {
        let section = try #require(Self.document.range(of: "#### Decimal values"))
        let end = Self.document.range(of: "`ObjectID` =", range: section.upperBound..<Self.document.endIndex)?
            .lowerBound
        let rows = Self.document[section.upperBound..<(end ?? Self.document.endIndex)].split(separator: "\n")
            .filter { $0.hasPrefix("| ") && $0.hasSuffix("` |") }
        #expect(rows.count >= 4)
        for row in rows {
            let cells = row.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
            let value = try #require(Decimal(string: cells[0]), "\(row)")
            #expect("`\(OrderedDecimal.encode(value) ?? "?")`" == cells.last, "\(row)")
        }
    }

    @Test("every message kind is in the document's tables with its tag")
    func kindsAreDocumented() {
        for kind in WireProtocol.Kind.allCases {
            #expect(
                Self.document.contains("| \(kind.rawValue) | `\(kind)` |"),
                "\(kind) (\(kind.rawValue)) is not documented")
        }
        #expect(Self.document.contains("# The Skyros wire protocol, version \(WireProtocol.version)"))
    }

    @Test("the document's hello and save, sent as bytes to skyrosd, get the documented replies")
    func bytesAgainstTheDaemon() throws {
        let groups = DaemonProcessTests().groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let daemon = try DaemonProcessTests().startDaemon(groups)
        defer {
            kill(daemon.pid, SIGTERM)
            daemon.wait()
        }
        let container = GroupContainer(url: URL(fileURLWithPath: groups).appendingPathComponent("g"))
        let context = try ZeroMQContext()
        let dealer = try ZeroMQSocket(context: context, kind: .dealer)
        try dealer.setReceiveTimeout(milliseconds: 5_000)
        try dealer.connect(container.requestsEndpoint)
        let hello = Self.hex("hello") + Array(Self.example("description").utf8)
        try dealer.send([Data(hello)])
        let welcome = [UInt8](try dealer.receive().last ?? Data())
        // 04 40 01 04 00 TT EE…EE 01
        #expect(welcome.count == 6 + 16 + 1)
        #expect(Array(welcome.prefix(5)) == [0x04, 0x40, 0x01, 0x04, 0x00] && welcome.last == 0x01)
        #expect(welcome.count > 5 && welcome[5] != WireProtocol.broadcastTopic)
        try dealer.send([Data(Self.hex("save"))])
        #expect([UInt8](try dealer.receive().last ?? Data()) == Self.hex("saved"))
        #expect(Self.hex("saved") == [0x04, 0x44, 0x02, 0x01])
    }
}
