import Foundation
import GRDBSQLite
import Skyros
import SkyrosDaemon
import SkyrosShared
import SkyrosWire

/// `skyros-bench contention`: 1, 4, 8 and 16 client processes each save one-object change
/// sets as fast as they can (each waits for its acknowledgement) for a fixed time, at
/// durability full, through one daemon (group commit). Baseline, in the same run: the same
/// number of processes inserting the same rows straight into one SQLite WAL file, one
/// transaction each, with a busy timeout.
///
/// A third figure, with `--ceiling`: the same processes through a bare group-commit server (a
/// ROUTER thread that inserts every request waiting in one transaction, raw SQLite, no Skyros
/// layers; our own ZMTP on both ends and the daemon's commit delay, ``BareServer``), the most
/// any daemon over ZeroMQ can give on this machine. The bare server's rate drifts by ±20% from
/// minute to minute on a small VM, so `--ceiling` also runs 8 clients through the daemon and
/// through the bare server in turn (each first in every other round), three rounds, and
/// reports the round with the median ratio.
///
/// The clients are this executable again, in the hidden roles `contention-client`,
/// `contention-direct` and `contention-bare`; each prints its number of saves and their latencies.
struct ContentionBenchmark {
    let directory: URL
    let seconds: Double
    var clientCounts = [1, 4, 8, 16]
    var ceiling = false

    func run(report: (Row) -> Void) throws {
        var rates: [Int: Double] = [:]
        for count in clientCounts {
            let skyros = try throughDaemon("contention-\(count)", count: count)
            let databasePath = directory.appendingPathComponent("direct-\(count).sqlite").path
            let setup = RawSQLite(path: databasePath)
            setup.createItemTable()
            let direct = try measure(role: "contention-direct", target: databasePath, count: count)
            rates[count] = skyros.rate
            report(
                Row(
                    name: "contention: \(count) clients, aggregate saves", unit: "saves/s",
                    skyros: skyros.rate, baseline: direct.rate))
            report(
                Row(
                    name: "contention: \(count) clients, save p99", unit: "us",
                    skyros: percentile(skyros.latencies, 99), baseline: percentile(direct.latencies, 99)))
            // Direct SQLite's latencies have a long tail past its p99, even past its p99.9 (SQLite's
            // busy handler sleeps 1, 2, 5, 10… ms while another process holds the write lock):
            // its mean shows it.
            report(
                Row(
                    name: "contention: \(count) clients, save p99.9", unit: "us",
                    skyros: percentile(skyros.latencies, 99.9), baseline: percentile(direct.latencies, 99.9)))
            report(
                Row(
                    name: "contention: \(count) clients, save mean", unit: "us",
                    skyros: mean(skyros.latencies), baseline: mean(direct.latencies)))
            if ceiling {
                let bare = try throughBare("bare-\(count)", count: count)
                report(
                    Row(
                        name: "contention: \(count) clients, bare group commit", unit: "saves/s",
                        skyros: bare.rate, baseline: direct.rate))
                // What the p99 target asks of any server: the bare one's p99 against direct SQLite's.
                report(
                    Row(
                        name: "contention: \(count) clients, bare group commit save p99", unit: "us",
                        skyros: percentile(bare.latencies, 99), baseline: percentile(direct.latencies, 99)))
            }
        }
        if let eight = rates[8], let one = rates[1] {
            report(
                Row(
                    name: "contention: 8 clients vs Skyros' own single-client rate", unit: "saves/s",
                    skyros: eight, baseline: one))
        }
        if ceiling {
            var rounds: [(skyros: Double, bare: Double)] = []
            for round in 0..<3 { rounds.append(try alternating(round: round, count: 8)) }
            let median = rounds.sorted { $0.skyros / $0.bare < $1.skyros / $1.bare }[1]
            report(
                Row(
                    name:
                        "contention: 8 clients vs the bare group commit, daemon and bare in turn (median of 3 rounds)",
                    unit: "saves/s", skyros: median.skyros, baseline: median.bare))
        }
    }

