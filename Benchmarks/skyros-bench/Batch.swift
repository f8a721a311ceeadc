import Foundation
import GRDBSQLite
import Skyros

/// `skyros-bench batch`: aggregates, batch update and batch delete over many rows, beside the
/// raw SQL statement on the same file in the same run.
struct BatchBenchmark {
    let directory: URL
    let rows: Int
    let rounds: Int

    func run(report: (Row) -> Void) throws {
        let url = directory.appendingPathComponent("batch.sqlite")
        let store = try Skyros(sqliteStack: benchSchema, at: url, durability: .normal, savesOnStop: false)
        try store.writeAndWait { context in
            for index in 0..<rows {
                let item = Item.create(in: context)
                item.name = "n\(index % 1_000)"
                item.value = index
                item.score = Double(index % 97) / 4
                item.flag = index % 3 == 0
            }
        }
        let raw = RawSQLite(path: url.path, synchronous: "NORMAL")
        func rawScalar(_ sql: String) -> Double {
            let statement = raw.prepare(sql)
            defer { sqlite3_finalize(statement) }
            var value = 0.0
            while sqlite3_step(statement) == SQLITE_ROW { value += sqlite3_column_double(statement, 0) }
            return value
        }
        func median(_ body: () throws -> Void) rethrows -> Double {
            var samples: [Double] = []
            for _ in 0..<rounds { samples.append(try Clock.seconds(body)) }
            return samples.sorted()[samples.count / 2]
        }
        let millions = Double(rows) / 1e6
        var sum = 0
        let skyrosSum = try median { sum = try store.read { try Item.sum(\.value, in: $0) } }
        let rawSum = median { _ = rawScalar("SELECT SUM(value) FROM \"Item\"") }
        precondition(sum == rows * (rows - 1) / 2, "wrong sum")
        report(
            Row(
                name: "sum of an attribute over \(rows / 1000)k rows", unit: "Mrows/s",
                skyros: millions / skyrosSum, baseline: millions / rawSum))
        let skyrosAverage = try median {
            _ = try store.read { try Item.average(\.score, where: #Predicate { $0.flag }, in: $0) }
        }
        let rawAverage = median { _ = rawScalar("SELECT AVG(score) FROM \"Item\" WHERE flag = 1") }
        report(
            Row(
                name: "average with a predicate over \(rows / 1000)k rows", unit: "Mrows/s",
                skyros: millions / skyrosAverage, baseline: millions / rawAverage))
        var groups = 0
        let skyrosGroups = try median { groups = try store.read { try Item.count(groupedBy: \.name, in: $0) }.count }
        let rawGroups = median { _ = rawScalar("SELECT COUNT(*) FROM \"Item\" GROUP BY name") }
        precondition(groups == 1_000, "wrong groups")
        report(
            Row(
                name: "count grouped by an attribute (1,000 groups) over \(rows / 1000)k rows", unit: "Mrows/s",
                skyros: millions / skyrosGroups, baseline: millions / rawGroups))
        // A tenth of the rows each, twice on each side on ranges of their own (the first run
        // warms each connection's cache); the second runs are reported.
        let tenth = rows / 10
        func range(_ n: Int) -> (Int, Int) { (n * tenth, (n + 1) * tenth) }
        var skyrosUpdate = 0.0
        var rawUpdate = 0.0
        for round in 0..<2 {
            let (low, high) = range(round * 2)
            var updated = 0
            skyrosUpdate = try Clock.seconds {
                updated = try awaitResult {
                    try await store.batchUpdate(
                        Item.self, where: #Predicate { $0.value >= low && $0.value < high }, .set(\.score, to: 1.5))
                }
            }
            precondition(updated == tenth, "wrong update count")
            let (rawLow, rawHigh) = range(round * 2 + 1)
            rawUpdate = Clock.seconds {
                raw.execute(
                    "UPDATE \"Item\" SET score = 2.5, _version = _version + 1 WHERE value >= \(rawLow) AND value < \(rawHigh)"
                )
            }
        }
        report(
            Row(
                name: "batch update of \(tenth / 1000)k of \(rows / 1000)k rows", unit: "Mrows/s",
                skyros: Double(tenth) / 1e6 / skyrosUpdate, baseline: Double(tenth) / 1e6 / rawUpdate))
        var skyrosDelete = 0.0
        var rawDelete = 0.0
        for round in 0..<2 {
            let (low, high) = range(4 + round * 2)
            var deleted = 0
            skyrosDelete = try Clock.seconds {
                deleted = try awaitResult {
                    try await store.batchDelete(Item.self, where: #Predicate { $0.value >= low && $0.value < high })
                }
            }
            precondition(deleted == tenth, "wrong delete count")
            let (rawLow, rawHigh) = range(5 + round * 2)
            rawDelete = Clock.seconds {
                raw.execute("DELETE FROM \"Item\" WHERE value >= \(rawLow) AND value < \(rawHigh)")
            }
        }
        report(
            Row(
                name: "batch delete of \(tenth / 1000)k of \(rows / 1000)k rows", unit: "Mrows/s",
                skyros: Double(tenth) / 1e6 / skyrosDelete, baseline: Double(tenth) / 1e6 / rawDelete))
        try runShared(embeddedUpdate: skyrosUpdate, embeddedDelete: skyrosDelete, report: report)
        try runImport(report: report)
        try runReads(report: report)
    }

    /// Runs an async operation from this synchronous benchmark and waits for it.
    func awaitResult<T: Sendable>(_ operation: @escaping @Sendable () async throws -> T) throws -> T {
        let done = DispatchSemaphore(value: 0)
        let box = UncheckedBox(ResultBox<T>())
        Task {
            do { box.value.result = .success(try await operation()) } catch { box.value.result = .failure(error) }
            done.signal()
        }
        done.wait()
        return try box.value.result!.get()
    }

    private final class ResultBox<T>: @unchecked Sendable {
        var result: Result<T, any Error>?
    }
}
