import Foundation
import GRDB
import Skyros
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
    /// The kinds of fault, each injected ``Configuration/faultsPerKind`` times.
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
    }

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
        /// Faults injected, by kind.
        public var faults: [FaultKind: Int]
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

        /// Whether the checker passed, every machine converged within 10 s, and every kind of
        /// fault was injected at least as often as planned.
        public var passed: Bool {
            verdict.passed && (convergenceSeconds ?? .infinity) <= 10 && unavailable.isEmpty
                && FaultKind.allCases.allSatisfy { (faults[$0] ?? 0) >= configuration.perKind }
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
            let injected: [String] = FaultKind.allCases.map { kind in "\(kind.rawValue) \(faults[kind] ?? 0)" }
            let totalFaults: Int = faults.values.reduce(0, +)
            let refused: Int = history.uploads.filter { $0.rejected != nil }.count
            let converged: String = convergenceSeconds.map { String(format: "%.2f s", $0) } ?? "not within 60 s"
            var lines: [String] = []
            lines.append(
                "sync fault campaign: seed \(configuration.seed), \(Int(configuration.duration)) s, \(configuration.machines) machines × \(configuration.writersPerMachine) writers, \(configuration.rate > 0 ? "\(String(format: "%g", configuration.rate)) operations per second each" : "unpaced")"
            )
            lines.append("operations: \(operations.count) (\(kinds.joined(separator: ", "))), \(reads) values read")
            lines.append("saves: \(acknowledged) acknowledged, \(saves.count - acknowledged) failed (outcome unknown)")
            lines.append(
                "faults: \(injected.joined(separator: ", ")) (\(totalFaults) in all; \(resets) connections reset by the proxies\(killedStops > 0 ? "; \(killedStops) PostgreSQL stops did not end within 30 s and the server was killed" : ""))"
            )
            lines.append("change sets refused by the server: \(refused) of \(history.uploads.count)")
            lines.append("convergence after the quiet period: \(converged)")
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
    let shared: [UUID]
    let disk: CampaignDisk?
    let diskUnavailable: String?
    let started = ContinuousClock.now
    private let state = Mutex(State())

    struct State {
        var stopping = false
        var faults: [SyncFaultCampaign.FaultKind: Int] = [:]
        var serverOperations: [SyncHistory.Operation] = []
        var psqlCount = 0
        /// PostgreSQL stops that did not end within 30 s, whose server was killed.
        var killedStops = 0
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
            let postgres = try PostgresServer()
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
                    handle text, firstname text, lastname text);
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
                CREATE TRIGGER campaign_audit AFTER INSERT OR UPDATE OR DELETE ON \(schemaName)."User"
                    FOR EACH ROW EXECUTE FUNCTION public.campaign_audit();
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
            do {
                disk = try CampaignDisk(directory: directory + "/space", postgres: postgres, database: database)
                diskUnavailable = nil
            } catch {
                disk = nil
                diskUnavailable = "\(error)"
            }
            var machines: [CampaignMachine] = []
            for index in 0..<configuration.machines {
                let proxy = try FaultProxy(upstreamPort: postgres.port)
                let url = "postgresql://postgres@127.0.0.1:\(proxy.port)/\(database)?sslmode=disable"
                let machine = try CampaignMachine(
                    index: index, directory: directory + "/m\(index)", skyrosd: configuration.skyrosd,
                    arguments: ["--sync", url, "--sync-schema", schemaName], proxy: proxy)
                machines.append(machine)
            }
            self.machines = machines
        } catch {
            // What was started stops with its owner (the machines' daemons, the server, the volume).
            try? FileManager.default.removeItem(atPath: directory)
            SyncFaultCampaign.running.withLock { [directory] in _ = $0.directories.remove(directory) }
            throw error
        }
    }

    deinit {
        for machine in machines { machine.stop() }
        try? postgres.stop(mode: .immediate)
        disk?.remove()
        if let keep = ProcessInfo.processInfo.environment["SKYROS_CAMPAIGN_KEEP_LOGS"] {
            // The daemons' logs, for a post-mortem.
            for machine in machines {
                try? FileManager.default.copyItem(
                    atPath: machine.logFile, toPath: keep + "/skyrosd-\(machine.index).log")
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

    func counted(_ kind: SyncFaultCampaign.FaultKind) { state.withLock { $0.faults[kind, default: 0] += 1 } }

    func run() async throws -> SyncFaultCampaign.Report {
        // Every machine has the shared objects before the faults start.
        let stacks = try machines.map { machine in
            try (0..<configuration.writersPerMachine).map { _ in
                try Skyros(sharedStack: testSchema, container: machine.container, timeout: 3, savesOnStop: false)
            }
        }
        for (index, machine) in machines.enumerated() {
            let ready = await poll(seconds: 60) {
                try await stacks[index][0].read { context in try User.all(in: context).count } >= self.shared.count
            }
            guard ready else {
                throw PostgresServerError.timedOut(
                    "machine \(index) has not synced the shared objects in 60 s: \(machine.logTail())")
            }
        }
        say("\(machines.count) machines synced; writers and faults start")
        let plan = planFaults()
        let writers = (0..<machines.count * configuration.writersPerMachine).map { client in
            Task {
                await self.write(
                    client: client, machine: client / configuration.writersPerMachine,
                    stack: stacks[client / configuration.writersPerMachine][client % configuration.writersPerMachine])
            }
        }
        let faults = Task { await self.inject(plan) }
        try? await Task.sleep(for: .seconds(configuration.duration))
        state.withLock { $0.stopping = true }
        var history = SyncHistory()
        for writer in writers { history.operations += await writer.value }
        await faults.value
        // Everything heals.
        for machine in machines { machine.proxy.healAll() }
        disk?.free()
        try? postgres.start()
        for machine in machines where !machine.isRunning { try? machine.start() }
        say("healed; quiet for 3 s")
        try? await Task.sleep(for: .seconds(3))
        let quietEnded = now
        var convergence: Double?
        var notes: [String] = []
        if await poll(seconds: 10, { try await self.converged(stacks) }) {
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
                let rows = (try? await rows(of: stacks[index][0])) ?? [:]
                let different = Set(server.keys).union(rows.keys).filter { server[$0] != rows[$0] }.count
                notes.append(
                    "machine \(index) at \(String(format: "%.1f", now - quietEnded)) s: \(machine.queued().map(String.init) ?? "?") queued, \(different) objects differ, checkpoint \(machine.checkpoint() ?? "?"), running \(machine.isRunning), sync \(machine.status()); its log ends:\n"
                        + machine.logTail().split(separator: "\n").suffix(12).joined(separator: "\n"))
            }
            if await poll(seconds: 50, { try await self.converged(stacks) }) { convergence = now - quietEnded }
        }
        say("convergence: \(convergence.map { String(format: "%.2f s", $0) } ?? "none in 60 s")")
        for note in notes { say(note) }

        history.operations += state.withLock { $0.serverOperations }
        history.initialTokens = Set((0..<shared.count).flatMap { ["init-\($0)-f", "init-\($0)-l"] })
        history.audit = try auditRows()
        history.serverRows = try serverRows()
        history.uploads = try uploads()
        for (index, machine) in machines.enumerated() {
            var state = machine.finalState()
            state.rows = (try? await rows(of: stacks[index][0])) ?? [:]
            history.machines.append(state)
        }
        let verdict = history.check()
        let faultCounts = state.withLock { $0.faults }
        var unavailable: [SyncFaultCampaign.FaultKind: String] = [:]
        if let diskUnavailable { unavailable[.diskFull] = diskUnavailable }
        return SyncFaultCampaign.Report(
            configuration: configuration, history: history, verdict: verdict, faults: faultCounts,
            unavailable: unavailable,
            convergenceSeconds: convergence, convergenceNotes: notes,
            resets: machines.reduce(0) { $0 + $1.proxy.statistics.resets },
            killedStops: state.withLock { $0.killedStops })
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

    /// Every machine's queue empty and its store equal to the server's table.
    func converged(_ stacks: [[Skyros]]) async throws -> Bool {
        let server = try serverRows()
        for (index, machine) in machines.enumerated() {
            guard machine.queued() == 0, try await rows(of: stacks[index][0]) == server else { return false }
        }
        return true
    }

    // MARK: Writers

    /// One writer's loop until the campaign stops: inserts (some with a handle another writer
    /// may take too), updates of the shared objects, deletes of what it inserted, reads.
    func write(client: Int, machine: Int, stack: Skyros) async -> [SyncHistory.Operation] {
        var generator = SeededGenerator(seed: configuration.seed &+ 0x1000 &+ UInt64(client))
        var operations: [SyncHistory.Operation] = []
        var mine: [UUID] = []
        var count = 0
        while !stopping {
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
                        ? "dup-\(Int.random(in: 0..<20, using: &generator))" : "h-\(token)"
                    operation.kind = .insert
                    operation.property = "handle"
                    operation.value = handle
                    let id = try await stack.write { context in
                        let user = User.create(in: context)
                        user.handle = handle
                        user.firstname = token
                        return user.objectID.uuid
                    }
                    operation.object = id
                    mine.append(id)
                case 15..<25 where !mine.isEmpty:
                    let id = mine.remove(at: Int.random(in: 0..<mine.count, using: &generator))
                    operation.kind = .delete
                    operation.object = id
                    try await stack.write { context in
                        guard let user = context.object(with: ObjectID(entityName: "User", uuid: id), as: User.self)
                        else { return }
                        user.delete(in: context)
                    }
                case 25..<80:
                    let id = shared[Int.random(in: 0..<shared.count, using: &generator)]
                    let property = Bool.random(using: &generator) ? "firstname" : "lastname"
                    operation.kind = .update
                    operation.object = id
                    operation.property = property
                    operation.value = token
                    try await stack.write { context in
                        guard let user = context.object(with: ObjectID(entityName: "User", uuid: id), as: User.self)
                        else { return }
                        if property == "firstname" { user.firstname = token } else { user.lastname = token }
                    }
                default:
                    break
                }
                operation.acknowledged = operation.kind != .read
            } catch {
                operation.error = "\(error)"
            }
            operation.end = now
            operation.reads = await read(machine: machine, stack: stack)
            operations.append(operation)
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

    /// The shared objects' values as `stack` reads them, with the machine's checkpoint.
    func read(machine: Int, stack: Skyros) async -> [SyncHistory.Read] {
        let checkpoint = machines[machine].checkpoint()
        let shared = self.shared
        let values = try? await stack.read { context in
            shared.map { id -> (UUID, String?, String?) in
                let user = context.object(with: ObjectID(entityName: "User", uuid: id), as: User.self)
                return (id, user?.firstname, user?.lastname)
            }
        }
        return (values ?? []).flatMap { id, firstname, lastname in
            [
                SyncHistory.Read(object: id, property: "firstname", value: firstname, checkpoint: checkpoint),
                SyncHistory.Read(object: id, property: "lastname", value: lastname, checkpoint: checkpoint),
            ]
        }
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
        for kind in SyncFaultCampaign.FaultKind.allCases {
            for _ in 0..<configuration.perKind {
                var length: Double
                switch kind {
                case .cut, .blackHole, .slow: length = Double.random(in: 0...longest, using: &generator)
                case .diskFull: length = Double.random(in: 0...(longest / 2), using: &generator)
                case .daemonKill, .postgresFast, .postgresImmediate:
                    length = Double.random(in: 0...1, using: &generator)
                case .psqlWrite: length = 0
                }
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
    /// a daemon's start, PostgreSQL's stop); the server's restarts one at a time.
    func inject(_ plan: [PlannedFault]) async {
        let group = DispatchGroup()
        let serverQueue = DispatchQueue(label: "campaign.server")
        let diskQueue = DispatchQueue(label: "campaign.disk")
        let psqlQueue = DispatchQueue(label: "campaign.psql")
        let machineQueues = machines.map { DispatchQueue(label: "campaign.machine\($0.index)") }
        for fault in plan {
            let wait = fault.at - now
            if wait > 0 { try? await Task.sleep(for: .seconds(wait)) }
            let queue: DispatchQueue
            switch fault.kind {
            case .postgresFast, .postgresImmediate: queue = serverQueue
            case .diskFull: queue = diskQueue
            case .psqlWrite: queue = psqlQueue
            case .daemonKill: queue = machineQueues[fault.machines[0]]
            case .cut, .blackHole, .slow: queue = .global()
            }
            queue.async(group: group) { self.perform(fault) }
        }
        await withCheckedContinuation { continuation in
            group.notify(queue: .global()) { continuation.resume() }
        }
    }

    func perform(_ fault: PlannedFault) {
        let length = UInt32(fault.length * 1_000_000)
        switch fault.kind {
        case .cut, .blackHole, .slow:
            let kind: FaultProxy.FaultKind =
                fault.kind == .cut ? .cut : fault.kind == .blackHole ? .blackHole : .slow(.milliseconds(200))
            let injected = fault.machines.map { machines[$0].proxy.inject(kind, fault.direction) }
            counted(fault.kind)
            say(
                "\(fault.kind.rawValue) \(fault.direction.rawValue) machines \(fault.machines) for \(String(format: "%.1f", fault.length)) s"
            )
            usleep(length)
            for (machine, injected) in zip(fault.machines, injected) { machines[machine].proxy.heal(injected) }
        case .daemonKill:
            let machine = machines[fault.machines[0]]
            machine.kill()
            counted(.daemonKill)
            say("daemon of machine \(machine.index) killed, down for \(String(format: "%.1f", fault.length)) s")
            usleep(length)
            do { try machine.start() } catch {
                say("machine \(machine.index) did not restart: \(error); again")
                try? machine.start()
            }
        case .postgresFast, .postgresImmediate:
            do {
                try postgres.stop(mode: fault.kind == .postgresFast ? .fast : .immediate)
                counted(fault.kind)
                say(
                    "PostgreSQL stopped (\(fault.kind == .postgresFast ? "fast" : "immediate")) for \(String(format: "%.1f", fault.length)) s"
                )
            } catch {
                // A fast stop whose shutdown checkpoint cannot write (the tablespace full) may
                // not end within 30 s: the server is then killed, and was stopped all the same.
                if !postgres.isRunning {
                    counted(fault.kind)
                    state.withLock { $0.killedStops += 1 }
                }
                say("PostgreSQL did not stop: \(error)")
            }
            usleep(length)
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
        case .diskFull:
            guard let disk else { return }
            disk.fill()
            counted(.diskFull)
            say("disk full for \(String(format: "%.1f", fault.length)) s")
            usleep(length)
            disk.free()
        case .psqlWrite:
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
            do {
                try postgres.psql(
                    #"UPDATE \#(schemaName)."User" SET \#(property) = '\#(token)' WHERE "_id" = '\#(id)'"#,
                    database: database, timeout: .seconds(10))
                operation.acknowledged = true
            } catch {
                operation.error = "\(error)"
            }
            operation.end = now
            counted(.psqlWrite)
            state.withLock { $0.serverOperations.append(operation) }
        }
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
            "SELECT seq, op, id, coalesce(handle, ''), coalesce(firstname, ''), coalesce(lastname, '') FROM public.campaign_audit ORDER BY seq"
        )
        .compactMap { row in
            guard row.count == 6, let sequence = Int64(row[0]), let operation = row[1].first,
                let id = UUID(uuidString: row[2])
            else { return nil }
            return SyncHistory.AuditRow(
                sequence: sequence, operation: operation, object: id, handle: row[3], firstname: row[4],
                lastname: row[5])
        }
    }

    func uploads() throws -> [SyncHistory.Upload] {
        try query("SELECT machine, number, coalesce(rejected, E'\\x01') FROM \(schemaName)._skyros_uploads").compactMap
        { row in
            guard row.count == 3, let machine = UUID(uuidString: row[0]), let number = Int64(row[1]) else { return nil }
            return SyncHistory.Upload(machine: machine, number: number, rejected: row[2] == "\u{1}" ? nil : row[2])
        }
    }

    func rows(of stack: Skyros) async throws -> SyncHistory.Rows {
        try await stack.read { context in
            var rows: SyncHistory.Rows = [:]
            for user in try User.all(in: context) {
                rows[user.objectID.uuid] = "\(user.handle)|\(user.firstname)|\(user.lastname)"
            }
            return rows
        }
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
    let proxy: FaultProxy
    private let process = Mutex<pid_t?>(nil)
    private let store = Mutex<DatabaseQueue?>(nil)

    init(index: Int, directory: String, skyrosd: String, arguments: [String], proxy: FaultProxy) throws {
        self.index = index
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

    /// Starts the daemon and returns once it told systemd's protocol it is ready (20 s at most).
    func start() throws {
        try process.withLock { pid in
            guard pid == nil else { return }
            let notify = try NotifyListener()
            let log = open(logFile, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
            let null = open("/dev/null", O_RDONLY | O_CLOEXEC)
            defer {
                close(log)
                close(null)
            }
            var environment = ProcessInfo.processInfo.environment
            environment["NOTIFY_SOCKET"] = notify.path
            let child = try PostgresServer.spawn(
                [skyrosd, "--group", "g", "--groups-dir", groups] + arguments, environment: environment, stdin: null,
                stdout: log, stderr: log)
            guard notify.wait(for: "READY=1", seconds: 20) else {
                PostgresServer.killTree(child)
                throw PostgresServerError.timedOut("skyrosd of machine \(index) was not ready in 20 s: \(logTail())")
            }
            pid = child
            SyncFaultCampaign.running.withLock { _ = $0.pids.insert(child) }
        }
    }

    /// SIGKILL, reaped.
    func kill() {
        process.withLock { pid in
            guard let child = pid else { return }
            Glibc.kill(child, SIGKILL)
            _ = PostgresServer.waitForExit(child, timeout: .seconds(10))
            SyncFaultCampaign.running.withLock { _ = $0.pids.remove(child) }
            pid = nil
        }
    }

    func stop() {
        kill()
        proxy.stop()
        store.withLock { $0 = nil }
    }

    func logTail() -> String { PostgresServer.logTail(logFile, from: 0) }

    /// The store, read-only (nil until the daemon made it).
    func withStore<T>(_ body: (Database) throws -> T) -> T? {
        let path = container.appendingPathComponent("store.sqlite").path
        let queue = store.withLock { queue -> DatabaseQueue? in
            if queue == nil, FileManager.default.fileExists(atPath: path) {
                var configuration = GRDB.Configuration()
                configuration.readonly = true
                configuration.busyMode = .timeout(2)
                queue = try? DatabaseQueue(path: path, configuration: configuration)
            }
            return queue
        }
        return try? queue?.read(body)
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

    func queued() -> Int? {
        withStore { database in try Int.fetchOne(database, sql: "SELECT count(*) FROM skyros_sync_queue") ?? 0 }
    }

    /// Its machine id, queue, numbering, rejected log and checkpoint (not its rows).
    func finalState() -> SyncHistory.Machine {
        withStore { database in
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
        } ?? SyncHistory.Machine(id: nil, rows: [:], queued: -1, lastNumber: 0, rejected: [], checkpoint: nil)
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
