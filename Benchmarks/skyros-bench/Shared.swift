import Foundation
import GRDBSQLite
import Skyros
import SkyrosDaemon
import SkyrosShared
import SkyrosWire
import SkyrosZeroMQ

/// `skyros-bench shared`: the shared stack through the daemon's code (run on a thread of this
/// process, over real ipc:// sockets), against a bare ZeroMQ request/reply loop writing one
/// SQLite row per request, measured in the same run.
struct SharedBenchmark {
    let directory: URL
    let saveSamples: Int
    let insertCount: Int

    final class Daemon: Sendable {
        let server: DaemonServer.Handle
        let container: GroupContainer
        init(_ path: URL, durability: Durability) throws {
            container = GroupContainer(url: path)
            server = try DaemonServer.detached(
                configuration: .init(container: container, durability: durability), pollInterval: 50)
        }
        func stop() {
            server.stop()
            _ = server.waitUntilFinished(timeout: .never)
        }
    }

    func run(report: (Row) -> Void) throws {
        var bareFull: [Double] = []
        var bareNormal: [Double] = []
        for durability in [Durability.full, .normal] {
            let (skyros, waited, unique, baseline) = try saves(durability)
            if durability == .full { bareFull = baseline } else { bareNormal = baseline }
            report(
                Row(
                    name: "one-object save through the daemon p50 (\(durability.rawValue))", unit: "us",
                    skyros: percentile(skyros, 50), baseline: percentile(baseline, 50)))
            report(
                Row(
                    name: "one-object save through the daemon p99 (\(durability.rawValue))", unit: "us",
                    skyros: percentile(skyros, 99), baseline: percentile(baseline, 99)))
            report(
                Row(
                    name: "one-object writeAndWait through the daemon p50 (\(durability.rawValue))", unit: "us",
                    skyros: percentile(waited, 50), baseline: percentile(baseline, 50)))
            report(
                Row(
                    name: "one-object writeAndWait through the daemon p99 (\(durability.rawValue))", unit: "us",
                    skyros: percentile(waited, 99), baseline: percentile(baseline, 99)))
            report(
                Row(
                    name: "one-object writeAndWait with a unique attribute p50 (\(durability.rawValue))", unit: "us",
                    skyros: percentile(unique, 50), baseline: percentile(baseline, 50)))
        }
        // Baseline: the bare commit-and-reply round trip of the same run at the same
        // durability, the least any "saved here, known there" can take (a change is published
        // once it is durable). The target is an absolute 1 ms.
        for (durability, bare) in [(Durability.full, bareFull), (.normal, bareNormal)] {
            let (visibility, byID, timeouts) = try crossClientVisibility(durability)
            // A sample that timed out is no figure; it is counted here rather than dropped unseen.
            report(
                Row(
                    name:
                        "visibility: saves B did not see within 5 s (\(durability.rawValue); of \(min(saveSamples, 200)))",
                    unit: "saves",
                    skyros: Double(timeouts), baseline: 0))
            report(
                Row(
                    name: "visibility: A saves, B reads it by ID from the change p50 (\(durability.rawValue))",
                    unit: "us",
                    skyros: percentile(byID, 50), baseline: percentile(bare, 50)))
            report(
                Row(
                    name: "visibility: A saves, B reads it by ID from the change p99 (\(durability.rawValue))",
                    unit: "us",
                    skyros: percentile(byID, 99), baseline: percentile(bare, 99)))
            report(
                Row(
                    name: "visibility: A saves, B's main context has it p50 (\(durability.rawValue))", unit: "us",
                    skyros: percentile(visibility, 50), baseline: percentile(bare, 50)))
            report(
                Row(
                    name: "visibility: A saves, B's main context has it p99 (\(durability.rawValue))", unit: "us",
                    skyros: percentile(visibility, 99), baseline: percentile(bare, 99)))
        }
        // Three rounds, each timing both sides back to back; the round with the median ratio.
        var rounds: [(shared: Double, embedded: Double)] = []
        for round in 0..<3 { rounds.append(try bulkInsert(round)) }
        let (shared, embedded) = rounds.sorted { $0.embedded / $0.shared < $1.embedded / $1.shared }[1]
        report(
            Row(
                name:
                    "insert \(insertCount) objects in one write through the daemon (baseline: the embedded stack, not raw SQLite)",
                unit: "objects/s",
                skyros: Double(insertCount) / shared, baseline: Double(insertCount) / embedded))
    }

