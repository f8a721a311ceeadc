import Foundation
import Skyros
import SkyrosShared
import SkyrosTestSupport
import SkyrosZeroMQ
import Testing

/// A datagram socket standing in for systemd's notification socket.
final class NotifySocket: @unchecked Sendable {
    let path: String
    private let fd: Int32

    init() throws {
        path = "/tmp/skn-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).sock"
        fd = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue), 0)
        guard fd >= 0, withUnixSocketAddress(path, { bind(fd, $0, $1) }) == 0 else { throw POSIXError(.EADDRINUSE) }
    }

    /// Waits for a datagram containing `state` (e.g. "READY=1"); false on timeout.
    func waitFor(_ state: String, seconds: Double = 20) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, 100) >= 0 else { return false }
            guard descriptor.revents != 0 else { continue }
            var buffer = [UInt8](repeating: 0, count: 4096)
            let count = recv(fd, &buffer, buffer.count, 0)
            if count > 0,
                String(decoding: buffer[0..<count], as: UTF8.self).split(separator: "\n").contains(Substring(state))
            {
                return true
            }
        }
        return false
    }

    deinit {
        close(fd)
        unlink(path)
    }
}

/// The real `skyrosd` executable, started and stopped by the tests.
@Suite("skyrosd process", .timeLimit(.minutes(3)))
struct DaemonProcessTests {
    static var skyrosd: URL { ChildProcess.builtExecutable("skyrosd") }

    /// Starts skyrosd for group `g` in `groups` and waits for its READY=1 (bounded).
    func startDaemon(_ groups: String, sourceLocation: SourceLocation = #_sourceLocation) throws -> ChildProcess {
        let notify = try NotifySocket()
        let daemon = try ChildProcess(
            ["--group", "g", "--groups-dir", groups], executable: Self.skyrosd,
            environment: ["NOTIFY_SOCKET": notify.path])
        #expect(notify.waitFor("READY=1"), "skyrosd did not get ready", sourceLocation: sourceLocation)
        return daemon
    }

