// skyrosd: the daemon of one application group.
//
//     skyrosd --group com.example.todo [--groups-dir DIR] [--durability full|normal]
//             [--history-count N] [--history-age SECONDS] [--max-clients N]
//             [--hello-timeout SECONDS] [--admin-group NAME] [--log-level info]
//             [--sync postgresql://user@host:port/db] [--sync-password-file PATH] [--sync-schema NAME]
//     skyrosd --group com.example.todo [--groups-dir DIR] --check
//     skyrosd --group com.example.todo [--groups-dir DIR] [--sync URL] [--sync-password-file PATH]
//             [--sync-schema NAME] --sync-setup
//
// Sync with PostgreSQL is configured by --sync, else SKYROS_SYNC_URL, else the container's
// sync.conf; the password comes from a file, SKYROS_SYNC_PASSWORD or the systemd credential
// skyros-sync-password, never from the command line.
import ArgumentParser
import Foundation
import Logging
import ServiceLifecycle
import Skyros
import SkyrosDaemon
import SkyrosSync
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

            Sync with PostgreSQL (the group's store kept the same on every machine whose daemon \
            syncs with the same server and schema): the URL is --sync, else SKYROS_SYNC_URL, else \
            url in the container's sync.conf (key = value lines: url, schema, password-file, \
            retention; # comments); none: no sync. Secrets are never on the command line or in a \
            URL: the role's password is read from --sync-password-file, else password-file in \
            sync.conf, else SKYROS_SYNC_PASSWORD, else the systemd credential \
            skyros-sync-password ($CREDENTIALS_DIRECTORY); none: no password (trust or peer \
            authentication). An invalid sync configuration exits with status 64. --sync-setup \
            creates or migrates the group's tables on the server once, with a role that may, \
            from the schema of the group's existing store, and exits (0 when done, 1 on failure): \
            for daemons whose role is given DML only.
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

    @Option(
        help: """
            How long, in milliseconds, a commit's change events may wait for the next commits' \
            while more requests are waiting, to go out in one message (0: after every commit).
            """)
    var eventDelay: Double = 2

    @Option(
        help: """
            How long, in milliseconds, a turn may wait for the saves of clients that lately saved \
            together, to commit them in one transaction (0: commit what is waiting at once).
            """)
    var commitDelay: Double = DaemonServer.Configuration.defaultCommitDelay * 1000

    @Option(
        help: """
            The most client connections open at once on each of the two sockets (default: sized to \
            the file-descriptor limit, which skyrosd raises from its soft to its hard value at start: \
            half of what a reserve of max(limit/4, min(384, limit/2)) leaves, at most 10,000: 320 for a \
            limit of 1,024; a larger N is lowered to that). Past it, a \
            new connection closes the oldest one that has not said hello yet, or is closed itself when \
            every open connection said hello: the client's request times out and it retries.
            """)
    var maxClients: Int?

    @Option(
        help: """
            Close a request connection that has not said hello within this many seconds, so that idle or half-open connections cannot hold the slots members need.
            """)
    var helloTimeout: Double = WireProtocol.helloTimeout.timeInterval

    @Option(
        help: ArgumentHelp(
            """
            A Unix group whose members may open admin sessions (skyros status|history|backup|… --group); \
            root and the daemon's user always may. Repeatable.
            """, valueName: "name"))
    var adminGroup: [String] = []
    @Option(help: "trace, debug, info, notice, warning, error or critical.")
    var logLevel: Logger.Level = .info

    @Flag(
        help: """
            Check the group's store (PRAGMA integrity_check) without writing to it, and exit \
            instead of serving: 0 when it is healthy or absent, 1 with the findings on stderr.
            """)
    var check = false

    @Option(
        help: ArgumentHelp(
            """
            Sync the group with this PostgreSQL server: \
            postgresql://user@host[:port][/database][?sslmode=disable|prefer|require|verify-ca|verify-full\
            &sslrootcert=PATH&schema=NAME&retention=SECONDS], or a sync gateway's \
            wss://host[:port]/GROUP[?sslrootcert=PATH] with --sync-token-file (default: SKYROS_SYNC_URL, else url in the \
            container's sync.conf; none: no sync). Secrets never go here: a URL with a password is \
            refused; see --sync-password-file.
            """, valueName: "url"))
    var sync: String?

    @Option(
        help: ArgumentHelp(
            """
            The file holding the sync role's password, its trailing newline ignored (default: \
            password-file in sync.conf, else SKYROS_SYNC_PASSWORD, else the systemd credential \
            skyros-sync-password; none: no password).
            """, valueName: "path"))
    var syncPasswordFile: String?

    @Option(
        help: ArgumentHelp(
            """
            The file holding this machine's token for a sync gateway (a wss:// URL), read again at \
            every connection (default: token-file in sync.conf, else SKYROS_SYNC_TOKEN_FILE, else the \
            systemd credential skyros-sync-token).
            """, valueName: "path"))
    var syncTokenFile: String?

    @Option(
        help: ArgumentHelp(
            """
            The PostgreSQL schema of the group's tables, [a-z_][a-z0-9_]{0,62} (default: the URL's \
            schema=, else schema in sync.conf, else the group id lowercased with every other \
            character made '_').
            """, valueName: "name"))
    var syncSchema: String?

    @Flag(
        help: """
            Create or migrate the group's tables on the sync server once, with this role, from the \
            schema of the group's existing store, and exit instead of serving: 0 when done, 1 on \
            failure. For servers where the daemons' role may only read and write rows.
            """)
    var syncSetup = false

    func validate() throws {
        guard eventDelay >= 0, eventDelay.isFinite else {
            throw ValidationError("--event-delay is a number of milliseconds, 0 or more")
        }
        guard commitDelay >= 0, commitDelay <= 100 else {
            throw ValidationError("--commit-delay is a number of milliseconds, from 0 to 100")
        }
        if let maxClients, maxClients < 1 {
            throw ValidationError("--max-clients is a number of connections, 1 or more")
        }
        guard helloTimeout > 0, helloTimeout.isFinite else {
            throw ValidationError("--hello-timeout is a number of seconds, more than 0")
        }
        if check, syncSetup {
            throw ValidationError("--check and --sync-setup each do one thing and exit: give one of them")
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
        let syncConfiguration: SyncConfiguration?
        do {
            syncConfiguration = try SyncConfiguration.resolve(
                group: group, container: containerURL, url: sync, passwordFile: syncPasswordFile, schema: syncSchema,
                tokenFile: syncTokenFile, environment: ProcessInfo.processInfo.environment)
        } catch let error as SkyrosError {
            logger.critical("\(error.message)")
            throw ExitCode(64)
        }
        if let syncConfiguration {
            logger.info("sync: \(syncConfiguration.redacted)")
            for warning in syncConfiguration.warnings { logger.warning("sync: \(warning)") }
        } else if let unused = SyncConfiguration.unusedEnvironment(ProcessInfo.processInfo.environment) {
            logger.warning("sync: \(unused)")
        }
        if syncSetup {
            guard let syncConfiguration else {
                let file = containerURL.appendingPathComponent(SyncConfiguration.fileName).path
                logger.critical(
                    "--sync-setup needs the sync server: give it with --sync, SKYROS_SYNC_URL, or url in \(file)")
                throw ExitCode(64)
            }
            try await setUpSyncServer(syncConfiguration, store: GroupContainer(url: containerURL).store, logger: logger)
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
        var configuration = DaemonServer.Configuration(
            container: GroupContainer(url: containerURL), durability: durability,
            historyCount: historyCount, historyAge: historyAge, maximumEventDelay: eventDelay / 1000,
            maximumCommitDelay: commitDelay / 1000,
            maximumClients: maxClients, helloTimeout: helloTimeout,
            log: { message in logger.log(level: DaemonLogLevel.of(message), "\(message)") })
        configuration.sync = syncConfiguration
        let server: DaemonServer.Handle
        do {
            server = try DaemonServer.detached(configuration: configuration) { [adminGroups] server in
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

    /// `--sync-setup`: creates or migrates the group's server schema from the schema of its
    /// store (read without writing to it), then returns; exits with status 1 when there is no
    /// store or the server refuses.
    func setUpSyncServer(_ configuration: SyncConfiguration, store: URL, logger: Logger) async throws {
        do {
            guard let description = try SQLiteStore.storedSchemaDescription(at: store) else {
                logger.critical(
                    """
                    --sync-setup takes the schema from the group's store, and there is none at \(store.path): \
                    run an application of the group once (or use the store of another machine)
                    """)
                throw ExitCode(1)
            }
            let version = try SQLiteStore.storedSchemaVersion(at: store) ?? 1
            let schema = try Schema(description: description, version: version)
            try await SyncSetup.run(configuration, schema: schema, log: { message in logger.info("\(message)") })
        } catch let exit as ExitCode {
            throw exit
        } catch let error as SkyrosError {
            logger.critical("--sync-setup failed: \(error.message)")
            throw ExitCode(1)
        } catch {
            logger.critical("--sync-setup failed: \(String(reflecting: error))")
            throw ExitCode(1)
        }
        logger.info("sync setup done: \(configuration.redacted)")
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
