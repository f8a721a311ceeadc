import Foundation
import GRDB
import GRDBSQLite
import NIOPosix
import PostgresNIO
import Skyros
import SkyrosSync
import SkyrosTestSupport
import Synchronization

/// `skyros-bench sync` (issue 34, docs/SYNC.md): groups syncing with PostgreSQL, beside bare
/// postgres-nio programs doing the same work against the same server, in the same run.
///
/// Everything runs in this process: a private PostgreSQL server (``PostgresServer``, started
/// for the run, stopped and removed at its end), each "machine" a daemon of its own group
/// container serving on a thread (``RunningDaemon``) with its client stacks; each measurement
/// has a database of its own on the server.
///
/// Every baseline is given what our side has (docs/BENCHMARKS.md, "How we measure"):
///
/// 1. Save on machine A until it is in machine B's main context (p50, p99; a sample not seen
///    within 10 s counts as +∞, and over 1% of them fails the run), against the floor: one
///    connection INSERTs a row (autocommit, prepared; a trigger NOTIFYs), another LISTENs and
///    on the notification SELECTs the row (prepared). Four rounds, taking turns to go first;
///    the machines' daemons are paused while the floor runs.
/// 2. Upload of `count` change sets saved while PostgreSQL was stopped, from the moment it
///    accepts connections again until the server has them all, against a bare program
///    sending the same rows (time-ordered ids) in one COPY, its data made and its connection
///    opened before its clock starts; and how long the machine took to notice the server.
/// 3. Initial sync of `rows` server rows onto a new machine, from the daemon's start until its
///    client counts them all, against a bare program reading them with postgres-nio `ORDER BY
///    "_id"` (as the machine does) and inserting them in that key order into a SQLite file,
///    one transaction, values bound from the decoded rows; the table is in the server's
///    buffers before either side runs.
/// 4. `machines` machines on one database, one writer: until every other machine's main
///    context has the save, and the server's processor time per change, against a fan-out
///    floor of `machines - 1` listening connections, in rounds as 1's.
struct SyncBenchmark {
    let directory: URL
    /// Change sets queued while offline (row 2).
    let count: Int
    /// Server rows synced onto a new machine (row 3).
    let rows: Int
    /// Machines of the fleet (row 4).
    let machines: Int
    /// Saves timed on each side for visibility (rows 1 and 4).
    let samples: Int
    /// Prints each machine's sync log lines on stderr.
    let verbose: Bool
    /// The measurements to run (`--only visibility|fleet|upload|initial`; fleet includes
    /// visibility, its baseline); empty: all.
    var only: Set<String> = []

    /// The longest a throughput measurement may run before it is cut short (and said so).
    static let cap: Double = 300
    /// The server schema of every group of the run.
    static let schema = "bench_sync"
    /// How long a visibility sample may wait before it counts as not seen.
    static let sampleTimeout: Double = 10
    /// The pause between two visibility samples: each save is timed alone, not in a stream.
    static let pause: useconds_t = 50_000

    func run(report: (Row) -> Void) throws {
        // SKYROS_BENCH_PG_SETTINGS="name=value;…": server settings for a diagnosis, e.g.
        // "logging_collector=on;log_directory=/tmp/pglog;log_min_duration_statement=0" gives
        // each statement's parse, bind (planning) and execute times.
        var settings: [String: String] = [:]
        for pair in (ProcessInfo.processInfo.environment["SKYROS_BENCH_PG_SETTINGS"] ?? "").split(separator: ";") {
            let parts = pair.split(separator: "=", maxSplits: 1)
            if parts.count == 2 { settings[String(parts[0])] = String(parts[1]) }
        }
        let postgres = try PostgresServer(settings: settings)
        defer { try? postgres.stop(mode: .fast) }  // its deinit removes the directory
        note("PostgreSQL \(postgres.binDirectory) on port \(postgres.port)")

        if only.isEmpty || only.contains("visibility") || only.contains("fleet") {
            let (two, floor) = try visibilityAgainstFloor(postgres)
            reportVisibility(two: two, floor: floor, report: report)
            if machines > 2 && (only.isEmpty || only.contains("fleet")) {
                let (fleet, fanOut) = try fleetAgainstFloor(postgres)
                reportFleet(fleet, floor: fanOut, two: two, report: report)
            }
        }
        if only.isEmpty || only.contains("upload") { try upload(postgres, report: report) }
        if only.isEmpty || only.contains("initial") { try initialSync(postgres, report: report) }
    }

    // MARK: - 1 and 4: visibility

    /// What a series of visibility samples gave.
    struct Visibility {
        var samples: [Double] = []  // µs
        var timeouts = 0
        var serverCPU = 0.0  // processor seconds of the whole server during the samples
        var saves = 0
        var cpuPerChange: Double { saves == 0 ? 0 : serverCPU * 1e6 / Double(saves) }  // µs
        /// The samples with each timeout as +∞: a change never seen is the slowest, not left out.
        var withTimeouts: [Double] { samples + Array(repeating: .infinity, count: timeouts) }
        /// Whether more than 1% of the samples timed out (the row fails).
        var tooManyTimeouts: Bool { timeouts * 100 > samples.count + timeouts }
    }

    /// Rounds of visibility samples in which the two sides take turns (each side's samples a
    /// block, so that the server's processor time is each side's own; the first side of a
    /// round is the second of the next); the fleet's daemons are paused while the floor runs.
    static let rounds = 4

    /// Two machines against the floor of one listener.
    private func visibilityAgainstFloor(_ postgres: PostgresServer) throws -> (Visibility, Visibility) {
        let fleet = try Fleet(postgres, machines: 2, log: log)
        defer { fleet.stop() }
        let floor = try Floor(postgres, listeners: 1)
        defer { floor.stop() }
        return try inTurns(fleet, floor, samples: samples)
    }

    /// `machines` machines, one writer, against the fan-out floor of `machines - 1` listeners.
    private func fleetAgainstFloor(_ postgres: PostgresServer) throws -> (Visibility, Visibility) {
        let fleet = try Fleet(postgres, machines: machines, log: log)
        defer { fleet.stop() }
        let floor = try Floor(postgres, listeners: machines - 1)
        defer { floor.stop() }
        return try inTurns(fleet, floor, samples: samples)
    }