    func groupsDirectory() -> String {
        let path = "/tmp/skg-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }

    @Test("sd_notify: READY once serving, STOPPING and exit 0 on SIGTERM; clients are served in between")
    func lifecycle() throws {
        let groups = groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let notify = try NotifySocket()
        let daemon = try ChildProcess(
            ["--group", "com.example.test", "--groups-dir", groups], executable: Self.skyrosd,
            environment: ["NOTIFY_SOCKET": notify.path, "WATCHDOG_USEC": "200000"])
        #expect(notify.waitFor("READY=1"))
        #expect(notify.waitFor("WATCHDOG=1"))
        let container = URL(fileURLWithPath: groups).appendingPathComponent("com.example.test")
        do {
            let store = try Skyros(sharedStack: testSchema, container: container)
            var count = -1
            store.writeSync { makeUsers([("A", "B")], in: $0) }
            store.read { count = try User.count(in: $0) }
            #expect(count == 1)
            #expect(store.flush(timeout: 10))
        }
        let attributes = try FileManager.default.attributesOfItem(atPath: container.path)
        #expect((attributes[.posixPermissions] as? Int) == 0o770)
        kill(daemon.pid, SIGTERM)
        #expect(notify.waitFor("STOPPING=1"))
        #expect(daemon.wait() == .exited(0))
    }

    @Test("SIGTERM while clients write: exit 0, every acknowledged save in the store, the store checkpointed")
    func sigtermKeepsAcknowledgedSaves() throws {
        let groups = groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let daemon = try startDaemon(groups)
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g")
        let writers = try ["a", "b"].map { try ChildProcess(["ack-writer", container.path, $0]) }
        for writer in writers { #expect(writer.waitForLine("ACK 200")) }
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait(seconds: 10) == .exited(0))
        var acknowledged: [String] = []
        for (name, writer) in zip(["a", "b"], writers) {
            kill(writer.pid, SIGKILL)
            writer.wait()
            acknowledged += writer.readAll().split(separator: "\n").compactMap { line in
                line.hasPrefix("ACK ") ? "\(name)-\(line.dropFirst(4))" : nil
            }
        }
        #expect(acknowledged.count >= 400)
        #expect(!FileManager.default.fileExists(atPath: container.appendingPathComponent("store.sqlite-wal").path))
        let store = try SQLiteStore(schema: testSchema, url: container.appendingPathComponent("store.sqlite"))
        defer { try? store.close() }
        let stored = Set(
            try store.rows(#"SELECT "lastname" FROM "User" WHERE "firstname" = 'ack'"#).map { row in
                if case .text(let label) = row[0] { label } else { "?" }
            })
        #expect(Set(acknowledged).subtracting(stored).isEmpty, "acknowledged but not stored")
    }

    @Test("a second daemon for the same group exits 2 with a clear message; the first keeps serving")
    func secondDaemon() throws {
        let groups = groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let first = try startDaemon(groups)
        let second = try ChildProcess(["--group", "g", "--groups-dir", groups], executable: Self.skyrosd)
        #expect(second.wait() == .exited(2))
        #expect(second.readAll().contains("another skyrosd already serves the group"))
        let store = try Skyros(
            sharedStack: testSchema, container: URL(fileURLWithPath: groups).appendingPathComponent("g"))
        var count = -1
        store.read { count = try User.count(in: $0) }
        #expect(count == 0)
        kill(first.pid, SIGTERM)
        #expect(first.wait() == .exited(0))
    }

    @Test("4 client processes × 250 writes: the store and every client count 1,000, each saw the others' inserts")
    func fourClients() throws {
        let groups = groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let daemon = try startDaemon(groups)
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g")
        // The schema is created by a first hello, so that the writers start on the same store.
        let observer = try Skyros(sharedStack: testSchema, container: container)
        let writers = try (0..<4).map { index in
            try ChildProcess(["shared-writer", container.path, "250", "w\(index)", "750"])
        }
        for writer in writers { #expect(writer.waitForLine("READY")) }
        #expect(FileManager.default.createFile(atPath: container.appendingPathComponent("go").path, contents: nil))
        for writer in writers {
            #expect(writer.wait(seconds: 50) == .exited(0))
            #expect(writer.readAll().contains("SEEN 750"))
        }
        var count = -1
        observer.read { count = try User.count(in: $0) }
        #expect(count == 1_000)
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
    }

    @Test(
        "a user outside the group is refused with a clear error; a member is served",
        .enabled(if: getuid() == 0, "skipped: needs root, to run a client as the user nobody"))
    func unauthorisedUser() throws {
        let groups = groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        chmod(groups, 0o755)
        let daemon = try startDaemon(groups)
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g").path
        // The helper binary must be reachable by nobody: copy it next to the groups.
        let helper = groups + "/skyros-test-child"
        try copyExecutable(ChildProcess.helperURL.path, to: helper)
        let outsider = try ChildProcess(
            ["--reuid=nobody", "--regid=nogroup", "--clear-groups", helper, "shared-open", container],
            executable: URL(fileURLWithPath: "/usr/bin/setpriv"))
        #expect(outsider.wait() == .exited(0))
        let output = outsider.readAll()
        #expect(output.contains("ERROR permissionDenied"), "\(output)")
        // The daemon checks each peer's credentials too: with the container's mode loosened
        // by mistake, the outsider reaches the sockets and the daemon refuses it.
        for path in [container, container + "/requests.ipc", container + "/events.ipc"] { chmod(path, 0o777) }
        let reachable = try ChildProcess(
            ["--reuid=nobody", "--regid=nogroup", "--clear-groups", helper, "shared-open", container],
            executable: URL(fileURLWithPath: "/usr/bin/setpriv"))
        #expect(reachable.wait() == .exited(0))
        let refused = reachable.readAll()
        #expect(refused.contains("ERROR permissionDenied") && refused.contains("neither the owner"), "\(refused)")
        let member = try ChildProcess(["shared-open", container])
        #expect(member.wait() == .exited(0))
        #expect(member.readAll().contains("OPENED"))
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
    }

    @Test(
        "events stay in the group: with the container's mode loosened, an outsider's subscription receives nothing",
        .enabled(if: getuid() == 0, "skipped: needs root, to run a subscriber as the user nobody"))
    func eventsStayInTheGroup() throws {
        let groups = groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        chmod(groups, 0o755)
        let daemon = try startDaemon(groups)
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g").path
        for path in [container, container + "/requests.ipc", container + "/events.ipc"] { chmod(path, 0o777) }
        let helper = groups + "/skyros-test-child"
        try copyExecutable(ChildProcess.helperURL.path, to: helper)
        // Both subscribe to everything for 3 s with a plain SUB socket; the daemon publishes a
        // heartbeat every 100 ms and the member's saves below.
        let outsider = try ChildProcess(
            ["--reuid=nobody", "--regid=nogroup", "--clear-groups", helper, "raw-subscribe", container, "3"],
            executable: URL(fileURLWithPath: "/usr/bin/setpriv"))
        let member = try ChildProcess(["raw-subscribe", container, "3"])
        #expect(outsider.waitForLine("SUBSCRIBED"))
        #expect(member.waitForLine("SUBSCRIBED"))
        let store = try Skyros(sharedStack: testSchema, container: URL(fileURLWithPath: container), timeout: 5)
        for index in 0..<5 {
            try store.writeAndWait { context in
                let user = User.create(in: context)
                user.handle = "secret-\(index)"
            }
        }
        #expect(outsider.wait(seconds: 15) == .exited(0))
        #expect(member.wait(seconds: 15) == .exited(0))
        let seenByOutsider = outsider.readAll()
        let seenByMember = member.readAll()
        #expect(seenByOutsider.contains("RECEIVED 0"), "\(seenByOutsider)")
        // The control: the same subscriber run by a member receives heartbeats and the saves.
        let count =
            seenByMember.split(separator: "\n").first { $0.hasPrefix("RECEIVED ") }
            .flatMap { Int($0.dropFirst("RECEIVED ".count)) } ?? 0
        #expect(count >= 5, "\(seenByMember)")
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
    }

    @Test("a writer's saves all succeed beside 4 processes fetching 2,000 objects in a loop")
    func readFlood() throws {
        let groups = groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let daemon = try startDaemon(groups)
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g")
        let writer = try Skyros(sharedStack: testSchema, container: container, timeout: 2)
        try writer.writeAndWait { context in
            for index in 0..<2_000 {
                let user = User.create(in: context)
                user.handle = "seed-\(index)"
            }
        }
        let readers = try (0..<4).map { _ in try ChildProcess(["read-flood", container.path]) }
        for reader in readers { #expect(reader.waitForLine("READY")) }
        // Each save waits for its acknowledgement, 2 s at most; before the daemon read beside
        // its commits, a third of them timed out behind the reads.
        var failures: [SkyrosError.Code] = []
        for index in 0..<60 {
            do {
                try writer.writeAndWait { context in User.create(in: context).handle = "writer-\(index)" }
            } catch let error as SkyrosError {
                failures.append(error.code)
            }
        }
        #expect(
            FileManager.default.createFile(atPath: container.appendingPathComponent("stop-flood").path, contents: nil))
        for reader in readers {
            #expect(reader.wait(seconds: 30) == .exited(0))
            let output = reader.readAll()
            #expect(output.contains("READS ") && !output.contains("READS 0\n"), "\(output)")
        }
        #expect(failures.isEmpty, "\(failures)")
        #expect(try writer.read { context in try User.count(in: context) } == 2_060)
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
    }

    @Test("a daemon restart: calls while it is away fail after the timeout; then clients go on by themselves")
    func restart() throws {
        let groups = groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        var daemon = try startDaemon(groups)
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g")
        let store = try Skyros(sharedStack: testSchema, container: container, timeout: 1)
        let first = CompletionProbe()
        store.writeSync({ makeUsers([("A", "B")], in: $0) }, completion: first.completion)
        #expect(first.wait())
        #expect(first.calls.first! == nil)

        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
        let started = Date()
        let recorder = ErrorRecorder()
        store.errorHandler = { recorder.record($0) }
        var count = -1
        store.read { count = try User.count(in: $0) }
        #expect(count == -1)
        #expect(recorder.errors.first?.code == .daemonUnavailable)
        #expect(Date().timeIntervalSince(started) < 10)

        daemon = try startDaemon(groups)
        let second = CompletionProbe()
        store.writeSync({ makeUsers([("C", "D")], in: $0) }, completion: second.completion)
        #expect(second.wait())
        #expect(second.calls.first! == nil)
        store.read { count = try User.count(in: $0) }
        #expect(count == 2)
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
    }

    @Test("ping-pong: two processes increment one counter in turns up to 100, each acting on the other's events")
    func pingPong() throws {
        let groups = groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let daemon = try startDaemon(groups)
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g")
        let store = try Skyros(sharedStack: testSchema, container: container)
        let created = CompletionProbe()
        store.writeSync({ context in Tag.create(in: context).label = "counter" }, completion: created.completion)
        #expect(created.wait())
        let players = try (0..<2).map { try ChildProcess(["ping-pong", container.path, "\($0)"]) }
        for player in players { #expect(player.waitForLine("READY")) }
        #expect(FileManager.default.createFile(atPath: container.appendingPathComponent("go").path, contents: nil))
        for player in players {
            #expect(player.wait(seconds: 50) == .exited(0))
            #expect(player.readAll().contains("FINAL 100"))
        }
        var value = -1
        store.read { context in value = try Tag.first(in: context)?.uses ?? -1 }
        #expect(value == 100)
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
    }

    @Test("a client that only reads causes no change events")
    func readOnlyClient() async throws {
        let groups = groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let daemon = try startDaemon(groups)
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g")
        let watcher = try Skyros(sharedStack: testSchema, container: container)
        let changes = watcher.changes
        let collected = Task { () -> [StoreChange] in
            var seen: [StoreChange] = []
            for await change in changes {
                seen.append(change)
                if !change.inserted.isEmpty { break }  // the control write below
            }
            return seen
        }
        let reader = try ChildProcess(["shared-read", container.path])
        #expect(await reader.wait() == .exited(0))
        #expect(reader.readAll().contains("COUNT 0"))
        // A write by another process afterwards is seen: the watcher was listening.
        let writer = try ChildProcess(["write-via-shared", container.path])
        #expect(await writer.wait() == .exited(0))
        let timeout = Task {
            try? await Task.sleep(for: .seconds(10))
            collected.cancel()
        }
        let seen = await collected.value
        timeout.cancel()
        #expect(seen.count == 1)
        #expect(seen.first?.inserted.count == 1)
        kill(daemon.pid, SIGTERM)
        #expect(await daemon.wait() == .exited(0))
    }

    @Test("`skyros demo` runs a daemon and three clients sharing a todo list, and exits 0")
    func demo() throws {
        let demo = try ChildProcess(["demo"], executable: ChildProcess.builtExecutable("skyros"))
        #expect(demo.wait(seconds: 50) == .exited(0))
        let output = demo.readAll()
        for line in [
            "[alice] added 'buy milk'", "[bob] marked 'fix bike' done", "[watcher] saw everything",
            "skyrosd stopped with status 0", "demo finished: 3 processes shared 6 todos through one daemon",
        ] {
            #expect(output.contains(line), "missing: \(line)")
        }
    }

    @Test("`skyros demo` started by its bare name from PATH, in another directory, finds skyrosd beside it")
    func demoFromPath() throws {
        let products = ChildProcess.builtExecutable("skyros").deletingLastPathComponent().path
        // `exec skyros`: argv[0] is the bare name a shell gives, as the sync walk-through has it.
        let demo = try ChildProcess(
            ["-c", "cd / && exec skyros demo"], executable: URL(fileURLWithPath: "/bin/sh"),
            environment: ["PATH": "\(products):/usr/bin:/bin"])
        #expect(demo.wait(seconds: 50) == .exited(0))
        #expect(demo.readAll().contains("demo finished: 3 processes shared 6 todos through one daemon"))
    }

    @Test("`skyros demo` with no skyrosd beside it nor on PATH says so, exits 69, and starts nothing")
    func demoWithoutDaemon() throws {
        let alone = groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: alone) }
        // Copied by cp, not by this process: a file this process held open for writing would be
        // inherited by the children other tests spawn meanwhile, and exec would fail with
        // ETXTBSY ("Text file busy") until they exec themselves.
        let copy = try ChildProcess(
            [ChildProcess.builtExecutable("skyros").path, alone + "/skyros"],
            executable: URL(fileURLWithPath: "/bin/cp"))
        #expect(copy.wait() == .exited(0))
        let demo = try ChildProcess(
            ["-c", "cd / && exec skyros demo"], executable: URL(fileURLWithPath: "/bin/sh"),
            environment: ["PATH": "\(alone):/usr/bin:/bin"])
        #expect(demo.wait(seconds: 20) == .exited(69))
        let output = demo.readAll()
        #expect(output.contains("the demo needs skyrosd, which is neither beside skyros nor on PATH"), "\(output)")
        #expect(output.contains(alone + "/skyrosd"), "\(output)")
        #expect(!output.contains("starting skyrosd"), "\(output)")
    }

    @Test("`todo --help` prints its usage with no daemon running; an unknown command is refused before connecting")
    func todoWithoutDaemon() throws {
        let groups = groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let environment = ["SKYROS_GROUPS_DIR": groups]
        for flag in ["--help", "-h", "help"] {
            let help = try ChildProcess(
                [flag], executable: ChildProcess.builtExecutable("todo"), environment: environment)
            #expect(help.wait(seconds: 20) == .exited(0), "todo \(flag)")
            let output = help.readAll()
            #expect(
                output.contains("usage: todo [--group ID] add TITLE") && output.contains("skyrosd --group"), "\(output)"
            )
        }
        let unknown = try ChildProcess(
            ["frobnicate"], executable: ChildProcess.builtExecutable("todo"), environment: environment)
        #expect(unknown.wait(seconds: 20) == .exited(1))
        let output = unknown.readAll()
        #expect(output.contains("todo: unknown command frobnicate") && output.contains("usage: todo"), "\(output)")
        // Refused as a command, not after waiting for a daemon that is not there.
        #expect(!output.contains("did not answer"), "\(output)")
    }

