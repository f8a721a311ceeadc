import Foundation
import Logging
import NIOCore
import NIOPosix
import PostgresNIO
import Skyros
import SkyrosGateway
import SkyrosSync
import SkyrosTestSupport
import Synchronization

/// `skyros-bench fleet` (issue 60): machines through a sync gateway, at N connected machines.
/// Each simulated machine is a real WebSocket+TLS client of a real `skyros-gateway` process, with
/// its own token (`sub` m<i>) and bucket (the `Item`s named m<i>); a bucket every machine holds
/// (`Account`) gives the fan-out to all. The direct mode's figures are measured beside, for the
/// N it reaches (each of its machines holds two server connections).
struct FleetBenchmark {
    let directory: URL
    /// The numbers of connected machines.
    let counts: [Int]
    /// Writes timed per N.
    let samples: Int
    /// Rows of the initial sync.
    let rows: Int
    /// The rows to run (`--only latency|uploads|initial`); empty: all.
    var only: Set<String> = []

    static let schema = SyncBenchmark.schema
    static let rules = """
        buckets:
          own:
            parameters:
              who: token.sub
            entities:
              Item: name = bucket.who
          everyone:
            entities:
              Account: true
        """

    func run(report: (Row) -> Void) throws {
        let gatewayPath = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
            .appendingPathComponent("skyros-gateway").path
        guard FileManager.default.isExecutableFile(atPath: gatewayPath) else {
            throw BenchError(
                "skyros-bench fleet runs the gateway at \(gatewayPath): build it first (swift build -c release --product skyros-gateway)"
            )
        }
        // Room for the direct mode's 100 uploading machines (one connection each) beside the
        // gateway's: the default 100 would refuse the comparison itself.
        let postgres = try PostgresServer(settings: ["max_connections": "300"])
        defer { try? postgres.stop(mode: .fast) }
        note("PostgreSQL \(postgres.binDirectory) on port \(postgres.port)")
        let database = try ServerDatabase(postgres, prefix: "fleet")
        try syncAwait { [configuration = database.configuration] in
            try await SyncSetup.run(configuration, schema: benchSchema, log: { _ in })
        }
        let certificates = try TestCertificates()
        let secret = Data((0..<32).map { _ in UInt8.random(in: 0...255) })
        let rulesPath = directory.appendingPathComponent("sync-rules.yaml").path
        let secretPath = directory.appendingPathComponent("secret").path
        try Self.rules.write(toFile: rulesPath, atomically: true, encoding: .utf8)
        _ = FileManager.default.createFile(atPath: secretPath, contents: secret, attributes: [.posixPermissions: 0o600])
        let gateway = try GatewayProcess(
            path: gatewayPath,
            arguments: [
                "--group", "bench",
                "--database",
                "postgresql://\(postgres.superuser)@\(postgres.host):\(postgres.port)/\(database.name)?sslmode=disable&schema=\(Self.schema)",
                "--rules", rulesPath, "--secret-file", secretPath, "--listen", "127.0.0.1:0",
                "--tls-cert", certificates.serverCertificate, "--tls-key", certificates.serverKey,
            ])
        defer { gateway.stop() }
        let endpoint = GatewayEndpoint(
            host: "127.0.0.1", port: gateway.port, group: "bench", rootCertificate: certificates.authority)
        let largest = counts.max() ?? 10
        note("gateway pid \(gateway.pid) on port \(gateway.port); \(largest) machines at most")
        let tokens = try syncAwait {
            var tokens: [String] = []
            for index in 0..<largest {
                tokens.append(
                    try await SyncToken.mint(
                        SyncTokenClaims(subject: "m\(index)", expiration: Date().addingTimeInterval(86_400)),
                        secret: secret))
            }
            return tokens
        }
        let serverSchema = ServerSchema(benchSchema, name: Self.schema)

        if only.isEmpty || only.contains("latency") {
            // A first round the figures leave out: the gateway's one-time allocations (its
            // pools, TLS, the first feed) are not counted per machine.
            try syncAwait {
                try await SimulatedFleet.connect(count: 10, tokens: tokens, endpoint: endpoint, schema: serverSchema)
            }.stop()
            usleep(500_000)
            var atTen: Latency?
            // Smallest first: the baseline (the smallest N) meets the smallest server (fewer rows,
            // a shorter log); each larger N is charged for what the runs before it left.
            for count in counts.sorted() {
                let latency = try measureLatency(
                    count: count, tokens: tokens, endpoint: endpoint, schema: serverSchema, database: database,
                    gateway: gateway, postgres: postgres)
                if count == counts.min() { atTen = latency }
                reportLatency(latency, count: count, base: atTen ?? latency, report: report)
            }
            let direct = try measureDirect(
                count: min(10, counts.min() ?? 10), schema: serverSchema, database: database, postgres: postgres)
            report(
                Row(
                    name:
                        "fleet: direct mode, \(direct.count) machines: a write in one machine's rows → it, p50 (baseline: the same through the gateway at \(direct.count))",
                    unit: "us", skyros: direct.p50,
                    baseline: atTen.map { percentile($0.samples + Array(repeating: .infinity, count: $0.timeouts), 50) }
                        ?? 0))
            report(
                Row(
                    name:
                        "fleet: direct mode, \(direct.count) machines: PostgreSQL CPU per change (baseline: through the gateway)",
                    unit: "us", skyros: direct.cpuPerChange, baseline: atTen?.cpuPerChange ?? 0))
        }
        if only.isEmpty || only.contains("uploads") {
            let machines = 100
            let sets = samples >= 100 ? 1_000 : 100
            let through = try measureUploads(
                machines: machines, sets: sets, tokens: tokens, endpoint: endpoint, schema: serverSchema,
                database: database, viaGateway: true)
            let direct = try measureUploads(
                machines: machines, sets: sets, tokens: tokens, endpoint: endpoint, schema: serverSchema,
                database: database, viaGateway: false)
            report(
                Row(
                    name:
                        "fleet: uploads, \(machines) machines × \(sets) change sets, through the gateway (baseline: direct mode; goal ≥ 0.8×)",
                    unit: "sets/s", skyros: through, baseline: direct))
        }
        if only.isEmpty || only.contains("initial") {
            try initialSync(endpoint: endpoint, secret: secret, database: database, report: report)
        }
    }

