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

/// The systemd units' hardening, as `systemd-analyze security` scores them.
@Suite("systemd unit")
struct SystemdUnitTests {
    static let analyzer = ["/usr/bin/systemd-analyze", "/bin/systemd-analyze"].first {
        FileManager.default.isExecutableFile(atPath: $0)
    }

    /// A unit file of the repository's `systemd` directory.
    static func unitFile(_ name: String) -> URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("systemd").appendingPathComponent(name)
    }

    /// Whether the unit names a `User=` other than root.
    static func runsAsNonRoot(_ unitFile: URL) throws -> Bool {
        let unit = try String(contentsOf: unitFile, encoding: .utf8)
        let settings = unit.split(separator: "\n").map { $0.trimmingCharacters(in: .whitespaces) }
        return settings.contains { $0.hasPrefix("User=") && $0 != "User=root" && $0 != "User=0" }
    }

    /// The unit's overall exposure by `systemd-analyze security --offline=yes`, and the analyzer's
    /// whole report (for a failure's message).
    static func exposure(of unitFile: URL) throws -> (score: Double, report: String) {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: try #require(analyzer))
        process.arguments = ["security", "--offline=yes", "--no-pager", unitFile.path]
        let output = Pipe()
        process.standardOutput = output
        process.standardError = output
        try process.run()
        let text = String(decoding: output.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        process.waitUntilExit()
        let line = try #require(text.split(separator: "\n").first { $0.contains("Overall exposure level") }, "\(text)")
        let score = try #require(
            line.split(separator: ":").last?.split(separator: " ").first.flatMap { Double($0) }, "\(line)")
        return (score, text)
    }

    @Test(
        "the unit does not run as root and its exposure is at most 1.5",
        .enabled(if: analyzer != nil, "systemd-analyze is missing"))
    func exposure() throws {
        let unitFile = Self.unitFile("skyrosd@.service")
        #expect(try Self.runsAsNonRoot(unitFile))
        let (score, report) = try Self.exposure(of: unitFile)
        #expect(score <= 1.5, "\(report)")
    }

    @Test(
        "the gateway's unit does not run as root and its exposure is at most 1.0",
        .enabled(if: analyzer != nil, "systemd-analyze is missing"))
    func gatewayExposure() throws {
        let unitFile = Self.unitFile("skyros-gateway@.service")
        #expect(try Self.runsAsNonRoot(unitFile))
        let (score, report) = try Self.exposure(of: unitFile)
        #expect(score <= 1.0, "\(report)")
    }
}
