import Foundation
import GRDB
import Skyros
import SkyrosShared
import SkyrosTestSupport
import SkyrosWire
import SkyrosZeroMQ
import Testing
import ZeroMQReference

/// What a run of the built `skyros` printed and how it ended.
struct ToolRun {
    var status: Int32
    var stdout: String
    var stderr: String

    /// The stdout lines, each parsed as a JSON object.
    var jsonLines: [[String: Any]] {
        stdout.split(separator: "\n").compactMap {
            (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any]
        }
    }

    /// The stdout as one JSON object.
    var json: [String: Any] { jsonLines.first ?? [:] }
}

/// End-to-end tests of the operating commands (DESIGN §8): the built `skyros` executable run
/// as a separate process (swift-argument-parser's pattern: the binary next to the test
/// bundle, Foundation.Process, stdout, stderr and exit status checked) against real store
/// files, a real `skyrosd` and real client processes.
@Suite("skyros operating commands", .serialized, .timeLimit(.minutes(3)))
struct OperatingToolTests {
    static var skyros: URL { ChildProcess.builtExecutable("skyros") }

    /// Runs `skyros` with `arguments` (through `launcher`, e.g. setpriv, when given), bounded.
    @discardableResult
    static func run(_ arguments: [String], launcher: [String] = [], seconds: Double = 60) throws -> ToolRun {
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("skyros-run-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        let out = directory.appendingPathComponent("out")
        let err = directory.appendingPathComponent("err")
        _ = FileManager.default.createFile(atPath: out.path, contents: nil)
        _ = FileManager.default.createFile(atPath: err.path, contents: nil)
        let process = Process()
        if let first = launcher.first {
            process.executableURL = URL(fileURLWithPath: first)
            process.arguments = Array(launcher.dropFirst()) + arguments
        } else {
            process.executableURL = skyros
            process.arguments = arguments
        }
        process.standardOutput = try FileHandle(forWritingTo: out)
        process.standardError = try FileHandle(forWritingTo: err)
        try process.run()
        let deadline = Date().addingTimeInterval(seconds)
        while process.isRunning && Date() < deadline { usleep(10_000) }
        if process.isRunning {
            kill(process.processIdentifier, SIGKILL)
            process.waitUntilExit()
            Issue.record("skyros \(arguments.joined(separator: " ")) did not finish in \(seconds) s")
        }
        process.waitUntilExit()
        return ToolRun(
            status: process.terminationStatus, stdout: (try? String(contentsOf: out, encoding: .utf8)) ?? "",
            stderr: (try? String(contentsOf: err, encoding: .utf8)) ?? "")
    }

    /// A temporary directory, removed by the caller.
    static func directory() -> String {
        let path = "/tmp/skt-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    /// Writes `users` users (each with a post) through a client of the group, and returns it.
    static func populate(_ container: URL, users: Int) throws -> Skyros {
        let store = try Skyros(sharedStack: testSchema, container: container, timeout: 10)
        try store.writeAndWait { context in
            for index in 0..<users {
                let user = User.create(in: context)
                user.firstname = "First\(index)"
                user.lastname = index % 2 == 0 ? "Even" : "Odd"
                user.age = 20 + index
                user.handle = "user-\(index)"
                let post = Post.create(in: context)
                post.title = "post \(index)"
                post.score = Double(index) / 2
                post.author = user
            }
        }
        return store
    }

    @Test("every command on a store file, as text and as --json, with DESIGN §8's keys")
    func storeFileCommands() throws {
        let root = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let file = root + "/embedded.sqlite"
        try StoreFiles.makeStore(at: URL(fileURLWithPath: file), users: 3)

        let status = try Self.run(["status", "--store", file, "--json"])
        #expect(status.status == 0, "\(status.stderr)")
        for key in [
            "pid", "uptimeSeconds", "protocolVersion", "schemaVersion", "sequence", "clients", "savesPerSecond",
            "saveLatencyP50Micros", "saveLatencyP99Micros", "storeBytes", "walBytes",
        ] {
            #expect(status.json[key] != nil, "status --json lacks \(key): \(status.stdout)")
        }
        #expect((status.json["objects"] as? [String: Any])?["User"] as? Int == 3)
        let statusText = try Self.run(["status", "--store", file])
        #expect(statusText.status == 0 && statusText.stdout.contains("User 3"), "\(statusText.stdout)")

        let inspect = try Self.run(["inspect", "--store", file, "--json"])
        #expect(inspect.status == 0)
        let entities = (inspect.json["entities"] as? [[String: Any]])?.compactMap { $0["name"] as? String } ?? []
        #expect(entities.contains("User") && entities.contains("Post"), "\(inspect.stdout)")
        // The versions the store has had (one here), with the fingerprint each had.
        let versions = inspect.json["versions"] as? [[String: Any]] ?? []
        #expect(versions.count == 1 && versions.first?["version"] as? Int == 1, "\(inspect.stdout)")
        #expect(versions.first?["fingerprint"] as? String == inspect.json["fingerprint"] as? String)
        let inspectText = try Self.run(["inspect", "--store", file])
        #expect(
            inspectText.stdout.contains("entity User") && inspectText.stdout.contains("handle"), "\(inspectText.stdout)"
        )

        let dump = try Self.run(["dump", "User", "--store", file])
        #expect(dump.status == 0)
        #expect(dump.jsonLines.count == 3, "\(dump.stdout)")
        let first = try #require(dump.jsonLines.first)
        #expect(first["entity"] as? String == "User" && first["id"] is String)
        #expect((first["values"] as? [String: Any])?["handle"] as? String == "user0", "\(dump.stdout)")
        let filtered = try Self.run([
            "dump", "User", "--store", file, "--filter", #"handle == "user1" || handle == "user2""#,
        ])
        #expect(
            filtered.jsonLines.compactMap { ($0["values"] as? [String: Any])?["handle"] as? String }.sorted() == [
                "user1", "user2",
            ])

        let history = try Self.run(["history", "--store", file])
        #expect(history.status == 0 && history.stdout.contains("no change sets"), "\(history.stdout)")

        let check = try Self.run(["check", "--store", file, "--json"])
        #expect(check.status == 0)
        #expect(
            check.json["ok"] as? Bool == true && (check.json["findings"] as? [Any])?.isEmpty == true, "\(check.stdout)")
        #expect(try Self.run(["check", "--store", file]).stdout.hasPrefix("ok: "))