    /// Skyros: writeSync of one object until its completion, and writeAndWait of one object
    /// (the same save, with no hop to the root's queue and back). Baseline: a DEALER sends a
    /// request, a ROUTER thread inserts one row in its own transaction and replies. The three
    /// take turns, sample by sample.
    private func saves(_ durability: Durability) throws -> ([Double], [Double], [Double], [Double]) {
        let daemon = try Daemon(directory.appendingPathComponent("s-\(durability.rawValue)"), durability: durability)
        defer { daemon.stop() }
        let store = try Skyros(sharedStack: benchSchema, container: daemon.container.url)
        let server = try BareServer(
            directory.appendingPathComponent("bare-\(durability.rawValue)"), durability: durability)
        let baseline = try BareClient(endpoint: server.endpoint, timeoutMilliseconds: 5_000)
        defer {
            server.stop()
            baseline.close()
        }
        let done = DispatchSemaphore(value: 0)
        var skyros: [Double] = []
        var waited: [Double] = []
        var unique: [Double] = []
        var bare: [Double] = []
        for index in 0..<saveSamples {
            var start = Clock.now()
            store.writeSync({ context in Item.create(in: context).value = index }, completion: { _ in done.signal() })
            done.wait()
            skyros.append(Double(Clock.now() - start) / 1000)
            start = Clock.now()
            try store.writeAndWait { context in Item.create(in: context).value = -index }
            waited.append(Double(Clock.now() - start) / 1000)
            start = Clock.now()
            try store.writeAndWait { context in Account.create(in: context).handle = "a\(index)" }
            unique.append(Double(Clock.now() - start) / 1000)
            start = Clock.now()
            try baseline.roundTrip(index)
            bare.append(Double(Clock.now() - start) / 1000)
        }
        return (skyros, waited, unique, bare)
    }

    /// Client A saves (`writeAndWait`: its request leaves from this thread); client B (its own
    /// connection to the daemon) reacts to the change as an app would, in a task iterating
    /// `changes`, and reads the new value from its main context: the time is taken there,
    /// once reading the object by the ID the change names (its values came with the event:
    /// no request), then fetching it by value (a request to the daemon).
    private func crossClientVisibility(_ durability: Durability) throws -> (
        fetched: [Double], byID: [Double], timeouts: Int
    ) {
        let daemon = try Daemon(directory.appendingPathComponent("v-\(durability.rawValue)"), durability: durability)
        defer { daemon.stop() }
        let a = try Skyros(sharedStack: benchSchema, container: daemon.container.url)
        let b = try Skyros(sharedStack: benchSchema, container: daemon.container.url)
        let seen = DispatchSemaphore(value: 0)
        let expected = Expected()
        let watcher = Task {
            for await change in b.changes {
                guard let wanted = expected.value else { continue }
                if let id = change.inserted.first?.id, Self.value(of: id, in: b) == wanted {
                    expected.foundByID(at: Clock.now())
                }
                if Self.value(wanted, in: b) == wanted { expected.found(at: Clock.now()) }
                seen.signal()
            }
        }
        defer { watcher.cancel() }
        var samples: [Double] = []
        var byID: [Double] = []
        var timeouts = 0
        for index in 0..<min(saveSamples, 200) {
            expected.expect(index)
            let start = Clock.now()
            try a.writeAndWait { context in Item.create(in: context).value = index }
            guard seen.wait(timeout: .now() + 5) == .success, let end = expected.foundAt else {
                timeouts += 1
                continue
            }
            samples.append(Double(end - start) / 1000)
            if let found = expected.foundByIDAt { byID.append(Double(found - start) / 1000) }
        }
        return (samples, byID, timeouts)
    }

    /// The `value` of the item with this ID in a stack's main context (-1 when there is none).
    private static func value(of id: ObjectID, in store: Skyros) -> Int {
        var value = -1
        store.read { context in value = context.object(with: id, as: Item.self)?.value ?? -1 }
        return value
    }

    /// The `value` of the item with this value in a stack's main context, read there
    /// synchronously (-1 when there is none).
    private static func value(_ wanted: Int, in store: Skyros) -> Int {
        var value = -1
        store.read { context in
            value = try Item.first(where: #Predicate { $0.value == wanted }, in: context)?.value ?? -1
        }
        return value
    }

    /// The value client B waits for, and when it found it.
    private final class Expected: @unchecked Sendable {
        private let lock = NSLock()
        private var wanted: Int?
        private var at: UInt64?
        private var byIDAt: UInt64?
        var value: Int? { lock.withLock { wanted } }
        var foundAt: UInt64? { lock.withLock { at } }
        var foundByIDAt: UInt64? { lock.withLock { byIDAt } }
        func expect(_ value: Int) { lock.withLock { (wanted, at, byIDAt) = (value, nil, nil) } }
        func found(at time: UInt64) { lock.withLock { at = time } }
        func foundByID(at time: UInt64) { lock.withLock { byIDAt = time } }
    }

    /// One write of `insertCount` objects through the daemon, and through the embedded stack,
    /// each into a new store; the seconds each took.
    private func bulkInsert(_ round: Int) throws -> (shared: Double, embedded: Double) {
        func timeInsert(_ store: Skyros) -> Double {
            let done = DispatchSemaphore(value: 0)
            return Clock.seconds {
                store.writeSync(
                    { context in
                        for index in 0..<insertCount { Item.create(in: context).value = index }
                    }, completion: { _ in done.signal() })
                done.wait()
            }
        }
        let daemon = try Daemon(directory.appendingPathComponent("b\(round)"), durability: .full)
        defer { daemon.stop() }
        let shared = timeInsert(try Skyros(sharedStack: benchSchema, container: daemon.container.url, timeout: 60))
        let embedded = timeInsert(
            try Skyros(sqliteStack: benchSchema, at: directory.appendingPathComponent("embedded-\(round).sqlite")))
        return (shared, embedded)
    }
}

/// The baseline server, with no Skyros layer: a ROUTER thread that inserts one SQLite row
/// per request in its own transaction and replies; with `groupCommit`, it takes every request
/// waiting and inserts their rows in one transaction (the contention benchmark's ceiling).
///
/// It is given what the daemon has: our own ZMTP (``ZMTPServer``, which reads and writes its
/// connections on the serving thread, where libzmq's I/O thread would wake twice a request)
/// and, with `groupCommit`, the daemon's wait for the saves of clients that save in turn
/// (``CommitDelay``, of the same default length), so that it pays no more WAL syncs a save
/// than the daemon does.
final class BareServer: @unchecked Sendable {
    let endpoint: String
    private let stopped = NSLock()
    private var isStopped = false
    private let finished = DispatchSemaphore(value: 0)
    /// Transactions committed and requests answered (SKYROS_BENCH_CPU's report of batch sizes).
    private var commits = 0
    private var saves = 0
    var counts: (commits: Int, saves: Int) { stopped.withLock { (commits, saves) } }

