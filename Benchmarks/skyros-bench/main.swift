// skyros-bench: Skyros side by side with raw SQLite, measured in the same run.
//
//     swift run -c release skyros-bench embedded [--json] [--quick] [--only fetch|saves|iterate]
//     swift run -c release skyros-bench shared [--json] [--quick] [--flood]
//     swift run -c release skyros-bench shared --garbage [--json]   (build skyrosd too, to measure it)
//     swift run -c release skyros-bench contention [--json] [--quick] [--clients N …] [--ceiling]
//     swift run -c release skyros-bench observe [--json] [--quick]
//     swift run -c release skyros-bench backup [--json] [--quick]   (1 GB store; --quick: 100 MB)
//     swift run -c release skyros-bench sync [--json] [--quick] [--count N] [--rows M] [--machines K] [--samples S] [--only visibility|fleet|upload|initial] [--verbose]
//         (PostgreSQL's server binaries needed: Debian's postgresql)
//     swift build -c release && .build/release/skyros-bench sync-faults [--seed S] [--duration SECONDS] [--machines K] [--writers W] [--rate OPS] [--verbose]
//         (the fault campaign and its history checker; as root, for the full-disk faults; exits 1 when it fails)
//
// SKYROS_BENCH_CPU=1 (contention, shared --flood): processor time per save of the clients and the
// daemon. SKYROS_BENCH_WRAP="valgrind --tool=callgrind --callgrind-out-file=/tmp/cg.%p.out": the
// first client process of each measurement runs under that command, among the real others (run
// a copy made with `objcopy --strip-debug`: valgrind 3.19 reads no DWARF 5, and the clients are
// the executable that launches them). SKYROS_BENCH_WRAP_COUNT=N: the first N clients do (a
// wrapper that runs another build for some of them compares two builds' clients in one run).
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
    case "contention-bare":
        try ContentionBenchmark.bare(endpoint: arguments[1], go: arguments[2], seconds: seconds)
        exit(0)
    case "flood-writer":
        try FloodBenchmark.writer(container: arguments[1], go: arguments[2], seconds: seconds)
        exit(0)
    case "flood-reader":
        try FloodBenchmark.reader(container: arguments[1], go: arguments[2], seconds: seconds)
        exit(0)
    case "flood-busy":
        FloodBenchmark.busy(go: arguments[2], seconds: seconds)
        exit(0)
    default:
        break
    }
}
// Hidden role: the daemon of `shared --garbage` when skyrosd was not built next to this executable.
if arguments.count == 2 && arguments[0] == "garbage-daemon" {
    try GarbageBenchmark.daemon(groups: arguments[1])
    exit(0)
}
// `--help` anywhere prints the usage and runs nothing (`sync --help` used to run the whole sync suite).
if arguments.contains("--help") || arguments.contains("-h") {
    print(
        """
        usage: skyros-bench SUITE [options]   (release builds: swift run -c release skyros-bench …)
          embedded [--json] [--quick] [--only fetch|saves|iterate]
          shared [--json] [--quick] [--flood] [--garbage]
          contention [--json] [--quick] [--clients N …] [--ceiling]
          observe | backup | migrate | batch | batch-reads [--json] [--quick]
          sync [--json] [--quick] [--count N] [--rows M] [--machines K] [--samples S]
               [--only visibility|fleet|upload|initial] [--verbose]   (needs Debian's postgresql)
          fleet [--json] [--quick] [--machines N …] [--samples S] [--rows M] [--only latency|uploads|initial]
               (needs Debian's postgresql and a release skyros-gateway: swift build -c release --product skyros-gateway)
          sync-faults [--seed S] [--duration SECONDS] [--machines K] [--writers W] [--rate OPS] [--verbose]
        Each prints a table (or one JSON object per line with --json) with a raw baseline measured in the same run.
        """)
    exit(0)
}
let json = arguments.contains("--json")
let quick = arguments.contains("--quick")
// `profile-insert` and `profile-fetch` are hidden suites for profilers (Profile.swift).
let suites = [
    "embedded", "model", "shared", "contention", "observe", "backup", "migrate", "batch", "batch-reads", "sync",
    "sync-faults", "fleet", "profile-insert", "profile-fetch", "profile-update", "profile-iterate", "profile-shared",
    "profile-open", "profile-migrate", "profile-schema-json",
]
guard let suite = arguments.first, suites.contains(suite) else {
    FileHandle.standardError.write(
        Data(
            "usage: skyros-bench embedded|model|shared|contention|observe|backup|migrate|batch|batch-reads|sync|sync-faults [--json] [--quick] [--only fetch|saves|iterate|import|ordered|inheritance] [--garbage] [--count N] [--rows M] [--machines K]\n"
                .utf8))
    exit(64)
}