    /// `samples` samples on each side, in ``rounds`` rounds taking turns (the fleet paused
    /// while the floor runs).
    private func inTurns(_ fleet: Fleet, _ floor: Floor, samples: Int) throws -> (Visibility, Visibility) {
        var ours = Visibility()
        var bare = Visibility()
        var next = 0
        try fleet.warmUp(&next)
        try floor.warmUp(&next)
        let perRound = max(samples / Self.rounds, 1)
        for round in 0..<Self.rounds {
            if round % 2 == 0 {
                try fleet.measure(samples: perRound, next: &next, into: &ours)
                try fleet.paused { try floor.measure(samples: perRound, next: &next, into: &bare) }
            } else {
                try fleet.paused { try floor.measure(samples: perRound, next: &next, into: &bare) }
                try fleet.measure(samples: perRound, next: &next, into: &ours)
            }
        }
        return (ours, bare)
    }

    private func reportVisibility(two: Visibility, floor: Visibility, report: (Row) -> Void) {
        report(
            Row(
                name:
                    "sync: A saves, B's main context has it: not seen within \(Int(Self.sampleTimeout)) s (of \(two.samples.count + two.timeouts))",
                unit: "saves", skyros: Double(two.timeouts), baseline: Double(floor.timeouts)))
        benchmarkAssert(
            !two.tooManyTimeouts && !floor.tooManyTimeouts,
            "sync visibility: over 1% of the samples timed out (Skyros \(two.timeouts), floor \(floor.timeouts))")
        report(
            Row(
                name:
                    "sync: A saves, B's main context has it p50 (floor: prepared INSERT, NOTIFY, prepared SELECT; goal ≤ 2×)",
                unit: "us",
                skyros: percentile(two.withTimeouts, 50), baseline: percentile(floor.withTimeouts, 50)))
        report(
            Row(
                name: "sync: A saves, B's main context has it p99 (floor: the same; a timeout is +∞)", unit: "us",
                skyros: percentile(two.withTimeouts, 99), baseline: percentile(floor.withTimeouts, 99)))
        report(
            Row(
                name: "sync: server CPU per change, 2 machines (floor: the same)", unit: "us",
                skyros: two.cpuPerChange, baseline: floor.cpuPerChange))
    }

    private func reportFleet(_ fleet: Visibility, floor: Visibility, two: Visibility, report: (Row) -> Void) {
        let listeners = machines - 1
        report(
            Row(
                name:
                    "sync: \(machines) machines, one writer: not seen by all within \(Int(Self.sampleTimeout)) s (of \(fleet.samples.count + fleet.timeouts))",
                unit: "saves", skyros: Double(fleet.timeouts), baseline: Double(floor.timeouts)))
        benchmarkAssert(
            !fleet.tooManyTimeouts && !floor.tooManyTimeouts,
            "sync with \(machines) machines: over 1% of the samples timed out (Skyros \(fleet.timeouts), floor \(floor.timeouts))"
        )
        report(
            Row(
                name:
                    "sync: \(machines) machines, one writer: all have it p50 (floor: \(listeners) connections, LISTEN + prepared SELECT)",
                unit: "us",
                skyros: percentile(fleet.withTimeouts, 50), baseline: percentile(floor.withTimeouts, 50)))
        report(
            Row(
                name: "sync: \(machines) machines, one writer: all have it p99 (floor: the same)", unit: "us",
                skyros: percentile(fleet.withTimeouts, 99), baseline: percentile(floor.withTimeouts, 99)))
        report(
            Row(
                name: "sync: \(machines) machines: server CPU per change (floor: the same)", unit: "us",
                skyros: fleet.cpuPerChange, baseline: floor.cpuPerChange))
        report(
            Row(
                name: "sync: \(machines) machines, one writer: all have it p50 (baseline: Skyros, 2 machines)",
                unit: "us",
                skyros: percentile(fleet.withTimeouts, 50), baseline: percentile(two.withTimeouts, 50)))
    }

    /// Machines on one database of their own: machine 0's client writes, every other
    /// machine's client watches its `changes` and looks the new object up in its main context.
    private final class Fleet: VisibilityProbe {
        let database: ServerDatabase
        let daemons: [RunningDaemon]
        let clients: [Skyros]
        let arrivals = Arrivals()
        private var watchers: [Task<Void, Never>] = []
        let postmaster: pid_t?

        init(_ postgres: PostgresServer, machines: Int, log: @escaping @Sendable (String) -> Void) throws {
            database = try ServerDatabase(postgres, prefix: "fleet")
            postmaster = postgres.processIdentifier
            var daemons: [RunningDaemon] = []
            var clients: [Skyros] = []
            for _ in 0..<machines {
                // skyrosd's heartbeat (100 ms), not the tests' 20 ms.
                let daemon = try RunningDaemon(heartbeatInterval: 100, sync: database.configuration, log: log)
                daemons.append(daemon)
                clients.append(
                    try Skyros(
                        sharedStack: benchSchema, container: daemon.container.url, timeout: 30, savesOnStop: false))
            }
            self.daemons = daemons
            self.clients = clients
            // A daemon opens its store, and starts syncing, at its first client's hello.
            for client in clients { _ = try client.read { context in try Item.count(in: context) } }
            for machine in 1..<clients.count {
                watchers.append(Self.watch(clients[machine], machine: machine, arrivals: arrivals))
            }
        }

        /// A task iterating a machine's client's `changes`, as an app reacts to them: each
        /// inserted object is looked up in the main context, and the awaited value noted.
        private static func watch(_ client: Skyros, machine: Int, arrivals: Arrivals) -> Task<Void, Never> {
            let changes = client.changes
            return Task {
                for await change in changes {
                    guard let wanted = arrivals.wanted else { continue }
                    for snapshot in change.inserted where value(of: snapshot.id, in: client) == wanted {
                        arrivals.saw(wanted, machine: machine, at: Clock.now())
                    }
                }
            }
        }

        /// The `value` of the item with this ID in a stack's main context, read there
        /// synchronously (`Int.min` when it has none).
        private static func value(of id: ObjectID, in store: Skyros) -> Int {
            var value = Int.min
            store.read { context in value = context.object(with: id, as: Item.self)?.value ?? Int.min }
            return value
        }

        /// Warming up: saves until every machine has one (their engines online, the tables made).
        let warmUpTimeout = 2.0
        let silence = "the machines never saw each other's saves (is the sync engine online?)"

