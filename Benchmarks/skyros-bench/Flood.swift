import Foundation
import Skyros
import SkyrosShared

/// `skyros-bench shared --flood`: one writer process saves one object at a time through the
/// daemon (each save waited for with `writeAndWait`), alone, then beside 4 processes that
/// fetch all 2,000 objects of the store in a loop. Reported: the writer's save p99 with the
/// flood against its p99 alone in the same run (target ≤ 3×), and the saves that failed.
///
/// A third run puts the writer beside 4 processes that only burn the processor and never talk
/// to the daemon: the same load on the machine's scheduler with no read work at all. Its p99 is
/// the floor any flood of 4 busy processes puts under the writer's on this machine, whatever
/// the daemon does (on 2 cores, each of the writer's and the daemon's thread wake-ups may wait
/// for a busy process's time slice).
///
/// The processes are this executable in the hidden roles `flood-writer`, `flood-reader` and
/// `flood-busy`.
struct FloodBenchmark {
    let directory: URL
    let seconds: Double
    let readers = 4
    let objects = 2_000

    func run(report: (Row) -> Void) throws {
        let folder = directory.appendingPathComponent("flood")
        let daemon = try SharedBenchmark.Daemon(folder, durability: .full)
        defer { daemon.stop() }
        let seed = try Skyros(sharedStack: benchSchema, container: folder, timeout: 30)
        try seed.writeAndWait { context in
            for index in 0..<objects {
                let item = Item.create(in: context)
                item.name = "item \(index)"
                item.value = index
            }
        }
        let alone = try Self.launch(
            ["flood-writer"], target: folder.path, go: directory.appendingPathComponent("go-alone").path,
            seconds: seconds)
        let flooded = try Self.launch(
            ["flood-writer"] + Array(repeating: "flood-reader", count: readers), target: folder.path,
            go: directory.appendingPathComponent("go-flood").path, seconds: seconds)
        let busy = try Self.launch(
            ["flood-writer"] + Array(repeating: "flood-busy", count: readers), target: folder.path,
            go: directory.appendingPathComponent("go-busy").path, seconds: seconds)
        let aloneSaves = try Self.reported(after: "RESULT ", in: alone[0], by: "flood-writer")
        let floodSaves = try Self.reported(after: "RESULT ", in: flooded[0], by: "flood-writer")
        let busySaves = try Self.reported(after: "RESULT ", in: busy[0], by: "flood-writer")
        let reads = try flooded.dropFirst().map { try Self.reported(after: "READS ", in: $0, by: "flood-reader")[0] }
            .reduce(0, +)
        report(
            Row(
                name: "flood: writer save p99, 4 readers of \(objects) objects (vs alone)", unit: "us",
                skyros: percentile(Array(floodSaves.dropFirst()), 99),
                baseline: percentile(Array(aloneSaves.dropFirst()), 99)))
        report(
            Row(
                name: "flood: writer save p50, 4 readers of \(objects) objects (vs alone)", unit: "us",
                skyros: percentile(Array(floodSaves.dropFirst()), 50),
                baseline: percentile(Array(aloneSaves.dropFirst()), 50)))
        report(
            Row(
                name: "flood: writer save p99, 4 readers (vs 4 busy processes that never use Skyros)", unit: "us",
                skyros: percentile(Array(floodSaves.dropFirst()), 99),
                baseline: percentile(Array(busySaves.dropFirst()), 99)))
        report(
            Row(
                name: "flood: writer saves/s, 4 readers (vs alone)", unit: "saves/s",
                skyros: (floodSaves.first ?? 0) / seconds, baseline: (aloneSaves.first ?? 0) / seconds))
        report(
            Row(
                name: "flood: writer saves/s, 4 readers (vs 4 busy processes that never use Skyros)", unit: "saves/s",
                skyros: (floodSaves.first ?? 0) / seconds, baseline: (busySaves.first ?? 0) / seconds))
        report(
            Row(
                name: "flood: writer saves failed, 4 readers (vs alone)", unit: "saves",
                skyros: try Self.reported(after: "FAILED ", in: flooded[0], by: "flood-writer")[0],
                baseline: try Self.reported(after: "FAILED ", in: alone[0], by: "flood-writer")[0]))
        report(
            Row(
                name: "flood: fetches of \(objects) objects by the 4 readers", unit: "fetches/s",
                skyros: reads / seconds, baseline: 0))
    }

    /// The numbers of the line a process reported with `prefix`: a process that reported
    /// nothing fails the benchmark (its figures would be missing from a sum or a percentile).
    static func reported(after prefix: String, in output: String, by role: String) throws -> [Double] {
        let numbers = numbers(after: prefix, in: output)
        guard !numbers.isEmpty else {
            throw SkyrosError(
                .storeFailure, "a \(role) process reported no '\(prefix)' line; its output:\n\(output.suffix(2_000))")
        }
        return numbers
    }