    init(_ folder: URL, durability: Durability, groupCommit: Bool = false) throws {
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        endpoint = "ipc://" + folder.appendingPathComponent("bare.ipc").path
        let server = try ZMTPServer(maximumMessageSize: 1 << 20, highWaterMark: 1_000)
        try server.listen(.router, endpoint: endpoint)
        let raw = RawSQLite(
            path: folder.appendingPathComponent("bare.sqlite").path,
            synchronous: durability == .full ? "FULL" : "NORMAL")
        raw.createItemTable()
        let box = UncheckedBox((server, raw))
        Thread.detachNewThread { [self] in
            let (server, raw) = box.value
            let statement = raw.prepare(RawSQLite.insertItemSQL)
            var delay = CommitDelay(
                maximum: groupCommit ? .microseconds(Int(DaemonServer.Configuration.defaultCommitDelay * 1e6)) : .zero)
            var next = 0  // the rows' numbers: clients in other processes send the same indexes
            var batch: [Data] = []  // the requesters' identities
            func take() {
                while batch.isEmpty || groupCommit, let message = server.receive() {
                    if message.frames.count == 2 { batch.append(message.frames[0]) }
                }
            }
            while !stopped.withLock({ isStopped }) {
                guard server.wait(orDescriptor: -1, milliseconds: 50).socket else { continue }
                take()
                guard !batch.isEmpty else { continue }
                // The daemon's wait for the clients that saved together in the last commits.
                if let wait = delay.wait(connections: Set(batch).count, now: .now) {
                    while wait.goesOn(connections: Set(batch).count, now: .now) {
                        let left = Int((wait.deadline - ContinuousClock.now) / .microseconds(1))
                        guard left > 0 else { break }
                        guard server.waitBriefly(microseconds: left).socket else { continue }
                        take()
                    }
                }
                delay.collected(connections: Set(batch).count)
                raw.execute("BEGIN IMMEDIATE")
                for _ in batch {
                    raw.insertItem(statement, next)
                    next += 1
                }
                raw.execute("COMMIT")
                stopped.withLock {
                    commits += 1
                    saves += batch.count
                }
                for identity in batch { _ = server.send(to: identity, Data("ok".utf8)) }
                delay.committed(at: .now)
                batch.removeAll(keepingCapacity: true)
            }
            sqlite3_finalize(statement)
            server.close()
            // Closed before `stop()` returns: the run's folder is removed after it, and the
            // files SQLite deletes at close vanished under that removal (the folder was left).
            raw.close()
            finished.signal()
        }
    }

    func stop() {
        stopped.withLock { isStopped = true }
        finished.wait()
    }
}

/// A client of a ``BareServer``: a DEALER (our own ZMTP, ``ZMTPSocket``, as the Skyros
/// client's) that sends one request and waits for its reply.
final class BareClient {
    private let socket: ZMTPSocket
    private let timeoutMilliseconds: Int

    init(endpoint: String, timeoutMilliseconds: Int32) throws {
        socket = try ZMTPSocket(kind: .dealer, endpoint: endpoint, maximumMessageSize: 1 << 20)
        self.timeoutMilliseconds = Int(timeoutMilliseconds)
    }

    func roundTrip(_ index: Int) throws {
        guard socket.send([withUnsafeBytes(of: index) { Data($0) }]) else {
            throw BenchError("the bare client's request was not queued")
        }
        guard socket.waitForInput(milliseconds: timeoutMilliseconds), socket.receive() != nil else {
            throw BenchError("the bare server did not answer within \(timeoutMilliseconds) ms")
        }
    }

    func close() { socket.close() }
}

struct UncheckedBox<T>: @unchecked Sendable {
    let value: T
    init(_ value: T) { self.value = value }
}
