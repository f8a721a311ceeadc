// skyrosd: the daemon of one application group.
//
//     skyrosd --group com.example.todo [--groups-dir DIR] [--durability full|normal]
//             [--history-count N] [--history-age SECONDS] [--max-clients N]
//             [--hello-timeout SECONDS] [--admin-group NAME] [--log-level info]
//     skyrosd --group com.example.todo [--groups-dir DIR] --check
import ArgumentParser
import Foundation
import Logging
import ServiceLifecycle
import Skyros
import SkyrosDaemon
import SkyrosWire

extension Durability: ExpressibleByArgument {}
extension Logger.Level: @retroactive ExpressibleByArgument {}

@main
struct Skyrosd: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "skyrosd",
        abstract: "Serve the store of a Skyros application group to its client processes.",
        discussion: """
            skyrosd owns the group container's store.sqlite and serves it on ipc:// sockets in \
            the container. Without --groups-dir, the container is resolved like clients do: \
            $SKYROS_GROUPS_DIR/<group>, else /var/lib/skyros/<group> when it exists, else \
            $XDG_DATA_HOME/skyros/<group>. One daemon per group: a second one exits with status 2. \
            SIGTERM or SIGINT stops it gracefully: saves in progress are committed and \
            acknowledged, the store is checkpointed, and it exits with status 0.

            At start it checks the store (PRAGMA quick_check) without writing to it: an empty \
            store.sqlite, a file that is not a Skyros store, or a damaged store is refused with \
            a message naming the file and the problem (exit status 1), and left untouched. \
            --check runs the full PRAGMA integrity_check instead of serving, and exits: 0 when \
            the store is healthy (or absent: the daemon creates it), 1 with the findings.
            """)

    @Option(help: "The application group identifier (letters, digits, '.', '_', '-').")
    var group: String

    @Option(help: "The directory holding group containers (default: resolved like clients do).")
    var groupsDir: String?

    @Option(help: "full (synchronous=FULL) or normal (synchronous=NORMAL).")
    var durability: Durability = .full

    @Option(help: "How many committed change sets the history keeps for clients catching up.")
    var historyCount: Int = 100_000

    @Option(help: "How long the history keeps a change set, in seconds (default: 7 days).")
    var historyAge: Double = 7 * 86_400

    @Option(help: """
        How long, in milliseconds, a commit's change events may wait for the next commits' \
        while more requests are waiting, to go out in one message (0: after every commit).
        """)
    var eventDelay: Double = 2

    @Option(help: """
        The most client connections open at once on each of the two sockets (default: sized to \
        the file-descriptor limit, which skyrosd raises from its soft to its hard value at start: \
        half of what a reserve of max(limit/4, min(384, limit/2)) leaves, at most 10,000: 320 for a \
        limit of 1,024; a larger N is lowered to that). Past it, a \
        new connection closes the oldest one that has not said hello yet, or is closed itself when \
        every open connection said hello: the client's request times out and it retries.
        """)
    var maxClients: Int?

    @Option(help: """
        Close a request connection that has not said hello within this many seconds, so that idle or half-open connections cannot hold the slots members need.
        """)
    var helloTimeout: Double = WireProtocol.helloTimeout.timeInterval

    @Option(help: ArgumentHelp("""
        A Unix group whose members may open admin sessions (skyros status|history|backup|… --group); \
        root and the daemon's user always may. Repeatable.
        """, valueName: "name"))
    var adminGroup: [String] = []
    @Option(help: "trace, debug, info, notice, warning, error or critical.")
    var logLevel: Logger.Level = .info

    @Flag(help: """
        Check the group's store (PRAGMA integrity_check) without writing to it, and exit \
        instead of serving: 0 when it is healthy or absent, 1 with the findings on stderr.
        """)
    var check = false

    func validate() throws {
        guard eventDelay >= 0, eventDelay.isFinite else {
            throw ValidationError("--event-delay is a number of milliseconds, 0 or more")
        }
        if let maxClients, maxClients < 1 {
            throw ValidationError("--max-clients is a number of connections, 1 or more")
        }
        guard helloTimeout > 0, helloTimeout.isFinite else {
            throw ValidationError("--hello-timeout is a number of seconds, more than 0")
        }
    }

    func run() async throws {
        let level = logLevel
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        let logger = Logger(label: "skyrosd")
        let containerURL: URL
        do {
            try Skyros.validateApplicationGroup(group)
            if let groupsDir {
                containerURL = URL(fileURLWithPath: groupsDir).appendingPathComponent(group)
            } else {
                containerURL = try Skyros.containerURL(forApplicationGroup: group)
            }
        } catch let error as SkyrosError {
            logger.critical("\(error.message)")
            throw ExitCode(64)
        }
        if check {
            try checkStore(GroupContainer(url: containerURL).store)
            return
        }
        var adminGroups: [gid_t] = []
        for name in adminGroup {
            guard let entry = getgrnam(name) else {
                logger.critical("--admin-group \(name): no such Unix group")
                throw ExitCode(64)
            }
            adminGroups.append(entry.pointee.gr_gid)
        }
        let notifier = SystemdNotifier()
        let server: DaemonServer.Handle
        do {
            server = try DaemonServer.detached(
                configuration: .init(
                    container: GroupContainer(url: containerURL), durability: durability,
                    historyCount: historyCount, historyAge: historyAge, maximumEventDelay: eventDelay / 1000,
                    maximumClients: maxClients, helloTimeout: helloTimeout,
                    log: { message in logger.info("\(message)") })
            ) { [adminGroups] server in
                server.admin.logger = logger
                server.admin.adminGroups = adminGroups
                // systemd's watchdog ping, from the serve loop's turns (see DaemonService).
                var watchdog = WatchdogPing(notifier: notifier)
                return { watchdog.pingIfDue() }
            }
        } catch let error as SkyrosError where error.code == .groupLocked {
            logger.critical("\(error.message)")
            throw ExitCode(2)
        } catch let error as SkyrosError where error.underlyingError == nil {
            logger.critical("refusing to serve: \(error.message)")
            throw ExitCode(1)
        } catch {
            logger.critical("cannot start: \(error)")
            throw ExitCode(1)
        }
        let service = DaemonService(server: server, notifier: notifier, logger: logger)
        let serviceGroup = ServiceGroup(
            configuration: .init(services: [service], gracefulShutdownSignals: [.sigterm, .sigint], logger: logger))
        try await serviceGroup.run()
    }

    /// `--check`: the full check of the store file, reported on stdout (healthy, absent) or
    /// stderr (the findings, exit status 1).
    func checkStore(_ store: URL) throws {
        do {
            if try StoreCheck.verify(store, depth: .full) {
                print("ok: \(store.path) is a Skyros store without errors (PRAGMA integrity_check)")
            } else {
                print("no store at \(store.path): nothing to check (the daemon creates it for its first client)")
            }
        } catch let error as SkyrosError {
            FileHandle.standardError.write(Data("skyrosd --check: \(error.message)\n".utf8))
            throw ExitCode(1)
        }
    }
}