    // MARK: - Latency, fan-out, memory, connections

    struct Latency {
        var count = 0
        var samples: [Double] = []  // µs
        var timeouts = 0
        var cpuPerChange = 0.0  // µs
        var everyone: [Double] = []  // µs, every machine's arrival of rows every machine holds
        var everyoneTimeouts = 0
        var memoryPerMachineKB = 0.0
        var serverConnections = 0
        var connectSeconds = 0.0
    }

    private func measureLatency(
        count: Int, tokens: [String], endpoint: GatewayEndpoint, schema: ServerSchema, database: ServerDatabase,
        gateway: GatewayProcess, postgres: PostgresServer
    ) throws -> Latency {
        var result = Latency()
        result.count = count
        let before = gateway.residentKB()
        let started = Clock.now()
        let fleet = try syncAwait {
            try await SimulatedFleet.connect(count: count, tokens: tokens, endpoint: endpoint, schema: schema)
        }
        defer { fleet.stop() }
        result.connectSeconds = Double(Clock.now() - started) / 1e9
        // Settled: every machine past its first read through the gateway's chain (a machine
        // that joins it may make the gateway read once; a connection storm's reads are not
        // charged to the changes measured), and the gateway's heap after it.
        guard fleet.waitUntilFollowing(count, timeout: 120) else {
            throw BenchError("\(count) machines did not all follow the gateway's changes within 120 s")
        }
        usleep(500_000)
        result.memoryPerMachineKB = max(0, gateway.residentKB() - before) / Double(count)
        result.serverConnections = try database.gatewayConnections()
        note(
            "fleet: \(count) machines connected in \(String(format: "%.1f", result.connectSeconds)) s, gateway +\(Int(result.memoryPerMachineKB)) KB each, \(result.serverConnections) server connections"
        )
        let connection = try syncAwait { try await database.connect() }
        defer { try? syncAwait { try await connection.close() } }
        // A write in one machine's bucket, each sample another machine's. (The server's CPU is
        // counted in ticks of 10 ms: at least 200 writes; 20 from 5,000 machines on, each write
        // there taking seconds.)
        let writes = count >= 5_000 ? 20 : max(200, samples)
        let timed = try timedWrites(
            writes, on: count, fleet: fleet, markers: 1_000_000, connection: connection, database: database,
            postgres: postgres)
        result.samples = timed.samples
        result.timeouts = timed.timeouts
        result.cpuPerChange = timed.cpuPerChange

        // Rows every machine holds.
        for sample in 0..<5 {
            let marker = 2_000_000 + sample
            let start = Clock.now()
            fleet.expect(marker, machines: Set(0..<count))
            try syncAwait {
                _ = try await connection.query(
                    "INSERT INTO \(unescaped: Self.schema).\"Account\" (handle) VALUES (\("everyone-\(count)-\(sample)"))",
                    logger: database.logger
                ).collect()
            }
            let arrived = fleet.wait(marker, timeout: 30) ?? fleet.arrivals(marker)
            result.everyone += arrived.values.map { Double($0) / 1e3 - Double(start) / 1e3 }
            result.everyoneTimeouts += count - arrived.count
        }
        return result
    }

