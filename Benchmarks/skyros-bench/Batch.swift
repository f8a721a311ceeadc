import Foundation
import GRDBSQLite
import Skyros

/// `skyros-bench batch`: aggregates over many rows beside the raw SQL aggregate on the same
/// file in the same run (issue 18's batch update, delete and import rows are to come).
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
        report(Row(name: "sum of an attribute over \(rows / 1000)k rows", unit: "Mrows/s",
                   skyros: millions / skyrosSum, baseline: millions / rawSum))
        let skyrosAverage = try median { _ = try store.read { try Item.average(\.score, where: #Predicate { $0.flag }, in: $0) } }
        let rawAverage = median { _ = rawScalar("SELECT AVG(score) FROM \"Item\" WHERE flag = 1") }
        report(Row(name: "average with a predicate over \(rows / 1000)k rows", unit: "Mrows/s",
                   skyros: millions / skyrosAverage, baseline: millions / rawAverage))
        var groups = 0
        let skyrosGroups = try median { groups = try store.read { try Item.count(groupedBy: \.name, in: $0) }.count }
        let rawGroups = median { _ = rawScalar("SELECT COUNT(*) FROM \"Item\" GROUP BY name") }
        precondition(groups == 1_000, "wrong groups")
        report(Row(name: "count grouped by an attribute (1,000 groups) over \(rows / 1000)k rows", unit: "Mrows/s",
                   skyros: millions / skyrosGroups, baseline: millions / rawGroups))
    }
}
