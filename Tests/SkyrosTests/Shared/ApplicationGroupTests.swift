import Foundation
import Skyros
import Testing

@Suite("Application groups")
struct ApplicationGroupTests {
    let noSystem = URL(fileURLWithPath: "/nonexistent-skyros-state")

    @Test("SKYROS_GROUPS_DIR comes first")
    func groupsDirFirst() throws {
        let url = try Skyros.containerURL(
            forApplicationGroup: "com.example.todo",
            environment: ["SKYROS_GROUPS_DIR": "/tmp/groups", "HOME": "/home/a"],
            systemStateDirectory: noSystem)
        #expect(url.path == "/tmp/groups/com.example.todo")
    }

    @Test("the systemd state directory is used when it exists")
    func systemStateDirectory() throws {
        let directory = try TemporaryDirectory()
        try FileManager.default.createDirectory(
            at: directory.file("com.example.todo"), withIntermediateDirectories: true)
        let url = try Skyros.containerURL(
            forApplicationGroup: "com.example.todo", environment: ["HOME": "/home/a"],
            systemStateDirectory: directory.url)
        #expect(url.standardizedFileURL.path == directory.file("com.example.todo").standardizedFileURL.path)
    }

    @Test("then XDG_DATA_HOME, then ~/.local/share")
    func xdgThenHome() throws {
        let xdg = try Skyros.containerURL(
            forApplicationGroup: "a.b", environment: ["XDG_DATA_HOME": "/data", "HOME": "/home/a"],
            systemStateDirectory: noSystem)
        #expect(xdg.path == "/data/skyros/a.b")
        let home = try Skyros.containerURL(
            forApplicationGroup: "a.b", environment: ["HOME": "/home/a"], systemStateDirectory: noSystem)
        #expect(home.path == "/home/a/.local/share/skyros/a.b")
    }

    @Test(
        "invalid identifiers are refused with a typed error, and no file is touched",
        arguments: [
            "", String(repeating: "a", count: 129), "a/b", "..", "a..b", "a b", "é", "a;b", "../etc", "a\u{0}b",
        ])
    func invalid(identifier: String) throws {
        let directory = try TemporaryDirectory()
        #expect {
            _ = try Skyros.containerURL(
                forApplicationGroup: identifier, environment: ["SKYROS_GROUPS_DIR": directory.url.path],
                systemStateDirectory: noSystem)
        } throws: { error in
            (error as? SkyrosError)?.code == .invalidApplicationGroup
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.url.path).isEmpty)
    }

    @Test("the longest valid identifier and every allowed character are accepted")
    func valid() throws {
        let longest = String(repeating: "x", count: 128)
        #expect(throws: Never.self) { try Skyros.validateApplicationGroup(longest) }
        #expect(throws: Never.self) { try Skyros.validateApplicationGroup("Az09._-") }
    }

    /// The rule of the README and docs/PROTOCOL.md, case by case: each identifier, whether it
    /// is accepted, and the part of the message that says why not.
    @Test(
        "one rule for group ids: 1-128 of [A-Za-z0-9._-], the first a letter or a digit, no '..'",
        arguments: [
            ("com.example.todo", nil), ("g", nil), ("1app", nil), ("a-b_c.d", nil), ("a.", nil), ("A", nil),
            ("9", nil), ("a.b.c", nil), (String(repeating: "x", count: 128), nil),
            ("", "it is empty"), (String(repeating: "x", count: 129), "longer than 128"),
            (".", "begin with a letter or a digit"), ("..", "contains '..'"),
            (".hidden", "begin with a letter or a digit"),
            ("-g", "begin with a letter or a digit"), ("_g", "begin with a letter or a digit"),
            ("a..b", "contains '..'"), ("a/b", "contains '/'"), ("a b", "only letters, digits"),
            ("é", "only letters, digits"), ("a:b", "only letters, digits"),
        ] as [(String, String?)])
    func rule(identifier: String, refusal: String?) throws {
        do {
            try Skyros.validateApplicationGroup(identifier)
            #expect(refusal == nil, "\"\(identifier)\" was accepted")
        } catch let error as SkyrosError {
            #expect(error.code == .invalidApplicationGroup)
            #expect(refusal.map { error.message.contains($0) } == true, "\"\(identifier)\": \(error.message)")
        }
    }

    @Test("the groups directory itself is never a container: '.' is refused before any file is touched")
    func dotIsNotTheGroupsDirectory() throws {
        let directory = try TemporaryDirectory()
        #expect(throws: SkyrosError.self) {
            _ = try Skyros.containerURL(
                forApplicationGroup: ".", environment: ["SKYROS_GROUPS_DIR": directory.url.path],
                systemStateDirectory: noSystem)
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: directory.url.path).isEmpty)
    }
}