    /// One round of `count` clients through a new daemon and through a new bare server, back
    /// to back, the daemon first on even rounds and the bare server first on odd ones; their
    /// saves per second.
    private func alternating(round: Int, count: Int) throws -> (skyros: Double, bare: Double) {
        var skyros = Result(rate: 0, latencies: [])
        var bare = Result(rate: 0, latencies: [])
        try BatchBenchmark.inTurn(
            round,
            [
                { skyros = try throughDaemon("turn-\(round)", count: count) },
                { bare = try throughBare("turn-bare-\(round)", count: count) },
            ])
        FileHandle.standardError.write(
            Data(
                "round \(round + 1): daemon \(Int(skyros.rate)), bare \(Int(bare.rate)) saves/s, \(String(format: "%.2f", skyros.rate / bare.rate))×\n"
                    .utf8))
        return (skyros.rate, bare.rate)
    }

    /// `count` clients through a new daemon (durability full) in the folder `name`; with
    /// SKYROS_BENCH_CPU, its commits and event messages.
    private func throughDaemon(_ name: String, count: Int) throws -> Result {
        let folder = directory.appendingPathComponent(name)
        let daemon = try SharedBenchmark.Daemon(folder, durability: .full)
        // The store is made by a first hello, before the clients race.
        _ = try RemoteStore(schema: benchSchema, container: daemon.container)
        let result = try measure(role: "contention-client", target: folder.path, count: count)
        daemon.stop()
        if ProcessInfo.processInfo.environment["SKYROS_BENCH_CPU"] != nil {
            let statistics = daemon.server.statistics
            FileHandle.standardError.write(
                Data(
                    "daemon ×\(count): \(statistics.changeSets) change sets, \(statistics.commits) commits, \(statistics.publishes) event messages\n"
                        .utf8))
        }
        return result
    }

    /// `count` clients through a new bare group-commit server in the folder `name`; with
    /// SKYROS_BENCH_CPU, its commits.
    private func throughBare(_ name: String, count: Int) throws -> Result {
        let server = try BareServer(directory.appendingPathComponent(name), durability: .full, groupCommit: true)
        let result = try measure(role: "contention-bare", target: server.endpoint, count: count)
        server.stop()
        if ProcessInfo.processInfo.environment["SKYROS_BENCH_CPU"] != nil {
            FileHandle.standardError.write(
                Data("bare ×\(count): \(server.counts.saves) saves, \(server.counts.commits) commits\n".utf8))
        }
        return result
    }

    struct Result {
        var rate: Double
        var latencies: [Double]
    }

    /// Starts `count` processes in `role`, lets them go together, and sums what they report.
    private func measure(role: String, target: String, count: Int) throws -> Result {
        let go = directory.appendingPathComponent("go-\(role)-\(count)").path
        var cpuBefore = (0.0, 0.0)
        let outputs = try FloodBenchmark.launch(
            Array(repeating: role, count: count), target: target, go: go, seconds: seconds
        ) {
            cpuBefore = (Self.cpuSeconds(RUSAGE_SELF.rawValue), Self.cpuSeconds(RUSAGE_CHILDREN.rawValue))
        }
        var result = Result(rate: 0, latencies: [])
        var loopCPU = 0.0
        for output in outputs {
            loopCPU += FloodBenchmark.numbers(after: "CPU ", in: output).first ?? 0
            // A client that reports nothing fails the run: dropping it would flatter the rate.
            let numbers = try FloodBenchmark.reported(after: "RESULT ", in: output, by: role)
            let saves = numbers[0]
            result.rate += saves / seconds
            result.latencies += numbers.dropFirst()
        }
        if ProcessInfo.processInfo.environment["SKYROS_BENCH_CPU"] != nil {
            let saves = result.rate * seconds
            let daemon = (Self.cpuSeconds(RUSAGE_SELF.rawValue) - cpuBefore.0) / saves * 1e6
            let clients = (Self.cpuSeconds(RUSAGE_CHILDREN.rawValue) - cpuBefore.1) / saves * 1e6
            FileHandle.standardError.write(
                Data(
                    "\(role) ×\(count): CPU per save: this process \(Int(daemon)) µs, clients \(Int(clients)) µs (\(Int(loopCPU / saves * 1e6)) µs in the loop, without start-up)\n"
                        .utf8))
        }
        return result
    }

    private func mean(_ samples: [Double]) -> Double {
        samples.isEmpty ? 0 : samples.reduce(0, +) / Double(samples.count)
    }