        /// One save on machine 0 (`writeAndWait`: durable locally) until every other machine's
        /// main context has it, in µs; nil when one did not within `timeout` seconds.
        func sample(_ value: Int, timeout: Double) throws -> Double? {
            arrivals.expect(value, machines: Set(1..<clients.count))
            let start = Clock.now()
            try clients[0].writeAndWait { context in
                let item = Item.create(in: context)
                EmbeddedBenchmark.fill(item, value)
                item.value = value
            }
            guard let end = arrivals.wait(timeout: timeout) else { return nil }
            return Double(end - start) / 1000
        }

        /// Runs `body` with every daemon's serve loop held (no heartbeat, no turn), then lets
        /// them go on and samples twice, unmeasured, so that the next measured sample does not
        /// pay for what waited meanwhile.
        func paused(_ body: () throws -> Void) throws {
            var held: [RunningDaemon] = []
            defer { for daemon in held { daemon.resume() } }
            for daemon in daemons {
                guard daemon.pause() else { throw BenchError("a daemon of the fleet could not be paused") }
                held.append(daemon)
            }
            try body()
            for daemon in held { daemon.resume() }
            held = []
            for value in [-2, -3] { _ = try sample(value, timeout: SyncBenchmark.sampleTimeout) }
        }

        func stop() {
            for watcher in watchers { watcher.cancel() }
            for daemon in daemons { daemon.shutDown() }
        }
    }

    /// The floor: a bare postgres-nio program. One connection INSERTs a row (autocommit, a
    /// prepared statement) into a table whose trigger NOTIFYs its id; `listeners` others LISTEN
    /// and, at the notification, each SELECTs the row by its id (primary key, prepared) and
    /// decodes it: what a machine's engine does at a change, and no more.
    private final class Floor: VisibilityProbe {
        let database: ServerDatabase
        let writer: PostgresConnection
        let readers: [PostgresConnection]
        let arrivals = Arrivals()
        private var listeners: [Task<Void, Never>] = []
        let postmaster: pid_t?

        /// The floor's INSERT, prepared once on the writer's connection.
        struct Insert: PostgresPreparedStatement {
            static let sql =
                "INSERT INTO item (_id, name, value, score, flag, created) VALUES ($1, $2, $3, $4, $5, $6)"
            typealias Row = ()
            var id: UUID
            var value: Int

            func makeBindings() throws -> PostgresBindings {
                var bindings = PostgresBindings(capacity: 6)
                bindings.append(id)
                bindings.append("item \(value)")
                bindings.append(value)
                bindings.append(Double(value) * 0.5)
                bindings.append(value % 2 == 0)
                bindings.append(Date(timeIntervalSince1970: Double(value)))
                return bindings
            }

            func decodeRow(_ row: PostgresRow) throws -> Row { () }
        }

        /// The listeners' SELECT, prepared once on each of their connections.
        struct Select: PostgresPreparedStatement {
            static let sql = "SELECT name, value, score, flag, created FROM item WHERE _id = $1"
            typealias Row = (String, Int, Double, Bool, Date)
            var id: UUID

            func makeBindings() throws -> PostgresBindings {
                var bindings = PostgresBindings(capacity: 1)
                bindings.append(id)
                return bindings
            }

            func decodeRow(_ row: PostgresRow) throws -> Row {
                try row.decode(Row.self)
            }
        }

        init(_ postgres: PostgresServer, listeners count: Int) throws {
            database = try ServerDatabase(postgres, prefix: "floor")
            postmaster = postgres.processIdentifier
            try database.psql(
                """
                CREATE TABLE item (_id uuid PRIMARY KEY, name text NOT NULL, value bigint NOT NULL, \
                score double precision NOT NULL, flag boolean NOT NULL, created timestamptz NOT NULL);
                CREATE INDEX item_value ON item (value);
                CREATE FUNCTION notify_item() RETURNS trigger LANGUAGE plpgsql AS $$
                BEGIN PERFORM pg_notify('item', NEW._id::text); RETURN NULL; END $$;
                CREATE TRIGGER notify_item AFTER INSERT ON item FOR EACH ROW EXECUTE FUNCTION notify_item();
                """)
            let database = database
            writer = try syncAwait { try await database.connect() }
            var readers: [PostgresConnection] = []
            for _ in 0..<count { readers.append(try syncAwait { try await database.connect() }) }
            self.readers = readers
            let arrivals = arrivals
            for (index, reader) in readers.enumerated() {
                listeners.append(
                    Task {
                        _ = try? await reader.listen(on: "item") { notifications in
                            for try await notification in notifications {
                                guard let id = UUID(uuidString: notification.payload) else { continue }
                                let rows = try await reader.execute(Select(id: id), logger: database.logger)
                                for try await (_, value, _, _, _) in rows {
                                    arrivals.saw(value, machine: index + 1, at: Clock.now())
                                }
                            }
                        }
                    })
            }
        }

        /// Warming up: inserts until every listener has one row (LISTEN is sent by its task).
        let warmUpTimeout = 1.0
        let silence = "the floor's listeners never heard a notification"

        /// One INSERT until every listener has read the row back, in µs (the clock starts in
        /// the task that sends the INSERT: the hop to it is not counted).
        func sample(_ value: Int, timeout: Double) throws -> Double? {
            arrivals.expect(value, machines: Set(1...readers.count))
            let writer = writer
            let logger = database.logger
            let start = try syncAwait {
                let start = Clock.now()
                // Run to its end (postgres-nio 1.33's `Row == ()` overload asks the stream for its
                // command tag before it has ended, a precondition failure).
                let rows = try await writer.execute(Insert(id: UUID(), value: value), logger: logger)
                for try await _ in rows {}
                return start
            }
            guard let end = arrivals.wait(timeout: timeout) else { return nil }
            return Double(end - start) / 1000
        }

        func stop() {
            for listener in listeners { listener.cancel() }
            let connections = [writer] + readers
            _ = try? syncAwait {
                for connection in connections { try? await connection.close() }
            }
        }
    }

    /// What the visibility row measures, the same way for Skyros's machines and the bare floor.
    fileprivate protocol VisibilityProbe {
        /// The PostgreSQL postmaster, for the server's CPU per change.
        var postmaster: pid_t? { get }
        /// How long a warm-up sample may wait, in seconds.
        var warmUpTimeout: Double { get }
        /// Why warming up failed, when no sample ever arrived.
        var silence: String { get }
        /// One change until it is seen, in µs; nil when not within `timeout` seconds.
        func sample(_ value: Int, timeout: Double) throws -> Double?
    }

