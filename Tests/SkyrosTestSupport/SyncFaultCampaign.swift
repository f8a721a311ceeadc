import Foundation
import GRDB
import Skyros
import SkyrosDaemon
import SkyrosShared
import SkyrosSync
import SkyrosZeroMQ
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// The sync fault campaign (issue 35): machines (`skyrosd` processes, each with its own
/// group directory and its own ``FaultProxy`` to the server) sync with one private PostgreSQL
/// server while writers on every machine insert, update shared objects and delete, and
/// seeded faults break the network, the daemons and the server; then everything heals, and
/// ``SyncHistory/check()`` verifies what the clients saw and what everyone holds.
///
/// `skyros-bench sync-faults` runs it for as long as asked; `SyncFaultCampaignTests` runs a
/// 20-second one. The plan (which faults, when, where, for how long; which operation each
/// writer does) follows from the seed; the timing of real processes does not, so two runs of
/// one seed inject the same faults but interleave them differently with the writes.
public enum SyncFaultCampaign {
    /// The kinds of fault, each injected ``Configuration/faultsPerKind`` times, and counted
    /// when it took effect. A kind says how long it lasts (``lengths(longest:)``), where it
    /// acts (``scope``), and the campaign performs it in one function of its own that returns
    /// whether it took effect: a new kind is a case and those three.
    public enum FaultKind: String, Sendable, CaseIterable {
        /// A partition of one or more machines by connection resets (inbound, outbound or both).
        case cut
        /// A partition of one or more machines by a black hole (inbound, outbound or both).
        case blackHole
        /// One machine's link slowed by 200 ms each way it covers.
        case slow
        /// A daemon killed (SIGKILL) and started again.
        case daemonKill
        /// PostgreSQL stopped with `-m fast` and started again.
        case postgresFast
        /// PostgreSQL stopped with `-m immediate` (crash recovery) and started again.
        case postgresImmediate
        /// The tablespace of the group's tables filled, then freed.
        case diskFull
        /// A `psql` update of a shared object on the server.
        case psqlWrite
        /// A machine's store restored from an older backup: `skyros backup` of the running
        /// daemon's store, the machine saving on for the fault's length, then (as an operator
        /// stops the apps) its writers paused until its upload queue is empty and every refusal
        /// the server recorded for it is in its rejected log and told to its apps, its daemon
        /// stopped (SIGTERM), the backup put in place of the store, the daemon started again,
        /// the machine's apps restarted (new shared stacks, as the README's restore says) and
        /// the writers resumed. The daemon goes on under a new machine id; the saves made
        /// after the backup come back from the server. Took effect when the machine numbered a
        /// change set after the backup.
        case restoreBackup
        /// A machine's daemon restarted without sync (no `--sync`, no `sync.conf`) for the
        /// fault's length while its writers go on, then with sync again: what it saved
        /// meanwhile is queued and uploaded. Took effect when the daemon said it queues its
        /// commits with sync off.
        case syncOffOn
        /// The rename of `User.lastname` to `surname` (``renamedTestSchema``, version 2) rolled
        /// out machine by machine, once in a campaign: in turn, a machine's writers are paused,
        /// its apps restarted with version 2 (the first one's hello migrates the store; its
        /// daemon expands the server's table, both names kept equal) and its writers resumed,
        /// the fault's length spread between the machines, while the machines not yet upgraded
        /// save with version 1. Took effect when every machine was upgraded.
        case renameRollout

        /// How many faults of the kind a campaign plans, given how many of each kind it plans.
        /// (A restore pauses its machine's writers until its queue drains, up to 30 s: one for
        /// six of the other kinds, five in 120 s, one in 20 s, so that the writers keep saving.)
        public func planned(perKind: Int) -> Int {
            switch self {
            case .renameRollout: min(perKind, 1)
            case .restoreBackup: perKind == 0 ? 0 : max(1, perKind / 6)
            default: perKind
            }
        }

        /// What a fault of a kind acts on: what it is serialized with, and which machines it takes.
        public enum Scope: Sendable {
            /// The links of one or more machines (several faults may overlap).
            case links
            /// One machine (its faults one at a time).
            case machine
            /// The PostgreSQL server (its faults one at a time).
            case server
            /// The server's disk.
            case disk
            /// The rows on the server.
            case rows
            /// Every machine, one after another (each with its own faults, one at a time).
            case fleet
        }

        public var scope: Scope {
            switch self {
            case .cut, .blackHole, .slow: .links
            case .daemonKill, .restoreBackup, .syncOffOn: .machine
            case .postgresFast, .postgresImmediate: .server
            case .diskFull: .disk
            case .psqlWrite: .rows
            case .renameRollout: .fleet
            }
        }

        /// How long a fault of the kind lasts, in seconds, given the longest partition.
        public func lengths(longest: Double) -> ClosedRange<Double> {
            switch self {
            case .cut, .blackHole, .slow: 0...longest
            case .diskFull: 0...(longest / 2)
            case .daemonKill, .postgresFast, .postgresImmediate: 0...1
            case .psqlWrite: 0...0
            case .restoreBackup: 0...longest
            case .syncOffOn: (longest / 4)...(longest / 2)
            case .renameRollout: (longest / 2)...longest
            }
        }
    }

    /// A defect of the daemons, on purpose (``Configuration/defect``).
    package typealias Defect = DebugDefect

    public struct Configuration: Sendable {
        public var seed: UInt64
        /// How long the writers write and the faults come, in seconds.
        public var duration: Double
        public var machines: Int
        public var writersPerMachine: Int
        /// Operations per second each writer aims at, Jepsen-style pacing (the operation's own
        /// time counts; each pause is drawn between half and one and a half of the interval);
        /// 0: unpaced, each writer as fast as its saves go, with 5–25 ms between operations.
        /// At 10 (the default) a machine of four writers saves about 28 change sets a second.
        public var rate: Double
        /// How many faults of each kind; nil: 30 per 120 seconds (at least 3).
        public var faultsPerKind: Int?
        /// The longest partition, slow link or full disk, in seconds; nil: 10 s, or a twelfth
        /// of the duration when that is shorter.
        public var longestFault: Double?
        /// The `skyrosd` executable.
        public var skyrosd: String
        /// Where the campaign says what it does (nil: nowhere).
        public var log: (@Sendable (String) -> Void)?
        /// A defect the daemons are started with (`SKYROS_DEBUG_DEFECT`; a debug build of
        /// `skyrosd` only), to show that the checker catches it.
        package var defect: Defect?
        /// Whether the last machine starts writing before its first checkpoint: its link is cut
        /// from its daemon's start until its first writes are saved (one of them an insert the
        /// server refuses), so that a refusal comes with a machine's first checkpoint.
        public var startsOneMachineLate = true
        /// How long after the quiet period the machines may take to converge, in seconds.
        public var convergenceLimit: Double = 10
        /// How much longer the campaign waits for them when they did not, for the report.
        public var convergencePatience: Double = 50
        /// The kinds of fault injected: by default every kind.
        public var kinds: [FaultKind] = FaultKind.allCases
        /// How many handles the writers' unique values are drawn from (one insert in five
        /// takes one): the fewer, the more change sets the server refuses.
        public var sharedHandles = 20
        /// Machines sync through sync gateways instead of PostgreSQL itself (DESIGN §10): nil,
        /// the direct mode.
        public var gateways: Gateways?

        /// `skyros-gateway` processes the machines sync through, machine i through gateway
        /// i modulo their number, each link a fault proxy; the gateways reach PostgreSQL directly.
        public struct Gateways: Sendable {
            /// How many gateway processes.
            public var count: Int
            /// The `skyros-gateway` executable.
            public var executable: String
            /// The HS256 secret the tokens are signed with.
            public var secret: Data
            /// One token per machine (its `sub` its own; every one holding the campaign's bucket).
            public var tokens: [String]
            /// The sync rules: every machine holds and may write every row.
            public var rules: String

            public init(count: Int, executable: String, secret: Data, tokens: [String], rules: String) {
                self.count = count
                self.executable = executable
                self.secret = secret
                self.tokens = tokens
                self.rules = rules
            }
        }

        public init(
            seed: UInt64, duration: Double, machines: Int = 3, writersPerMachine: Int = 4, rate: Double = 10,
            faultsPerKind: Int? = nil, longestFault: Double? = nil, skyrosd: String,
            log: (@Sendable (String) -> Void)? = nil
        ) {
            self.seed = seed
            self.duration = duration
            self.machines = machines
            self.writersPerMachine = writersPerMachine
            self.rate = rate
            self.faultsPerKind = faultsPerKind
            self.longestFault = longestFault
            self.skyrosd = skyrosd
            self.log = log
        }

        var perKind: Int { faultsPerKind ?? max(3, Int((30 * duration / 120).rounded(.up))) }
        var longest: Double { longestFault ?? min(10, duration / 12) }
    }

    /// What a campaign did and what the checker found.
    public struct Report: Sendable, CustomStringConvertible {
        public var configuration: Configuration
        public var history: SyncHistory
        public var verdict: SyncHistory.Verdict
        /// Faults that took effect, by kind: a kill of a running daemon, a stop of a running
        /// server, a partition or slow link that acted on a connection, a full disk on which
        /// PostgreSQL failed to write, a `psql` update that updated a row, a restore of a store
        /// that had numbered change sets since its backup, a daemon that queued its commits
        /// with sync off.
        public var faults: [FaultKind: Int]
        /// Faults attempted, by kind.
        public var attempted: [FaultKind: Int] = [:]
        /// Kinds that could not be injected on this machine, with the reason.
        public var unavailable: [FaultKind: String]
        /// Seconds from the end of the quiet period until every machine's queue was empty and
        /// its store equal to the server's; nil when that did not happen within a minute.
        public var convergenceSeconds: Double?
        /// When the machines had not converged 10 s after the quiet period: each one's state
        /// then, and the end of its daemon's log.
        public var convergenceNotes: [String]
        /// Connections the proxies reset.
        public var resets: Int
        /// PostgreSQL stops (fast or immediate) that did not end within 30 s: the server was
        /// killed (SIGKILL), and the fault counted.
        public var killedStops: Int

