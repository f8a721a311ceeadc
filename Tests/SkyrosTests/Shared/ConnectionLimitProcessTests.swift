import Foundation
import Skyros
import SkyrosShared
import SkyrosTestSupport
import SkyrosWire
import SkyrosZeroMQ
import Testing
import ZeroMQReference

/// What no member of the group can do to `skyrosd`: hold its connections, exhaust its file
/// descriptors (libzmq aborts the process at the limit), or bloat its memory and log.
/// A real daemon, started through `/bin/sh` to set its descriptor limit, reaped by pid.
@Suite("skyrosd connection limit and memory bounds", .serialized, .timeLimit(.minutes(2)))
struct ConnectionLimitProcessTests {
    /// A skyrosd run by `/bin/sh` under the descriptor limits `hard` and `soft`, with its log
    /// (stderr) in `log`; started and ready (READY=1), or the test fails.
    func startDaemon(
        _ groups: String, hard: Int = 1_024, soft: Int = 1_024, arguments: [String] = [], log: String? = nil,
        sourceLocation: SourceLocation = #_sourceLocation
    ) throws -> ChildProcess {
        let notify = try NotifySocket()
        let redirect = log.map { " 2>'\($0)'" } ?? ""
        let script = "ulimit -S -n \(soft) && ulimit -H -n \(hard) && exec \"$0\" \"$@\"\(redirect)"
        let daemon = try ChildProcess(
            ["-c", script, DaemonProcessTests.skyrosd.path, "--group", "g", "--groups-dir", groups] + arguments,
            executable: URL(fileURLWithPath: "/bin/sh"), environment: ["NOTIFY_SOCKET": notify.path])
        #expect(notify.waitFor("READY=1"), "skyrosd did not get ready", sourceLocation: sourceLocation)
        return daemon
    }

