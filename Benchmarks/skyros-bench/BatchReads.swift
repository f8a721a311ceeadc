import Foundation
import GRDB
import GRDBSQLite
import Skyros

/// A hand-written GRDB record of the store's `Item` table, as GRDB's documentation writes
/// one: every column read by name in `init(row:)`. Only a reference beside the iteration
/// (`SKYROS_BENCH_VERBOSE=1`), and the table of `updateAll`: the rows' baselines are the
/// positional record below.
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
/// fastest hand-written form, the baseline of every read row (a record read by name costs
/// GRDB a lookup per column that ours does not pay: a weaker baseline than our technique).
struct GRDBItemByPosition: FetchableRecord, PersistableRecord {
    static let databaseTableName = "Item"
    static let sql = "SELECT \"_id\", name, value, score, flag, created FROM \"Item\""
    /// The rows whose indexed `value` is the argument.
    static let byValueSQL = sql + " WHERE value = ?"
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

    func encode(to container: inout PersistenceContainer) throws {
        container["_id"] = id
        container["name"] = name
        container["value"] = value
        container["score"] = score
        container["flag"] = flag
        container["created"] = created
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
        // The same durability on both sides (the writes): synchronous NORMAL, WAL.
        var configuration = GRDB.Configuration()
        configuration.prepareDatabase { db in try db.execute(sql: "PRAGMA synchronous = NORMAL") }
        let pool = try DatabasePool(path: url.path, configuration: configuration)
        defer { try? pool.close() }

        // Iteration: every attribute of every object read, RSS sampled every 10,000 objects.
        // The sides alternate which goes first, round by round (the first pays for cold
        // caches); GRDB's record read by name is printed beside, for reference only.
        var skyrosIterate: [Double] = []
        var grdbIterate: [Double] = []
        var byName: [Double] = []
        var skyrosGrowth = 0.0
        var grdbGrowth = 0.0
        var skyrosSum = 0.0
        var grdbSum = 0.0
        func iterateSkyros() throws {
            let start = residentMB()
            var peak = start
            skyrosIterate.append(
                try Clock.seconds {
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
        }
        func iterateGRDB() throws {
            let start = residentMB()
            var peak = start
            grdbIterate.append(
                try Clock.seconds {
                    grdbSum = try pool.read { db in
                        var sum = 0.0
                        var seen = 0
                        let items = try GRDBItemByPosition.fetchCursor(db, sql: GRDBItemByPosition.sql)
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
        }
        func iterateByName() throws {
            byName.append(
                try Clock.seconds {
                    let sum = try pool.read { db in
                        var sum = 0.0
                        let items = try GRDBItem.fetchCursor(db)
                        while let item = try items.next() {
                            sum += Self.checksum(item.name, item.value, item.flag, item.score, item.created)
                        }
                        return sum
                    }
                    precondition(sum == grdbSum, "the iterations read different data")
                })
        }
        for round in 0..<rounds {
            try Self.inTurn(round, [iterateSkyros, iterateGRDB])
            try iterateByName()
            precondition(skyrosSum == grdbSum, "the iterations read different data")
        }
        let millions = "\(rows / 1_000_000 > 0 ? "\(rows / 1_000_000)M" : "\(rows / 1_000)k")"
        report(
            Row(
                name: "iterate \(millions) objects, batchSize 1000 (vs fetchCursor reading by position)",
                unit: "objects/s",
                skyros: Double(rows) / Self.median(skyrosIterate), baseline: Double(rows) / Self.median(grdbIterate)))
        report(
            Row(
                name: "iterate \(millions) objects, peak RSS growth (vs fetchCursor reading by position)", unit: "MB",
                skyros: skyrosGrowth, baseline: grdbGrowth))
        if ProcessInfo.processInfo.environment["SKYROS_BENCH_VERBOSE"] == "1" {
            print(
                String(
                    format: "  (reference: GRDB's record read by name iterates %.0f objects/s)",
                    Double(rows) / Self.median(byName)))
        }
        // The memory assertion of issue 18: iterating never holds the result.
        benchmarkAssert(
            skyrosGrowth <= 20, "iterating \(millions) objects grew the RSS by \(skyrosGrowth) MB (at most 20)")

        // 1 % of the rows by the indexed attribute, 10 values a round, each fetch its own read
        // (at 100 k objects, queries of 1,000 rows: the per-query cost). Sides alternate.
        try fetchIndexedRows(store: store, pool: pool, rows: rows, values: 10, report: report)
        // The same as 20 queries of 1,000 rows (the per-query cost), on a file of a tenth of
        // the rows (1 % of them per `value` again).
        let smallURL = directory.appendingPathComponent("reads-small.sqlite")
        try RawSQLite.fillStore(at: smallURL, rows: rows / 10)
        let small = try Skyros(sqliteStack: benchSchema, at: smallURL, durability: .normal, savesOnStop: false)
        let smallPool = try DatabasePool(path: smallURL.path, configuration: configuration)
        defer { try? smallPool.close() }
        try fetchIndexedRows(store: small, pool: smallPool, rows: rows / 10, values: 20, report: report)
        try fetchAllRows(store: small, pool: smallPool, rows: rows / 10, report: report)
        try runWrites(store: store, pool: pool, report: report)
    }

    static func median(_ samples: [Double]) -> Double { samples.sorted()[samples.count / 2] }

    /// Runs the sides of one round: in order on even rounds, in reverse order on odd ones, so
    /// that no side always goes first (and meets the caches as the one before it left them).
    static func inTurn(_ round: Int, _ sides: [() throws -> Void]) throws {
        for side in round % 2 == 0 ? sides : sides.reversed() { try side() }
    }

    /// One read of the "fetch 1 %" row: the objects whose indexed `value` is `wanted`, each
    /// read; how many there are.
    static func fetchIndexed(_ store: Skyros, _ wanted: Int) throws -> Int {
        try store.read { context in
            var count = 0
            for item in try context.fetch(FetchDescriptor<Item>(predicate: #Predicate { $0.value == wanted }))
            where item.value == wanted && !item.name.isEmpty {
                count += 1
            }
            return count
        }
    }

    /// The same read with GRDB's positional record and a cached statement.
    static func fetchIndexed(_ pool: DatabasePool, _ wanted: Int) throws -> Int {
        let items = try pool.read { db in
            try GRDBItemByPosition.fetchAll(
                try db.cachedStatement(sql: GRDBItemByPosition.byValueSQL), arguments: [wanted])
        }
        return items.count { $0.value == wanted && !$0.name.isEmpty }
    }

    /// "fetch 1 %": the objects of `values` values of the indexed attribute of a file of `rows`
    /// rows (1 % of them each), a read each, beside GRDB's positional record on a cached
    /// statement; the sides alternate which goes first.
    func fetchIndexedRows(store: Skyros, pool: DatabasePool, rows: Int, values: Int, report: (Row) -> Void) throws {
        var skyrosTimes: [Double] = []
        var grdbTimes: [Double] = []
        var skyrosRows = 0
        var grdbRows = 0
        func skyros() throws {
            skyrosRows = 0
            skyrosTimes.append(
                try Clock.seconds {
                    for wanted in 0..<values { skyrosRows += try Self.fetchIndexed(store, wanted) }
                })
        }
        func grdb() throws {
            grdbRows = 0
            grdbTimes.append(
                try Clock.seconds {
                    for wanted in 0..<values { grdbRows += try Self.fetchIndexed(pool, wanted) }
                })
        }
        // The baseline before issue 58, for reference only (SKYROS_BENCH_VERBOSE=1): GRDB's
        // by-name record through the query interface, its SQL built for every query.
        let verbose = ProcessInfo.processInfo.environment["SKYROS_BENCH_VERBOSE"] == "1"
        var byNameTimes: [Double] = []
        func byName() throws {
            guard verbose else { return }
            var count = 0
            byNameTimes.append(
                try Clock.seconds {
                    for wanted in 0..<values {
                        count += try pool.read { db in
                            try GRDBItem.filter(Column("value") == wanted).fetchAll(db)
                        }.count { $0.value == wanted && !$0.name.isEmpty }
                    }
                })
            precondition(count == values * rows / 100, "the by-name fetch read \(count) rows")
        }
        for round in 0..<rounds {
            try Self.inTurn(round, [skyros, grdb, byName])
            precondition(skyrosRows == grdbRows && grdbRows == values * rows / 100, "indexed fetches disagree")
        }
        if verbose {
            print(
                String(
                    format: "  (reference: GRDB's record read by name, query interface, fetches %.0f objects/s)",
                    Double(values * rows / 100) / Self.median(byNameTimes)))
        }
        report(
            Row(
                name:
                    "fetch 1% by an indexed predicate, \(values) queries of \(rows / 100) rows (vs fetchAll by position, cached statement)",
                unit: "objects/s",
                skyros: Double(skyrosRows) / Self.median(skyrosTimes),
                baseline: Double(grdbRows) / Self.median(grdbTimes)))
    }

    /// "fetch all": every object of the file of `rows` rows in one fetch, each read (every
    /// attribute), beside GRDB's positional record's `fetchAll` on a cached statement; a read
    /// each, the sides alternating which goes first; medians.
    func fetchAllRows(store: Skyros, pool: DatabasePool, rows: Int, report: (Row) -> Void) throws {
        var skyrosTimes: [Double] = []
        var grdbTimes: [Double] = []
        var skyrosSum = 0.0
        var grdbSum = 0.0
        func skyros() throws {
            skyrosTimes.append(
                try Clock.seconds {
                    skyrosSum = try store.read { context in
                        var sum = 0.0
                        for item in try context.fetch(FetchDescriptor<Item>()) {
                            sum += Self.checksum(item.name, item.value, item.flag, item.score, item.created)
                        }
                        return sum
                    }
                })
        }
        func grdb() throws {
            grdbTimes.append(
                try Clock.seconds {
                    let items = try pool.read { db in
                        try GRDBItemByPosition.fetchAll(try db.cachedStatement(sql: GRDBItemByPosition.sql))
                    }
                    grdbSum = items.reduce(0) { $0 + Self.checksum($1.name, $1.value, $1.flag, $1.score, $1.created) }
                })
        }
        for round in 0..<rounds {
            try Self.inTurn(round, [skyros, grdb])
            precondition(skyrosSum == grdbSum, "the fetches of every object disagree")
        }
        report(
            Row(
                name: "fetch all \(rows) objects, every attribute read (vs fetchAll by position, cached statement)",
                unit: "objects/s", skyros: Double(rows) / Self.median(skyrosTimes),
                baseline: Double(rows) / Self.median(grdbTimes)))
    }

    /// Writes beside GRDB 7 on the same file, each round on values of its own: one attribute
    /// of 10,000 objects changed and saved in one transaction (objects fetched by the indexed
    /// attribute, changed, saved; against records fetched, changed and `update(_:columns:)`),
    /// and the same change as one statement (`batchUpdate` against `updateAll`). Medians.
    func runWrites(
        store: Skyros, pool: DatabasePool, report: (Row) -> Void
    ) throws {
        let perValue = rows / 100
        var skyrosSave: [Double] = []
        var grdbSave: [Double] = []
        var preparedSave: [Double] = []
        var skyrosBatch: [Double] = []
        var grdbBatch: [Double] = []
        for round in 0..<rounds {
            // Values 20 + 5·round … 24 + 5·round: never the same rows twice, nor the reads' 0–9.
            let first = 20 + 5 * round
            precondition(first + 4 < 100, "too many rounds for the values the fill writes")
            let skyrosValue = first
            let grdbValue = first + 1
            let skyrosBatchValue = first + 2
            let grdbBatchValue = first + 3
            let preparedValue = first + 4
            let score = Double(round) + 0.25
            func skyrosUpdate() throws {
                var changed = 0
                skyrosSave.append(
                    try Clock.seconds {
                        try store.writeAndWait { context in
                            for item in try context.fetch(
                                FetchDescriptor<Item>(predicate: #Predicate { $0.value == skyrosValue }))
                            {
                                item.score = score
                                changed += 1
                            }
                        }
                    })
                precondition(changed == perValue, "Skyros changed \(changed) objects")
            }
            /// GRDB's positional records of `value`, fetched on a cached statement, each given
            /// the new score and written by what `writer` makes once per transaction (a
            /// statement held, not looked up per record); the time goes to `samples`.
            func grdbUpdate(
                _ value: Int, _ samples: inout [Double],
                _ writer: (Database) throws -> (GRDBItemByPosition) throws -> Void
            ) throws {
                var changed = 0
                samples.append(
                    try Clock.seconds {
                        try pool.write { db in
                            let fetch = try db.cachedStatement(sql: GRDBItemByPosition.byValueSQL)
                            let write = try writer(db)
                            for var item in try GRDBItemByPosition.fetchAll(fetch, arguments: [value]) {
                                item.score = score
                                try write(item)
                                changed += 1
                            }
                        }
                    })
                precondition(changed == perValue, "GRDB changed \(changed) records")
            }
            // The record's `update(_:columns:)`.
            func recordUpdate() throws {
                try grdbUpdate(grdbValue, &grdbSave) { db in
                    { item in try item.update(db, columns: [Column("score")]) }
                }
            }
            // A cached prepared `UPDATE … SET score = ? WHERE _id = ?`, held for the transaction.
            func preparedUpdate() throws {
                try grdbUpdate(preparedValue, &preparedSave) { db in
                    let update = try db.cachedStatement(sql: "UPDATE \"Item\" SET score = ? WHERE \"_id\" = ?")
                    return { item in try update.execute(arguments: [item.score, item.id]) }
                }
            }
            try Self.inTurn(round, [skyrosUpdate, recordUpdate, preparedUpdate])
            var updated = 0
            func skyrosBatchUpdate() throws {
                skyrosBatch.append(
                    try Clock.seconds {
                        updated = try awaitResult {
                            try await store.batchUpdate(
                                Item.self, where: #Predicate { $0.value == skyrosBatchValue }, .set(\.score, to: score))
                        }
                    })
                precondition(updated == perValue, "batchUpdate changed \(updated) rows")
            }
            func grdbBatchUpdate() throws {
                grdbBatch.append(
                    try Clock.seconds {
                        updated = try pool.write { db in
                            try GRDBItem.filter(Column("value") == grdbBatchValue).updateAll(
                                db, Column("score").set(to: score))
                        }
                    })
                precondition(updated == perValue, "updateAll changed \(updated) rows")
            }
            try Self.inTurn(round, [skyrosBatchUpdate, grdbBatchUpdate])
        }
        let thousands = "\(perValue / 1_000)k"
        report(
            Row(
                name:
                    "update one attribute of \(thousands) objects, one transaction (vs GRDB positional record update)",
                unit: "objects/s",
                skyros: Double(perValue) / Self.median(skyrosSave), baseline: Double(perValue) / Self.median(grdbSave)))
        report(
            Row(
                name:
                    "update one attribute of \(thousands) objects, one transaction (vs a cached prepared UPDATE per record)",
                unit: "objects/s",
                skyros: Double(perValue) / Self.median(skyrosSave),
                baseline: Double(perValue) / Self.median(preparedSave)))
        report(
            Row(
                name: "batchUpdate \(thousands) rows (vs GRDB updateAll)", unit: "rows/s",
                skyros: Double(perValue) / Self.median(skyrosBatch), baseline: Double(perValue) / Self.median(grdbBatch)
            ))
    }
}