    private func reportLatency(_ latency: Latency, count: Int, base: Latency, report: (Row) -> Void) {
        let samples = latency.samples + Array(repeating: .infinity, count: latency.timeouts)
        let goals = count >= 10_000 ? "≤ 20 ms / 100 ms" : count >= 1_000 ? "≤ 10 ms / 50 ms" : "—"
        report(
            Row(
                name:
                    "fleet \(count): a write in one machine's bucket → that machine, p50 (baseline: at \(base.count); goal \(goals))",
                unit: "us", skyros: percentile(samples, 50),
                baseline: percentile(base.samples + Array(repeating: .infinity, count: base.timeouts), 50)))
        report(
            Row(
                name:
                    "fleet \(count): a write in one machine's bucket → that machine, p99 (baseline: at \(base.count))",
                unit: "us", skyros: percentile(samples, 99),
                baseline: percentile(base.samples + Array(repeating: .infinity, count: base.timeouts), 99)))
        report(
            Row(
                name:
                    "fleet \(count): PostgreSQL CPU per change, one machine's bucket (baseline: at \(base.count); goal at 10,000 ≤ 1.2×)",
                unit: "us", skyros: latency.cpuPerChange, baseline: base.cpuPerChange))
        let everyone = latency.everyone + Array(repeating: .infinity, count: latency.everyoneTimeouts)
        report(
            Row(
                name:
                    "fleet \(count): a row every machine holds → all \(count), p99 (baseline: at \(base.count); goal ≤ 1 s at 1,000)",
                unit: "us", skyros: percentile(everyone, 99),
                baseline: percentile(base.everyone + Array(repeating: .infinity, count: base.everyoneTimeouts), 99)))
        report(
            Row(
                name: "fleet \(count): gateway memory per connected machine (baseline: the goal)", unit: "KB",
                skyros: latency.memoryPerMachineKB, baseline: 64))
        report(
            Row(
                name: "fleet \(count): server connections held by the gateway (baseline: the goal)",
                unit: "connections",
                skyros: Double(latency.serverConnections), baseline: 4))
    }

    /// `count` direct-mode machines (each a connection and a LISTEN), the same writes.
    private func measureDirect(count: Int, schema: ServerSchema, database: ServerDatabase, postgres: PostgresServer)
        throws -> (count: Int, p50: Double, cpuPerChange: Double)
    {
        let fleet = try syncAwait {
            try await SimulatedFleet.connectDirect(count: count, configuration: database.configuration, schema: schema)
        }
        defer { fleet.stop() }
        usleep(300_000)
        let connection = try syncAwait { try await database.connect() }
        defer { try? syncAwait { try await connection.close() } }
        let timed = try timedWrites(
            max(200, samples), on: count, fleet: fleet, markers: 3_000_000, connection: connection, database: database,
            postgres: postgres)
        let samples = timed.samples + Array(repeating: .infinity, count: timed.timeouts)
        return (count, percentile(samples, 50), timed.cpuPerChange)
    }

