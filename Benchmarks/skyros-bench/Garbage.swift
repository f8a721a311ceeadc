import Foundation
import Skyros
import SkyrosDaemon
import SkyrosShared
import SkyrosTestSupport
import SkyrosWire
import SkyrosZeroMQ

/// `skyros-bench shared --garbage`: what a member of the group sending garbage costs the
/// daemon. The daemon runs in its own process (`skyrosd` when it was built next to this
/// executable, else this executable's hidden `garbage-daemon` role, the same `DaemonServer`),
/// with its log in a file; a member says hello, then sends 100,000 malformed frames, then 200
/// hellos whose client names are 1 MiB long. Rows: the growth of the daemon's resident memory
/// (VmRSS) and of its log after each, against the bounds (20 MB, 1 MB) as the baseline.
struct GarbageBenchmark {
    let directory: URL
    let malformedFrames: Int
    let longHellos: Int

    /// The hidden role: a daemon for the group `g` in `groups`, logging to stderr.
    static func daemon(groups: String) throws {
        let server = try DaemonServer(
            configuration: .init(
                container: GroupContainer(url: URL(fileURLWithPath: groups).appendingPathComponent("g")),
                log: { line in FileHandle.standardError.write(Data((line + "\n").utf8)) }))
        signal(SIGTERM) { _ in exit(0) }
        server.serve()
    }

    func run(report: (Row) -> Void) throws {
        let groups = directory.appendingPathComponent("garbage")
        try FileManager.default.createDirectory(at: groups, withIntermediateDirectories: true)
        let log = groups.appendingPathComponent("daemon.log").path
        let pid = try Self.spawnDaemon(groups: groups.path, log: log)
        defer {
            kill(pid, SIGTERM)
            var status: Int32 = 0
            waitpid(pid, &status, 0)
        }
        let container = GroupContainer(url: groups.appendingPathComponent("g"))
        // A member creates the store (retrying until the daemon is up, within the timeout).
        let store = try Skyros(sharedStack: benchSchema, container: container.url, timeout: 30)
        try store.writeAndWait { Item.create(in: $0).value = 1 }
        let logSize = { ((try? FileManager.default.attributesOfItem(atPath: log))?[.size] as? Int) ?? 0 }
        let rss0 = Self.residentMB(pid)
        let log0 = logSize()
        let client = try GarbageClient(container.requestsEndpoint, schema: benchSchema)
        let answered = try client.malformedFrames(malformedFrames)
        let rss1 = Self.residentMB(pid)
        let log1 = logSize()
        let refused = try client.longNameHellos(longHellos, nameBytes: 1 << 20)
        let rss2 = Self.residentMB(pid)
        let log2 = logSize()
        guard answered == malformedFrames, refused == longHellos, kill(pid, 0) == 0 else {
            FileHandle.standardError.write(
                Data(
                    "garbage: \(answered) of \(malformedFrames) frames answered, \(refused) of \(longHellos) hellos refused\n"
                        .utf8))
            exit(1)
        }
        report(
            Row(
                name: "daemon RSS growth after \(malformedFrames) malformed frames", unit: "MB",
                skyros: rss1 - rss0, baseline: 20))
        report(
            Row(
                name: "daemon RSS growth after \(longHellos) hellos with 1 MiB names", unit: "MB",
                skyros: rss2 - rss1, baseline: 20))
        report(
            Row(
                name: "daemon log growth after \(malformedFrames) malformed frames", unit: "KB",
                skyros: Double(log1 - log0) / 1024, baseline: 1024))
        report(
            Row(
                name: "daemon log growth after \(longHellos) hellos with 1 MiB names", unit: "KB",
                skyros: Double(log2 - log1) / 1024, baseline: 1024))
    }

    /// Starts the daemon with its stderr in `log`; its pid.
    static func spawnDaemon(groups: String, log: String) throws -> pid_t {
        let me = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        let skyrosd = me.deletingLastPathComponent().appendingPathComponent("skyrosd").path
        let arguments =
            FileManager.default.isExecutableFile(atPath: skyrosd)
            ? [skyrosd, "--group", "g", "--groups-dir", groups]
            : [me.path, "garbage-daemon", groups]
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 1, "/dev/null", O_WRONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 2, log, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        let argv = arguments.map { strdup($0) } + [nil]
        defer { argv.forEach { free($0) } }
        var pid: pid_t = 0
        let status = posix_spawn(&pid, arguments[0], &actions, nil, argv, environ)
        guard status == 0 else { throw POSIXError(POSIXErrorCode(rawValue: status) ?? .ENOENT) }
        return pid
    }

    /// A process's resident set size in MB (`VmRSS` in /proc/PID/status).
    static func residentMB(_ pid: pid_t) -> Double {
        guard let status = try? String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8),
            let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmRSS:") }),
            let kilobytes = Double(line.split(separator: " ").dropFirst().first ?? "")
        else { return 0 }
        return kilobytes / 1024
    }
}
