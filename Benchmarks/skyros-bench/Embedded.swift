import Foundation
import GRDBSQLite
import Skyros

/// `skyros-bench embedded`: the embedded stack against raw SQLite, same work, same run,
/// same durability (synchronous=FULL, WAL).
struct EmbeddedBenchmark {
    let directory: URL
    let count: Int
    let iterateCount: Int
    let saveSamples: Int
    /// Rounds of the insert and fetch measurements; the median is reported.
    let rounds: Int
    /// Runs only the groups named here (`fetch`, `saves`, `iterate`) when not empty.
    let only: Set<String>

    func run(report: (Row) -> Void) throws {
        if only.isEmpty || only.contains("fetch") { try insertAndFetch(report: report) }
        if only.isEmpty || only.contains("saves") { try singleSaves(report: report) }
        if only.isEmpty || only.contains("iterate") { try iterate(report: report) }
    }

    /// Gives an item the five attribute values of row `index`.
    static func fill(_ item: Item, _ index: Int) {
        item.name = "item \(index)"
        item.value = index % 100
        item.score = Double(index) * 0.5
        item.flag = index % 2 == 0
        item.created = Date(timeIntervalSince1970: Double(index))
    }

    /// Seconds taken by each side in one round.
    struct RoundTimes {
        var skyrosInsert = 0.0, rawInsert = 0.0, skyrosFetch = 0.0, rawFetch = 0.0
        var skyrosIndexed = 0.0, rawIndexed = 0.0, indexedRows = 0
    }

    /// Runs `rounds` rounds (each on new files). Each round measures Skyros and the baseline
    /// back to back, so a round's ratio compares the two at the same moment of a machine whose
    /// speed drifts; the round with the median ratio is reported (its two rates, as measured).
    /// `SKYROS_BENCH_VERBOSE=1` prints every round's pair on stderr.
    private func insertAndFetch(report: (Row) -> Void) throws {
        var times: [RoundTimes] = []
        for round in 0..<rounds { times.append(try insertAndFetchRound(round)) }
        let rows = Double(times[0].indexedRows)
        let verbose = ProcessInfo.processInfo.environment["SKYROS_BENCH_VERBOSE"] != nil
        func pairedMedian(_ name: String, _ rates: (RoundTimes) -> (skyros: Double, baseline: Double)) -> Row {
            let pairs = times.map(rates)
            if verbose {
                let text = pairs.map {
                    String(format: "%.0f/%.0f=%.3f", $0.skyros, $0.baseline, $0.skyros / $0.baseline)
                }
                FileHandle.standardError.write(Data("\(name): \(text.joined(separator: " "))\n".utf8))
            }
            let median = pairs.sorted { $0.skyros / $0.baseline < $1.skyros / $1.baseline }[pairs.count / 2]
            return Row(name: name, unit: "objects/s", skyros: median.skyros, baseline: median.baseline)
        }
        report(
            pairedMedian("insert \(count) objects, one write") {
                (Double(count) / $0.skyrosInsert, Double(count) / $0.rawInsert)
            })
        report(
            pairedMedian("fetch all \(count) and read every attribute") {
                (Double(count) / $0.skyrosFetch, Double(count) / $0.rawFetch)
            })
        report(pairedMedian("fetch 1% by an indexed attribute") { (rows / $0.skyrosIndexed, rows / $0.rawIndexed) })
    }

