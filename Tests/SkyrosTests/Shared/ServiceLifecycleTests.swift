import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// Save on stop without hijacking the process: a stack run by a ServiceLifecycle
/// `ServiceGroup` through a `SkyrosService`, and stacks that opt out.
@Suite("Save on stop and ServiceLifecycle", .timeLimit(.minutes(3)))
struct ServiceLifecycleTests {
    /// The number of users in the store file a child wrote, and whether the main context's
    /// unsaved user is among them.
    func contents(at path: String) throws -> (count: Int, unsavedMain: Bool) {
        let store = try Skyros(sqliteStack: testSchema, at: URL(fileURLWithPath: path), savesOnStop: false)
        var count = -1
        var unsavedMain = false
        store.read { context in
            count = try User.count(in: context)
            unsavedMain = try User.count(where: #Predicate { $0.handle == "unsaved-main" }, in: context) == 1
        }
        return (count, unsavedMain)
    }

    @Test("SIGTERM to a ServiceGroup running a SkyrosService: in-flight writes and the main context are saved, exit 0")
    func gracefulShutdownSaves() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("store.sqlite").path
        let child = try ChildProcess(["service-write", path, "300"])
        #expect(child.waitForLine("WRITING"))
        kill(child.pid, SIGTERM)
        #expect(child.wait() == .exited(0))
        #expect(child.readAll().contains("STOPPED"))
        let saved = try contents(at: path)
        #expect(saved.count == 301)
        #expect(saved.unsavedMain)
    }

    @Test("savesOnStop: false installs no handler: SIGTERM's default action ends the process at once, nothing saved")
    func optOutInstallsNothing() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("store.sqlite").path
        let child = try ChildProcess(["handler-state", path, "false"])
        #expect(child.waitForLine("HANDLER default"))
        let sent = Date()
        kill(child.pid, SIGTERM)
        #expect(child.wait(seconds: 5) == .signalled(SIGTERM))
        #expect(Date().timeIntervalSince(sent) < 2)
        let saved = try contents(at: path)
        #expect(saved.count == 0)
    }

    @Test(
        "savesOnStop: true (the default) still installs the handler: SIGTERM saves the main context, then ends as signalled"
    )
    func defaultStillSaves() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("store.sqlite").path
        let child = try ChildProcess(["handler-state", path, "true"])
        #expect(child.waitForLine("HANDLER installed"))
        kill(child.pid, SIGTERM)
        #expect(child.wait() == .signalled(SIGTERM))
        let saved = try contents(at: path)
        #expect(saved.count == 1)
        #expect(saved.unsavedMain)
    }
}

/// The systemd unit's hardening, as `systemd-analyze security` scores it.
@Suite("systemd unit")
struct SystemdUnitTests {
    static let analyzer = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"].first {
        FileManager.default.isExecutableFile(atPath: $0)
    }

    static var unitFile: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("systemd/skyrosd@.service")
    }

    @Test(
        "the unit does not run as root and its exposure is at most 1.5",
        .enabled(if: analyzer != nil, "systemd-analyze is missing"))
    func exposure() throws {
        let unit = try String(contentsOf: Self.unitFile, encoding: .utf8)
        let settings = unit.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
        #expect(settings.contains { $0.hasPrefix("User=") && $0 != "User=root" && $0 != "User=0" })
        let process = Process()
        process.executableURL = URL(fileURLWithPath: try #require(Self.analyzer))
        process.arguments = ["security", "--offline=yes", "--no-pager", Self.unitFile.path]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        let line = try #require(text.split(separator: "\n").first { $0.contains("Overall exposure level") }, "\(text)")
        let score = try #require(
            line.split(separator: ":").last?.split(separator: " ").first.flatMap { Double($0) }, "\(line)")
        #expect(score <= 1.5, "\(text)")
    }
}