        let copy = root + "/copy.sqlite"
        let backup = try Self.run(["backup", copy, "--store", file, "--json"])
        #expect(backup.status == 0, "\(backup.stderr)")
        #expect(
            backup.json["path"] as? String == copy && (backup.json["bytes"] as? Int ?? 0) > 0
                && backup.json["sequence"] as? Int == 0)
        #expect(try Self.run(["dump", "User", "--store", copy]).stdout == dump.stdout)
        let again = try Self.run(["backup", copy, "--store", file])
        #expect(again.status == 1 && again.stderr.contains("exists"), "\(again.stderr)")
    }

    @Test(
        "a store that migrated (versions 1, 2 and 3) is healthy to every --store command, and so is its backup",
        arguments: [1, 2, 3])
    func migratedStore(version: Int) throws {
        let root = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let file = root + "/migrated.sqlite"
        let url = URL(fileURLWithPath: file)
        try MigrationModels.fillV1(at: url, authors: 3)
        // Opened by each version up to `version` in turn, as an app updated twice would.
        for (schema, plan) in [
            (MigrationModels.v2, MigrationPlan()), (MigrationModels.v3, MigrationModels.stage3),
        ].prefix(version - 1) {
            try SQLiteStore(schema: schema, url: url, migrations: plan).close()
        }
        #expect(try SQLiteStore.storedSchemaVersion(at: url) == version)

        for command in [["check"], ["status"], ["inspect"], ["history"], ["dump", "Author"]] {
            let run = try Self.run(command + ["--store", file])
            #expect(run.status == 0, "skyros \(command.joined(separator: " ")) --store: \(run.stderr)")
            #expect(!run.stderr.contains("damaged") && !run.stdout.contains("damaged"), "\(run.stdout)\(run.stderr)")
        }
        #expect(try Self.run(["dump", "Author", "--store", file]).stdout.contains("Author 2"))
        let inspect = try Self.run(["inspect", "--store", file, "--json"])
        #expect(inspect.json["schemaVersion"] as? Int == version, "\(inspect.stdout)")
        let status = try Self.run(["status", "--store", file, "--json"])
        #expect(status.json["schemaVersion"] as? Int == version, "\(status.stdout)")
        // The README's restore procedure: a backup, then a check of the copy.
        let copy = root + "/copy.sqlite"
        let backup = try Self.run(["backup", copy, "--store", file])
        #expect(backup.status == 0, "\(backup.stderr)")
        let check = try Self.run(["check", "--store", copy])
        #expect(check.status == 0 && check.stdout.hasPrefix("ok: "), "\(check.stdout)\(check.stderr)")
    }

    @Test("exit codes: usage 64 (a filter error points at its column), no daemon 69, damaged store 65")
    func exitCodes() throws {
        let root = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let file = root + "/store.sqlite"
        try StoreFiles.makeStore(at: URL(fileURLWithPath: file), users: 40)

        #expect(try Self.run(["status"]).status == 64)
        #expect(try Self.run(["status", "--store", file, "--group", "g"]).status == 64)
        #expect(try Self.run(["dump", "--store", file, "--filter", "age > 1"]).status == 64)
        let filter = try Self.run(["dump", "User", "--store", file, "--filter", "age > 30 && (handle = \"x\")"])
        #expect(filter.status == 64)
        #expect(
            filter.stderr.contains("at column 21")
                && filter.stderr.contains("\n  " + String(repeating: " ", count: 20) + "^"), "\(filter.stderr)")
        let unknown = try Self.run(["dump", "User", "--store", file, "--filter", "agee > 3"])
        #expect(unknown.status == 64 && unknown.stderr.contains("no property 'agee'"), "\(unknown.stderr)")

        let absent = try Self.run(["status", "--group", "nobody-serves-this", "--groups-dir", root])
        #expect(absent.status == 69, "\(absent.stderr)")
        #expect(absent.stderr.contains("no daemon serves the group"))
        #expect(try Self.run(["metrics", "--group", "nobody-serves-this", "--groups-dir", root]).status == 69)

        try StoreFiles.damage(URL(fileURLWithPath: file))
        let check = try Self.run(["check", "--store", file, "--json"])
        #expect(check.status == 65, "\(check.stdout) \(check.stderr)")
        #expect(
            check.json["ok"] as? Bool == false && !((check.json["findings"] as? [String]) ?? []).isEmpty,
            "\(check.stdout)")
        let checkText = try Self.run(["check", "--store", file])
        #expect(checkText.status == 65 && checkText.stdout.contains("damaged"))
        #expect(try Self.run(["dump", "--store", file]).status == 65)
    }

    @Test("check finds Skyros' own damage: a gap in the history and a relationship pointing nowhere")
    func checkFindsInvariants() throws {
        let root = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let daemon = try DaemonProcessTests().startDaemon(root)
        let container = URL(fileURLWithPath: root).appendingPathComponent("g")
        do {
            let client = try Self.populate(container, users: 3)
            for index in 0..<3 {
                try client.writeAndWait { context in User.create(in: context).handle = "more-\(index)" }
            }
        }
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
        let file = container.appendingPathComponent("store.sqlite").path
        #expect(try Self.run(["check", "--store", file]).status == 0)
        // Damage only a program bypassing Skyros (and SQLite's foreign keys) can do.
        var configuration = Configuration()
        configuration.foreignKeysEnabled = false
        let queue = try DatabaseQueue(path: file, configuration: configuration)
        try queue.write { db in
            try db.execute(sql: "DELETE FROM skyros_history WHERE sequence = 2")
            try db.execute(sql: "DELETE FROM \"User\" WHERE handle = 'user-0'")
        }
        try queue.close()
        let check = try Self.run(["check", "--store", file, "--json"])
        #expect(check.status == 65)
        let findings = (check.json["findings"] as? [String]) ?? []
        #expect(findings.contains { $0.contains("history has gaps") && $0.contains("first missing: 2") }, "\(findings)")
        #expect(findings.contains { $0.contains("Post.author") && $0.contains("does not exist") }, "\(findings)")
    }

    @Test("through the daemon: status, inspect, dump --filter, history, metrics, as text and --json")
    func groupCommands() throws {
        let root = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let daemon = try DaemonProcessTests().startDaemon(root)
        defer {
            kill(daemon.pid, SIGTERM)
            daemon.wait()
        }
        let container = URL(fileURLWithPath: root).appendingPathComponent("g")
        let client = try Self.populate(container, users: 20)
        let group = ["--group", "g", "--groups-dir", root]

        let status = try Self.run(["status", "--json"] + group)
        #expect(status.status == 0, "\(status.stderr)")
        #expect(status.json["pid"] as? Int == Int(daemon.pid))
        #expect(status.json["sequence"] as? Int == 1)
        #expect((status.json["uptimeSeconds"] as? Double ?? -1) >= 0)
        #expect((status.json["savesPerSecond"] as? Double ?? 0) > 0)
        #expect(
            (status.json["saveLatencyP99Micros"] as? Double ?? 0)
                >= (status.json["saveLatencyP50Micros"] as? Double ?? 1))
        #expect((status.json["storeBytes"] as? Int ?? 0) > 0 && status.json["walBytes"] != nil)
        let clients = (status.json["clients"] as? [[String: Any]]) ?? []
        let me = clients.first { $0["pid"] as? Int == Int(getpid()) }
        #expect(me != nil, "\(status.stdout)")
        #expect(me?["uid"] as? Int == Int(getuid()) && me?["saves"] as? Int == 1)
        #expect(me?["connectedAt"] is String && me?["lastSeenAt"] is String && me?["name"] is String)
        let text = try Self.run(["status"] + group)
        #expect(
            text.stdout.contains("daemon     pid \(daemon.pid)") && text.stdout.contains("sequence   1"),
            "\(text.stdout)")

        let inspect = try Self.run(["inspect"] + group)
        #expect(
            inspect.status == 0 && inspect.stdout.contains("entity Post") && inspect.stdout.contains("-> User"),
            "\(inspect.stdout)")
        #expect(try Self.run(["inspect", "--json"] + group).json["fingerprint"] as? String == testSchema.fingerprint)

        let dump = try Self.run(["dump", "User", "--filter", #"age >= 35 && lastname == "Odd""#] + group)
        #expect(dump.status == 0, "\(dump.stderr)")
        let ages = dump.jsonLines.compactMap { ($0["values"] as? [String: Any])?["age"] as? Int }.sorted()
        #expect(ages == [35, 37, 39], "\(dump.stdout)")
        let posts = try Self.run(["dump", "Post", "--filter", #"author.handle == "user-3""#] + group)
        let author = (posts.jsonLines.first?["values"] as? [String: Any])?["author"] as? String
        #expect(posts.jsonLines.count == 1 && author?.hasPrefix("User/") == true, "\(posts.stdout)")

        try client.writeAndWait { context in User.create(in: context).handle = "late" }
        let history = try Self.run(["history", "--json"] + group)
        #expect(history.jsonLines.count == 2, "\(history.stdout)")
        let line = try #require(history.jsonLines.first)
        for key in ["sequence", "author", "date", "inserted", "updated", "deleted"] {
            #expect(line[key] != nil, "\(key)")
        }
        #expect(line["sequence"] as? Int == 1 && line["inserted"] as? Int == 40)
        let since = try Self.run(["history", "--since", "1"] + group)
        #expect(since.stdout.split(separator: "\n").count == 2 && since.stdout.contains("+1 ~0 -0"), "\(since.stdout)")

        let metrics = try Self.run(["metrics"] + group)
        #expect(metrics.status == 0)
        #expect(metrics.stdout.contains("skyros_saves_total 2"), "\(metrics.stdout)")
        #expect(metrics.stdout.contains("# TYPE skyros_save_duration_seconds histogram"))
        #expect(metrics.stdout.contains("skyros_events_published_total"))
    }

    @Test(
        "an admin command from a user who is not an admin is refused with 77",
        .enabled(if: getuid() == 0, "skipped: needs root, to run the tool as the user nobody"))
    func nonAdminRefused() throws {
        let root = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: root) }
        chmod(root, 0o755)
        let daemon = try DaemonProcessTests().startDaemon(root)
        defer {
            kill(daemon.pid, SIGTERM)
            daemon.wait()
        }
        let container = URL(fileURLWithPath: root).appendingPathComponent("g")
        _ = try Self.populate(container, users: 1)
        let tool = root + "/skyros"
        try copyExecutable(Self.skyros.path, to: tool)
        let setpriv = ["/usr/bin/setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"]
        // The container's mode keeps nobody out.
        let closed = try Self.run([tool, "status", "--group", "g", "--groups-dir", root], launcher: setpriv)
        #expect(closed.status == 77, "\(closed.stderr)")
        // With the mode loosened by mistake, the daemon refuses the admin session itself.
        for path in [container.path, container.path + "/requests.ipc", container.path + "/events.ipc"] {
            chmod(path, 0o777)
        }
        for command in ["status", "history", "inspect", "metrics"] {
            let refused = try Self.run([tool, command, "--group", "g", "--groups-dir", root], launcher: setpriv)
            #expect(refused.status == 77, "\(command): \(refused.stderr)")
            #expect(refused.stderr.contains("not an admin"), "\(refused.stderr)")
        }
        #expect(try Self.run(["status", "--group", "g", "--groups-dir", root]).status == 0)
    }

    @Test("backup while 4 processes write: the copy passes check and holds every save acknowledged before it started")
    func backupWhileWriting() throws {
        let root = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let daemon = try DaemonProcessTests().startDaemon(root)
        defer {
            kill(daemon.pid, SIGTERM)
            daemon.wait()
        }
        let container = URL(fileURLWithPath: root).appendingPathComponent("g")
        _ = try Self.populate(container, users: 500)
        let writers = try (0..<4).map { try ChildProcess(["ack-writer", container.path, "w\($0)"]) }
        defer {
            for writer in writers {
                kill(writer.pid, SIGKILL)
                writer.wait()
            }
        }
        for writer in writers { #expect(writer.waitForLine("ACK 20", seconds: 60)) }
        let group = ["--group", "g", "--groups-dir", root]
        let copy = root + "/copy.sqlite"
        let backup = try Self.run(["backup", copy, "--json"] + group)
        #expect(backup.status == 0, "\(backup.stderr)")
        #expect(backup.json["path"] as? String == copy)
        let sequence = backup.json["sequence"] as? Int ?? 0
        #expect(sequence > 80)
        // The writers went on: the backup did not stop them.
        for writer in writers { #expect(writer.waitForLine("ACK 30", seconds: 60)) }
        let check = try Self.run(["check", "--store", copy, "--json"])
        #expect(check.status == 0 && check.json["ok"] as? Bool == true, "\(check.stdout)")
        let handles = Set(
            try Self.run(["dump", "User", "--store", copy]).jsonLines.compactMap {
                ($0["values"] as? [String: Any])?["handle"] as? String
            })
        for writer in 0..<4 {
            for number in 1...20 { #expect(handles.contains("w\(writer)-\(number)"), "w\(writer)-\(number) missing") }
        }
        // The copy's sequence is its history's last, and it holds exactly that many change sets' users.
        let history = try Self.run(["history", "--store", copy, "--since", String(sequence - 1), "--json"])
        #expect(history.jsonLines.map { $0["sequence"] as? Int } == [sequence])

        // A backup of the file itself (--store) while the daemon and writers keep going.
        let direct = root + "/direct.sqlite"
        let fileBackup = try Self.run(["backup", direct, "--store", container.path + "/store.sqlite"])
        #expect(fileBackup.status == 0 && fileBackup.stdout.contains("integrity check ok"), "\(fileBackup.stderr)")
        #expect(try Self.run(["check", "--store", direct]).status == 0)
    }

    @Test("import then dump round trip, on a file and through the daemon; import refuses a file a daemon serves")
    func importDumpRoundTrip() throws {
        let root = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let daemon = try DaemonProcessTests().startDaemon(root)
        defer {
            kill(daemon.pid, SIGTERM)
            daemon.wait()
        }
        let container = URL(fileURLWithPath: root).appendingPathComponent("g")
        do {
            let client = try Self.populate(container, users: 30)
            try client.writeAndWait { context in
                let team = Team.create(in: context)
                team.name = "Reds"
                let badge = Badge.create(in: context)
                badge.label = "gold"
                badge.team = team
                let person = Person.create(in: context)
                person.name = "Ann"
                let passport = Passport.create(in: context)
                passport.number = "X1"
                passport.holder = person
            }
        }
        let group = ["--group", "g", "--groups-dir", root]
        let source = try Self.run(["dump"] + group)
        #expect(source.status == 0 && source.jsonLines.count == 64, "\(source.stderr)")
        let file = root + "/dump.jsonl"
        try source.stdout.write(toFile: file, atomically: true, encoding: .utf8)

        // Into an empty store file of the same schema.
        let empty = root + "/empty/store.sqlite"
        try FileManager.default.createDirectory(atPath: root + "/empty", withIntermediateDirectories: true)
        try SQLiteStore(schema: testSchema, url: URL(fileURLWithPath: empty)).close()
        let imported = try Self.run(["import", file, "--store", empty, "--chunk", "7", "--json"])
        #expect(imported.status == 0, "\(imported.stderr)")
        #expect(imported.json["objects"] as? Int == 64 && imported.json["inserted"] as? Int == 64)
        #expect(try Self.run(["dump", "--store", empty]).stdout == source.stdout)
        let twice = try Self.run(["import", file, "--store", empty])
        #expect(twice.status == 1 && twice.stderr.contains("--upsert"), "\(twice.stderr)")
        let upserted = try Self.run(["import", file, "--store", empty, "--upsert", "--json"])
        #expect(upserted.status == 0 && upserted.json["updated"] as? Int == 64, "\(upserted.stderr)")

        // A store a daemon serves is not written behind its back.
        let refused = try Self.run(["import", file, "--store", container.path + "/store.sqlite"])
        #expect(refused.status == 1 && refused.stderr.contains("serves the store"), "\(refused.stderr)")

        // Through another group's daemon, in chunks whose relationships point to later chunks.
        let other = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: other) }
        let second = try DaemonProcessTests().startDaemon(other)
        defer {
            kill(second.pid, SIGTERM)
            second.wait()
        }
        let secondContainer = URL(fileURLWithPath: other).appendingPathComponent("g")
        _ = try Skyros(sharedStack: testSchema, container: secondContainer, timeout: 10)
        let reversed = root + "/reversed.jsonl"
        try source.stdout.split(separator: "\n").reversed().joined(separator: "\n").write(
            toFile: reversed, atomically: true, encoding: .utf8)
        let through = try Self.run(["import", reversed, "--group", "g", "--groups-dir", other, "--chunk", "5"])
        #expect(through.status == 0, "\(through.stderr)")
        #expect(try Self.run(["dump", "--group", "g", "--groups-dir", other]).stdout == source.stdout)
        #expect(try Self.run(["check", "--group", "g", "--groups-dir", other]).status == 0)
    }

    @Test("watch prints the save of another process as it happens (--json), and the history of a file")
    func watchSeesAnotherProcess() throws {
        let root = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let daemon = try DaemonProcessTests().startDaemon(root)
        defer {
            kill(daemon.pid, SIGTERM)
            daemon.wait()
        }
        let container = URL(fileURLWithPath: root).appendingPathComponent("g")
        _ = try Self.populate(container, users: 2)
        let watch = try ChildProcess(
            ["watch", "--group", "g", "--groups-dir", root, "--json", "--count", "1", "--since", "1"],
            executable: Self.skyros)
        let writer = try ChildProcess(["write-via-shared", container.path])
        #expect(writer.wait() == .exited(0))
        #expect(watch.wait(seconds: 30) == .exited(0))
        let lines = watch.readAll().split(separator: "\n").compactMap {
            (try? JSONSerialization.jsonObject(with: Data($0.utf8))) as? [String: Any]
        }
        let event = try #require(lines.first)
        #expect(event["sequence"] as? Int == 2)
        let inserted = (event["inserted"] as? [[String: Any]]) ?? []
        #expect(((inserted.first?["values"]) as? [String: Any])?["handle"] as? String == "control", "\(lines)")
        for key in ["kind", "author", "date", "updated", "deleted"] { #expect(event[key] != nil, "\(key)") }

        let file = try Self.run(["watch", "--store", container.path + "/store.sqlite", "--since", "0", "--count", "2"])
        #expect(file.status == 0)
        #expect(
            file.stdout.contains("#1 ") && file.stdout.contains("#2 ") && file.stdout.contains("control"),
            "\(file.stdout)")
    }

    @Test("an admin session counts as having said hello: idle past the hello timeout, it is still answered")
    func adminSessionOutlivesTheHelloTimeout() throws {
        let root = Self.directory()
        defer { try? FileManager.default.removeItem(atPath: root) }
        let daemon = try ConnectionLimitProcessTests().startDaemon(root, arguments: ["--hello-timeout", "0.2"])
        defer {
            kill(daemon.pid, SIGTERM)
            daemon.wait()
        }
        let container = GroupContainer(url: URL(fileURLWithPath: root).appendingPathComponent("g"))
        _ = try Self.populate(container.url, users: 1)
        let context = try ZeroMQContext()
        defer { context.shutdown() }
        let dealer = try ZeroMQSocket(context: context, kind: .dealer)
        defer { dealer.close() }
        try dealer.setReceiveTimeout(milliseconds: 5_000)
        try dealer.connect(container.requestsEndpoint)
        try dealer.send([Data(AdminMessage.hello(clientName: "ops", pid: 1).encoded(requestID: 1))])
        guard case .welcome? = try? WireMessage.decode([UInt8](try dealer.receive().last ?? Data())).body else {
            Issue.record("no welcome")
            return
        }
        // Five times the hello timeout: a connection that had not said hello would be closed
        // (and the reply to a request on it lost, as a long backup's end was before the fix).
        usleep(1_000_000)
        try dealer.send([Data(AdminMessage.status.encoded(requestID: 2))])
        let reply = try AdminMessage.decode([UInt8](try dealer.receive().last ?? Data()))
        #expect(reply.requestID == 2)
        guard case .statusReply = reply.message else {
            Issue.record("not a status: \(reply.message)")
            return
        }
    }
}