    /// Inserts `count` objects in one write, then fetches them all, then 1% by an indexed value.
    private func insertAndFetchRound(_ round: Int) throws -> RoundTimes {
        let folder = directory.appendingPathComponent("round-\(round)")
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: folder) }
        let skyrosURL = folder.appendingPathComponent("skyros.sqlite")
        let store = try Skyros(sqliteStack: benchSchema, at: skyrosURL)
        let done = DispatchSemaphore(value: 0)
        let skyrosInsert = Clock.seconds {
            store.writeSync(
                { context in
                    for index in 0..<count { Self.fill(Item.create(in: context), index) }
                },
                completion: { error in
                    if let error { fatalError("insert failed: \(error)") }
                    done.signal()
                })
            done.wait()
        }

        let raw = RawSQLite(path: folder.appendingPathComponent("raw.sqlite").path)
        raw.createItemTable()
        let rawInsert = Clock.seconds { raw.insertItems(count) }

        // Fetch all and read every attribute, from a stack that has nothing cached.
        var checksum = 0.0
        let reader = try Skyros(sqliteStack: benchSchema, at: skyrosURL)
        let skyrosFetch = try Clock.seconds {
            try reader.read { context in
                for item in try Item.all(in: context) {
                    checksum +=
                        Double(item.name.utf8.count + item.value) + item.score + (item.flag ? 1 : 0)
                        + item.created.timeIntervalSince1970
                }
            }
        }
        // The same for the baseline: a new connection, whose page cache does not hold the
        // pages its insert just wrote (up to a fifth faster when it does).
        var rawChecksum = 0.0
        let reading = RawSQLite(path: folder.appendingPathComponent("raw.sqlite").path)
        let rawFetch = Clock.seconds { rawChecksum = reading.readAllItems() }
        precondition(checksum == rawChecksum, "the two fetches read different data")

        // 1% of the rows through the index; each round fetches other rows, nothing is cached.
        let rounds = 20
        var skyrosRows = 0
        reader.read { $0.reset() }
        let skyrosIndexed = Clock.seconds {
            for round in 0..<rounds {
                let wanted = round
                reader.read { context in
                    for item in try Item.all(where: #Predicate { $0.value == wanted }, in: context) {
                        skyrosRows += item.value == wanted ? 1 : 0
                    }
                }
            }
        }
        var rawRows = 0
        let rawIndexed = Clock.seconds {
            let statement = raw.prepare("SELECT id, name, value, score, flag, created FROM item WHERE value = ?")
            for round in 0..<rounds {
                sqlite3_reset(statement)
                sqlite3_bind_int64(statement, 1, Int64(round))
                while sqlite3_step(statement) == SQLITE_ROW {
                    _ = raw.text(statement, 1)
                    rawRows += Int(sqlite3_column_int64(statement, 2)) == round ? 1 : 0
                }
            }
            sqlite3_finalize(statement)
        }
        precondition(skyrosRows == rawRows && rawRows == rounds * count / 100, "indexed fetches disagree")
        return RoundTimes(
            skyrosInsert: skyrosInsert, rawInsert: rawInsert, skyrosFetch: skyrosFetch, rawFetch: rawFetch,
            skyrosIndexed: skyrosIndexed, rawIndexed: rawIndexed, indexedRows: rawRows)
    }

    /// One-object writeSync until its completion, against a raw single-row transaction; then
    /// one-object writeAndWait (the same save on the calling thread, with no hand-off) against
    /// the same. Samples alternate between Skyros and the baseline, so that both see the same
    /// disk conditions.
    private func singleSaves(report: (Row) -> Void) throws {
        let done = DispatchSemaphore(value: 0)
        let (skyros, baseline) = try alternatingSaves("saves") { store, index in
            store.writeSync(
                { context in Self.fill(Item.create(in: context), index) }, completion: { _ in done.signal() })
            done.wait()
        }
        report(
            Row(
                name: "one-object save until durable p50", unit: "us",
                skyros: percentile(skyros, 50), baseline: percentile(baseline, 50)))
        report(
            Row(
                name: "one-object save until durable p99", unit: "us",
                skyros: percentile(skyros, 99), baseline: percentile(baseline, 99)))
        let (waited, waitedBaseline) = try alternatingSaves("waits") { store, index in
            try store.writeAndWait { context in Self.fill(Item.create(in: context), index) }
        }
        report(
            Row(
                name: "one-object writeAndWait p50", unit: "us",
                skyros: percentile(waited, 50), baseline: percentile(waitedBaseline, 50)))
        report(
            Row(
                name: "one-object writeAndWait p99", unit: "us",
                skyros: percentile(waited, 99), baseline: percentile(waitedBaseline, 99)))
    }

    /// `saveSamples` one-object saves through a new stack, each followed by a raw single-row
    /// transaction into a new file; the latencies of each, in µs.
    private func alternatingSaves(
        _ name: String, _ save: (Skyros, Int) throws -> Void
    ) throws -> (skyros: [Double], baseline: [Double]) {
        let store = try Skyros(sqliteStack: benchSchema, at: directory.appendingPathComponent("\(name).sqlite"))
        let raw = RawSQLite(path: directory.appendingPathComponent("raw-\(name).sqlite").path)
        raw.createItemTable()
        let statement = raw.prepare(RawSQLite.insertItemSQL)
        defer { sqlite3_finalize(statement) }
        var skyros: [Double] = []
        var baseline: [Double] = []
        for index in 0..<saveSamples {
            var start = Clock.now()
            try save(store, index)
            skyros.append(Double(Clock.now() - start) / 1000)

            start = Clock.now()
            raw.execute("BEGIN IMMEDIATE")
            raw.insertItem(statement, index)
            raw.execute("COMMIT")
            baseline.append(Double(Clock.now() - start) / 1000)
        }
        return (skyros, baseline)
    }

    /// Iterates `iterateCount` stored objects in batches; reports peak RSS growth.
    private func iterate(report: (Row) -> Void) throws {
        let url = directory.appendingPathComponent("million.sqlite")
        try RawSQLite.fillStore(at: url, rows: iterateCount)
        let raw = RawSQLite(path: url.path, synchronous: "OFF")

        // Raw iteration first, then Skyros: each growth is measured from its own start.
        var rawPeak = residentMB()
        let rawStart = rawPeak
        var rawSum = 0
        let select = raw.prepare("SELECT \"_id\", name, value, score, flag, created FROM \"Item\" ORDER BY \"_id\"")
        var seen = 0
        while sqlite3_step(select) == SQLITE_ROW {
            rawSum += raw.text(select, 1).utf8.count + Int(sqlite3_column_int64(select, 2))
            seen += 1
            if seen % 10_000 == 0 { rawPeak = max(rawPeak, residentMB()) }
        }
        sqlite3_finalize(select)

        let store = try Skyros(sqliteStack: benchSchema, at: url)
        var peak = residentMB()
        let start = peak
        var sum = 0
        store.read { context in
            var index = 0
            for item in try context.fetch(FetchDescriptor<Item>(), batchSize: 1_000) {
                sum += item.name.utf8.count + item.value
                index += 1
                if index % 10_000 == 0 { peak = max(peak, residentMB()) }
            }
        }
        precondition(sum == rawSum, "iterations disagree")
        report(
            Row(
                name: "iterate \(iterateCount) objects in batches, peak RSS growth", unit: "MB",
                skyros: peak - start, baseline: rawPeak - rawStart))
    }
}