/// The serve loop as a service: the server runs on its own thread (``DaemonServer/detached(configuration:pollInterval:setUp:)``),
/// and stops when the service group shuts down gracefully (SIGTERM, SIGINT): the request
/// in progress and the saves of its turn are committed and acknowledged, the events
/// published, then ``DaemonServer/close()`` checkpoints the store and the process exits 0.
///
/// systemd's watchdog ping (`WATCHDOG=1`, when the unit sets `WatchdogSec=`) is sent by the
/// serve loop itself, from its per-turn hook: a loop that hangs stops pinging, and systemd
/// restarts the daemon.
struct DaemonService: Service {
    let server: DaemonServer.Handle
    let notifier: SystemdNotifier
    let logger: Logger

    func run() async throws {
        notifier.notify("READY=1\nSTATUS=serving")
        await withGracefulShutdownHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                server.whenFinished { continuation.resume() }
            }
        } onGracefulShutdown: { [server, notifier] in
            notifier.notify("STOPPING=1")
            server.stop()
        }
        logger.info("shut down")
    }
}

/// The watchdog ping, sent at most every half `WATCHDOG_USEC` by the turns of the serve loop.
struct WatchdogPing {
    let notifier: SystemdNotifier
    private var last: ContinuousClock.Instant?

    init(notifier: SystemdNotifier) { self.notifier = notifier }

    mutating func pingIfDue(now: ContinuousClock.Instant = .now) {
        guard let interval = notifier.watchdogInterval else { return }
        if let last, now - last < interval { return }
        notifier.notify("WATCHDOG=1")
        last = now
    }
}