    /// The numbers of the line starting with `prefix` in a process's output.
    static func numbers(after prefix: String, in output: String) -> [Double] {
        guard let line = output.split(separator: "\n").first(where: { $0.hasPrefix(prefix) }) else { return [] }
        return line.dropFirst(prefix.count).split(separator: " ").compactMap { Double($0) }
    }

    /// Starts one process per role (this executable, `<role> <target> <go> <seconds>`), lets
    /// them go together once all are ready (after `beforeGo`), and returns their outputs in
    /// the same order.
    static func launch(
        _ roles: [String], target: String, go: String, seconds: Double, beforeGo: () -> Void = {}
    ) throws -> [String] {
        let executable = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        try? FileManager.default.removeItem(atPath: go)  // a go file of an earlier round would start them early
        // SKYROS_BENCH_WRAP="valgrind --tool=callgrind …": the first process is this executable
        // run by that command, found on the PATH (instruction counts of one client among real
        // others); SKYROS_BENCH_WRAP_COUNT=N wraps the first N (a script that runs another
        // build for some of them compares two builds' clients in one run, under the same load).
        let wrap =
            ProcessInfo.processInfo.environment["SKYROS_BENCH_WRAP"]?.split(separator: " ").map(String.init) ?? []
        let wrapped = ProcessInfo.processInfo.environment["SKYROS_BENCH_WRAP_COUNT"].flatMap { Int($0) } ?? 1
        var processes: [(Process, Pipe)] = []
        for role in roles {
            let process = Process()
            process.executableURL = executable
            process.arguments = [role, target, go, "\(seconds)"]
            if processes.count < wrapped, !wrap.isEmpty {
                process.executableURL = URL(fileURLWithPath: "/usr/bin/env")
                process.arguments = wrap + [executable.path, role, target, go, "\(seconds)"]
            }
            let pipe = Pipe()
            process.standardOutput = pipe
            try process.run()
            processes.append((process, pipe))
        }
        var outputs = processes.map { _ in Data() }
        for (index, (_, pipe)) in processes.enumerated() {
            while !String(decoding: outputs[index], as: UTF8.self).contains("READY\n") {
                let chunk = pipe.fileHandleForReading.availableData
                guard !chunk.isEmpty else { throw SkyrosError(.storeFailure, "a \(roles[index]) process ended early") }
                outputs[index].append(chunk)
            }
        }
        beforeGo()
        _ = FileManager.default.createFile(atPath: go, contents: nil)
        for (index, (process, pipe)) in processes.enumerated() {
            outputs[index].append(pipe.fileHandleForReading.readDataToEndOfFile())
            process.waitUntilExit()
        }
        return outputs.map { String(decoding: $0, as: UTF8.self) }
    }

    /// The writer: one-object saves for `seconds`; a save that fails (a timeout) is counted,
    /// and its latency kept.
    static func writer(container: String, go: String, seconds: Double) throws {
        let store = try Skyros(sharedStack: benchSchema, container: URL(fileURLWithPath: container), timeout: 5)
        var failed = 0
        ContentionBenchmark.saveLoop(go: go, seconds: seconds) { index in
            do {
                try store.writeAndWait { context in Item.create(in: context).value = -index }
            } catch {
                failed += 1
            }
        }
        print("FAILED \(failed)")
    }

    /// A busy process: burns the processor for `seconds`, never touching the daemon.
    static func busy(go: String, seconds: Double) {
        print("READY")
        fflush(nil)
        ContentionBenchmark.waitForGo(go)
        let end = Clock.now() + UInt64(seconds * 1e9)
        var state: UInt64 = 0x9E37_79B9_7F4A_7C15
        while Clock.now() < end {
            for _ in 0..<10_000 { state = state &* 6_364_136_223_846_793_005 &+ 1_442_695_040_888_963_407 }
        }
        if state == 0 { print("unlikely") }  // keeps the loop
    }

    /// A reader: fetches every item (the 2,000 of the seed and the writer's) in a loop.
    static func reader(container: String, go: String, seconds: Double) throws {
        let store = try Skyros(sharedStack: benchSchema, container: URL(fileURLWithPath: container), timeout: 30)
        print("READY")
        fflush(nil)
        ContentionBenchmark.waitForGo(go)
        var reads = 0
        let end = Date().addingTimeInterval(seconds)
        while Date() < end {
            let count = try store.read { context in try Item.all(in: context).count }
            if count > 0 { reads += 1 }
        }
        print("READS \(reads)")
    }
}