        /// Writes acknowledged on the late machine before its first checkpoint (nil: no
        /// machine started late).
        public var writtenBeforeFirstCheckpoint: Int?

        /// Whether the checker passed, every machine converged within the limit, and every kind
        /// of fault was attempted as often as planned and took effect at least once.
        public var passed: Bool {
            verdict.passed && (convergenceSeconds ?? .infinity) <= configuration.convergenceLimit
                && unavailable.isEmpty
                && configuration.kinds.allSatisfy {
                    (attempted[$0] ?? 0) >= $0.planned(perKind: configuration.perKind) && (faults[$0] ?? 0) >= 1
                }
        }

        public var description: String {
            let operations = history.operations
            let saves = operations.filter { $0.kind != .read }
            let kinds: [String] = SyncHistory.Operation.Kind.allKinds.map { kind in
                let count = operations.filter { $0.kind == kind }.count
                return "\(count) \(kind.rawValue)"
            }
            let reads: Int = operations.reduce(0) { $0 + $1.reads.count }
            let acknowledged: Int = saves.filter(\.acknowledged).count
            let injected: [String] = configuration.kinds.map { kind in
                "\(kind.rawValue) \(faults[kind] ?? 0)/\(attempted[kind] ?? 0)"
            }
            let totalFaults: Int = faults.values.reduce(0, +)
            let refused: Int = history.uploads.filter { $0.rejected != nil }.count
            let converged: String =
                convergenceSeconds.map { String(format: "%.2f s", $0) }
                ?? "not within \(Int(configuration.convergenceLimit + configuration.convergencePatience)) s"
            var lines: [String] = []
            lines.append(
                "sync fault campaign: seed \(configuration.seed), \(Int(configuration.duration)) s, \(configuration.machines) machines × \(configuration.writersPerMachine) writers, \(configuration.rate > 0 ? "\(String(format: "%g", configuration.rate)) operations per second each" : "unpaced")\(configuration.defect.map { "; daemons with the defect \($0.rawValue)" } ?? "")"
            )
            lines.append("operations: \(operations.count) (\(kinds.joined(separator: ", "))), \(reads) values read")
            lines.append("saves: \(acknowledged) acknowledged, \(saves.count - acknowledged) failed (outcome unknown)")
            lines.append(
                "faults that took effect/attempted: \(injected.joined(separator: ", ")) (\(totalFaults) took effect; \(resets) connections reset by the proxies\(killedStops > 0 ? "; \(killedStops) PostgreSQL stops did not end within 30 s and the server was killed" : ""))"
            )
            lines.append("change sets refused by the server: \(refused) of \(history.uploads.count)")
            lines.append("convergence after the quiet period: \(converged)")
            if let writtenBeforeFirstCheckpoint {
                lines.append(
                    "saves acknowledged on the late machine before its first checkpoint: \(writtenBeforeFirstCheckpoint)"
                )
            }
            for (kind, reason) in unavailable.sorted(by: { $0.key.rawValue < $1.key.rawValue }) {
                lines.append("unavailable: \(kind.rawValue): \(reason)")
            }
            lines += convergenceNotes
            lines.append(verdict.description)
            lines.append(passed ? "PASSED" : "FAILED")
            return lines.joined(separator: "\n")
        }
    }

    /// Stops what running campaigns started that an exit would leave behind (their daemons, by
    /// pid, their full-disk volumes and their directories), for a program interrupted by a signal; PostgreSQL
    /// servers are stopped by the exit itself (``PostgresServer``). Safe to call from a signal
    /// source's handler.
    public static func cleanUpAfterInterruption() {
        let (pids, mounts, directories) = running.withLock { ($0.pids, $0.mounts, $0.directories) }
        for pid in pids {
            kill(pid, SIGKILL)
            _ = PostgresServer.waitForExit(pid, timeout: .seconds(5))
        }
        for mount in mounts { umount2(mount, Int32(MNT_DETACH)) }
        for directory in directories { try? FileManager.default.removeItem(atPath: directory) }
    }

    /// The daemons and volumes of the campaigns running in this process.
    static let running = Mutex<(pids: Set<pid_t>, mounts: Set<String>, directories: Set<String>)>(([], [], []))

    /// Runs a campaign and returns its report (whether it passed is the report's to say).
    /// - Throws: when the campaign cannot be set up (PostgreSQL missing, a daemon that does not
    ///   start), not when a guarantee fails.
    public static func run(_ configuration: Configuration) async throws -> Report {
        let campaign = try await Campaign(configuration)
        return try await campaign.run()
    }
}

extension SyncHistory.Operation.Kind {
    static let allKinds: [Self] = [.insert, .update, .delete, .read]
}

/// SplitMix64: a small seeded generator, the same numbers for a seed on every machine.
public struct SeededGenerator: RandomNumberGenerator, Sendable {
    private var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

/// One campaign's machines, server and writers.
private final class Campaign: Sendable {
    let configuration: SyncFaultCampaign.Configuration
    let postgres: PostgresServer
    let database: String
    let schemaName = "campaign"
    let directory: String
    let machines: [CampaignMachine]
    /// Each machine's writers' gate (closed while its store is restored).
    let gates: [WriterGate]
    /// Each machine's faults, one at a time.
    let machineQueues: [DispatchQueue]
    let shared: [UUID]
    let disk: CampaignDisk?
    let diskUnavailable: String?
    /// The cut that keeps the late machine from its first checkpoint (nil: none starts late).
    let lateCut: FaultProxy.Fault?
    /// The gateways' processes (``SyncFaultCampaign/Configuration/gateways``).
    let gatewayProcesses: [pid_t]
    /// Their TLS certificates (removed with the campaign).
    let certificates: TestCertificates?
    /// The handle of a user made on the server before the machines start.
    static let takenHandle = "dup-0"
    let started = ContinuousClock.now
    private let state = Mutex(State())

    struct State {
        var stopping = false
        var faults: [SyncFaultCampaign.FaultKind: Int] = [:]
        var attempted: [SyncFaultCampaign.FaultKind: Int] = [:]
        /// The refusals each client's app was told, by client.
        var told: [Int: [Set<UUID>]] = [:]
        var serverOperations: [SyncHistory.Operation] = []
        var psqlCount = 0
        /// PostgreSQL stops that did not end within 30 s, whose server was killed.
        var killedStops = 0
        /// Per machine, its store's earlier lives, each ended by a restore from a backup.
        var lives: [Int: [SyncHistory.Machine.Life]] = [:]
        /// Per machine restored, where its store's current life began: its first number, the
        /// numbers of its rejected log from the backup, and when.
        var current: [Int: (firstNumber: Int64, inherited: Set<Int64>, began: Double)] = [:]
        /// Each client's app (a shared stack), by client: replaced by a new one when its
        /// machine's store is restored, as an operator restarts the apps (README, "Backup and
        /// restore").
        var apps: [Int: App] = [:]
        /// The machines whose apps run ``renamedTestSchema`` (``SyncFaultCampaign/FaultKind/renameRollout``).
        var renamed: Set<Int> = []
    }

    /// A client's app: its shared stack, and whether it has ``renamedTestSchema``.
    struct App {
        var stack: Skyros
        var renamed: Bool
    }

