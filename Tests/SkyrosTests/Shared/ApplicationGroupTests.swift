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
}