let directory = FileManager.default.temporaryDirectory.appendingPathComponent("skyros-bench-\(getpid())")
try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
defer { removeWorkingDirectory() }

/// Removes the run's working directory; says so when it cannot (the directory is left).
func removeWorkingDirectory() {
    do {
        try FileManager.default.removeItem(at: directory)
    } catch {
        FileHandle.standardError.write(Data("skyros-bench: could not remove \(directory.path): \(error)\n".utf8))
    }
}

if suite.hasPrefix("profile-") {
    let profile = Profile(directory: directory)
    switch suite {
    case "profile-insert": try profile.insert()
    case "profile-shared": try profile.shared()
    case "profile-update": try profile.update()
    case "profile-iterate": try profile.iterate()
    case "profile-open": try profile.open()
    case "profile-migrate": try profile.migrate()
    case "profile-schema-json": try profile.schemaJSON()
    default: try profile.fetch()
    }
} else if !json && suite != "sync-faults" {
    print(
        "benchmark".padding(toLength: 52, withPad: " ", startingAt: 0),
        "unit".padding(toLength: 10, withPad: " ", startingAt: 0),
        "skyros".padding(toLength: 14, withPad: " ", startingAt: 0),
        "baseline".padding(toLength: 14, withPad: " ", startingAt: 0), "ratio")
}
let encoder = JSONEncoder()
encoder.outputFormatting = [.sortedKeys]
let report: (Row) -> Void = { row in
    if json {
        print(String(decoding: try! encoder.encode(row), as: UTF8.self))
    } else {
        print(
            row.name.padding(toLength: 52, withPad: " ", startingAt: 0),
            row.unit.padding(toLength: 10, withPad: " ", startingAt: 0),
            String(format: "%-14.1f", row.skyros), String(format: "%-14.1f", row.baseline),
            String(format: "%.3f", row.ratio))
    }
    fflush(nil)
}
/// The number after `flag` on the command line (`--count 1000`), else `default`.
func option(_ flag: String, default value: Int) -> Int {
    Array(zip(arguments, arguments.dropFirst())).last(where: { $0.0 == flag }).flatMap { Int($0.1) } ?? value
}
if suite == "sync-faults" {
    let seed =
        Array(zip(arguments, arguments.dropFirst())).last(where: { $0.0 == "--seed" }).flatMap { UInt64($0.1) } ?? 1
    let passed = try SyncFaultsBenchmark.run(
        seed: seed, duration: Double(option("--duration", default: quick ? 20 : 120)),
        machines: option("--machines", default: 3),
        writers: option("--writers", default: 4),
        rate: Array(zip(arguments, arguments.dropFirst())).last(where: { $0.0 == "--rate" }).flatMap { Double($0.1) }
            ?? 10,
        verbose: arguments.contains("--verbose"))
    // exit() runs no defer: the (empty) working directory goes first.
    removeWorkingDirectory()
    exit(passed ? 0 : 1)
}
if suite == "fleet" {
    do {
        let counts = zip(arguments, arguments.dropFirst()).filter { $0.0 == "--machines" }.compactMap { Int($0.1) }
        try FleetBenchmark(
            directory: directory, counts: counts.isEmpty ? (quick ? [10, 100] : [10, 100, 1_000]) : counts,
            samples: option("--samples", default: quick ? 30 : 100),
            rows: option("--rows", default: quick ? 100_000 : 1_000_000),
            only: Set(zip(arguments, arguments.dropFirst()).filter { $0.0 == "--only" }.map(\.1))
        ).run(report: report)
    } catch {
        note("failed: \(error)")
        benchmarkFailed = true
    }
} else if suite == "sync" {
    do {
        try SyncBenchmark(
            directory: directory, count: option("--count", default: quick ? 10_000 : 100_000),
            rows: option("--rows", default: quick ? 100_000 : 1_000_000), machines: option("--machines", default: 16),
            samples: option("--samples", default: quick ? 60 : 200), verbose: arguments.contains("--verbose"),
            only: Set(zip(arguments, arguments.dropFirst()).filter { $0.0 == "--only" }.map(\.1))
        ).run(report: report)
    } catch {
        // Its server and daemons are stopped by now; the exit below removes the directory.
        note("failed: \(error)")
        benchmarkFailed = true
    }
} else if suite == "backup" {
    try BackupBenchmark(directory: directory, megabytes: quick ? 100 : 1_024).run(report: report)
} else if suite == "contention" {
    var benchmark = ContentionBenchmark(directory: directory, seconds: quick ? 2 : 5)
    let counts = zip(arguments, arguments.dropFirst()).filter { $0.0 == "--clients" }.compactMap { Int($0.1) }
    if !counts.isEmpty { benchmark.clientCounts = counts }
    benchmark.ceiling = arguments.contains("--ceiling")
    try benchmark.run(report: report)
} else if suite == "shared" && arguments.contains("--flood") {
    try FloodBenchmark(directory: directory, seconds: quick ? 2 : 5).run(report: report)
} else if suite == "shared" && arguments.contains("--garbage") {
    try GarbageBenchmark(directory: directory, malformedFrames: 100_000, longHellos: 200).run(report: report)
} else if suite == "shared" {
    try SharedBenchmark(directory: directory, saveSamples: quick ? 100 : 300, insertCount: quick ? 5_000 : 50_000)
        .run(report: report)
} else if suite == "batch-reads" {
    // Only the streaming-read rows of `batch` (hidden; for profiling them).
    try BatchBenchmark(directory: directory, rows: quick ? 100_000 : 1_000_000, rounds: quick ? 3 : 5).runReads(
        report: report)
} else if suite == "batch" {
    let batch = BatchBenchmark(directory: directory, rows: quick ? 100_000 : 1_000_000, rounds: quick ? 3 : 5)
    if zip(arguments, arguments.dropFirst()).contains(where: { $0 == ("--only", "import") }) {
        try batch.runImport(report: report)  // `skyros-bench batch --only import`
    } else {
        try batch.run(report: report)
    }
} else if suite == "model" {
    let model = ModelBenchmark(directory: directory, posts: quick ? 10_000 : 100_000, rounds: quick ? 3 : 5)
    if zip(arguments, arguments.dropFirst()).contains(where: { $0 == ("--only", "ordered") }) {
        try model.orderedMove(
            try Skyros(
                sqliteStack: modelSchema, at: directory.appendingPathComponent("ordered.sqlite"), savesOnStop: false),
            report: report)
    } else if zip(arguments, arguments.dropFirst()).contains(where: { $0 == ("--only", "inheritance") }) {
        try model.inheritance(report: report)
    } else {
        try model.run(report: report)
    }
} else if suite == "observe" {
    try ObserveBenchmark(
        directory: directory, sizes: quick ? [10_000] : [10_000, 100_000], samples: quick ? 200 : 1_000
    )
    .run(report: report)
} else if suite == "migrate" {
    try MigrateBenchmark(directory: directory, rows: quick ? 100_000 : 1_000_000, rounds: quick ? 1 : 3).run(
        report: report)
} else if suite == "embedded" {
    try EmbeddedBenchmark(
        directory: directory, count: quick ? 10_000 : 100_000, iterateCount: quick ? 100_000 : 1_000_000,
        saveSamples: quick ? 100 : 500, rounds: quick ? 1 : 7,
        only: Set(zip(arguments, arguments.dropFirst()).filter { $0.0 == "--only" }.map(\.1))
    ).run(report: report)
}
if benchmarkFailed {
    removeWorkingDirectory()  // exit skips the defer above
    exit(1)
}
