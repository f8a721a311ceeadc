// skyros-bench: Skyros side by side with raw SQLite, measured in the same run.
//
//     swift run -c release skyros-bench embedded [--json] [--quick] [--only fetch|saves|iterate]
//     swift run -c release skyros-bench shared [--json] [--quick]
//     swift run -c release skyros-bench contention [--json] [--quick] [--clients N …]
//
// Prints a table, or with --json one object per line:
// {"name": …, "unit": …, "skyros": …, "baseline": …, "ratio": …} (ratio = skyros ÷ baseline).
import Foundation
import Skyros

let arguments = Array(CommandLine.arguments.dropFirst())
// Hidden roles: the client processes of the contention benchmark.
if arguments.count == 4, let seconds = Double(arguments[3]) {
    switch arguments[0] {
    case "contention-client":
        try ContentionBenchmark.client(container: arguments[1], go: arguments[2], seconds: seconds)
        exit(0)
    case "contention-direct":
        ContentionBenchmark.direct(database: arguments[1], go: arguments[2], seconds: seconds)
        exit(0)
    default:
        break
    }
}
// Hidden: `profile-insert`, inserts of 100,000 objects in one write, to run under a profiler.
if arguments.first == "profile-insert" {
    let rounds = Int(ProcessInfo.processInfo.environment["SKYROS_PROFILE_ROUNDS"] ?? "") ?? 5
    var seconds = 0.0
    for round in 0..<rounds {
        let url = FileManager.default.temporaryDirectory.appendingPathComponent("skyros-profile-\(getpid())-\(round).sqlite")
        defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: url.path + suffix) } }
        let store = try Skyros(sqliteStack: benchSchema, at: url)
        let done = DispatchSemaphore(value: 0)
        seconds += Clock.seconds {
            store.writeSync({ context in
                for index in 0..<100_000 {
                    let item = Item.create(in: context)
                    item.name = "item \(index)"
                    item.value = index % 100
                    item.score = Double(index) * 0.5
                    item.flag = index % 2 == 0
                    item.created = Date(timeIntervalSince1970: Double(index))
                }
            }, completion: { _ in done.signal() })
            done.wait()
        }
    }
    print("insert: \(Int(Double(rounds * 100_000) / seconds)) objects/s")
    exit(0)
}
// Hidden: `profile-fetch`, a loop of "fetch all" to run under a profiler.
if arguments.first == "profile-fetch" {
    let url = FileManager.default.temporaryDirectory.appendingPathComponent("skyros-profile-\(getpid()).sqlite")
    defer { for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: url.path + suffix) } }
    let store = try Skyros(sqliteStack: benchSchema, at: url)
    store.writeSync { context in for index in 0..<100_000 { Item.create(in: context).value = index } }
    _ = store.flush()
    var total = 0
    let rounds = Int(ProcessInfo.processInfo.environment["SKYROS_PROFILE_ROUNDS"] ?? "") ?? 20
    // Each reader is timed while it reads, and deallocated outside the timing, as in the benchmark.
    func timed(_ body: (ObjectContext) throws -> Void) -> Double {
        var seconds = 0.0
        for _ in 0..<rounds {
            let reader = try! Skyros(sqliteStack: benchSchema, at: url)
            seconds += Clock.seconds { reader.read { context in try body(context) } }
        }
        return seconds
    }
    let all = timed { context in
        for item in try Item.all(in: context) {
            total += item.value + item.name.utf8.count + (item.flag ? 1 : 0) + Int(item.score) + Int(item.created.timeIntervalSince1970)
        }
    }
    let unread = timed { context in total += try Item.all(in: context).count }
    let ids = timed { context in total += try context.fetchIdentifiers(FetchDescriptor<Item>()).count }
    let rawStore = try SQLiteStore(schema: benchSchema, url: url)
    let rows = Clock.seconds {
        for _ in 0..<rounds { try! rawStore.forEachSnapshot(StoreRequest(entityName: "Item")) { _, values, _ in total += values.count } }
    }
    for (name, seconds) in [("fetch all, read every attribute", all), ("fetch all, read nothing", unread),
                            ("identifiers only", ids), ("store rows only", rows)] {
        let objects = Double(rounds * 100_000)
        print("\(name): \(Int(objects / seconds)) /s, \(Int(seconds / objects * 1e9)) ns each")
    }
    print(total)
    exit(0)
}
let json = arguments.contains("--json")
let quick = arguments.contains("--quick")
guard let suite = arguments.first, ["embedded", "shared", "contention"].contains(suite) else {
    FileHandle.standardError.write(
        Data("usage: skyros-bench embedded|shared|contention [--json] [--quick] [--only fetch|saves|iterate]\n".utf8))
    exit(64)
}

let directory = FileManager.default.temporaryDirectory.appendingPathComponent("skyros-bench-\(getpid())")
try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
defer { try? FileManager.default.removeItem(at: directory) }

if !json {
    print("benchmark".padding(toLength: 52, withPad: " ", startingAt: 0), "unit".padding(toLength: 10, withPad: " ", startingAt: 0),
          "skyros".padding(toLength: 14, withPad: " ", startingAt: 0), "baseline".padding(toLength: 14, withPad: " ", startingAt: 0), "ratio")
}
let encoder = JSONEncoder()
encoder.outputFormatting = [.sortedKeys]
let report: (Row) -> Void = { row in
    if json {
        print(String(decoding: try! encoder.encode(row), as: UTF8.self))
    } else {
        print(row.name.padding(toLength: 52, withPad: " ", startingAt: 0), row.unit.padding(toLength: 10, withPad: " ", startingAt: 0),
              String(format: "%-14.1f", row.skyros), String(format: "%-14.1f", row.baseline), String(format: "%.3f", row.ratio))
    }
    fflush(nil)
}
if suite == "contention" {
    var benchmark = ContentionBenchmark(directory: directory, seconds: quick ? 2 : 5)
    let counts = zip(arguments, arguments.dropFirst()).filter { $0.0 == "--clients" }.compactMap { Int($0.1) }
    if !counts.isEmpty { benchmark.clientCounts = counts }
    try benchmark.run(report: report)
} else if suite == "shared" {
    try SharedBenchmark(directory: directory, saveSamples: quick ? 100 : 300, insertCount: quick ? 5_000 : 50_000)
        .run(report: report)
} else {
    try EmbeddedBenchmark(
        directory: directory, count: quick ? 10_000 : 100_000, iterateCount: quick ? 100_000 : 1_000_000,
        saveSamples: quick ? 100 : 500, rounds: quick ? 1 : 3,
        only: Set(zip(arguments, arguments.dropFirst()).filter { $0.0 == "--only" }.map(\.1))
    ).run(report: report)
}