    /// The value the watchers wait for, which machines have it yet, and when the last got it.
    final class Arrivals: @unchecked Sendable {  // its state is guarded by `condition`
        private let condition = NSCondition()
        private var expected: Int?
        private var remaining: Set<Int> = []
        private var last: UInt64 = 0

        var wanted: Int? { condition.withLock { expected } }

        func expect(_ value: Int, machines: Set<Int>) {
            condition.withLock {
                expected = value
                remaining = machines
                last = 0
            }
        }

        func saw(_ value: Int, machine: Int, at time: UInt64) {
            condition.withLock {
                guard expected == value, remaining.remove(machine) != nil else { return }
                last = max(last, time)
                if remaining.isEmpty { condition.broadcast() }
            }
        }

        /// When the last machine got the value; nil after `timeout` seconds.
        func wait(timeout: Double) -> UInt64? {
            let deadline = Date().addingTimeInterval(timeout)
            return condition.withLock {
                while !remaining.isEmpty {
                    guard condition.wait(until: deadline) else { break }
                }
                defer { expected = nil }
                return remaining.isEmpty ? last : nil
            }
        }
    }

    // MARK: - 2: upload of change sets queued offline

    /// What the machine's upload gave.
    private struct Upload {
        var uploaded = 0  // rows on the server at the end (the first save excluded)
        var seconds = 0.0  // from PostgreSQL ready until they were all there (or the cap)
        var reconnect: Double?  // from PostgreSQL ready until the first of them was there
        var recorded = 0  // upload records on the server (one per change set applied)
        var growth = 0.0  // peak RSS growth meanwhile, MB
    }

    private func upload(_ postgres: PostgresServer, report: (Row) -> Void) throws {
        let database = try ServerDatabase(postgres, prefix: "upload")
        try syncAwait { [configuration = database.configuration] in
            try await SyncSetup.run(configuration, schema: benchSchema, log: { _ in })
        }
        // The machine is stopped before the baseline runs (it would be applying the
        // checkpoint that brings its own uploads back meanwhile).
        let skyros = try machineUpload(postgres, database)
        // Baseline: the same rows into a table of the same columns and indexes (no triggers),
        // one COPY, its data made and its connection opened before the clock starts.
        let bareSeconds = try syncAwait { [count] in try await database.bareUpload(count) }
        let capped = skyros.uploaded < count
        let suffix = capped ? " (capped at \(Int(Self.cap)) s: \(skyros.uploaded) of \(count))" : ""
        // The goal's row counts from the moment the server is ready again: the time the engine
        // takes to notice it is the machine's as much as the upload's.
        report(
            Row(
                name:
                    "sync: upload of \(count) change sets queued offline, from PostgreSQL ready (bare: one COPY; goal ≥ 0.8×)\(suffix)",
                unit: "rows/s", skyros: Double(skyros.uploaded) / skyros.seconds, baseline: Double(count) / bareSeconds)
        )
        if let reconnect = skyros.reconnect {
            report(
                Row(
                    name: "sync: upload: PostgreSQL ready until the first batch is on the server (goal ≤ 500 ms)",
                    unit: "ms", skyros: reconnect * 1000, baseline: 500))
            benchmarkAssert(
                reconnect <= 0.5,
                "the machine's first batch reached the server \(Int(reconnect * 1000)) ms after it was ready (goal ≤ 500 ms)"
            )
        } else {
            benchmarkAssert(false, "the machine uploaded nothing after PostgreSQL came back")
        }
        report(
            Row(
                name: "sync: upload: change sets the server recorded (exactly once: baseline = saves + 1)",
                unit: "change sets",
                skyros: Double(skyros.recorded), baseline: Double(count + 1)))
        report(
            Row(
                name: "sync: upload of \(count), peak RSS growth of the whole process (goal < 100)", unit: "MB",
                skyros: skyros.growth, baseline: 0))
        benchmarkAssert(
            skyros.growth < 100,
            "uploading \(count) change sets grew the peak RSS by \(Int(skyros.growth)) MB (goal < 100)")
        benchmarkAssert(
            skyros.recorded == count + 1, "the server recorded \(skyros.recorded) change sets of \(count + 1)")
        if capped {
            note("upload: cut short after \(Int(Self.cap)) s with \(skyros.uploaded) of \(count) rows on the server")
        }
    }

    /// A machine saves once online, then `count` times while PostgreSQL is stopped (each save
    /// its own change set); timed from PostgreSQL's restart until the server has them all.
    private func machineUpload(_ postgres: PostgresServer, _ database: ServerDatabase) throws -> Upload {
        let table = "\(Self.schema).\"Item\""
        let machine = try RunningDaemon(sync: database.configuration, log: log)
        defer { machine.shutDown() }
        var writers: [Skyros] = []
        for _ in 0..<4 {
            writers.append(
                try Skyros(sharedStack: benchSchema, container: machine.container.url, timeout: 60, savesOnStop: false))
        }
        // Online first: one save on the server proves the engine has connected.
        try writers[0].writeAndWait { context in EmbeddedBenchmark.fill(Item.create(in: context), -1) }
        guard try waitFor(seconds: 60, { try database.psql("SELECT count(*) FROM \(table)") == "1" }) else {
            throw BenchError("the machine never uploaded its first save")
        }
        // The machine's upload record of that save: the offline saves are the next numbers of
        // its queue, and the server has them all once it has the record of the last one.
        let record = try database.psql("SELECT machine || '|' || number FROM \(Self.schema)._skyros_uploads").split(
            separator: "|")
        guard record.count == 2, let firstNumber = Int(record[1]) else {
            throw BenchError("no upload record of the first save")
        }
        let machineID = String(record[0])

        try postgres.stop(mode: .fast)
        // `count` saves, each its own change set (writeAndWait: nothing coalesces them), from
        // four clients at once; not timed.
        let saving = Clock.now()
        let failures = Mutex(0)
        let clients = writers
        DispatchQueue.concurrentPerform(iterations: clients.count) { writer in
            for index in stride(from: writer, to: count, by: clients.count) {
                do {
                    try clients[writer].writeAndWait { context in
                        EmbeddedBenchmark.fill(Item.create(in: context), index)
                    }
                } catch {
                    failures.withLock { $0 += 1 }
                }
            }
        }
        let failed = failures.withLock { $0 }
        note(
            "upload: \(count - failed) saves made offline in \(String(format: "%.1f", Double(Clock.now() - saving) / 1e9)) s"
        )
        guard failed == 0 else {
            try? postgres.start()
            throw BenchError("\(failed) offline saves failed")
        }

        var result = Upload()
        let memory = PeakMemory()
        try postgres.start()
        let started = Clock.now()
        let connection = try syncAwait { try await database.connect() }
        defer {
            _ = try? syncAwait {
                try? await connection.close()
            }
        }
        // Polled every 50 ms: the machine's highest upload record (a lookup in the primary
        // key's index, not a count of a growing table, which would load the server).
        var first: UInt64?
        var through = firstNumber
        while true {
            through = try syncAwait { try await database.lastUpload(of: machineID, on: connection) }
            if first == nil, through > firstNumber { first = Clock.now() }
            if through >= firstNumber + count || Double(Clock.now() - started) / 1e9 > Self.cap { break }
            usleep(50_000)
        }
        let ended = Clock.now()
        result.growth = memory.growthMB()
        // What the server has, counted once the clock has stopped.
        result.uploaded = try syncAwait { try await database.count(table, on: connection) } - 1
        result.seconds = Double(ended - started) / 1e9
        result.reconnect = first.map { Double($0 - started) / 1e9 }
        result.recorded =
            Int(try database.psql("SELECT count(*) FROM \(Self.schema)._skyros_uploads WHERE rejected IS NULL")) ?? 0
        return result
    }