    @Test(
        "an invalid group id is refused before any file is touched",
        arguments: ["", "../etc", "a/b", "a b", ".", ".hidden"])
    func invalidGroup(group: String) throws {
        let groups = groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let daemon = try ChildProcess(["--group", group, "--groups-dir", groups], executable: Self.skyrosd)
        #expect(daemon.wait() == .exited(64))
        #expect(try FileManager.default.contentsOfDirectory(atPath: groups).isEmpty)
    }

    @Test(
        "an --event-delay or --commit-delay out of range is refused with a clear message before any file is touched",
        arguments: [
            ("--event-delay=-1", "--event-delay is a number of milliseconds, 0 or more"),
            ("--commit-delay=-1", "--commit-delay is a number of milliseconds, from 0 to 100"),
            ("--commit-delay=101", "--commit-delay is a number of milliseconds, from 0 to 100"),
            ("--commit-delay=nan", "--commit-delay is a number of milliseconds, from 0 to 100"),
        ])
    func invalidDelay(argument: String, message: String) throws {
        let groups = groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let daemon = try ChildProcess(["--group", "g", "--groups-dir", groups, argument], executable: Self.skyrosd)
        #expect(daemon.wait() == .exited(64))
        #expect(daemon.readAll().contains(message))
        #expect(try FileManager.default.contentsOfDirectory(atPath: groups).isEmpty)
    }
}

/// Copies an executable through a close-on-exec descriptor: a process spawned meanwhile by
/// another test must not inherit it open for writing, or executing the copy fails with
/// "Text file busy".
func copyExecutable(_ source: String, to destination: String) throws {
    // Written whole under another name, flushed and closed, then renamed into place: whoever
    // runs `destination` can never find a partly written file (which `execvp` hands to `sh`).
    let bytes = try Data(contentsOf: URL(fileURLWithPath: source))
    let partial = destination + ".partial"
    let fd = open(partial, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o755)
    guard fd >= 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
    var offset = 0
    let failure: Int32? = bytes.withUnsafeBytes { buffer in
        while offset < buffer.count {
            let written = write(fd, buffer.baseAddress! + offset, buffer.count - offset)
            if written < 0 {
                if errno == EINTR { continue }
                return errno
            }
            offset += written
        }
        return fsync(fd) == 0 ? nil : errno
    }
    close(fd)
    if let failure {
        unlink(partial)
        throw POSIXError(POSIXErrorCode(rawValue: failure) ?? .EIO)
    }
    guard rename(partial, destination) == 0 else { throw POSIXError(POSIXErrorCode(rawValue: errno) ?? .EIO) }
}
