import Foundation
import GRDB
import Skyros
import SkyrosDaemon
import SkyrosShared
import SkyrosWire

/// `skyros-bench observe`: a fetched-results controller following changes, beside GRDB's
/// `ValueObservation` of the same query in the same run, and another process's save reaching a
/// controller beside the bare commit round trip.
struct ObserveBenchmark {
    let directory: URL
    let sizes: [Int]
    let samples: Int

    func run(report: (Row) -> Void) throws {
        for size in sizes {
            let (work, endToEnd) = try controller(size)
            let grdb = try valueObservation(size)
            report(
                Row(
                    name: "controller: a change delivered over \(size / 1000)k results p50", unit: "us",
                    skyros: percentile(work, 50), baseline: percentile(grdb, 50)))
            report(
                Row(
                    name: "controller: a change delivered over \(size / 1000)k results p99", unit: "us",
                    skyros: percentile(work, 99), baseline: percentile(grdb, 99)))
            report(
                Row(
                    name: "controller: write → onChange over \(size / 1000)k results p50", unit: "us",
                    skyros: percentile(endToEnd, 50), baseline: percentile(grdb, 50)))
        }
        for durability in [Durability.full, .normal] {
            let (visible, bare) = try acrossStacks(durability)
            report(
                Row(
                    name: "controller: another client's insert in onChange p50 (\(durability.rawValue))", unit: "us",
                    skyros: percentile(visible, 50), baseline: percentile(bare, 50)))
            report(
                Row(
                    name: "controller: another client's insert in onChange p99 (\(durability.rawValue))", unit: "us",
                    skyros: percentile(visible, 99), baseline: percentile(bare, 99)))
        }
    }

    /// The cycle of changes each sample makes: an insert, an update in place, a move across
    /// the sort, a deletion.
    static func change(_ index: Int, _ context: ObjectContext, _ held: inout [ObjectID]) throws {
        switch index % 4 {
        case 0:
            let item = Item.create(in: context)
            item.name = "n\(UInt32.random(in: 0...UInt32.max))"
            item.value = index
            held.append(item.objectID)
        case 1:
            (context.object(with: held[held.count - 1]) as? Item)?.score = Double(index)
        case 2:
            (context.object(with: held[held.count - 1]) as? Item)?.name = "n\(UInt32.random(in: 0...UInt32.max))"
        default:
            if let object = context.object(with: held.removeLast()) { context.delete(object) }
        }
    }