    /// `writes` inserts, each in another machine's bucket (marker `markers + sample`), each
    /// timed until that machine has it (10 s at most: a timeout), and the server's CPU per
    /// change on the database's backends.
    private func timedWrites(
        _ writes: Int, on count: Int, fleet: SimulatedFleet, markers: Int, connection: PostgresConnection,
        database: ServerDatabase, postgres: PostgresServer
    ) throws -> (samples: [Double], timeouts: Int, cpuPerChange: Double) {
        var samples: [Double] = []
        var timeouts = 0
        let cpuBefore = databaseCPUSeconds(postgres.processIdentifier ?? 0, database: database.name)
        for sample in 0..<writes {
            let machine = sample * 7919 % count
            let marker = markers + sample
            let start = Clock.now()
            fleet.expect(marker, machines: [machine])
            try syncAwait {
                _ = try await connection.query(
                    "INSERT INTO \(unescaped: Self.schema).\"Item\" (name, value) VALUES (\("m\(machine)"), \(marker))",
                    logger: database.logger
                ).collect()
            }
            if let arrived = fleet.wait(marker, timeout: 10) {
                samples.append(Double(arrived[machine] ?? start) / 1e3 - Double(start) / 1e3)
            } else {
                timeouts += 1
            }
        }
        let cpu =
            (databaseCPUSeconds(postgres.processIdentifier ?? 0, database: database.name) - cpuBefore) * 1e6
            / Double(writes)
        return (samples, timeouts, cpu)
    }

    // MARK: - Uploads

    /// Change sets per second: `machines` machines each uploading `sets` inserts in its bucket
    /// in batches of 100, all at once, through the gateway or directly.
    private func measureUploads(
        machines: Int, sets: Int, tokens: [String], endpoint: GatewayEndpoint, schema: ServerSchema,
        database: ServerDatabase, viaGateway: Bool
    ) throws -> Double {
        let executor = SyncExecutor()
        let seconds = try syncAwait {
            var connections: [(machine: UUID, connection: any SyncServerConnection)] = []
            for index in 0..<machines {
                let machine = UUID()
                let server: any SyncServer
                if viaGateway {
                    let tokenFile = directory.appendingPathComponent("upload-\(index).token").path
                    try tokens[index % tokens.count].write(toFile: tokenFile, atomically: true, encoding: .utf8)
                    var endpoint = endpoint
                    endpoint.tokenFile = tokenFile
                    server = GatewaySyncServer(endpoint: endpoint, statementTimeout: .seconds(60), executor: executor)
                } else {
                    server = PostgresSyncServer(
                        configuration: database.configuration, statementTimeout: .seconds(60), createsSchema: false,
                        executor: executor)
                }
                let connection = try await server.connect(machine: machine) {}
                try await connection.prepare(schema)
                connections.append((machine, connection))
            }
            let start = Clock.now()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for (index, (machine, connection)) in connections.enumerated() {
                    group.addTask {
                        var number: Int64 = 0
                        let name = "m\(index % tokens.count)"
                        while number < sets {
                            var batch: [QueuedEntry] = []
                            for _ in 0..<100 where number < sets {
                                number += 1
                                var changes = QueuedChangeSet()
                                changes.inserted = [
                                    QueuedChangeSet.Row(
                                        entity: "Item", id: UUID(),
                                        values: ["name": .text(name), "value": .integer(number)])
                                ]
                                changes.nonce = UInt64.random(in: 1...UInt64.max)
                                batch.append((number, changes))
                            }
                            _ = try await connection.upload(batch, machine: machine)
                        }
                    }
                }
                try await group.waitForAll()
            }
            let seconds = Double(Clock.now() - start) / 1e9
            for (_, connection) in connections { connection.close() }
            return seconds
        }
        return Double(machines * sets) / seconds
    }

    // MARK: - Initial sync

    private func initialSync(endpoint: GatewayEndpoint, secret: Data, database: ServerDatabase, report: (Row) -> Void)
        throws
    {
        let table = "\(Self.schema).\"Item\""
        // Exactly `rows` rows: the rows before it (the latency and uploads rows' items, run
        // first) would be read too ("the bare copy read 1200400 rows of 1000000").
        try database.psql(
            """
            DELETE FROM \(table);
            INSERT INTO \(table) (name, value, score, flag, created) \
            SELECT 'bulk', i % 100, i * 0.5, i % 2 = 0, to_timestamp(i) FROM generate_series(0, \(rows - 1)) AS i;
            VACUUM ANALYZE \(table);
            CHECKPOINT;
            """, timeout: .seconds(1_800))
        let tokenFile = directory.appendingPathComponent("bulk.token").path
        let token = try syncAwait {
            try await SyncToken.mint(
                SyncTokenClaims(subject: "bulk", expiration: Date().addingTimeInterval(86_400)), secret: secret)
        }
        try token.write(toFile: tokenFile, atomically: true, encoding: .utf8)
        let bare = try syncAwait { [rows, directory] in
            try await database.bareInitialSync(rows, into: directory.appendingPathComponent("bare-fleet.sqlite").path)
        }
        var configuration = database.configuration
        var gatewayEndpoint = endpoint
        gatewayEndpoint.tokenFile = tokenFile
        configuration.gateway = gatewayEndpoint
        let through = try newMachine(configuration, expecting: rows)
        let direct = try newMachine(database.configuration, expecting: rows)
        report(
            Row(
                name:
                    "fleet: initial sync of \(rows) rows through the gateway (baseline: bare SELECT into SQLite; goal ≥ 100,000)",
                unit: "rows/s", skyros: Double(rows) / through, baseline: Double(rows) / bare))
        report(
            Row(
                name: "fleet: initial sync of \(rows) rows, direct mode (baseline: the same bare program)",
                unit: "rows/s", skyros: Double(rows) / direct, baseline: Double(rows) / bare))
    }

    /// Seconds from a new machine's start until its store holds at least `rows` items.
    private func newMachine(_ configuration: SyncConfiguration, expecting rows: Int) throws -> Double {
        let started = Clock.now()
        let machine = try RunningDaemon(sync: configuration)
        defer { machine.shutDown() }
        let client = try Skyros(sharedStack: benchSchema, container: machine.container.url, savesOnStop: false)
        while Double(Clock.now() - started) / 1e9 < SyncBenchmark.cap {
            let count = try client.read { context in try Item.count(in: context) }
            if count >= rows { return Double(Clock.now() - started) / 1e9 }
            usleep(50_000)
        }
        throw BenchError("the initial sync did not finish within \(Int(SyncBenchmark.cap)) s")
    }
}