    // MARK: - 3: initial sync onto a new machine

    private func initialSync(_ postgres: PostgresServer, report: (Row) -> Void) throws {
        let database = try ServerDatabase(postgres, prefix: "initial")
        try syncAwait { [configuration = database.configuration] in
            try await SyncSetup.run(configuration, schema: benchSchema, log: { _ in })
        }
        let table = "\(Self.schema).\"Item\""
        let filling = Clock.now()
        // The values `EmbeddedBenchmark.fill` gives; ids from the column's default.
        try database.psql(
            """
            INSERT INTO \(table) (name, value, score, flag, created) \
            SELECT 'item ' || i, i % 100, i * 0.5, i % 2 = 0, to_timestamp(i) FROM generate_series(0, \(rows - 1)) AS i;
            VACUUM ANALYZE \(table);
            VACUUM ANALYZE \(Self.schema)._skyros_log;
            CHECKPOINT;
            """, timeout: .seconds(1_800))
        note(
            "initial sync: \(rows) rows inserted on the server in \(String(format: "%.1f", Double(Clock.now() - filling) / 1e9)) s"
        )

        // The table's pages in the server's buffers before either side reads them: the side
        // that runs first does not warm them for the other.
        try database.warmItems()
        // The baseline first: the peak RSS growth of each is then its own (the machine's heap,
        // once grown, would hide the baseline's).
        let memory = PeakMemory()
        let bare = try syncAwait { [rows, directory] in
            try await database.bareInitialSync(
                rows, into: directory.appendingPathComponent("bare-initial.sqlite").path)
        }
        let bareGrowth = memory.growthMB()
        let (local, seconds, growth) = try newMachine(database)

        let capped = local < rows
        let suffix = capped ? " (capped at \(Int(Self.cap)) s: \(local) of \(rows))" : ""
        report(
            Row(
                name:
                    "sync: initial sync of \(rows) rows onto a new machine (bare: SELECT ORDER BY _id into SQLite; goal ≥ 0.8×)\(suffix)",
                unit: "rows/s", skyros: Double(local) / seconds, baseline: Double(rows) / bare))
        report(
            Row(
                name: "sync: initial sync of \(rows), peak RSS growth of the whole process (goal < 100)", unit: "MB",
                skyros: growth, baseline: bareGrowth))
        benchmarkAssert(
            growth < 100, "the initial sync of \(rows) rows grew the peak RSS by \(Int(growth)) MB (goal < 100)")
        if capped {
            note("initial sync: cut short after \(Int(Self.cap)) s with \(local) of \(rows) objects on the machine")
        }
        reportWhileSaving(try newMachineWhileSaving(database), bare: bare, report: report)
    }

    /// A new machine on the database: from its daemon's start until its client counts
    /// `rows` objects (polled every 50 ms), or the cap. The objects counted, the seconds, the
    /// process's peak RSS growth (MB).
    private func newMachine(_ database: ServerDatabase) throws -> (Int, Double, Double) {
        let memory = PeakMemory()
        let started = Clock.now()
        let machine = try RunningDaemon(sync: database.configuration, log: log)
        defer { machine.shutDown() }
        let client = try Skyros(
            sharedStack: benchSchema, container: machine.container.url, timeout: 120, savesOnStop: false)
        var local = 0
        while true {
            local = (try? client.read { context in try Item.count(in: context) }) ?? local
            if local >= rows || Double(Clock.now() - started) / 1e9 > Self.cap { break }
            usleep(50_000)
        }
        return (local, Double(Clock.now() - started) / 1e9, memory.growthMB())
    }

    // MARK: - 3, while the machine's app saves (issue 57 item 7)

    /// The app's pace while a new machine takes its snapshot (10 saves a second), and the
    /// server sampler's, in seconds.
    static let saveInterval = 0.1
    static let sampleInterval = 0.2

    /// What a new machine's initial sync gave while its app saved.
    private struct SavingSync {
        var synced = 0  // the server's rows on the machine at the end (its objects less its saves)
        var seconds = 0.0  // from the daemon's start until the store had them all (or the cap)
        var saves = AppSaves.Tally()
        var longest = LongestTransaction.Sample()
        var growth = 0.0  // peak RSS growth meanwhile, MB
    }