    /// A controller over `size` items in a SQLite stack. Returns the controller's own work
    /// per change (from the main context's did-change to `onChange`) and the time from the
    /// start of the write to `onChange`.
    private func controller(_ size: Int) throws -> (work: [Double], endToEnd: [Double]) {
        let url = directory.appendingPathComponent("observe-\(size).sqlite")
        let store = try Skyros(sqliteStack: benchSchema, at: url, durability: .normal, savesOnStop: false)
        try store.writeAndWait { context in
            for index in 0..<size {
                let item = Item.create(in: context)
                item.name = "n\(UInt32.random(in: 0...UInt32.max))"
                item.value = index
            }
        }
        let main = store.mainContext
        let controller = FetchedResultsController<Item>(
            fetch: FetchDescriptor(predicate: #Predicate { $0.value >= 0 }, sortBy: [SortDescriptor(\.name)]),
            context: main)
        // Observers are called in the order they were added: this one sees the change first.
        let received = Locked()
        let delivered = Locked()
        let first = main.addChangeObserver { _ in received.set(Clock.now(), count: 0) }
        defer { first.cancel() }
        controller.onChange = { _ in delivered.set(Clock.now(), count: 0) }
        try controller.performFetch()
        var work: [Double] = []
        var endToEnd: [Double] = []
        var held: [ObjectID] = []
        for index in 0..<samples {
            delivered.set(0, count: 0)
            let start = Clock.now()
            try store.writeAndWait { context in try Self.change(index, context, &held) }
            guard delivered.time > 0 else { continue }
            work.append(Double(delivered.time - received.time) / 1000)
            endToEnd.append(Double(delivered.time - start) / 1000)
        }
        precondition(controller.fetchedObjects.count == size, "the controller lost track")
        return (work, endToEnd)
    }

    /// GRDB's ValueObservation of the same query over `size` rows: from the start of a write
    /// (one row inserted, updated or deleted, as above) to the observation's new value.
    private func valueObservation(_ size: Int) throws -> [Double] {
        var configuration = Configuration()
        configuration.prepareDatabase { db in try db.execute(sql: "PRAGMA synchronous = NORMAL") }
        let pool = try DatabasePool(
            path: directory.appendingPathComponent("grdb-\(size).sqlite").path, configuration: configuration)
        try pool.write { db in
            try db.execute(
                sql:
                    "CREATE TABLE item (id INTEGER PRIMARY KEY, name TEXT NOT NULL, value INTEGER NOT NULL, score REAL NOT NULL)"
            )
            let statement = try db.makeStatement(sql: "INSERT INTO item (name, value, score) VALUES (?, ?, 0)")
            for index in 0..<size {
                try statement.execute(arguments: ["n\(UInt32.random(in: 0...UInt32.max))", index])
            }
        }
        let observation = ValueObservation.tracking { db in
            try ItemRecord.fetchAll(db, sql: "SELECT * FROM item WHERE value >= 0 ORDER BY name")
        }
        let changed = DispatchSemaphore(value: 0)
        let queue = DispatchQueue(label: "grdb-observer")
        let delivered = UncheckedBox(Locked())
        let cancellable = observation.start(
            in: pool, scheduling: .async(onQueue: queue), onError: { fatalError("\($0)") },
            onChange: { rows in
                delivered.value.set(Clock.now(), count: rows.count)
                changed.signal()
            })
        defer { cancellable.cancel() }
        changed.wait()  // the initial value
        var samples: [Double] = []
        var last: Int64 = 0
        for index in 0..<self.samples {
            while changed.wait(timeout: .now()) == .success {}  // values of earlier writes
            let start = Clock.now()
            try pool.write { db in
                switch index % 4 {
                case 0:
                    try db.execute(
                        sql: "INSERT INTO item (name, value, score) VALUES (?, ?, 0)",
                        arguments: ["n\(UInt32.random(in: 0...UInt32.max))", index])
                    last = db.lastInsertedRowID
                case 1: try db.execute(sql: "UPDATE item SET score = ? WHERE id = ?", arguments: [Double(index), last])
                case 2:
                    try db.execute(
                        sql: "UPDATE item SET name = ? WHERE id = ?",
                        arguments: ["n\(UInt32.random(in: 0...UInt32.max))", last])
                default: try db.execute(sql: "DELETE FROM item WHERE id = ?", arguments: [last])
                }
            }
            guard changed.wait(timeout: .now() + 10) == .success, delivered.value.time > start else { continue }
            samples.append(Double(delivered.value.time - start) / 1000)
        }
        return samples
    }

    /// Client A saves one new object (`writeAndWait`); client B's controller has it in
    /// `onChange`. Baseline: the bare commit-and-reply round trip at the same durability.
    /// (Inserts only: an update or a deletion in A's write block would first load the object
    /// there, a round trip of A's own that is not the save's.)
    private func acrossStacks(_ durability: Durability) throws -> (visible: [Double], bare: [Double]) {
        let daemon = try SharedBenchmark.Daemon(
            directory.appendingPathComponent("o-\(durability.rawValue)"), durability: durability)
        defer { daemon.stop() }
        let a = try Skyros(sharedStack: benchSchema, container: daemon.container.url, savesOnStop: false)
        let b = try Skyros(sharedStack: benchSchema, container: daemon.container.url, savesOnStop: false)
        try a.writeAndWait { context in
            for index in 0..<1_000 {
                let item = Item.create(in: context)
                item.name = "n\(UInt32.random(in: 0...UInt32.max))"
                item.value = index
            }
        }
        let controller = FetchedResultsController<Item>(
            fetch: FetchDescriptor(predicate: #Predicate { $0.value >= 0 }, sortBy: [SortDescriptor(\.name)]),
            context: b.mainContext)
        let seen = DispatchSemaphore(value: 0)
        let delivered = UncheckedBox(Locked())
        controller.onChange = { changes in
            delivered.value.set(Clock.now(), count: changes.objects.count)
            seen.signal()
        }
        // Wait until B has A's first thousand (they may still be arriving as a change).
        var ready = false
        for _ in 0..<500 where !ready {
            try controller.performFetch()
            ready = controller.fetchedObjects.count == 1_000
            if !ready { usleep(10_000) }
        }
        while seen.wait(timeout: .now()) == .success {}
        let server = try BareServer(
            directory.appendingPathComponent("obare-\(durability.rawValue)"), durability: durability)
        let bareClient = try BareClient(endpoint: server.endpoint, timeoutMilliseconds: 5_000)
        defer {
            server.stop()
            bareClient.close()
        }
        var visible: [Double] = []
        var bare: [Double] = []
        for index in 0..<min(samples, 400) {
            while seen.wait(timeout: .now()) == .success {}  // late calls of earlier samples
            let start = Clock.now()
            try a.writeAndWait { context in
                let item = Item.create(in: context)
                item.name = "n\(UInt32.random(in: 0...UInt32.max))"
                item.value = index
            }
            if seen.wait(timeout: .now() + 5) == .success, delivered.value.time > start {
                visible.append(Double(delivered.value.time - start) / 1000)
            }
            let bareStart = Clock.now()
            try bareClient.roundTrip(index)
            bare.append(Double(Clock.now() - bareStart) / 1000)
        }
        return (visible, bare)
    }

    /// A time and a count, set on one thread and read on another.
    final class Locked: @unchecked Sendable {
        private let lock = NSLock()
        private var _time: UInt64 = 0
        var time: UInt64 { lock.withLock { _time } }
        func set(_ time: UInt64, count: Int) { lock.withLock { _time = time } }
    }
}

/// A hand-written GRDB record of the item table (what a GRDB user would observe).
struct ItemRecord: FetchableRecord, Sendable {
    var id: Int64
    var name: String
    var value: Int
    var score: Double

    init(row: GRDB.Row) throws {
        id = row[0]
        name = row[1]
        value = row[2]
        score = row[3]
    }
}