/// The processor seconds of the server's backends of one database (the gateway's and the run's
/// own connections to it), without the server's background processes (the checkpointer, the WAL
/// writer, autovacuum), whose time grows with the wall-clock length of a measurement, not with
/// its changes: a slower row would be charged for them.
func databaseCPUSeconds(_ postmaster: pid_t, database: String) -> Double {
    var ticks = 0
    for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
        guard let pid = Int32(entry), let text = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
            let close = text.lastIndex(of: ")"),
            let command = try? String(contentsOfFile: "/proc/\(entry)/cmdline", encoding: .utf8),
            command.contains(" \(database) ")
        else { continue }
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 12, let parent = Int32(fields[1]), parent == postmaster, let user = Int(fields[11]),
            let system = Int(fields[12])
        else { continue }
        _ = pid
        ticks += user + system
    }
    return Double(ticks) / Double(sysconf(Int32(_SC_CLK_TCK)))
}

extension ServerDatabase {

    /// The database's client connections other than the one asking (the gateway's, here).
    func gatewayConnections() throws -> Int {
        Int(
            try psql(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() AND backend_type = 'client backend' AND pid <> pg_backend_pid()"
            ).trimmingCharacters(in: .whitespacesAndNewlines)) ?? -1
    }
}

/// A `skyros-gateway` process of the run, stopped by pid.
final class GatewayProcess: Sendable {
    let process: Process
    let port: Int
    var pid: Int32 { process.processIdentifier }

    init(path: String, arguments: [String]) throws {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: path)
        process.arguments = arguments
        let output = Pipe()
        process.standardOutput = output
        process.standardError = FileHandle.nullDevice
        try process.run()
        self.process = process
        var text = ""
        let deadline = Date().addingTimeInterval(30)
        while Date() < deadline, !text.contains("\n") {
            let data = output.fileHandleForReading.availableData
            if data.isEmpty { break }
            text += String(decoding: data, as: UTF8.self)
        }
        guard let line = text.split(separator: "\n").first(where: { $0.hasPrefix("listening on") }),
            let port = Int(line.split(separator: ":").last ?? "")
        else {
            process.terminate()
            throw BenchError("the gateway did not start: \(text)")
        }
        self.port = port
    }

    /// Its resident set (KB).
    func residentKB() -> Double {
        guard let text = try? String(contentsOfFile: "/proc/\(pid)/statm", encoding: .utf8) else { return 0 }
        let fields = text.split(separator: " ")
        guard fields.count > 1, let pages = Double(fields[1]) else { return 0 }
        return pages * Double(sysconf(Int32(_SC_PAGESIZE))) / 1024
    }

    func stop() {
        kill(pid, SIGTERM)
        process.waitUntilExit()
    }
}