    private func reportWhileSaving(_ result: SavingSync, bare: Double, report: (Row) -> Void) {
        let capped = result.synced < rows
        let suffix = capped ? " (capped at \(Int(Self.cap)) s: \(result.synced) of \(rows))" : ""
        report(
            Row(
                name:
                    "sync: initial sync of \(rows) rows while the machine's app saves 10×/s (bare: the same)\(suffix)",
                unit: "rows/s", skyros: Double(result.synced) / result.seconds, baseline: Double(rows) / bare))
        report(
            Row(
                name:
                    "sync: initial sync of \(rows) while the app saves: longest server transaction during it (bare: its one SELECT, open for the whole copy; goal ≤ 5 s)",
                unit: "s", skyros: result.longest.seconds, baseline: bare))
        let saves = result.saves
        note(
            "initial sync while saving: \(saves.made) saves made (\(saves.failed) failed, the slowest \(String(format: "%.0f", saves.slowest * 1000)) ms, ending \(String(format: "%.1f", saves.slowestEnded)) s in) in \(String(format: "%.1f", result.seconds)) s to completion; peak RSS growth \(String(format: "%.0f", result.growth)) MB"
        )
        note(
            "initial sync while saving: longest server transaction \(String(format: "%.2f", result.longest.seconds)) s, at: \(result.longest.statement.isEmpty ? "(none seen)" : result.longest.statement)"
        )
        benchmarkAssert(
            result.longest.seconds <= 5,
            "a server transaction stayed open \(result.longest.seconds) s during the initial sync (goal ≤ 5 s)")
        benchmarkAssert(saves.failed == 0, "\(saves.failed) of the app's saves failed during the initial sync")
        if capped {
            note(
                "initial sync while saving: cut short after \(Int(Self.cap)) s with \(result.synced) of \(rows) server rows on the machine"
            )
        }
    }

    /// A new machine on the database whose app saves an `Item` every 100 ms from its start (a
    /// thread of its own), while the server's longest-running transaction is sampled every
    /// 200 ms (another): from its daemon's start until its store holds every server row and
    /// every save made (polled every 50 ms), or the cap. Both threads end on every path.
    private func newMachineWhileSaving(_ database: ServerDatabase) throws -> SavingSync {
        var result = SavingSync()
        let memory = PeakMemory()
        let longest = LongestTransaction()
        let sampler = Repeating(every: Self.sampleInterval) { longest.sample(database) }
        defer { sampler.stop() }
        let started = Clock.now()
        let machine = try RunningDaemon(sync: database.configuration, log: log)
        defer { machine.shutDown() }
        let client = try Skyros(
            sharedStack: benchSchema, container: machine.container.url, timeout: 120, savesOnStop: false)
        let saves = AppSaves(first: rows)
        let saver = Repeating(every: Self.saveInterval) { saves.save(on: client) }
        defer { saver.stop() }
        var local = 0
        while true {
            local = (try? client.read { context in try Item.count(in: context) }) ?? local
            let made = saves.tally.made  // after the count: a save meanwhile delays the end, never hastens it
            result.synced = local - made
            if local >= rows + made || Double(Clock.now() - started) / 1e9 > Self.cap { break }
            usleep(50_000)
        }
        result.seconds = Double(Clock.now() - started) / 1e9
        saver.stop()
        sampler.stop()
        result.saves = saves.tally
        result.longest = longest.longest
        result.growth = memory.growthMB()
        return result
    }

    /// An app's saves on its machine, one `Item` each (`writeAndWait`: durable locally).
    private final class AppSaves: Sendable {
        struct Tally {
            var made = 0
            var failed = 0
            var slowest = 0.0  // seconds
            var slowestEnded = 0.0  // seconds from the first save's start
        }

        /// The index of the first save's values (`EmbeddedBenchmark.fill`).
        let first: Int
        private let state = Mutex(Tally())
        private let started = Clock.now()

        init(first: Int) { self.first = first }

        var tally: Tally { state.withLock { $0 } }

        func save(on client: Skyros) {
            let index = first + state.withLock { $0.made + $0.failed }
            let start = Clock.now()
            let saved =
                (try? client.writeAndWait { context in EmbeddedBenchmark.fill(Item.create(in: context), index) })
                != nil
            let end = Clock.now()
            let seconds = Double(end - start) / 1e9
            state.withLock { tally in
                if saved { tally.made += 1 } else { tally.failed += 1 }
                if seconds > tally.slowest {
                    tally.slowest = seconds
                    tally.slowestEnded = Double(end - started) / 1e9
                }
            }
        }
    }

    /// The longest-running transaction seen on the server in a database, with what it ran.
    private final class LongestTransaction: Sendable {
        struct Sample {
            var seconds = 0.0
            var statement = ""  // its backend type, state and query (the first 120 characters)
        }

        private let state = Mutex(Sample())

        var longest: Sample { state.withLock { $0 } }

        /// The oldest open transaction of a client in the database now, other than psql's own
        /// (none: 0 s); not the server's own workers' (an autovacuum of the log the fill wrote
        /// is not the machine's transaction).
        func sample(_ database: ServerDatabase) {
            guard
                let text = try? database.psql(
                    """
                    SELECT extract(epoch FROM clock_timestamp() - xact_start) || '|' || coalesce(backend_type, '') \
                    || ', ' || coalesce(state, '') || ': ' || left(regexp_replace(coalesce(query, ''), '\\s+', ' ', 'g'), 120) \
                    FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() \
                    AND backend_type = 'client backend' AND xact_start IS NOT NULL ORDER BY xact_start LIMIT 1
                    """, timeout: .seconds(10)),
                !text.isEmpty
            else { return }
            let parts = text.split(separator: "|", maxSplits: 1)
            guard let seconds = Double(parts[0]) else { return }
            state.withLock { longest in
                if seconds > longest.seconds {
                    longest = Sample(seconds: seconds, statement: parts.count > 1 ? String(parts[1]) : "")
                }
            }
        }
    }

    /// A thread of its own running `tick` every `interval` seconds, the first at once, until
    /// ``stop()``, which returns once the thread has ended (a tick that overran its interval
    /// is followed by the next at once, and the lost ones are not made up).
    private final class Repeating: @unchecked Sendable {  // `stopped` is guarded by `condition`
        private let condition = NSCondition()
        private var stopped = false
        private let ended = DispatchSemaphore(value: 0)

        init(every interval: Double, _ tick: @escaping @Sendable () -> Void) {
            Thread.detachNewThread { [self] in
                var next = Date()
                while !condition.withLock({ stopped }) {
                    tick()
                    next = max(next.addingTimeInterval(interval), Date())
                    condition.withLock {
                        while !stopped, condition.wait(until: next) {}
                    }
                }
                ended.signal()
            }
        }

        /// Stops the ticks; returns once the last has ended (at once when called again).
        func stop() {
            condition.withLock {
                stopped = true
                condition.broadcast()
            }
            ended.wait()
            ended.signal()  // for a later call
        }
    }