    /// Whether the process is still running (not a zombie, not gone).
    func isRunning(_ pid: pid_t) -> Bool {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8) else { return false }
        return !status.contains("State:\tZ")
    }

    /// The resident set size of a process in kB (`VmRSS` in /proc/PID/status).
    static func residentKB(_ pid: pid_t) -> Int {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") })
        else { return 0 }
        return Int(line.split(separator: " ").dropFirst().first ?? "") ?? 0
    }

    /// How many descriptors a process has open.
    func openDescriptors(_ pid: pid_t) -> Int {
        (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd").count) ?? -1
    }

    /// A non-blocking `AF_UNIX` stream connection to `path`; nil when it is refused or the
    /// listener's backlog is full (EAGAIN).
    static func unixConnect(_ path: String) -> Int32? {
        let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard fd >= 0 else { return nil }
        guard withUnixSocketAddress(path, { connect(fd, $0, $1) }) == 0 else {
            close(fd)
            return nil
        }
        return fd
    }

    /// Opens `count` idle connections to `path` within `seconds` (retrying those the backlog
    /// turns away), and returns their descriptors.
    static func idleConnections(_ count: Int, to path: String, seconds: Double) -> [Int32] {
        var descriptors: [Int32] = []
        let deadline = Date().addingTimeInterval(seconds)
        while descriptors.count < count && Date() < deadline {
            if let fd = unixConnect(path) { descriptors.append(fd) } else { usleep(1_000) }
        }
        return descriptors
    }

    /// How many of `descriptors` the peer closes (a read gives end of file, or an error) within
    /// `seconds`; returns as soon as `atLeast` are.
    static func closedByPeer(_ descriptors: [Int32], atLeast: Int, within seconds: Double) -> Int {
        var open = descriptors.map { pollfd(fd: $0, events: Int16(POLLIN), revents: 0) }
        var closed = 0
        var buffer = [UInt8](repeating: 0, count: 256)
        let deadline = Date().addingTimeInterval(seconds)
        while closed < atLeast && !open.isEmpty && Date() < deadline {
            guard poll(&open, nfds_t(open.count), 50) >= 0 else { break }
            open.removeAll { descriptor in
                guard descriptor.revents != 0 else { return false }
                // The daemon's ZMTP greeting comes first; then, for a refused one, the end.
                let count = read(descriptor.fd, &buffer, buffer.count)
                guard count == 0 || (count < 0 && errno != EAGAIN) else { return false }
                closed += 1
                return true
            }
            for index in open.indices { open[index].revents = 0 }
        }
        return closed
    }

    /// Waits until the peer closes `fd` (a read gives end of file, or an error); the seconds
    /// it took, or nil after `seconds`.
    static func secondsUntilClosed(_ fd: Int32, within seconds: Double) -> Double? {
        let start = Date()
        var buffer = [UInt8](repeating: 0, count: 256)
        while Date().timeIntervalSince(start) < seconds {
            var descriptor = pollfd(fd: fd, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, 50) >= 0 else { return nil }
            guard descriptor.revents != 0 else { continue }
            // The daemon's ZMTP greeting comes first; then the end.
            let count = read(fd, &buffer, buffer.count)
            if count == 0 || (count < 0 && errno != EAGAIN) { return Date().timeIntervalSince(start) }
        }
        return nil
    }

    @Test("1,100 idle connections under a hard descriptor limit of 1,024: the daemon stays up and serves a member")
    func idleConnectionsUnderTheLimit() throws {
        let groups = DaemonProcessTests().groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        // A soft limit of 256 under the hard 1,024: the daemon raises it itself.
        let log = groups + "/skyrosd.log"
        let daemon = try startDaemon(groups, hard: 1_024, soft: 256, log: log)
        defer {
            let text = (try? String(contentsOfFile: log, encoding: .utf8)) ?? ""
            print("skyrosd's log:\n" + text.suffix(4_000))
        }
        let container = GroupContainer(url: URL(fileURLWithPath: groups).appendingPathComponent("g"))
        let requests = Self.idleConnections(
            1_100, to: container.url.appendingPathComponent("requests.ipc").path, seconds: 3)
        let events = Self.idleConnections(600, to: container.url.appendingPathComponent("events.ipc").path, seconds: 2)
        defer { for fd in requests + events { close(fd) } }
        #expect(requests.count == 1_100)
        #expect(events.count == 600)
        // The event socket keeps at most 320 connections (the limit for 1,024 descriptors): the
        // daemon closes the others as it accepts them.
        let closedEvents = Self.closedByPeer(events, atLeast: events.count - 320, within: 10)
        #expect(closedEvents >= events.count - 320, "the daemon closed \(closedEvents) of 600 event connections")
        #expect(isRunning(daemon.pid), "skyrosd died under 1,100 idle connections")
        #expect(openDescriptors(daemon.pid) < 1_024)
        // A member is served while they are open: hello, save, fetch.
        let store = try Skyros(sharedStack: testSchema, container: container.url, timeout: 10)
        let saved = CompletionProbe()
        store.writeSync({ makeUsers([("Ann", "Lee")], in: $0) }, completion: saved.completion)
        #expect(saved.wait())
        #expect(saved.calls.first! == nil)
        var names: [String] = []
        store.read { names = try User.all(in: $0).map(\.firstname) }
        #expect(names == ["Ann"])
        #expect(isRunning(daemon.pid))
        #expect(openDescriptors(daemon.pid) < 1_024)
        // More idle connections while the member is connected: it is kept (it said hello).
        let more = Self.idleConnections(
            1_100, to: container.url.appendingPathComponent("requests.ipc").path, seconds: 3)
        defer { for fd in more { close(fd) } }
        var count = -1
        store.read { count = try User.count(in: $0) }
        #expect(count == 1)
        #expect(isRunning(daemon.pid))
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
    }

    @Test("a connection that says no hello is closed after --hello-timeout; one that said hello stays")
    func helloTimeout() throws {
        let groups = DaemonProcessTests().groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let daemon = try startDaemon(groups, arguments: ["--hello-timeout", "0.5"])
        let container = GroupContainer(url: URL(fileURLWithPath: groups).appendingPathComponent("g"))
        let context = try ZeroMQContext()
        let member = try ZeroMQSocket(context: context, kind: .dealer)
        defer { member.close() }
        try member.setReceiveTimeout(milliseconds: 5_000)
        try member.connect(container.requestsEndpoint)
        try member.send([
            Data(
                WireMessage(
                    requestID: 1, body: .hello(try WireMessage.Hello(schema: testSchema, clientName: "member"))
                ).encoded())
        ])
        let welcome = try WireMessage.decode([UInt8](try member.receive().last ?? Data()))
        guard case .welcome = welcome.body else {
            Issue.record("no welcome: \(welcome.body)")
            return
        }
        let idle = try #require(Self.unixConnect(container.url.appendingPathComponent("requests.ipc").path))
        defer { close(idle) }
        let closedAfter = Self.secondsUntilClosed(idle, within: 5)
        #expect(closedAfter != nil, "the idle connection was not closed")
        #expect((closedAfter ?? 0) >= 0.4)
        // The member's connection is the same one: a count is answered, not `helloRequired`
        // (a new connection, made by libzmq after a close, would not have said hello).
        try member.send([Data(WireMessage(requestID: 2, body: .count(StoreRequest(entityName: "User"))).encoded())])
        let reply = try WireMessage.decode([UInt8](try member.receive().last ?? Data()))
        guard case .countReply(0) = reply.body else {
            Issue.record("the member's connection was closed: \(reply.body)")
            return
        }
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
    }

    /// The issue's figures (100,000 frames, 200 hellos) are measured in release by
    /// `skyros-bench shared --garbage`; here a third of them against the debug daemon, which
    /// keeps both machine cores busy for the whole flood: still 60 MB of names, three times
    /// the bound, if each hello kept its name.
    @Test("30,000 malformed frames and 60 hellos with 1 MiB names: RSS grows < 20 MB, the log < 1 MB")
    func garbage() throws {
        let groups = DaemonProcessTests().groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let log = groups + "/skyrosd.log"
        let daemon = try startDaemon(groups, log: log)
        let container = GroupContainer(url: URL(fileURLWithPath: groups).appendingPathComponent("g"))
        // A member creates the store: the hellos below meet a daemon in its usual state.
        let store = try Skyros(sharedStack: testSchema, container: container.url, timeout: 10)
        var count = -1
        store.read { count = try User.count(in: $0) }
        #expect(count == 0)
        let logSize = { ((try? FileManager.default.attributesOfItem(atPath: log))?[.size] as? Int) ?? 0 }
        let rss0 = Self.residentKB(daemon.pid)
        let log0 = logSize()
        let answered = try GarbageClient(container.requestsEndpoint, schema: testSchema).malformedFrames(30_000)
        #expect(answered == 30_000)
        let rss1 = Self.residentKB(daemon.pid)
        let log1 = logSize()
        let refused = try GarbageClient(container.requestsEndpoint, schema: testSchema).longNameHellos(
            60, nameBytes: 1 << 20)
        #expect(refused == 60)
        let rss2 = Self.residentKB(daemon.pid)
        let log2 = logSize()
        print(
            "garbage: RSS \(rss0) kB, after 30,000 malformed frames \(rss1) kB, after 60 1 MiB hellos \(rss2) kB; log \(log0) → \(log1) → \(log2) bytes"
        )
        #expect(rss1 - rss0 < 20 * 1_024)
        #expect(rss2 - rss1 < 20 * 1_024)
        #expect(log1 - log0 < 1 << 20 && log2 - log1 < 1 << 20)
        #expect(isRunning(daemon.pid))
        store.read { count = try User.count(in: $0) }
        #expect(count == 0)
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
    }
}