    init(_ configuration: SyncFaultCampaign.Configuration) async throws {
        self.configuration = configuration
        guard FileManager.default.isExecutableFile(atPath: configuration.skyrosd) else {
            throw PostgresServerError.notInstalled(
                "skyrosd is not built at \(configuration.skyrosd): build every product first (swift build)")
        }
        directory = "/tmp/skfc-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        SyncFaultCampaign.running.withLock { [directory] in _ = $0.directories.insert(directory) }
        do {
            let postgres = try await PostgresServer.started()
            self.postgres = postgres
            database = try postgres.createUniqueDatabase(prefix: "campaign")
            let sync = SyncConfiguration(
                host: postgres.host, port: postgres.port, username: postgres.superuser, database: database,
                schema: schemaName,
                tls: .disable)
            try await SyncSetup.run(sync, schema: testSchema, log: { _ in })
            // The audit: every insert, update and delete of a User, in the order they happened.
            try postgres.psql(
                """
                CREATE TABLE public.campaign_audit (seq bigserial PRIMARY KEY, op char(1) NOT NULL, id uuid NOT NULL,
                    handle text, firstname text, lastname text, xid xid8 NOT NULL DEFAULT pg_current_xact_id());
                CREATE FUNCTION public.campaign_audit() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN
                    IF TG_OP = 'DELETE' THEN
                        INSERT INTO public.campaign_audit (op, id, handle, firstname, lastname)
                            VALUES ('D', OLD."_id", OLD.handle, OLD.firstname, OLD.lastname);
                        RETURN OLD;
                    END IF;
                    INSERT INTO public.campaign_audit (op, id, handle, firstname, lastname)
                        VALUES (left(TG_OP, 1), NEW."_id", NEW.handle, NEW.firstname, NEW.lastname);
                    RETURN NEW;
                END $$;
                CREATE TRIGGER campaign_audit AFTER INSERT OR DELETE ON \(schemaName)."User"
                    FOR EACH ROW EXECUTE FUNCTION public.campaign_audit();
                -- Updates of the audited columns only (the rename's rollout fills a new column).
                CREATE TRIGGER campaign_audit_update AFTER UPDATE ON \(schemaName)."User" FOR EACH ROW
                    WHEN (OLD.handle IS DISTINCT FROM NEW.handle OR OLD.firstname IS DISTINCT FROM NEW.firstname
                        OR OLD.lastname IS DISTINCT FROM NEW.lastname)
                    EXECUTE FUNCTION public.campaign_audit();
                """, database: database)
            // The shared objects, made on the server before any machine starts (each machine's
            // first checkpoint brings them).
            var generator = SeededGenerator(seed: configuration.seed)
            var shared: [UUID] = []
            for index in 0..<6 {
                let id = UUID(
                    uuid: (0, 0, 0, 0, 0, 0, 0x40, 0, 0x80, 0, 0, 0, 0, 0, UInt8(index), UInt8(generator.next() & 0xff))
                )
                shared.append(id)
                try postgres.psql(
                    #"INSERT INTO \#(schemaName)."User" ("_id", handle, firstname, lastname) VALUES ('\#(id)', 'shared-\#(index)', 'init-\#(index)-f', 'init-\#(index)-l')"#,
                    database: database)
            }
            self.shared = shared
            // A user whose handle the late machine's first save takes again, unaware of it:
            // the server refuses that save, and says so with the machine's first checkpoint.
            try postgres.psql(
                #"INSERT INTO \#(schemaName)."User" (handle, firstname, lastname) VALUES ('\#(Self.takenHandle)', 'init-taken', 'init-taken')"#,
                database: database)
            do {
                disk = try CampaignDisk(directory: directory + "/space", postgres: postgres, database: database)
                diskUnavailable = nil
            } catch {
                disk = nil
                diskUnavailable = "\(error)"
            }
            var machines: [CampaignMachine] = []
            var lateCut: FaultProxy.Fault?
            var gatewayPorts: [Int] = []
            var gatewayProcesses: [pid_t] = []
            var certificates: TestCertificates?
            if let gateways = configuration.gateways {
                let made = try TestCertificates()
                certificates = made
                let rules = directory + "/sync-rules.yaml"
                let secret = directory + "/gateway.secret"
                try gateways.rules.write(toFile: rules, atomically: true, encoding: .utf8)
                _ = FileManager.default.createFile(
                    atPath: secret, contents: gateways.secret, attributes: [.posixPermissions: 0o600])
                for index in 0..<gateways.count {
                    let logPath = directory + "/gateway\(index).log"
                    let log = open(logPath, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
                    let null = open("/dev/null", O_RDONLY | O_CLOEXEC)
                    defer {
                        close(log)
                        close(null)
                    }
                    let child = try PostgresServer.spawn(
                        [
                            gateways.executable, "--group", "g", "--database",
                            "postgresql://postgres@127.0.0.1:\(postgres.port)/\(database)?sslmode=disable&schema=\(schemaName)",
                            "--rules", rules, "--secret-file", secret, "--listen", "127.0.0.1:0", "--tls-cert",
                            made.serverCertificate, "--tls-key", made.serverKey,
                        ], environment: ProcessInfo.processInfo.environment, stdin: null, stdout: log, stderr: log)
                    SyncFaultCampaign.running.withLock { _ = $0.pids.insert(child) }
                    gatewayProcesses.append(child)
                    let deadline = Date().addingTimeInterval(20)
                    var port: Int?
                    while port == nil, Date() < deadline {
                        let text = (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? ""
                        port = text.split(separator: "\n").first { $0.hasPrefix("listening on 127.0.0.1:") }
                            .flatMap { Int($0.split(separator: ":").last ?? "") }
                        if port == nil { usleep(20_000) }
                    }
                    guard let port else {
                        throw PostgresServerError.timedOut(
                            "skyros-gateway \(index) did not listen in 20 s: \((try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "")"
                        )
                    }
                    gatewayPorts.append(port)
                }
            }
            self.gatewayProcesses = gatewayProcesses
            self.certificates = certificates
            for index in 0..<configuration.machines {
                let proxy = try FaultProxy(
                    upstreamPort: gatewayPorts.isEmpty ? postgres.port : gatewayPorts[index % gatewayPorts.count])
                if configuration.startsOneMachineLate && index == configuration.machines - 1 {
                    // Cut from the start: its first checkpoint waits until its first saves are made.
                    lateCut = proxy.inject(.cut, .both)
                }
                var arguments = [
                    "--sync", "postgresql://postgres@127.0.0.1:\(proxy.port)/\(database)?sslmode=disable",
                    "--sync-schema", schemaName,
                ]
                if let gateways = configuration.gateways, let certificates {
                    let token = directory + "/m\(index).token"
                    try gateways.tokens[index].write(toFile: token, atomically: true, encoding: .utf8)
                    arguments = [
                        "--sync", "wss://127.0.0.1:\(proxy.port)/g?sslrootcert=\(certificates.authority)",
                        "--sync-token-file", token,
                    ]
                }
                let machine = try CampaignMachine(
                    index: index, directory: directory + "/m\(index)", skyrosd: configuration.skyrosd,
                    arguments: arguments,
                    environment: configuration.defect.map {
                        ["SKYROS_DEBUG_DEFECT": $0.rawValue]
                    } ?? [:], proxy: proxy)
                machines.append(machine)
            }
            self.machines = machines
            gates = machines.map { _ in WriterGate() }
            machineQueues = machines.map { DispatchQueue(label: "campaign.machine\($0.index)") }
            self.lateCut = lateCut
        } catch {
            // What was started stops with its owner (the machines' daemons, the server, the volume).
            try? FileManager.default.removeItem(atPath: directory)
            SyncFaultCampaign.running.withLock { [directory] in _ = $0.directories.remove(directory) }
            throw error
        }
    }

    deinit {
        for machine in machines { machine.stop() }
        for child in gatewayProcesses {
            Glibc.kill(child, SIGTERM)
            if PostgresServer.waitForExit(child, timeout: .seconds(10)) == nil {
                Glibc.kill(child, SIGKILL)
                _ = PostgresServer.waitForExit(child, timeout: .seconds(10))
            }
            SyncFaultCampaign.running.withLock { _ = $0.pids.remove(child) }
        }
        if let keep = ProcessInfo.processInfo.environment["SKYROS_CAMPAIGN_KEEP_LOGS"] {
            // The server's audit and upload records, for a post-mortem.
            for (name, sql) in [
                ("audit", "SELECT * FROM public.campaign_audit ORDER BY seq"),
                (
                    "uploads",
                    "SELECT machine, number, xid, rejected, objects FROM \(schemaName)._skyros_uploads ORDER BY xid, number"
                ),
            ] {
                let rows = (try? postgres.psql(sql, database: database, timeout: .seconds(30))) ?? "(unreadable)"
                _ = FileManager.default.createFile(atPath: keep + "/\(name).txt", contents: Data(rows.utf8))
            }
        }
        try? postgres.stop(mode: .immediate)
        disk?.remove()
        if let keep = ProcessInfo.processInfo.environment["SKYROS_CAMPAIGN_KEEP_LOGS"] {
            // The daemons' logs, for a post-mortem.
            for machine in machines {
                try? FileManager.default.copyItem(
                    atPath: machine.logFile, toPath: keep + "/skyrosd-\(machine.index).log")
                try? FileManager.default.copyItem(
                    atPath: machine.container.path, toPath: keep + "/store-\(machine.index)")
            }
            try? FileManager.default.copyItem(atPath: postgres.logFile, toPath: keep + "/postgres.log")
        }
        try? FileManager.default.removeItem(atPath: directory)
        SyncFaultCampaign.running.withLock { [directory] in _ = $0.directories.remove(directory) }
    }

    var now: Double {
        let elapsed = ContinuousClock.now - started
        return Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
    }

    func say(_ message: String) { configuration.log?(String(format: "[%7.2f] ", now) + message) }

    var stopping: Bool { state.withLock { $0.stopping } }

    /// Counts a fault attempted, and taken effect when it did.
    func counted(_ kind: SyncFaultCampaign.FaultKind, tookEffect: Bool) {
        state.withLock {
            $0.attempted[kind, default: 0] += 1
            if tookEffect { $0.faults[kind, default: 0] += 1 }
        }
    }

    func run() async throws -> SyncFaultCampaign.Report {
        for machine in machines {
            for client in clients(of: machine.index) {
                let app = try startApp(on: machine, as: client)
                state.withLock { $0.apps[client] = app }
            }
        }
        // Each machine's first app (held only by the state, which a restore replaces).
        let firstApp = { (index: Int) -> Skyros in
            self.state.withLock { $0.apps[index * self.configuration.writersPerMachine]!.stack }
        }
        // Every machine but the late one has the shared objects before the faults start.
        for (index, machine) in machines.enumerated() where !(lateCut != nil && index == machines.count - 1) {
            let ready = await poll(seconds: 60) {
                try await firstApp(index).read { context in try User.all(in: context).count } >= self.shared.count
            }
            guard ready else {
                throw PostgresServerError.timedOut(
                    "machine \(index) has not synced the shared objects in 60 s: \(machine.logTail())")
            }
        }
        var history = SyncHistory()
        var early: Int?
        if let lateCut, let late = machines.last {
            // The late machine saves before its first checkpoint: an insert of a handle the
            // server has (refused when it goes up), and an object of its own.
            let client = (machines.count - 1) * configuration.writersPerMachine
            for (number, handle) in [Self.takenHandle, "h-early"].enumerated() {
                var operation = SyncHistory.Operation(
                    client: client, machine: late.index, kind: .insert, property: "handle", value: handle,
                    acknowledged: false, start: now, end: 0)
                do {
                    operation.object = try await firstApp(late.index).write { context in
                        let user = User.create(in: context)
                        user.handle = handle
                        user.firstname = "c\(client).early\(number)"
                        return user.objectID.uuid
                    }
                    operation.acknowledged = true
                } catch {
                    operation.error = "\(error)"
                }
                operation.end = now
                history.operations.append(operation)
            }
            early = late.checkpoint() == nil ? history.operations.filter(\.acknowledged).count : 0
            late.proxy.heal(lateCut)
            say("machine \(late.index) saved \(early ?? 0) change sets before its first checkpoint; its link heals")
        }
        say("\(machines.count) machines; writers and faults start")
        let plan = planFaults()
        let writers = (0..<machines.count * configuration.writersPerMachine).map { client in
            Task(executorPreference: CampaignExecutor.shared) {
                await self.write(
                    client: client, machine: client / self.configuration.writersPerMachine)
            }
        }
        let faults = Task(executorPreference: CampaignExecutor.shared) { await self.inject(plan) }
        try? await Task.sleep(for: .seconds(configuration.duration))
        state.withLock { $0.stopping = true }
        for writer in writers { history.operations += await writer.value }
        await faults.value
        // Everything heals.
        for machine in machines { machine.proxy.healAll() }
        disk?.free()
        try? postgres.start()
        for machine in machines where !machine.isRunning || !machine.syncs {
            // Down, or left without sync by a fault that could not restart it: with sync again.
            machine.terminate()
            try? machine.start()
        }
        say("healed; quiet for 3 s")
        try? await Task.sleep(for: .seconds(3))
        let quietEnded = now
        var convergence: Double?
        var notes: [String] = []
        if await poll(seconds: configuration.convergenceLimit, { try self.converged() }) {
            convergence = now - quietEnded
        } else {
            // Why not yet: the server, each machine's state, and the end of its daemon's log.
            let probe = ContinuousClock.now
            let answer = (try? postgres.psql("SELECT 1", database: database, timeout: .seconds(5))) ?? "no answer"
            notes.append(
                "server: running \(postgres.isRunning), SELECT 1 gave \(answer) in \(ContinuousClock.now - probe); its log ends:\n"
                    + PostgresServer.logTail(postgres.logFile, from: 0).split(separator: "\n").suffix(8).joined(
                        separator: "\n"))
            let server = (try? serverRows()) ?? [:]
            for (index, machine) in machines.enumerated() {
                let rows = machine.rows() ?? [:]
                let different = Set(server.keys).union(rows.keys).filter { server[$0] != rows[$0] }.count
                notes.append(
                    "machine \(index) at \(String(format: "%.1f", now - quietEnded)) s: \(machine.queued().map(String.init) ?? "?") queued, \(different) objects differ, checkpoint \(machine.checkpoint() ?? "?"), running \(machine.isRunning), sync \(machine.status()); its log ends:\n"
                        + machine.logTail().split(separator: "\n").suffix(12).joined(separator: "\n"))
            }
            if await poll(seconds: configuration.convergencePatience, { try self.converged() }) {
                convergence = now - quietEnded
            }
        }
        say("convergence: \(convergence.map { String(format: "%.2f s", $0) } ?? "none")")
        for note in notes { say(note) }

        history.operations += state.withLock { $0.serverOperations }
        history.initialTokens = Set((0..<shared.count).flatMap { ["init-\($0)-f", "init-\($0)-l"] })
        history.audit = try auditRows()
        history.serverRows = try serverRows()
        history.uploads = try uploads()
        for (index, machine) in machines.enumerated() {
            var state = machine.finalState()
            state.rows = machine.rows() ?? [:]
            let (earlier, current) = self.state.withLock { ($0.lives[index] ?? [], $0.current[index]) }
            state.earlierLives = earlier
            if let current {
                state.firstNumber = current.firstNumber
                state.inherited = current.inherited
                state.began = current.began
            }
            for client in clients(of: index) {
                history.clients[client] = index
                guard let app = self.state.withLock({ $0.apps[client] }) else { continue }
                state.appRows[client] = (try? await rows(of: app)) ?? [:]
            }
            history.machines.append(state)
        }
        // The apps are told on their stacks' completion queues: what is queued there now is told.
        for app in state.withLock({ Array($0.apps.values) }) { app.stack.completionQueue.sync {} }
        history.told = state.withLock { $0.told }
        if let keep = ProcessInfo.processInfo.environment["SKYROS_CAMPAIGN_KEEP_LOGS"] {
            // The writes, for a post-mortem: client, machine, kind, object, property, value,
            // acknowledged, start, end, error.
            let lines = history.operations.filter { $0.kind != .read }.map { operation in
                [
                    "\(operation.client)", "\(operation.machine)", "\(operation.kind)",
                    operation.object?.uuidString ?? "", operation.property ?? "", operation.value ?? "",
                    "\(operation.acknowledged)", String(format: "%.3f", operation.start),
                    String(format: "%.3f", operation.end), operation.error ?? "",
                ].joined(separator: "|")
            }
            _ = FileManager.default.createFile(
                atPath: keep + "/writes.txt", contents: Data(lines.joined(separator: "\n").utf8))
            // And the values read: client, machine, start, object, property, value (- for missing).
            let reads = history.operations.filter { $0.kind == .read }.flatMap { operation in
                operation.reads.map { read in
                    [
                        "\(operation.client)", "\(operation.machine)", String(format: "%.3f", operation.start),
                        read.object.uuidString, read.property, read.value ?? "-",
                    ].joined(separator: "|")
                }
            }
            _ = FileManager.default.createFile(
                atPath: keep + "/reads.txt", contents: Data(reads.joined(separator: "\n").utf8))
        }
        let verdict = history.check()
        let (faultCounts, attempted) = state.withLock { ($0.faults, $0.attempted) }
        var unavailable: [SyncFaultCampaign.FaultKind: String] = [:]
        if let diskUnavailable { unavailable[.diskFull] = diskUnavailable }
        var report = SyncFaultCampaign.Report(
            configuration: configuration, history: history, verdict: verdict, faults: faultCounts,
            unavailable: unavailable,
            convergenceSeconds: convergence, convergenceNotes: notes,
            resets: machines.reduce(0) { $0 + $1.proxy.statistics.resets },
            killedStops: state.withLock { $0.killedStops })
        report.attempted = attempted
        report.writtenBeforeFirstCheckpoint = early
        return report
    }

    /// Polls `condition` every 100 ms until it holds, `seconds` at most.
    func poll(seconds: Double, _ condition: () async throws -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + .seconds(seconds)
        while ContinuousClock.now < deadline {
            if (try? await condition()) == true { return true }
            try? await Task.sleep(for: .milliseconds(100))
        }
        return false
    }

    /// Checks `condition` every 100 ms until it holds, `seconds` at most, blocking the thread
    /// (a fault's): what it waits for (a machine's queue, the server's records) tells no one.
    func waitUntil(seconds: Double, _ condition: () throws -> Bool) -> Bool {
        let deadline = ContinuousClock.now + .seconds(seconds)
        while ContinuousClock.now < deadline {
            if (try? condition()) == true { return true }
            usleep(100_000)
        }
        return false
    }

    /// Every machine's queue empty and its store file equal to the server's table.
    func converged() throws -> Bool {
        let server = try serverRows()
        for machine in machines {
            guard machine.queued() == 0, machine.rows() == server else { return false }
        }
        return true
    }

    // MARK: Writers

    /// Client `client`'s new app on `machine`: a shared stack of its group, with the schema
    /// version the machine's apps have, whose refusals are recorded as told to the client.
    func startApp(on machine: CampaignMachine, as client: Int) throws -> App {
        let renamed = state.withLock { $0.renamed.contains(machine.index) }
        let stack = try Skyros(
            sharedStack: renamed ? renamedTestSchema : testSchema, container: machine.container, timeout: 3,
            savesOnStop: false)
        listen(to: stack, as: client)
        return App(stack: stack, renamed: renamed)
    }

    /// ``startApp(on:as:)`` tried up to `attempts` times, each failure said (nil: none started).
    func startApp(on machine: CampaignMachine, as client: Int, attempts: Int) -> App? {
        for attempt in 1...attempts {
            do { return try startApp(on: machine, as: client) } catch {
                let version = state.withLock { $0.renamed.contains(machine.index) } ? 2 : 1
                say(
                    "machine \(machine.index): client \(client)'s app (version \(version)) did not start (attempt \(attempt)): \(error)"
                )
            }
        }
        return nil
    }

    /// Records what `stack`, client `client`'s app, is told of the server's refusals.
    func listen(to stack: Skyros, as client: Int) {
        stack.errorHandler = { [weak self] error in
            guard error.code == .syncRejected else { return }
            let objects = Set(error.objectIDs.map(\.uuid))
            self?.state.withLock { $0.told[client, default: []].append(objects) }
        }
    }

    /// The clients (apps) of machine `index`.
    func clients(of index: Int) -> Range<Int> {
        (index * configuration.writersPerMachine)..<((index + 1) * configuration.writersPerMachine)
    }

    /// One writer's loop until the campaign stops: inserts (some with a handle another writer
    /// may take too), updates of the shared objects, deletes of what it inserted, reads.
    func write(client: Int, machine: Int) async -> [SyncHistory.Operation] {
        var generator = SeededGenerator(seed: configuration.seed &+ 0x1000 &+ UInt64(client))
        var operations: [SyncHistory.Operation] = []
        var mine: [UUID] = []
        var gone: [UUID] = []
        var count = 0
        let gate = gates[machine]
        while !stopping {
            // Paused while an operator's operation on the machine needs its apps idle.
            await gate.enter()
            if stopping {
                gate.leave()
                break
            }
            // The client's app as it is now (a restore restarts it; none: it did not start again).
            guard let app = state.withLock({ $0.apps[client] }) else {
                gate.leave()
                try? await Task.sleep(for: .milliseconds(100))
                continue
            }
            let (stack, renamed) = (app.stack, app.renamed)
            count += 1
            let token = "c\(client).\(count)"
            let roll = Int.random(in: 0..<100, using: &generator)
            var operation = SyncHistory.Operation(
                client: client, machine: machine, kind: .read, acknowledged: false, start: now, end: 0)
            do {
                switch roll {
                case 0..<15:
                    // An insert; one in five takes a handle from a small pool that every writer draws from.
                    let handle =
                        Int.random(in: 0..<5, using: &generator) == 0
                        ? "dup-\(Int.random(in: 0..<configuration.sharedHandles, using: &generator))" : "h-\(token)"
                    operation.kind = .insert
                    operation.property = "handle"
                    operation.value = handle
                    let id = try await stack.write { context in
                        CampaignUsers.insert(handle: handle, firstname: token, renamed: renamed, in: context)
                    }
                    operation.object = id
                    mine.append(id)
                case 15..<25 where !mine.isEmpty:
                    let id = mine.remove(at: Int.random(in: 0..<mine.count, using: &generator))
                    operation.kind = .delete
                    operation.object = id
                    operation.found = try await stack.write { context in
                        try CampaignUsers.delete(id, renamed: renamed, in: context)
                    }
                    gone = Array((gone + [id]).suffix(3))
                case 25..<80:
                    let id = shared[Int.random(in: 0..<shared.count, using: &generator)]
                    let property = Bool.random(using: &generator) ? "firstname" : "lastname"
                    operation.kind = .update
                    operation.object = id
                    operation.property = property
                    operation.value = token
                    operation.found = try await stack.write { context in
                        try CampaignUsers.set(property, to: token, of: id, renamed: renamed, in: context)
                    }
                default:
                    break
                }
                operation.acknowledged = operation.kind != .read
            } catch {
                operation.error = "\(error)"
            }
            operation.end = now
            let own = Array(mine.suffix(3)) + gone
            do {
                operation.reads = try await read(machine: machine, app: app, own: own)
            } catch {
                operation.readError = "\(error)"
            }
            operations.append(operation)
            gate.leave()
            if configuration.rate > 0 {
                let interval = 1 / configuration.rate
                let pause =
                    Double.random(in: (interval / 2)...(interval * 1.5), using: &generator) - (now - operation.start)
                if pause > 0 { try? await Task.sleep(for: .seconds(pause)) }
            } else {
                try? await Task.sleep(for: .milliseconds(Int.random(in: 5...25, using: &generator)))
            }
        }
        return operations
    }

    /// The shared objects' values as `app` reads them, with the machine's checkpoint, and
    /// the handles of the client's `own` objects (nil: missing).
    func read(machine: Int, app: App, own: [UUID]) async throws -> [SyncHistory.Read] {
        let checkpoint = machines[machine].checkpoint()
        let (shared, renamed) = (self.shared, app.renamed)
        let (values, handles) = try await app.stack.read { context in
            let values = try shared.map { id -> (UUID, String?, String?) in
                let user = try CampaignUsers.values(of: id, renamed: renamed, in: context)
                return (id, user?.firstname, user?.lastname)
            }
            let handles = try own.map { id in
                (id, try CampaignUsers.values(of: id, renamed: renamed, in: context)?.handle)
            }
            return (values, handles)
        }
        return values.flatMap { id, firstname, lastname in
            [
                SyncHistory.Read(object: id, property: "firstname", value: firstname, checkpoint: checkpoint),
                SyncHistory.Read(object: id, property: "lastname", value: lastname, checkpoint: checkpoint),
            ]
        } + handles.map { SyncHistory.Read(object: $0.0, property: "handle", value: $0.1, checkpoint: checkpoint) }
    }

    // MARK: Faults

    struct PlannedFault {
        var at: Double
        var kind: SyncFaultCampaign.FaultKind
        var machines: [Int]
        var direction: FaultProxy.Direction
        var length: Double
        var object: Int
    }

    /// The seeded plan: every kind `perKind` times, at random moments, each over before the end.
    func planFaults() -> [PlannedFault] {
        var generator = SeededGenerator(seed: configuration.seed &+ 0xFA17)
        var plan: [PlannedFault] = []
        let longest = configuration.longest
        for kind in configuration.kinds {
            for _ in 0..<kind.planned(perKind: configuration.perKind) {
                let lengths = kind.lengths(longest: longest)
                let length =
                    lengths.lowerBound == lengths.upperBound
                    ? lengths.lowerBound : Double.random(in: lengths, using: &generator)
                let latest = max(0.5, configuration.duration - length - 0.5)
                var chosen = Array(0..<configuration.machines).shuffled(using: &generator)
                switch kind {
                case .cut, .blackHole:
                    chosen = Array(chosen.prefix(Int.random(in: 1...configuration.machines, using: &generator)))
                default: chosen = Array(chosen.prefix(1))
                }
                plan.append(
                    PlannedFault(
                        at: Double.random(in: 0.2...latest, using: &generator), kind: kind, machines: chosen,
                        direction: FaultProxy.Direction.allCases.randomElement(using: &generator)!, length: length,
                        object: Int.random(in: 0..<shared.count, using: &generator)))
            }
        }
        return plan.sorted { $0.at < $1.at }
    }

    /// Injects the plan: each fault when its time comes, on a thread of its own (they block:
    /// a daemon's start, PostgreSQL's stop), the faults of one server, disk or machine one at
    /// a time.
    func inject(_ plan: [PlannedFault]) async {
        let group = DispatchGroup()
        let serverQueue = DispatchQueue(label: "campaign.server")
        let diskQueue = DispatchQueue(label: "campaign.disk")
        let rowsQueue = DispatchQueue(label: "campaign.rows")
        let fleetQueue = DispatchQueue(label: "campaign.fleet")
        for fault in plan {
            let wait = fault.at - now
            if wait > 0 { try? await Task.sleep(for: .seconds(wait)) }
            let queue: DispatchQueue
            switch fault.kind.scope {
            case .server: queue = serverQueue
            case .disk: queue = diskQueue
            case .rows: queue = rowsQueue
            case .machine: queue = machineQueues[fault.machines[0]]
            case .fleet: queue = fleetQueue
            case .links: queue = .global()
            }
            queue.async(group: group) {
                let tookEffect = self.perform(fault)
                self.counted(fault.kind, tookEffect: tookEffect)
                if !tookEffect {
                    self.say("\(fault.kind.rawValue) at \(String(format: "%.2f", fault.at)) s took no effect")
                }
            }
        }
        await withCheckedContinuation { continuation in
            group.notify(queue: .global()) { continuation.resume() }
        }
    }

    /// Performs a fault; returns whether it took effect.
    func perform(_ fault: PlannedFault) -> Bool {
        switch fault.kind {
        case .cut, .blackHole, .slow: partition(fault)
        case .daemonKill: killDaemon(fault)
        case .postgresFast, .postgresImmediate: stopServer(fault)
        case .diskFull: fillDisk(fault)
        case .psqlWrite: writeWithPsql(fault)
        case .restoreBackup: restoreBackup(fault)
        case .syncOffOn: switchSyncOffAndOn(fault)
        case .renameRollout: rollOutRename(fault)
        }
    }

    /// Breaks the links of the fault's machines for its length: took effect when it acted on
    /// a connection of one of them.
    func partition(_ fault: PlannedFault) -> Bool {
        let kind: FaultProxy.FaultKind =
            fault.kind == .cut ? .cut : fault.kind == .blackHole ? .blackHole : .slow(.milliseconds(200))
        let injected = fault.machines.map { machines[$0].proxy.inject(kind, fault.direction) }
        say(
            "\(fault.kind.rawValue) \(fault.direction.rawValue) machines \(fault.machines) for \(String(format: "%.1f", fault.length)) s"
        )
        usleep(UInt32(fault.length * 1_000_000))
        var acted = false
        for (machine, injected) in zip(fault.machines, injected) {
            if machines[machine].proxy.heal(injected) { acted = true }
        }
        return acted
    }

    /// Kills the machine's daemon and starts it again: took effect when it was running.
    func killDaemon(_ fault: PlannedFault) -> Bool {
        let machine = machines[fault.machines[0]]
        let killed = machine.kill()
        say(
            killed
                ? "daemon of machine \(machine.index) killed, down for \(String(format: "%.1f", fault.length)) s"
                : "daemon of machine \(machine.index) was not running")
        usleep(UInt32(fault.length * 1_000_000))
        do { try machine.start() } catch {
            say("machine \(machine.index) did not restart: \(error); again")
            try? machine.start()
        }
        return killed
    }

    /// Stops PostgreSQL and starts it again: took effect when it was running.
    func stopServer(_ fault: PlannedFault) -> Bool {
        var stopped = postgres.isRunning
        do {
            try postgres.stop(mode: fault.kind == .postgresFast ? .fast : .immediate)
            say(
                "PostgreSQL \(stopped ? "stopped" : "was not running") (\(fault.kind == .postgresFast ? "fast" : "immediate")) for \(String(format: "%.1f", fault.length)) s"
            )
        } catch {
            // A fast stop whose shutdown checkpoint cannot write (the tablespace full) may
            // not end within 30 s: the server is then killed, and was stopped all the same.
            if !postgres.isRunning {
                state.withLock { $0.killedStops += 1 }
            } else {
                stopped = false
            }
            say("PostgreSQL did not stop: \(error)")
        }
        usleep(UInt32(fault.length * 1_000_000))
        // A recovery that needs to extend a file of the full tablespace fails until the disk
        // is freed (at most half the longest fault later): started again until it comes up.
        let giveUp = now + 30
        for attempt in 1... {
            do {
                try postgres.start()
                break
            } catch {
                if attempt == 1 || now >= giveUp {
                    say("PostgreSQL did not start (attempt \(attempt)): \(String("\(error)".prefix(300)))")
                }
                if now >= giveUp { break }
                usleep(200_000)
            }
        }
        return stopped
    }

    /// Fills the tablespace for the fault's length: took effect when PostgreSQL failed to
    /// write for want of space meanwhile (its log says so).
    func fillDisk(_ fault: PlannedFault) -> Bool {
        guard let disk else { return false }
        let logged =
            (try? FileManager.default.attributesOfItem(atPath: postgres.logFile)[.size] as? NSNumber)?
            .int64Value ?? 0
        disk.fill()
        say("disk full for \(String(format: "%.1f", fault.length)) s")
        usleep(UInt32(fault.length * 1_000_000))
        // What the server logged meanwhile (read before the space comes back).
        var log = Data()
        if let handle = FileHandle(forReadingAtPath: postgres.logFile) {
            try? handle.seek(toOffset: UInt64(max(0, logged)))
            log = (try? handle.readToEnd()) ?? Data()
            try? handle.close()
        }
        disk.free()
        let text = String(decoding: log, as: UTF8.self)
        return text.contains("No space left on device") || text.contains("could not extend file")
    }

    /// Updates a shared object's property with `psql`: took effect when a row was updated.
    func writeWithPsql(_ fault: PlannedFault) -> Bool {
        let number = state.withLock { state in
            state.psqlCount += 1
            return state.psqlCount
        }
        let token = "psql-\(number)"
        let property = number % 2 == 0 ? "firstname" : "lastname"
        let id = shared[fault.object]
        var operation = SyncHistory.Operation(
            client: -1, machine: -1, kind: .update, object: id, property: property, value: token,
            acknowledged: false,
            start: now, end: 0)
        // While the server is down or starting (a restart, a recovery), psql cannot connect and sent nothing:
        // tried again every 200 ms, 10 s at most. Any other failure leaves the outcome unknown.
        let giveUp = now + 10
        while true {
            do {
                let output = try postgres.psql(
                    #"WITH updated AS (UPDATE \#(schemaName)."User" SET \#(property) = '\#(token)' WHERE "_id" = '\#(id)' RETURNING 1) SELECT count(*) FROM updated"#,
                    database: database, timeout: .seconds(10))
                operation.acknowledged = true
                operation.found = output.trimmingCharacters(in: .whitespacesAndNewlines) == "1"
                operation.error = nil
            } catch {
                operation.error = "\(error)"
                let text = "\(error)"
                // psql says `connection to server … failed:` only when no connection was made.
                let notConnected = text.contains("psql: error: connection to server") && text.contains(" failed: ")
                if notConnected && now < giveUp && !stopping {
                    usleep(200_000)
                    continue
                }
                say("psql update of \(id) failed: \(String(text.prefix(300)))")
            }
            break
        }
        operation.end = now
        state.withLock { $0.serverOperations.append(operation) }
        return operation.acknowledged && operation.found
    }

    /// Restores the machine's store from an older backup (``SyncFaultCampaign/FaultKind/restoreBackup``):
    /// took effect when the store had numbered change sets since the backup, and was restored.
    ///
    /// Before its daemon is stopped, the machine's writers are paused and everything its
    /// store has is on the server: its queue empty, every refusal the server recorded for it
    /// in its rejected log and told to its apps. So the restore loses nothing the checker
    /// expects anywhere (a save never uploaded would be the operator's loss, not sync's), and
    /// each save belongs to one life of the store (``SyncHistory/Machine/Life``).
    func restoreBackup(_ fault: PlannedFault) -> Bool {
        let machine = machines[fault.machines[0]]
        let index = machine.index
        let backup = machine.groups + "/backup-\(UInt32.random(in: 0...UInt32.max)).sqlite"
        defer { try? FileManager.default.removeItem(atPath: backup) }
        guard machine.isRunning, machine.backUp(to: backup) else {
            say(
                "machine \(index): no backup (its daemon \(machine.isRunning ? "did not make one" : "was not running"))"
            )
            return false
        }
        // A backup of a store whose daemon has not yet taken the new machine id of its last
        // restore would be a copy of that one: restored, it would upload its saves again.
        let ended = state.withLock { Set(($0.lives[index] ?? []).compactMap(\.id)) }
        guard let taken = CampaignMachine.state(ofStoreAt: backup), let id = taken.id, !ended.contains(id) else {
            say("machine \(index): its backup is of a store with no new machine id yet")
            return false
        }
        say(
            "machine \(index) backed up at number \(taken.lastNumber), saving on for \(String(format: "%.1f", fault.length)) s"
        )
        usleep(UInt32(fault.length * 1_000_000))
        let gate = gates[index]
        guard gate.close(timeout: .seconds(30)) else {
            gate.open()
            say("machine \(index): its writers did not become idle in 30 s; no restore")
            return false
        }
        defer { gate.open() }
        let clients = clients(of: index)
        var waitingFor = ""
        let drained = waitUntil(seconds: 30) {
            let queued = machine.queued()
            guard queued == 0, let current = machine.currentID() else {
                waitingFor = "\(queued.map(String.init) ?? "?") change sets queued"
                return false
            }
            let refused = try self.refusals(of: current)
            let logged = Set(machine.finalState().rejected.map(\.number))
            guard refused.allSatisfy({ logged.contains($0.number) }) else {
                waitingFor =
                    "refusals \(refused.map(\.number).filter { !logged.contains($0) }.sorted().prefix(5)) not in the rejected log"
                return false
            }
            waitingFor = "refusals not told to every app"
            // And told to every app of the machine.
            var expected: [Set<UUID>: Int] = [:]
            for refusal in refused { expected[refusal.objects, default: 0] += 1 }
            let told = self.state.withLock { $0.told }
            return clients.allSatisfy { client in
                var counts: [Set<UUID>: Int] = [:]
                for objects in told[client] ?? [] { counts[objects, default: 0] += 1 }
                return expected.allSatisfy { counts[$0.key, default: 0] >= $0.value }
            }
        }
        guard drained else {
            say("machine \(index): not everything on the server within 30 s (\(waitingFor)); no restore")
            return false
        }
        let stopped = now
        machine.closeStore()
        machine.terminate()
        let atStop = machine.finalState()
        machine.closeStore()
        guard atStop.queued == 0, atStop.lastNumber > taken.lastNumber else {
            say(
                "machine \(index): \(atStop.queued < 0 ? "its store was unreadable" : "nothing numbered since the backup"); no restore"
            )
            try? machine.start()
            return false
        }
        do {
            try machine.replaceStore(with: backup)
        } catch {
            say("machine \(index): the backup could not be put in place: \(error)")
            try? machine.start()
            return false
        }
        do { try machine.start() } catch {
            say("machine \(index) did not restart: \(error); again")
            try? machine.start()
        }
        // As the README's restore says: the apps that ran across the restore are restarted
        // (their main contexts hold the store as it was, their save numbers are ahead of the
        // restored store's record). The old ones stop before the new ones start.
        let began = now
        let earlierApps = state.withLock { state in clients.compactMap { state.apps.removeValue(forKey: $0) } }
        for app in earlierApps { app.stack.completionQueue.sync {} }
        for client in clients {
            guard let app = startApp(on: machine, as: client, attempts: 3) else { continue }
            state.withLock { $0.apps[client] = app }
        }
        state.withLock { state in
            let current = state.current[index] ?? (1, [], 0)
            state.lives[index, default: []].append(
                SyncHistory.Machine.Life(
                    id: atStop.id, firstNumber: current.firstNumber, lastNumber: atStop.lastNumber,
                    queued: atStop.queued, rejected: atStop.rejected, inherited: current.inherited,
                    began: current.began, ended: stopped))
            state.current[index] = (taken.lastNumber + 1, Set(taken.rejected.map(\.number)), began)
        }
        say(
            "machine \(index) restored from its backup at number \(taken.lastNumber) (it had numbered through \(atStop.lastNumber)); writers resume"
        )
        return true
    }

    /// The change sets the server recorded as refused for a machine id, with their objects.
    func refusals(of machine: UUID) throws -> [SyncHistory.Upload] {
        try query(
            """
            SELECT number, coalesce((SELECT string_agg(o->>'id', ' ') FROM jsonb_array_elements(objects) o), '')
                FROM \(schemaName)._skyros_uploads WHERE machine = '\(machine)' AND rejected IS NOT NULL
            """
        ).compactMap { row in
            guard row.count == 2, let number = Int64(row[0]) else { return nil }
            return SyncHistory.Upload(
                machine: machine, number: number, rejected: "",
                objects: Set(row[1].split(separator: " ").compactMap { UUID(uuidString: String($0)) }))
        }
    }

    /// Restarts the machine's daemon without sync for the fault's length, its writers going on,
    /// then with sync again (``SyncFaultCampaign/FaultKind/syncOffOn``): took effect when the
    /// daemon said that it queues its commits with sync off.
    func switchSyncOffAndOn(_ fault: PlannedFault) -> Bool {
        let machine = machines[fault.machines[0]]
        guard machine.isRunning, machine.currentID() != nil else {
            say(
                "machine \(machine.index): \(machine.isRunning ? "its store has not synced yet" : "its daemon was not running"); sync stays on"
            )
            return false
        }
        machine.terminate()
        let logged =
            (try? FileManager.default.attributesOfItem(atPath: machine.logFile)[.size] as? NSNumber)?.int64Value ?? 0
        do {
            try machine.start(sync: false)
        } catch {
            say("machine \(machine.index) did not start without sync: \(error)")
            try? machine.start()
            return false
        }
        say("machine \(machine.index): sync off for \(String(format: "%.1f", fault.length)) s")
        usleep(UInt32(fault.length * 1_000_000))
        let said = machine.log(from: logged).contains("sync is off; the store has synced")
        machine.terminate()
        do { try machine.start() } catch {
            say("machine \(machine.index) did not restart with sync: \(error); again")
            try? machine.start()
        }
        say("machine \(machine.index): sync on again")
        return said
    }

    /// Rolls out ``renamedTestSchema`` machine by machine (``SyncFaultCampaign/FaultKind/renameRollout``):
    /// took effect when every machine's apps were restarted with it.
    func rollOutRename(_ fault: PlannedFault) -> Bool {
        let pause = fault.length / Double(machines.count)
        var upgraded = 0
        for (index, machine) in machines.enumerated() {
            if index > 0 { usleep(UInt32(pause * 1_000_000)) }
            // In turn with the machine's other faults (a restore, a kill).
            let done = machineQueues[index].sync { upgrade(machine) }
            if done { upgraded += 1 }
        }
        return upgraded == machines.count
    }

    /// Restarts the machine's apps with ``renamedTestSchema``, its writers paused: the new
    /// apps start before the old ones stop, so that a machine whose daemon cannot be reached
    /// stays on version 1 (false).
    func upgrade(_ machine: CampaignMachine) -> Bool {
        let index = machine.index
        let gate = gates[index]
        guard gate.close(timeout: .seconds(30)) else {
            gate.open()
            say("machine \(index): its writers did not become idle in 30 s; not upgraded")
            return false
        }
        defer { gate.open() }
        state.withLock { _ = $0.renamed.insert(index) }
        var upgraded: [Int: App] = [:]
        for client in clients(of: index) {
            upgraded[client] = startApp(on: machine, as: client, attempts: 5)
        }
        guard upgraded.count == configuration.writersPerMachine else {
            state.withLock { _ = $0.renamed.remove(index) }
            say("machine \(index): not upgraded (its apps with version 2 did not start)")
            return false
        }
        let earlier = state.withLock { state in
            upgraded.compactMap { client, app in state.apps.updateValue(app, forKey: client) }
        }
        for app in earlier { app.stack.completionQueue.sync {} }
        say("machine \(index): apps restarted with version 2 (User.lastname renamed surname)")
        return true
    }

    // MARK: The server's side

    func query(_ sql: String) throws -> [[String]] {
        let output = try postgres.psql(sql, database: database, timeout: .seconds(60))
        return output.isEmpty
            ? []
            : output.split(separator: "\n", omittingEmptySubsequences: false).map {
                $0.split(separator: "|", omittingEmptySubsequences: false).map(String.init)
            }
    }

    func serverRows() throws -> SyncHistory.Rows {
        var rows: SyncHistory.Rows = [:]
        for row in try query(#"SELECT "_id", handle, firstname, lastname FROM \#(schemaName)."User""#)
        where row.count == 4 {
            if let id = UUID(uuidString: row[0]) { rows[id] = "\(row[1])|\(row[2])|\(row[3])" }
        }
        return rows
    }

    func auditRows() throws -> [SyncHistory.AuditRow] {
        try query(
            "SELECT seq, op, id, coalesce(handle, ''), coalesce(firstname, ''), coalesce(lastname, ''), xid FROM public.campaign_audit ORDER BY seq"
        )
        .compactMap { row in
            guard row.count == 7, let sequence = Int64(row[0]), let operation = row[1].first,
                let id = UUID(uuidString: row[2])
            else { return nil }
            return SyncHistory.AuditRow(
                sequence: sequence, transaction: row[6], operation: operation, object: id, handle: row[3],
                firstname: row[4], lastname: row[5])
        }
    }

    func uploads() throws -> [SyncHistory.Upload] {
        // The reason last: it may hold the separator.
        try query(
            """
            SELECT machine, number, xid, coalesce((SELECT string_agg(o->>'id', ' ') FROM jsonb_array_elements(objects) o), ''),
                coalesce(rejected, E'\\x01') FROM \(schemaName)._skyros_uploads
            """
        ).compactMap { row in
            guard row.count >= 5, let machine = UUID(uuidString: row[0]), let number = Int64(row[1]) else { return nil }
            let reason = row[4...].joined(separator: "|")
            return SyncHistory.Upload(
                machine: machine, number: number, rejected: reason == "\u{1}" ? nil : reason, transaction: row[2],
                objects: Set(row[3].split(separator: " ").compactMap { UUID(uuidString: String($0)) }))
        }
    }

    func rows(of app: App) async throws -> SyncHistory.Rows {
        let renamed = app.renamed
        return try await app.stack.read { context in try CampaignUsers.rows(renamed: renamed, in: context) }
    }
}

/// One machine: a group directory, its `skyrosd` process (killed and started again by the
/// campaign), its link to the server, and a read-only look into its store.
private final class CampaignMachine: Sendable {
    let index: Int
    let groups: String
    let container: URL
    let skyrosd: String
    let arguments: [String]
    /// Variables added to the daemon's environment.
    let environment: [String: String]
    let proxy: FaultProxy
    private let process = Mutex<pid_t?>(nil)
    /// Whether the running daemon was started with sync.
    private let syncing = Mutex(true)
    private let store = Mutex<DatabaseQueue?>(nil)

    init(
        index: Int, directory: String, skyrosd: String, arguments: [String], environment: [String: String],
        proxy: FaultProxy
    ) throws {
        self.index = index
        self.environment = environment
        groups = directory
        container = URL(fileURLWithPath: directory).appendingPathComponent("g")
        self.skyrosd = skyrosd
        self.arguments = arguments
        self.proxy = proxy
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        try start()
    }

    deinit { stop() }

    var logFile: String { groups + "/skyrosd.log" }

    var isRunning: Bool { process.withLock { $0 } != nil }

    /// Whether the daemon runs with sync (or is down, to be started with it).
    var syncs: Bool { syncing.withLock { $0 } }

    /// Starts the daemon (`sync` false: without `--sync`) and returns once it told systemd's
    /// protocol it is ready (20 s at most).
    func start(sync: Bool = true) throws {
        try process.withLock { pid in
            guard pid == nil else { return }
            let notify = try NotifyListener()
            let log = open(logFile, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
            let null = open("/dev/null", O_RDONLY | O_CLOEXEC)
            defer {
                close(log)
                close(null)
            }
            var environment = ProcessInfo.processInfo.environment.merging(self.environment) { $1 }
            environment["NOTIFY_SOCKET"] = notify.path
            let child = try PostgresServer.spawn(
                [skyrosd, "--group", "g", "--groups-dir", groups] + (sync ? arguments : []), environment: environment,
                stdin: null, stdout: log, stderr: log)
            guard notify.wait(for: "READY=1", seconds: 20) else {
                PostgresServer.killTree(child)
                throw PostgresServerError.timedOut("skyrosd of machine \(index) was not ready in 20 s: \(logTail())")
            }
            pid = child
            syncing.withLock { $0 = sync }
            SyncFaultCampaign.running.withLock { _ = $0.pids.insert(child) }
        }
    }

    /// SIGTERM, waited for (30 s, then SIGKILL), reaped; returns whether the daemon was running.
    @discardableResult
    func terminate() -> Bool {
        process.withLock { pid in
            guard let child = pid else { return false }
            let running = PostgresServer.reapIfExited(child) == nil
            if running {
                Glibc.kill(child, SIGTERM)
                if PostgresServer.waitForExit(child, timeout: .seconds(30)) == nil {
                    Glibc.kill(child, SIGKILL)
                    _ = PostgresServer.waitForExit(child, timeout: .seconds(10))
                }
            }
            SyncFaultCampaign.running.withLock { _ = $0.pids.remove(child) }
            pid = nil
            syncing.withLock { $0 = true }
            return running
        }
    }

    /// Its daemon's log from `offset` on.
    func log(from offset: Int64) -> String {
        guard let handle = FileHandle(forReadingAtPath: logFile) else { return "" }
        defer { try? handle.close() }
        try? handle.seek(toOffset: UInt64(max(0, offset)))
        return String(decoding: (try? handle.readToEnd()) ?? Data(), as: UTF8.self)
    }

    /// `skyros backup` of the running daemon's store to `path`: whether it made one.
    func backUp(to path: String) -> Bool {
        let tool = URL(fileURLWithPath: skyrosd).deletingLastPathComponent().appendingPathComponent("skyros").path
        let result = try? PostgresServer.run(
            [tool, "backup", "--group", "g", "--groups-dir", groups, path],
            environment: ProcessInfo.processInfo.environment, outputDirectory: groups, timeout: .seconds(30))
        return result?.status == 0 && FileManager.default.fileExists(atPath: path)
    }

    /// Puts the store file `backup` in place of the store (the daemon stopped): the store's
    /// files removed (`-wal` and `-shm` too), the backup copied in.
    func replaceStore(with backup: String) throws {
        closeStore()
        let store = container.appendingPathComponent("store.sqlite").path
        for suffix in ["", "-wal", "-shm"] { unlink(store + suffix) }
        try FileManager.default.copyItem(atPath: backup, toPath: store)
    }

    /// Closes the campaign's read-only connection to the store (opened again when next needed):
    /// before its daemon stops, so that no connection of the campaign's is the last one on it,
    /// and before its files are replaced.
    func closeStore() { store.withLock { $0 = nil } }

    /// SIGKILL, reaped; returns whether the daemon was running (a daemon that ended by itself
    /// is reaped and was not).
    @discardableResult
    func kill() -> Bool {
        process.withLock { pid in
            guard let child = pid else { return false }
            let running = PostgresServer.reapIfExited(child) == nil
            if running {
                Glibc.kill(child, SIGKILL)
                _ = PostgresServer.waitForExit(child, timeout: .seconds(10))
            }
            SyncFaultCampaign.running.withLock { _ = $0.pids.remove(child) }
            pid = nil
            return running
        }
    }

    func stop() {
        kill()
        proxy.stop()
        store.withLock { $0 = nil }
    }

    func logTail() -> String { PostgresServer.logTail(logFile, from: 0) }

    /// The store, read-only (nil until the daemon made it), one read at a time (so that
    /// ``closeStore()`` waits for a read in progress).
    func withStore<T: Sendable>(_ body: (Database) throws -> T) -> T? {
        let path = container.appendingPathComponent("store.sqlite").path
        return store.withLock { queue -> T? in
            if queue == nil, FileManager.default.fileExists(atPath: path) {
                queue = Self.openReadOnly(path)
            }
            return try? queue?.read(body)
        }
    }

    static func openReadOnly(_ path: String) -> DatabaseQueue? {
        var configuration = GRDB.Configuration()
        configuration.readonly = true
        configuration.busyMode = .timeout(2)
        return try? DatabaseQueue(path: path, configuration: configuration)
    }

    /// The machine id, numbering and rejected log of a store file no daemon uses (a backup).
    static func state(ofStoreAt path: String) -> SyncHistory.Machine? {
        try? openReadOnly(path)?.read(state(of:))
    }

    /// Its store's machine id now (nil: none yet, or unreadable).
    func currentID() -> UUID? {
        withStore { database in
            try String.fetchOne(database, sql: "SELECT value FROM skyros_metadata WHERE key = 'syncMachine'")
                .flatMap(UUID.init(uuidString:))
        } ?? nil
    }

    func checkpoint() -> String? {
        withStore { database in
            try String.fetchOne(database, sql: "SELECT value FROM skyros_metadata WHERE key = 'syncCheckpoint'")
        } ?? nil
    }

    /// `skyros status --json`'s `sync` object (the tool is built next to skyrosd), for reports.
    func status() -> String {
        let tool = URL(fileURLWithPath: skyrosd).deletingLastPathComponent().appendingPathComponent("skyros").path
        guard
            let result = try? PostgresServer.run(
                [tool, "status", "--group", "g", "--groups-dir", groups, "--json"],
                environment: ProcessInfo.processInfo.environment,
                outputDirectory: groups, timeout: .seconds(10)),
            let object = try? JSONSerialization.jsonObject(with: Data(result.output.utf8)) as? [String: Any],
            let sync = object["sync"]
        else { return "?" }
        return "\(sync)"
    }

    /// Its `User` objects as its daemon's store file holds them (nil: unreadable).
    func rows() -> SyncHistory.Rows? {
        withStore { database in
            var rows: SyncHistory.Rows = [:]
            // Version 2 of the schema names `lastname` `surname` (``renamedTestSchema``).
            let columns = try String.fetchAll(database, sql: #"SELECT name FROM pragma_table_info('User')"#)
            let lastname = columns.contains("surname") ? "surname" : "lastname"
            for row in try Row.fetchAll(
                database, sql: #"SELECT "_id", handle, firstname, \#(lastname) AS lastname FROM "User""#)
            {
                let data: Data = row["_id"]
                guard data.count == 16 else { continue }
                let id = UUID(uuid: data.withUnsafeBytes { $0.loadUnaligned(as: uuid_t.self) })
                let handle: String = row["handle"] ?? ""
                let firstname: String = row["firstname"] ?? ""
                let lastname: String = row["lastname"] ?? ""
                rows[id] = "\(handle)|\(firstname)|\(lastname)"
            }
            return rows
        }
    }

    func queued() -> Int? {
        withStore { database in try Int.fetchOne(database, sql: "SELECT count(*) FROM skyros_sync_queue") ?? 0 }
    }

    /// Its machine id, queue, numbering, rejected log and checkpoint (not its rows).
    func finalState() -> SyncHistory.Machine {
        withStore(Self.state(of:))
            ?? SyncHistory.Machine(id: nil, rows: [:], queued: -1, lastNumber: 0, rejected: [], checkpoint: nil)
    }

    /// A store's machine id, queue, numbering, rejected log and checkpoint (not its rows).
    static func state(of database: Database) throws -> SyncHistory.Machine {
        let id = try String.fetchOne(database, sql: "SELECT value FROM skyros_metadata WHERE key = 'syncMachine'")
            .flatMap(UUID.init(uuidString:))
        let queued = try Int.fetchOne(database, sql: "SELECT count(*) FROM skyros_sync_queue") ?? 0
        let last =
            try Int64.fetchOne(database, sql: "SELECT seq FROM sqlite_sequence WHERE name = 'skyros_sync_queue'")
            ?? 0
        var rejected: [(number: Int64, reason: String, objects: Set<UUID>)] = []
        for row in try Row.fetchAll(database, sql: "SELECT number, reason, objects FROM skyros_sync_rejected") {
            // `objects`: the change set's objects, `Entity/UUID` separated by spaces.
            let text: String = row["objects"] ?? ""
            let objects = Set(
                text.split(separator: " ").compactMap {
                    UUID(uuidString: String($0.split(separator: "/").last ?? ""))
                })
            rejected.append((row["number"], row["reason"], objects))
        }
        let checkpoint = try String.fetchOne(
            database, sql: "SELECT value FROM skyros_metadata WHERE key = 'syncCheckpoint'")
        return SyncHistory.Machine(
            id: id, rows: [:], queued: queued, lastNumber: last, rejected: rejected, checkpoint: checkpoint)
    }
}

/// A small volume for the group's tables: a tmpfs mounted in the campaign's directory, made
/// a tablespace holding every table and index of the campaign's database; `fill()` writes a
/// ballast file until the volume is full, `free()` removes it. Needs root (mount).
private final class CampaignDisk: Sendable {
    let mountPoint: String
    var ballast: String { mountPoint + "/ballast" }

    init(directory: String, postgres: PostgresServer, database: String) throws {
        guard geteuid() == 0 else { throw PostgresServerError.failed("a full disk needs root (mount -t tmpfs)") }
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        guard mount("tmpfs", directory, "tmpfs", 0, "size=64m,mode=0700") == 0 else {
            throw PostgresServerError.failed("mount -t tmpfs: \(String(cString: strerror(errno)))")
        }
        mountPoint = directory
        SyncFaultCampaign.running.withLock { _ = $0.mounts.insert(directory) }
        if geteuid() == 0 { chown(directory, PostgresServer.unprivilegedID, PostgresServer.unprivilegedID) }
        let space = directory + "/pg"
        mkdir(space, 0o700)
        if geteuid() == 0 { chown(space, PostgresServer.unprivilegedID, PostgresServer.unprivilegedID) }
        try postgres.psql(
            """
            CREATE TABLESPACE campaign_space LOCATION '\(space)';
            """, database: database)
        try postgres.psql(
            """
            ALTER TABLE ALL IN TABLESPACE pg_default SET TABLESPACE campaign_space;
            ALTER INDEX ALL IN TABLESPACE pg_default SET TABLESPACE campaign_space;
            """, database: database)
    }

    deinit { remove() }

    /// Writes the ballast until the volume has no space left.
    func fill() {
        let descriptor = open(ballast, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o600)
        guard descriptor >= 0 else { return }
        defer { close(descriptor) }
        let chunk = [UInt8](repeating: 0xAB, count: 1 << 20)
        while chunk.withUnsafeBytes({ write(descriptor, $0.baseAddress, $0.count) }) > 0 {}
    }

    func free() { unlink(ballast) }

    /// Unmounts the volume (once PostgreSQL has stopped).
    func remove() {
        free()
        umount2(mountPoint, Int32(MNT_DETACH))
        SyncFaultCampaign.running.withLock { _ = $0.mounts.remove(mountPoint) }
    }
}

/// Where the campaign's writers and fault injector run: threads of their own (a concurrent
/// dispatch queue), not Swift's cooperative pool, which has as many threads as cores. Inside
/// the whole test suite, other tests' blocking waits hold those threads, and the writers,
/// which resume after every save, read and pause, were starved: a CI run's 20 s campaign made
/// 129 operations (95 saves acknowledged, none timed out) in 103 s, where it makes about 1,800
/// alone.
final class CampaignExecutor: TaskExecutor {
    static let shared = CampaignExecutor()
    private let queue = DispatchQueue(label: "campaign.tasks", attributes: .concurrent)

    func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        queue.async { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}

/// Where the writers of one machine wait between operations while it is closed (an operator
/// stopping a machine's apps for a restore): ``close(timeout:)`` returns once none is in an
/// operation.
final class WriterGate: Sendable {
    private struct State {
        var closed = false
        /// Writers in an operation.
        var busy = 0
        var waiting: [CheckedContinuation<Void, Never>] = []
        /// Signaled when the last busy writer leaves a closed gate.
        var idle: DispatchSemaphore?
    }

    private let state = Mutex(State())

    /// Waits while the gate is closed, then counts the writer in an operation.
    func enter() async {
        await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
            let proceed = state.withLock { state -> Bool in
                guard !state.closed else {
                    state.waiting.append(continuation)
                    return false
                }
                state.busy += 1
                return true
            }
            if proceed { continuation.resume() }
        }
    }

    /// The writer's operation is over.
    func leave() {
        let idle = state.withLock { state -> DispatchSemaphore? in
            state.busy -= 1
            guard state.busy == 0, let idle = state.idle else { return nil }
            state.idle = nil
            return idle
        }
        idle?.signal()
    }

    /// Closes the gate and waits (blocking) until no writer is in an operation; false when
    /// some still were after `timeout` (the gate stays closed: ``open()`` it).
    func close(timeout: Duration) -> Bool {
        let semaphore = DispatchSemaphore(value: 0)
        let idle = state.withLock { state -> Bool in
            state.closed = true
            guard state.busy > 0 else { return true }
            state.idle = semaphore
            return false
        }
        if idle { return true }
        let seconds = Double(timeout.components.seconds) + Double(timeout.components.attoseconds) / 1e18
        return semaphore.wait(timeout: .now() + seconds) == .success
    }

    /// Opens the gate: the waiting writers go on.
    func open() {
        let waiting = state.withLock { state -> [CheckedContinuation<Void, Never>] in
            state.closed = false
            state.idle = nil
            state.busy += state.waiting.count
            defer { state.waiting = [] }
            return state.waiting
        }
        for continuation in waiting { continuation.resume() }
    }
}

/// A datagram socket standing in for systemd's notification socket.
private final class NotifyListener: Sendable {
    let path: String
    private let descriptor: Int32

    init() throws {
        path = "/tmp/skfn-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).sock"
        descriptor = socket(AF_UNIX, Int32(SOCK_DGRAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0, withUnixSocketAddress(path, { bind(descriptor, $0, $1) }) == 0 else {
            throw PostgresServerError.failed("cannot bind \(path)")
        }
    }

    deinit {
        close(descriptor)
        unlink(path)
    }

    func wait(for state: String, seconds: Double) -> Bool {
        let deadline = ContinuousClock.now + .seconds(seconds)
        var buffer = [UInt8](repeating: 0, count: 4096)
        while ContinuousClock.now < deadline {
            var entry = pollfd(fd: descriptor, events: Int16(POLLIN), revents: 0)
            guard poll(&entry, 1, 100) >= 0 else { return false }
            guard entry.revents != 0 else { continue }
            let count = recv(descriptor, &buffer, buffer.count, 0)
            if count > 0,
                String(decoding: buffer[0..<count], as: UTF8.self).split(separator: "\n").contains(Substring(state))
            {
                return true
            }
        }
        return false
    }
}