    // MARK: - Helpers

    /// The daemons' log: their sync lines on stderr with `--verbose`.
    private var log: @Sendable (String) -> Void {
        guard verbose else { return { _ in } }
        return { line in FileHandle.standardError.write(Data("skyrosd: \(line)\n".utf8)) }
    }

    /// Polls `condition` every 100 ms for `seconds` at most.
    private func waitFor(seconds: Double, _ condition: () throws -> Bool) throws -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if (try? condition()) == true { return true }
            usleep(100_000)
        }
        return try condition()
    }
}

/// A database of its own on the run's server, with the sync configuration of its machines.
struct ServerDatabase: Sendable {
    let postgres: PostgresServer
    let name: String
    let configuration: SyncConfiguration
    let logger: Logger

    init(_ postgres: PostgresServer, prefix: String) throws {
        self.postgres = postgres
        name = try postgres.createUniqueDatabase(prefix: prefix)
        configuration = SyncConfiguration(
            host: postgres.host, port: postgres.port, username: postgres.superuser, database: name,
            schema: SyncBenchmark.schema, tls: .disable)
        var logger = Logger(label: "skyros-bench.sync")
        logger.logLevel = .critical
        self.logger = logger
    }

    @discardableResult
    func psql(_ sql: String, timeout: Duration = .seconds(120)) throws -> String {
        try postgres.psql(sql, database: name, timeout: timeout)
    }

    /// A connection as the daemons make theirs (TCP to the loopback address, no TLS).
    func connect() async throws -> PostgresConnection {
        try await PostgresConnection.connect(
            on: MultiThreadedEventLoopGroup.singleton.any(), configuration: try configuration.connectionConfiguration(),
            id: Int.random(in: 1...Int.max), logger: logger)
    }

    func count(_ table: String, on connection: PostgresConnection) async throws -> Int {
        let rows = try await connection.query("SELECT count(*) FROM \(unescaped: table)", logger: logger)
        for try await count in rows.decode(Int.self) { return count }
        return 0
    }

    /// The highest upload number the server recorded for a machine (0: none).
    func lastUpload(of machine: String, on connection: PostgresConnection) async throws -> Int {
        let rows = try await connection.query(
            "SELECT coalesce(max(number), 0)::bigint FROM \(unescaped: SyncBenchmark.schema)._skyros_uploads WHERE machine = \(machine)::uuid",
            logger: logger)
        for try await number in rows.decode(Int.self) { return number }
        return 0
    }

    /// The upload baseline: `count` rows with the values `EmbeddedBenchmark.fill` gives (and
    /// time-ordered ids made here, as a machine makes its objects'), into a table of the same
    /// columns and index as the group's `Item`, in one `COPY … FROM STDIN` (text format,
    /// autocommitted: one statement, one transaction). The rows' bytes are made and the
    /// connection opened before the clock starts. Seconds from the COPY's start to its end.
    func bareUpload(_ count: Int) async throws -> Double {
        try psql(
            """
            CREATE TABLE bare_item (_id uuid PRIMARY KEY, name text NOT NULL, value bigint NOT NULL, \
            score double precision NOT NULL, flag boolean NOT NULL, created timestamptz NOT NULL);
            CREATE INDEX bare_item_value ON bare_item (value);
            """)
        let dates = ISO8601DateFormatter()
        var chunks: [ByteBuffer] = []
        for batch in stride(from: 0, to: count, by: 1_000) {
            var text = ""
            for index in batch..<min(batch + 1_000, count) {
                let id = ObjectID.make(entityName: "Item").uuid.uuidString
                let created = dates.string(from: Date(timeIntervalSince1970: Double(index)))
                text +=
                    "\(id)\titem \(index)\t\(index % 100)\t\(Double(index) * 0.5)\t\(index % 2 == 0 ? "t" : "f")\t\(created)\n"
            }
            chunks.append(ByteBuffer(string: text))
        }
        let connection = try await connect()
        let seconds: Double
        do {
            let start = Clock.now()
            try await connection.copyFrom(
                table: "bare_item", columns: ["_id", "name", "value", "score", "flag", "created"], logger: logger
            ) { writer in
                for chunk in chunks { try await writer.write(chunk) }
            }
            seconds = Double(Clock.now() - start) / 1e9
        } catch {
            try? await connection.close()
            throw error
        }
        try await connection.close()
        let stored = try psql("SELECT count(*) FROM bare_item")
        guard stored == String(count) else { throw BenchError("the bare upload stored \(stored) rows of \(count)") }
        return seconds
    }

    /// Reads every page of the group's `Item` table and its indexes into the server's buffers
    /// (a sequential scan and an index-ordered one), so that neither side of the initial-sync
    /// row reads a cold table the other warmed.
    func warmItems() throws {
        let table = "\(SyncBenchmark.schema).\"Item\""
        try psql(
            """
            SET enable_seqscan = off; SELECT count(*) FROM (SELECT "_id" FROM \(table) ORDER BY "_id") AS ids;
            SET enable_seqscan = on; SELECT sum(length(name)) FROM \(table);
            """, timeout: .seconds(600))
    }

    /// The initial-sync baseline: the group's `Item` rows read with postgres-nio (one SELECT
    /// `ORDER BY "_id"` as the machine reads its snapshot's pages, streamed, binary results),
    /// inserted in that key order into a new SQLite file (the store's table layout: 16-byte ids,
    /// STRICT, WITHOUT ROWID, an index on `value`; WAL, synchronous=FULL, as the daemon's
    /// store) in one transaction, one prepared statement whose values are bound straight from
    /// the decoded row (no `Data` or argument array per row). Seconds from the connection on.
    func bareInitialSync(_ rows: Int, into path: String) async throws -> Double {
        var configuration = GRDB.Configuration()
        configuration.allowsUnsafeTransactions = true  // BEGIN and COMMIT in writes of their own
        configuration.journalMode = .wal
        configuration.prepareDatabase { db in try db.execute(sql: "PRAGMA synchronous = FULL") }
        let queue = try DatabaseQueue(path: path, configuration: configuration)
        try await queue.writeWithoutTransaction { db in
            try db.execute(
                sql: """
                    CREATE TABLE item (id BLOB PRIMARY KEY NOT NULL, name TEXT NOT NULL, value INTEGER NOT NULL, \
                    score REAL NOT NULL, flag INTEGER NOT NULL, created REAL NOT NULL) STRICT, WITHOUT ROWID;
                    CREATE INDEX item_value ON item (value);
                    """)
        }
        let start = Clock.now()
        let connection = try await connect()
        let copied: Int
        do {
            let result = try await connection.query(
                "SELECT \"_id\", name, value, score, flag, created FROM \(unescaped: SyncBenchmark.schema).\"Item\" ORDER BY \"_id\"",
                logger: logger)
            // The rows go to SQLite as they stream in, on this task (GRDB's write is a
            // synchronous call: the database queue's thread, one transaction for all).
            copied = try await Self.insert(result, into: queue)
        } catch {
            try? await connection.close()
            throw error
        }
        let seconds = Double(Clock.now() - start) / 1e9
        try await connection.close()
        try queue.close()
        guard copied == rows else { throw BenchError("the bare copy read \(copied) rows of \(rows)") }
        return seconds
    }