/// Simulated machines: each a connection reading its checkpoints when told of a change, and
/// noting when each marked row (an `Item`'s or `Account`'s value) first arrives.
final class SimulatedFleet: Sendable {
    private let state = Mutex<(expected: [Int: Set<Int>], arrived: [Int: [Int: UInt64]])>(([:], [:]))
    private let done = Mutex<[Int: CheckedContinuation<Void, Never>]>([:])
    private let tasks = Mutex<[Task<Void, Never>]>([])
    private let closers = Mutex<[@Sendable () -> Void]>([])
    let condition = NSCondition()

    func expect(_ marker: Int, machines: Set<Int>) {
        state.withLock { $0.expected[marker] = machines }
    }

    func arrivals(_ marker: Int) -> [Int: UInt64] { state.withLock { $0.arrived[marker] ?? [:] } }

    /// The arrival times of `marker` on its machines, once all have it (nil after `timeout` s).
    func wait(_ marker: Int, timeout: Double) -> [Int: UInt64]? {
        let deadline = Date().addingTimeInterval(timeout)
        condition.lock()
        defer { condition.unlock() }
        while true {
            let (expected, arrived) = state.withLock { ($0.expected[marker] ?? [], $0.arrived[marker] ?? [:]) }
            if Set(arrived.keys).isSuperset(of: expected) { return arrived }
            if !condition.wait(until: deadline) { return nil }
        }
    }

    fileprivate func saw(_ checkpoint: Checkpoint, machine: Int) {
        let now = Clock.now()
        var any = false
        state.withLock { state in
            for values in checkpoint.objects.values {
                guard let values else { continue }
                for value in values {
                    guard case .integer(let number) = value, number >= 1_000_000 else { continue }
                    let marker = Int(number)
                    if state.arrived[marker]?[machine] == nil {
                        state.arrived[marker, default: [:]][machine] = now
                        any = true
                    }
                }
            }
        }
        if any {
            condition.lock()
            condition.broadcast()
            condition.unlock()
        }
    }

    fileprivate func saw(handle: String, machine: Int) {
        // "everyone-<count>-<sample>": marker 2_000_000 + sample
        guard let sample = handle.split(separator: "-").last.flatMap({ Int($0) }) else { return }
        let now = Clock.now()
        state.withLock { state in
            if state.arrived[2_000_000 + sample]?[machine] == nil {
                state.arrived[2_000_000 + sample, default: [:]][machine] = now
            }
        }
        condition.lock()
        condition.broadcast()
        condition.unlock()
    }

    func stop() {
        for task in tasks.withLock({ $0 }) { task.cancel() }
        for close in closers.withLock({ $0 }) { close() }
    }