    private static func cpuSeconds(_ who: __rusage_who_t) -> Double {
        var usage = rusage()
        getrusage(who, &usage)
        return Double(usage.ru_utime.tv_sec + usage.ru_stime.tv_sec)
            + Double(usage.ru_utime.tv_usec + usage.ru_stime.tv_usec) / 1e6
    }

    /// Waits for the go file (30 s at most).
    static func waitForGo(_ path: String) {
        let deadline = Date().addingTimeInterval(30)
        while !FileManager.default.fileExists(atPath: path) && Date() < deadline { usleep(1_000) }
    }

    /// A client process's part: says it is ready, waits for the go, then saves one at a time
    /// for `seconds`, and prints how many saves it made and the latency of each.
    static func saveLoop(go: String, seconds: Double, _ save: (Int) throws -> Void) rethrows {
        print("READY")
        fflush(nil)
        waitForGo(go)
        let cpuAtGo = processCPUSeconds()
        var latencies: [Double] = []
        let end = Clock.now() + UInt64(seconds * 1e9)
        var index = 0
        while Clock.now() < end {
            let start = Clock.now()
            try save(index)
            latencies.append(Double(Clock.now() - start) / 1000)
            index += 1
        }
        // The processor time of the loop alone (all threads: the event thread's merges too),
        // without the process's start-up (SKYROS_BENCH_CPU's "in the loop" figure).
        print("CPU \(processCPUSeconds() - cpuAtGo)")
        print("RESULT \(latencies.count) " + latencies.map { String(Int($0)) }.joined(separator: " "))
    }

    /// This process's user and system time so far, every thread, in seconds.
    static func processCPUSeconds() -> Double { cpuSeconds(RUSAGE_SELF.rawValue) }

    /// A client of the daemon: one-object writes, each waited for with `writeAndWait` (the
    /// API for a thread that waits for durability); with SKYROS_BENCH_WRITESYNC set, with
    /// `writeSync` and a semaphore signalled by its completion (two more thread hops a save).
    static func client(container: String, go: String, seconds: Double) throws {
        let store = try Skyros(sharedStack: benchSchema, container: URL(fileURLWithPath: container), timeout: 30)
        if ProcessInfo.processInfo.environment["SKYROS_BENCH_WRITESYNC"] != nil {
            let done = DispatchSemaphore(value: 0)
            saveLoop(go: go, seconds: seconds) { index in
                store.writeSync(
                    { context in Item.create(in: context).value = index }, completion: { _ in done.signal() })
                done.wait()
            }
            return
        }
        try saveLoop(go: go, seconds: seconds) { index in
            try store.writeAndWait { context in Item.create(in: context).value = index }
        }
    }

    /// A client of the bare group-commit server: one request at a time, each waited for.
    static func bare(endpoint: String, go: String, seconds: Double) throws {
        let client = try BareClient(endpoint: endpoint, timeoutMilliseconds: 10_000)
        try saveLoop(go: go, seconds: seconds) { index in try client.roundTrip(index) }
        client.close()
    }

    /// A process writing straight into the shared SQLite file: one transaction per row.
    static func direct(database: String, go: String, seconds: Double) {
        let raw = RawSQLite(path: database)
        sqlite3_busy_timeout(raw.db, 10_000)
        let statement = raw.prepare(RawSQLite.insertItemSQL)
        saveLoop(go: go, seconds: seconds) { index in
            raw.execute("BEGIN IMMEDIATE")
            sqlite3_reset(statement)
            // The same time-ordered (version 7) keys as Skyros' objects: random v4 keys would
            // scatter the WITHOUT ROWID table's inserts over its B-tree and flatter Skyros.
            var id = ObjectID.make(entityName: "Item").uuid.uuid
            _ = withUnsafeBytes(of: &id) { sqlite3_bind_blob(statement, 1, $0.baseAddress, 16, RawSQLite.transient) }
            raw.bind(statement, 2, "item \(index)")
            sqlite3_bind_int64(statement, 3, Int64(index % 100))
            sqlite3_bind_double(statement, 4, Double(index) * 0.5)
            sqlite3_bind_int64(statement, 5, 1)
            sqlite3_bind_double(statement, 6, Double(index))
            raw.step(statement)
            raw.execute("COMMIT")
        }
        sqlite3_finalize(statement)
    }
}