    /// Inserts the rows of `rows` into the `item` table of `queue`, 1,000 to a transaction's
    /// chunk, all in one transaction; how many.
    private static func insert(_ rows: PostgresRowSequence, into queue: DatabaseQueue) async throws -> Int {
        var chunk: [(UUID, String, Int, Double, Bool, Date)] = []
        chunk.reserveCapacity(1_000)
        var copied = 0
        try await queue.writeWithoutTransaction { db in try db.execute(sql: "BEGIN IMMEDIATE") }
        for try await row in rows.decode((UUID, String, Int, Double, Bool, Date).self) {
            chunk.append(row)
            if chunk.count == 1_000 {
                try await write(chunk, into: queue)
                copied += chunk.count
                chunk.removeAll(keepingCapacity: true)
            }
        }
        try await write(chunk, into: queue)
        copied += chunk.count
        try await queue.writeWithoutTransaction { db in try db.execute(sql: "COMMIT") }
        return copied
    }

    private static func write(_ rows: [(UUID, String, Int, Double, Bool, Date)], into queue: DatabaseQueue)
        async throws
    {
        guard !rows.isEmpty else { return }
        try await queue.writeWithoutTransaction { db in
            let statement = try db.cachedStatement(
                sql: "INSERT INTO item (id, name, value, score, flag, created) VALUES (?, ?, ?, ?, ?, ?)")
            let handle = statement.sqliteStatement
            for (id, name, value, score, flag, created) in rows {
                sqlite3_reset(handle)
                withUnsafeBytes(of: id.uuid) { bytes in
                    _ = sqlite3_bind_blob(handle, 1, bytes.baseAddress, 16, RawSQLite.transient)
                }
                _ = sqlite3_bind_text(handle, 2, name, -1, RawSQLite.transient)
                _ = sqlite3_bind_int64(handle, 3, Int64(value))
                _ = sqlite3_bind_double(handle, 4, score)
                _ = sqlite3_bind_int64(handle, 5, flag ? 1 : 0)
                _ = sqlite3_bind_double(handle, 6, created.timeIntervalSince1970)
                guard sqlite3_step(handle) == SQLITE_DONE else {
                    throw BenchError(
                        "the bare initial sync's insert failed: \(String(cString: sqlite3_errmsg(db.sqliteConnection)))"
                    )
                }
            }
        }
    }
}

/// The processor time, in seconds, of a PostgreSQL server: its postmaster (with its children
/// that have ended) and the children running now (backends, background workers), from /proc.
func serverCPUSeconds(_ postmaster: pid_t) -> Double {
    var ticks = 0
    for entry in (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? [] {
        guard let pid = Int32(entry), let text = try? String(contentsOfFile: "/proc/\(entry)/stat", encoding: .utf8),
            let close = text.lastIndex(of: ")")
        else { continue }
        // After "pid (comm) ": state ppid pgrp session tty tpgid flags minflt cminflt majflt
        // cmajflt utime stime cutime cstime …
        let fields = text[text.index(after: close)...].split(separator: " ")
        guard fields.count > 14, let parent = Int32(fields[1]), let user = Int(fields[11]),
            let system = Int(fields[12]),
            let childrenUser = Int(fields[13]), let childrenSystem = Int(fields[14])
        else { continue }
        if pid == postmaster {
            ticks += user + system + childrenUser + childrenSystem
        } else if parent == postmaster {
            ticks += user + system
        }
    }
    return Double(ticks) / Double(sysconf(Int32(_SC_CLK_TCK)))
}

/// Runs an async operation from this synchronous benchmark and waits for it.
func syncAwait<T: Sendable>(_ operation: @escaping @Sendable () async throws -> T) throws -> T {
    let done = DispatchSemaphore(value: 0)
    let box = UncheckedBox(SyncAwaitResult<T>())
    Task {
        do { box.value.result = .success(try await operation()) } catch { box.value.result = .failure(error) }
        done.signal()
    }
    done.wait()
    return try box.value.result!.get()
}

private final class SyncAwaitResult<T>: @unchecked Sendable {  // written before the semaphore's signal, read after
    var result: Result<T, any Error>?
}

/// A note on stderr (what the rows do not say: how long the set-up took, a cut-short run).
func note(_ message: String) {
    FileHandle.standardError.write(Data("skyros-bench sync: \(message)\n".utf8))
}

extension SyncBenchmark.VisibilityProbe {
    /// Samples until one arrives (everything connected and listening), then a few more.
    func warmUp(_ next: inout Int) throws {
        var seen = false
        for _ in 0..<60 where !seen {
            seen = try sample(next, timeout: warmUpTimeout) != nil
            next += 1
        }
        guard seen else { throw BenchError(silence) }
        for _ in 0..<5 {
            _ = try sample(next, timeout: SyncBenchmark.sampleTimeout)
            next += 1
        }
    }

    /// `samples` samples into `result`, with the server's CPU they took.
    func measure(samples: Int, next: inout Int, into result: inout SyncBenchmark.Visibility) throws {
        let before = postmaster.map(serverCPUSeconds) ?? 0
        for _ in 0..<samples {
            if let elapsed = try sample(next, timeout: SyncBenchmark.sampleTimeout) {
                result.samples.append(elapsed)
            } else {
                result.timeouts += 1
            }
            next += 1
            usleep(SyncBenchmark.pause)
        }
        result.serverCPU += (postmaster.map(serverCPUSeconds) ?? 0) - before
        result.saves += samples
    }
}

struct BenchError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
