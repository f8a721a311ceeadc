import Foundation
import GRDB
import GRDBSQLite
import Skyros

/// A hand-written GRDB record of the store's `Item` table, as GRDB's documentation writes
/// one: every column read by name in `init(row:)`.
struct GRDBItem: FetchableRecord, TableRecord {
    static let databaseTableName = "Item"
    var id: UUID
    var name: String
    var value: Int
    var score: Double
    var flag: Bool
    var created: Date

    init(row: GRDB.Row) throws {
        id = row["_id"]
        name = row["name"]
        value = row["value"]
        score = row["score"]
        flag = row["flag"]
        created = row["created"]
    }
}

/// The same record reading its columns by position from an explicit column list: GRDB's
/// fastest hand-written form (`SKYROS_BENCH_VERBOSE=1` prints the iteration against it).
struct GRDBItemByPosition: FetchableRecord {
    static let sql = "SELECT \"_id\", name, value, score, flag, created FROM \"Item\""
    var id: UUID
    var name: String
    var value: Int
    var score: Double
    var flag: Bool
    var created: Date

    init(row: GRDB.Row) throws {
        id = row[0]
        name = row[1]
        value = row[2]
        score = row[3]
        flag = row[4]
        created = row[5]
    }
}

extension BatchBenchmark {
    /// What every iteration adds up for one item, whatever reads it: the sums of both sides
    /// must be equal (they read the same data).
    static func checksum(_ name: String, _ value: Int, _ flag: Bool, _ score: Double, _ created: Date) -> Double {
        Double(name.utf8.count + value + (flag ? 1 : 0)) + score + created.timeIntervalSince1970
    }

    /// Streaming reads beside GRDB 7 with a hand-written record, on the same file in the same
    /// run: iterating `rows` objects with `fetch(_:batchSize:)` against `fetchCursor` (objects/s,
    /// then the peak RSS growth of each, MB), and fetching 1 % of them by an indexed predicate
    /// against `fetchAll` with the same filter. Each round measures both sides back to back;
    /// the medians are reported.
    func runReads(report: (Row) -> Void) throws {
        let url = directory.appendingPathComponent("reads.sqlite")
        try RawSQLite.fillStore(at: url, rows: rows)  // 1 % of the rows per `value`
        let store = try Skyros(sqliteStack: benchSchema, at: url, durability: .normal, savesOnStop: false)
        let pool = try DatabasePool(path: url.path)
        defer { try? pool.close() }

        // Iteration: every attribute of every object read, RSS sampled every 10,000 objects.
        var skyrosIterate: [Double] = [], grdbIterate: [Double] = []
        var skyrosGrowth = 0.0, grdbGrowth = 0.0
        var skyrosSum = 0.0, grdbSum = 0.0
        for _ in 0..<rounds {
            var start = residentMB()
            var peak = start
            skyrosIterate.append(try Clock.seconds {
                skyrosSum = try store.read { context in
                    var sum = 0.0
                    var seen = 0
                    for item in try context.fetch(FetchDescriptor<Item>(), batchSize: 1_000) {
                        sum += Self.checksum(item.name, item.value, item.flag, item.score, item.created)
                        seen += 1
                        if seen % 10_000 == 0 { peak = max(peak, residentMB()) }
                    }
                    precondition(seen == rows, "Skyros iterated \(seen) objects")
                    return sum
                }
            })
            skyrosGrowth = max(skyrosGrowth, peak - start)
            start = residentMB()
            peak = start
            grdbIterate.append(try Clock.seconds {
                grdbSum = try pool.read { db in
                    var sum = 0.0
                    var seen = 0
                    let items = try GRDBItem.fetchCursor(db)
                    while let item = try items.next() {
                        sum += Self.checksum(item.name, item.value, item.flag, item.score, item.created)
                        seen += 1
                        if seen % 10_000 == 0 { peak = max(peak, residentMB()) }
                    }
                    precondition(seen == rows, "GRDB iterated \(seen) records")
                    return sum
                }
            })
            grdbGrowth = max(grdbGrowth, peak - start)
            precondition(skyrosSum == grdbSum, "the iterations read different data")
        }
        if ProcessInfo.processInfo.environment["SKYROS_BENCH_VERBOSE"] != nil {
            var byPosition: [Double] = []
            for _ in 0..<rounds {
                byPosition.append(try Clock.seconds {
                    let sum = try pool.read { db in
                        var sum = 0.0
                        let items = try GRDBItemByPosition.fetchCursor(db, sql: GRDBItemByPosition.sql)
                        while let item = try items.next() {
                            sum += Self.checksum(item.name, item.value, item.flag, item.score, item.created)
                        }
                        return sum
                    }
                    precondition(sum == grdbSum, "the iterations read different data")
                })
            }
            let rate = Double(rows) / Self.median(byPosition)
            FileHandle.standardError.write(Data(String(
                format: "iterate: GRDB fetchCursor reading columns by position %.0f objects/s; Skyros %.3fx that\n",
                rate, Double(rows) / Self.median(skyrosIterate) / rate).utf8))
        }
        let millions = "\(rows / 1_000_000 > 0 ? "\(rows / 1_000_000)M" : "\(rows / 1_000)k")"
        report(Row(
            name: "iterate \(millions) objects, batchSize 1000 (vs fetchCursor)", unit: "objects/s",
            skyros: Double(rows) / Self.median(skyrosIterate), baseline: Double(rows) / Self.median(grdbIterate)))
        report(Row(
            name: "iterate \(millions) objects, peak RSS growth", unit: "MB",
            skyros: skyrosGrowth, baseline: grdbGrowth))
        // The memory assertion of issue 18: iterating never holds the result.
        benchmarkAssert(skyrosGrowth <= 20, "iterating \(millions) objects grew the RSS by \(skyrosGrowth) MB (at most 20)")

        // 1 % of the rows by the indexed attribute, 10 values a round, each fetch its own read.
        let values = 10
        var skyrosIndexed: [Double] = [], grdbIndexed: [Double] = []
        var skyrosRows = 0, grdbRows = 0
        for _ in 0..<rounds {
            skyrosRows = 0
            grdbRows = 0
            skyrosIndexed.append(try Clock.seconds {
                for wanted in 0..<values {
                    skyrosRows += try store.read { context in
                        var count = 0
                        for item in try context.fetch(FetchDescriptor<Item>(predicate: #Predicate { $0.value == wanted }))
                        where item.value == wanted && !item.name.isEmpty {
                            count += 1
                        }
                        return count
                    }
                }
            })
            grdbIndexed.append(try Clock.seconds {
                for wanted in 0..<values {
                    let items = try pool.read { db in try GRDBItem.filter(Column("value") == wanted).fetchAll(db) }
                    for item in items where item.value == wanted && !item.name.isEmpty { grdbRows += 1 }
                }
            })
            precondition(skyrosRows == grdbRows && grdbRows == values * rows / 100, "indexed fetches disagree")
        }
        report(Row(
            name: "fetch 1% by an indexed predicate (vs fetchAll)", unit: "objects/s",
            skyros: Double(skyrosRows) / Self.median(skyrosIndexed), baseline: Double(grdbRows) / Self.median(grdbIndexed)))
    }

    static func median(_ samples: [Double]) -> Double { samples.sorted()[samples.count / 2] }
}