    /// `count` machines through the gateway: each one WebSocket (hello, prepare, listen, and a
    /// checkpoint read at each notification), connected 64 at a time.
    static func connect(count: Int, tokens: [String], endpoint: GatewayEndpoint, schema: ServerSchema) async throws
        -> SimulatedFleet
    {
        let fleet = SimulatedFleet()
        let group = MultiThreadedEventLoopGroup.singleton
        let directory = FileManager.default.temporaryDirectory.appendingPathComponent("skyros-fleet-\(getpid())")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: directory) }
        var next = 0
        while next < count {
            let batch = next..<min(count, next + 64)
            try await withThrowingTaskGroup(of: Void.self) { tasks in
                for index in batch {
                    tasks.addTask {
                        let path = directory.appendingPathComponent("\(index).token").path
                        try tokens[index].write(toFile: path, atomically: true, encoding: .utf8)
                        var endpoint = endpoint
                        endpoint.tokenFile = path
                        let link = try await GatewayLink.open(
                            endpoint, machine: UUID(), timeout: .seconds(60), eventLoop: group.next())
                        fleet.closers.withLock { $0.append { link.close() } }
                        _ = try await link.request(
                            .prepare(schemaJSON: try schema.source.canonicalBytes(), version: schema.version))
                        _ = try await link.request(.listen)
                        // The first checkpoint (a snapshot of its bucket), then the changes since.
                        var notified = false
                        let snapshot = try await read(
                            link, after: nil, fleet: fleet, machine: index, notified: &notified)
                        let cursor = try await read(
                            link, after: snapshot, fleet: fleet, machine: index, notified: &notified)
                        let task = Task { await follow(link, cursor: cursor, fleet: fleet, machine: index) }
                        fleet.tasks.withLock { $0.append(task) }
                    }
                }
                try await tasks.waitForAll()
            }
            next = batch.upperBound
        }
        return fleet
    }

    /// Reads the checkpoint after `cursor` on `link` (pages acknowledged); its snapshot.
    private static func read(
        _ link: GatewayLink, after cursor: String?, fleet: SimulatedFleet, machine: Int, notified: inout Bool
    ) async throws -> String {
        let id = link.send(.readCheckpoint(previous: cursor, rejectedAfter: 0, pageSize: 10_000))
        while true {
            guard let (answered, message) = try await link.next(within: .seconds(60), pinging: false) else { continue }
            // A change told during the read may be after its snapshot: read again after it.
            if answered == 0, case .notify = message { notified = true }
            guard answered == id else { continue }
            switch message {
            case .page(let page):
                fleet.sawPage(page, machine: machine)
                link.send(.staged(failure: nil), id: id)
            case .checkpoint(let checkpoint):
                fleet.saw(checkpoint, machine: machine)
                fleet.sawAccounts(checkpoint, machine: machine)
                return checkpoint.snapshot
            case .failure(_, let message):
                throw BenchError("machine \(machine): \(message)")
            default:
                continue
            }
        }
    }

    /// Reads a checkpoint at each notification (one more when one came during a read).
    private static func follow(_ link: GatewayLink, cursor: String, fleet: SimulatedFleet, machine: Int) async {
        var announced = false
        var cursor = cursor
        var notified = true  // (one may have come during the first reads)
        do {
            while !Task.isCancelled {
                if !notified {
                    guard let (id, message) = try await link.next(within: .seconds(3_600), pinging: true), id == 0,
                        case .notify = message
                    else { continue }
                }
                notified = false
                cursor = try await read(link, after: cursor, fleet: fleet, machine: machine, notified: &notified)
                if !announced {
                    announced = true
                    fleet.follows()
                }
            }
        } catch {}
    }

    fileprivate func sawPage(_ page: SnapshotPage, machine: Int) {}

    /// Machines whose first read of their follow loop is done.
    private let following = Mutex(0)

    fileprivate func follows() {
        following.withLock { $0 += 1 }
        condition.lock()
        condition.broadcast()
        condition.unlock()
    }

    /// Waits until `count` machines follow (``follows()``), `timeout` seconds at most.
    func waitUntilFollowing(_ count: Int, timeout: Double) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        condition.lock()
        defer { condition.unlock() }
        while following.withLock({ $0 }) < count {
            if !condition.wait(until: deadline) { return following.withLock { $0 } >= count }
        }
        return true
    }

    fileprivate func sawAccounts(_ checkpoint: Checkpoint, machine: Int) {
        for (id, values) in checkpoint.objects where id.entityName == "Account" {
            guard let values, case .text(let handle) = values.first else { continue }
            saw(handle: handle, machine: machine)
        }
    }

    /// `count` direct-mode machines: a connection and a LISTEN each.
    static func connectDirect(count: Int, configuration: SyncConfiguration, schema: ServerSchema) async throws
        -> SimulatedFleet
    {
        let fleet = SimulatedFleet()
        for index in 0..<count {
            let executor = SyncExecutor()
            let server = PostgresSyncServer(
                configuration: configuration, statementTimeout: .seconds(60), createsSchema: false, executor: executor)
            let machine = UUID()
            let connection = try await server.connect(machine: machine) {}
            try await connection.prepare(schema)
            fleet.closers.withLock { $0.append { connection.close() } }
            let wake = AsyncStream<Void>.makeStream()
            let listening = Task<Void, Never> {
                _ = try? await server.listen(machine: machine) { _ in wake.continuation.yield() }
            }
            var cursor: String? = nil
            let first = try await connection.readCheckpoint(
                after: nil, rejectedAfter: 0, machine: machine, pageSize: 10_000, stage: { _ in nil })
            cursor = first.snapshot
            let following = Task<Void, Never> {
                var cursor = cursor
                for await _ in wake.stream {
                    guard
                        let checkpoint = try? await connection.readCheckpoint(
                            after: cursor, rejectedAfter: 0, machine: machine, pageSize: 10_000, stage: { _ in nil })
                    else { continue }
                    cursor = checkpoint.snapshot
                    fleet.saw(checkpoint, machine: index)
                }
            }
            fleet.tasks.withLock { $0 += [listening, following] }
        }
        return fleet
    }
}
