import Foundation
import GRDB
import GRDBSQLite
import Skyros

/// Hidden suites to run under a profiler (`perf record`, `valgrind --tool=callgrind`):
/// `skyros-bench profile-insert`, `profile-fetch`, `profile-update`, `profile-iterate`,
/// `profile-shared`, `profile-open`, `profile-migrate` and `profile-schema-json`. They print rates or times, not benchmark rows. `SKYROS_PROFILE_ROUNDS` sets how many times each step runs.
struct Profile {
    let directory: URL
    var rounds: Int? { Int(ProcessInfo.processInfo.environment["SKYROS_PROFILE_ROUNDS"] ?? "") }
    let count = 100_000

    /// Opening and closing an up-to-date store file (no migration), many times: the fixed cost
    /// every `Skyros(sqliteStack:at:)` and every migration pays.
    func open() throws {
        let rounds = rounds ?? 500
        let url = directory.appendingPathComponent("open.sqlite")
        try SQLiteStore(schema: benchSchema, url: url).close()
        let seconds = try Clock.seconds {
            for _ in 0..<rounds { try SQLiteStore(schema: benchSchema, url: url).close() }
        }
        print("open + close an up-to-date store: \(Int(seconds / Double(rounds) * 1e6)) µs")
    }

    /// Migrating a small store (1,000 rows) from `RecordV1` to `RecordV2` (a rename and an
    /// added attribute: ALTER TABLE, constant time), many times, each on a fresh copy (the copy
    /// is not timed): the fixed cost of a lightweight migration.
    func migrate() throws {
        let rounds = rounds ?? 200
        let original = directory.appendingPathComponent("migrate-v1.sqlite")
        try SQLiteStore(schema: Schema([RecordV1.self]), url: original).close()
        try Skyros(sqliteStack: Schema([RecordV1.self]), at: original, savesOnStop: false).writeAndWait { context in
            for index in 0..<1_000 { RecordV1.create(in: context).name = "record \(index)" }
        }
        let copy = directory.appendingPathComponent("migrate-copy.sqlite")
        let v2 = Schema([RecordV2.self], version: 2)
        var seconds = 0.0
        for _ in 0..<rounds {
            for suffix in ["", "-wal", "-shm"] { try? FileManager.default.removeItem(atPath: copy.path + suffix) }
            try FileManager.default.copyItem(at: original, to: copy)
            seconds += try Clock.seconds { try SQLiteStore(schema: v2, url: copy).close() }
        }
        print("migrate add+rename (1,000 rows): \(Int(seconds / Double(rounds) * 1e6)) µs")
    }

    /// Encoding and decoding the canonical description of a schema (what a migration records
    /// and reads, and what a hello carries), against Foundation's JSONEncoder and JSONDecoder.
    func schemaJSON() throws {
        let rounds = rounds ?? 2_000
        let description = Schema([RecordV2.self], version: 2).schemaDescription
        let json = try description.canonicalJSON()
        let foundationEncoder = JSONEncoder()
        foundationEncoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        let encode = try Clock.seconds { for _ in 0..<rounds { _ = try description.canonicalJSON() } }
        let foundationEncode = try Clock.seconds {
            for _ in 0..<rounds { _ = try foundationEncoder.encode(description) }
        }
        let decode = try Clock.seconds { for _ in 0..<rounds { _ = try SchemaDescription(json: json) } }
        let foundationDecode = try Clock.seconds {
            for _ in 0..<rounds { _ = try JSONDecoder().decode(SchemaDescription.self, from: json) }
        }
        let rebuild = try Clock.seconds { for _ in 0..<rounds { _ = try Schema(description: description, version: 2) } }
        func micros(_ seconds: Double) -> String { String(format: "%.1f µs", seconds / Double(rounds) * 1e6) }
        print(
            "canonical description, \(json.count) bytes: encode \(micros(encode)) (JSONEncoder \(micros(foundationEncode))), decode \(micros(decode)) (JSONDecoder \(micros(foundationDecode))); Schema(description:) \(micros(rebuild))"
        )
    }

    /// Inserts of `count` objects in one write, each into a new store, until durable.
    func insert() throws {
        let rounds = rounds ?? 5
        var seconds = 0.0
        for round in 0..<rounds {
            let store = try Skyros(
                sqliteStack: benchSchema, at: directory.appendingPathComponent("insert-\(round).sqlite"))
            let done = DispatchSemaphore(value: 0)
            seconds += Clock.seconds {
                store.writeSync(
                    { context in
                        for index in 0..<count { EmbeddedBenchmark.fill(Item.create(in: context), index) }
                    }, completion: { _ in done.signal() })
                done.wait()
            }
        }
        var rawSeconds = 0.0
        for round in 0..<rounds {
            let raw = RawSQLite(path: directory.appendingPathComponent("insert-raw-\(round).sqlite").path)
            raw.createItemTable()
            rawSeconds += Clock.seconds { raw.insertItems(count) }
        }
        print("insert: \(Int(Double(rounds * count) / seconds)) objects/s")
        print("raw SQLite insert: \(Int(Double(rounds * count) / rawSeconds)) objects/s")
    }

    /// One attribute of 10,000 objects of a 1,000,000-row store changed in one transaction
    /// (the `batch-reads` update row), stage by stage: the fetch alone, the fetch and the
    /// change without a save (rolled back), the whole write; and the same rows through the
    /// store alone (`SQLiteStore.save` of a change set of 10,000 updates). Each round on rows
    /// of its own; the best round of each stage.
    func update() throws {
        let url = directory.appendingPathComponent("update.sqlite")
        try RawSQLite.fillStore(at: url, rows: 1_000_000)
        let store = try Skyros(sqliteStack: benchSchema, at: url, durability: .normal, savesOnStop: false)
        let rounds = min(rounds ?? 5, 24)
        var fetch = Double.infinity
        var change = Double.infinity
        var write = Double.infinity
        var storeSave = Double.infinity
        var load = Double.infinity
        for round in 0..<rounds {
            let base = 4 * round
            let (fetchValue, changeValue, writeValue, storeValue) = (base, base + 1, base + 2, base + 3)
            let score = Double(round) + 0.5
            fetch = min(
                fetch,
                try Clock.seconds {
                    try store.read { context in
                        _ = try context.fetch(FetchDescriptor<Item>(predicate: #Predicate { $0.value == fetchValue }))
                            .count
                    }
                })
            change = min(
                change,
                Clock.seconds {
                    store.mainContext.performAndWait {
                        let context = store.mainContext
                        for item
                            in (try? context.fetch(
                                FetchDescriptor<Item>(predicate: #Predicate { $0.value == changeValue }))) ?? []
                        {
                            item.score = score
                        }
                        context.rollback()
                    }
                })
            write = min(
                write,
                try Clock.seconds {
                    try store.writeAndWait { context in
                        for item in try context.fetch(
                            FetchDescriptor<Item>(predicate: #Predicate { $0.value == writeValue }))
                        {
                            item.score = score
                        }
                    }
                })
            let ids = try store.read { context in
                try context.fetchIdentifiers(FetchDescriptor<Item>(predicate: #Predicate { $0.value == storeValue }))
            }
            guard let scoreIndex = benchSchema.entity(named: "Item")?.property(named: "score")?.index,
                let sqlite = store.store as? SQLiteStore
            else { fatalError("no Item.score, or not a SQLite store") }
            var changes = ChangeSet()
            changes.updated = ids.map { ChangeSet.Update(id: $0, changes: [scoreIndex: .real(score)], baseVersion: 0) }
            storeSave = min(storeSave, try Clock.seconds { try sqlite.save(changes) })
            // What each context level pays to load objects it does not hold: the rows by identifier.
            load = min(load, try Clock.seconds { _ = try sqlite.snapshots(for: ids).count })
        }
        // Each level of a save on its own: contexts made by hand over the same store.
        var scratchSave = Double.infinity
        var mainSave = Double.infinity
        var rootSave = Double.infinity
        if let sqlite = store.store as? SQLiteStore {
            for round in 0..<rounds {
                let root = ObjectContext(name: "root", parent: sqlite)
                let main = ObjectContext(name: "main", parent: root)
                let scratch = ObjectContext(name: "scratch", parent: main)
                let value = 4 * rounds + round
                let score = Double(round) + 0.25
                try scratch.performAndWait {
                    for item in try scratch.fetch(FetchDescriptor<Item>(predicate: #Predicate { $0.value == value })) {
                        item.score = score
                    }
                    scratchSave = min(scratchSave, try Clock.seconds { try scratch.save() })
                }
                try main.performAndWait { mainSave = min(mainSave, try Clock.seconds { try main.save() }) }
                try root.performAndWait { rootSave = min(rootSave, try Clock.seconds { try root.save() }) }
            }
        }
        for (name, seconds) in [
            ("scratch.save (into main)", scratchSave), ("main.save (into root)", mainSave),
            ("root.save (into the store)", rootSave),
        ] {
            print("\(name): \(Int(seconds * 1e3)) ms")
        }
        for (name, seconds) in [
            ("fetch 10,000 by the indexed attribute", fetch), ("fetch and change, no save", change),
            ("fetch, change and save (writeAndWait)", write), ("SQLiteStore.save of 10,000 updates", storeSave),
            ("SQLiteStore.snapshots(for: 10,000 identifiers)", load),
        ] {
            print("\(name): \(Int(seconds * 1e3)) ms, \(Int(seconds / 1e4 * 1e9)) ns per object")
        }
    }

    /// The `batch-reads` iteration alone, for instruction counts (`perf stat -e instructions`,
    /// callgrind): `SKYROS_PROFILE_SIDE` = `skyros` iterates 1M objects with
    /// `fetch(_:batchSize:)`, `grdb` with GRDB's positional record, `none` only fills the store
    /// (subtract it). `SKYROS_PROFILE_ROWS` sets the rows (default 1M). With
    /// `SKYROS_PROFILE_READ=indexed`, each side makes `batch-reads`' "fetch 1%" instead: 10
    /// fetches by the indexed `value`, each in a read of its own (GRDB: the by-name record's
    /// `fetchAll`).
    func iterate() throws {
        let rows = Int(ProcessInfo.processInfo.environment["SKYROS_PROFILE_ROWS"] ?? "") ?? 1_000_000
        let side = ProcessInfo.processInfo.environment["SKYROS_PROFILE_SIDE"] ?? "skyros"
        // SKYROS_PROFILE_STORE: a store filled by an earlier run (kept there), so that a
        // profiler sees the iteration alone.
        let kept = ProcessInfo.processInfo.environment["SKYROS_PROFILE_STORE"].map { URL(fileURLWithPath: $0) }
        let url = kept ?? directory.appendingPathComponent("iterate.sqlite")
        if kept == nil || !FileManager.default.fileExists(atPath: url.path) {
            try RawSQLite.fillStore(at: url, rows: rows)
        }
        let rounds = rounds ?? 3
        var sum = 0.0
        var best = Double.infinity
        let indexed = ProcessInfo.processInfo.environment["SKYROS_PROFILE_READ"] == "indexed"
        switch side {
        case "skyros":
            let store = try Skyros(sqliteStack: benchSchema, at: url, durability: .normal, savesOnStop: false)
            for _ in 0..<rounds {
                best = min(
                    best,
                    try Clock.seconds {
                        if indexed {
                            for wanted in 0..<10 { sum += Double(try BatchBenchmark.fetchIndexed(store, wanted)) }
                            return
                        }
                        sum += try store.read { context in
                            var sum = 0.0
                            for item in try context.fetch(FetchDescriptor<Item>(), batchSize: 1_000) {
                                sum += BatchBenchmark.checksum(
                                    item.name, item.value, item.flag, item.score, item.created)
                            }
                            return sum
                        }
                    })
            }
        case "grdb":
            let pool = try DatabasePool(path: url.path)
            for _ in 0..<rounds {
                best = min(
                    best,
                    try Clock.seconds {
                        if indexed {
                            for wanted in 0..<10 { sum += Double(try BatchBenchmark.fetchIndexed(pool, wanted)) }
                            return
                        }
                        sum += try pool.read { db in
                            var sum = 0.0
                            let items = try GRDBItemByPosition.fetchCursor(db, sql: GRDBItemByPosition.sql)
                            while let item = try items.next() {
                                sum += BatchBenchmark.checksum(
                                    item.name, item.value, item.flag, item.score, item.created)
                            }
                            return sum
                        }
                    })
            }
        default:
            print("\(side): the store filled, nothing iterated")
            return
        }
        let objects = indexed ? rows / 10 : rows
        print(
            "\(side): best of \(rounds) \(Int(best * 1e3)) ms, \(Int(best / Double(objects) * 1e9)) ns per object (checksum \(sum))"
        )
    }

    /// "Fetch all" of `count` stored objects, stage by stage: with every attribute read, with
    /// none read, identifiers only, and the store's rows alone. Each reader is a new stack,
    /// timed while it reads and deallocated outside the timing, as in the benchmark.
    func fetch() throws {
        let url = directory.appendingPathComponent("fetch.sqlite")
        let store = try Skyros(sqliteStack: benchSchema, at: url)
        store.writeSync { context in for index in 0..<count { EmbeddedBenchmark.fill(Item.create(in: context), index) }
        }
        _ = store.flush()
        let rounds = rounds ?? 20
        var total = 0
        // The best round of each stage: rounds differ a lot on a shared machine, the best is stable.
        func timed(_ body: (ObjectContext) throws -> Void) throws -> Double {
            var best = Double.infinity
            for _ in 0..<rounds {
                let reader = try Skyros(sqliteStack: benchSchema, at: url)
                best = min(best, try Clock.seconds { try reader.read { context in try body(context) } })
            }
            return best
        }
        // SKYROS_PROFILE_ONLY=indexed: only the indexed fetches, each a `read` of its own on
        // one store's main context (as `batch-reads` runs them), for a profiler to see alone.
        if ProcessInfo.processInfo.environment["SKYROS_PROFILE_ONLY"] == "indexed" {
            let grdb = ProcessInfo.processInfo.environment["SKYROS_PROFILE_SIDE"] == "grdb"
            let reader = try Skyros(sqliteStack: benchSchema, at: url)
            let pool = try DatabasePool(path: url.path)
            let seconds = try Clock.seconds {
                for _ in 0..<rounds {
                    for wanted in 0..<20 {
                        total +=
                            grdb
                            ? try BatchBenchmark.fetchIndexed(pool, wanted)
                            : try BatchBenchmark.fetchIndexed(reader, wanted)
                    }
                }
            }
            print(
                "1% by an indexed attribute, 20 reads (\(grdb ? "GRDB" : "Skyros")): \(Int(seconds / Double(rounds * 20 * count / 100) * 1e9)) ns each"
            )
            return
        }
        let all = try timed { context in
            for item in try Item.all(in: context) {
                total +=
                    item.value + item.name.utf8.count + (item.flag ? 1 : 0) + Int(item.score)
                    + Int(item.created.timeIntervalSince1970)
            }
        }
        let unread = try timed { context in total += try Item.all(in: context).count }
        // 1% of the rows, 20 times, through the index on `value`: 20,000 objects, a fifth of `count`.
        let indexed =
            try timed { context in
                for wanted in 0..<20 {
                    for item in try Item.all(where: #Predicate { $0.value == wanted }, in: context) {
                        total += item.value
                    }
                }
            } * 5
        let ids = try timed { context in total += try context.fetchIdentifiers(FetchDescriptor<Item>()).count }
        let rawStore = try SQLiteStore(schema: benchSchema, url: url)
        var rows = Double.infinity
        for _ in 0..<rounds {
            rows = min(
                rows,
                try Clock.seconds {
                    try rawStore.forEachSnapshot(StoreRequest(entityName: "Item")) { _, values, _ in
                        total += values.count
                    }
                })
        }
        let raw = RawSQLite(path: directory.appendingPathComponent("fetch-raw.sqlite").path)
        raw.createItemTable()
        raw.insertItems(count)
        var rawRows = Double.infinity
        for _ in 0..<rounds { rawRows = min(rawRows, Clock.seconds { total += Int(raw.readAllItems()) }) }
        let objects = Double(count)
        for (name, seconds) in [
            ("fetch all, read every attribute", all), ("fetch all, read nothing", unread),
            ("1% by an indexed attribute, 20 times", indexed), ("identifiers only", ids), ("store rows only", rows),
            ("raw SQLite, read every column", rawRows),
        ] {
            print("\(name): \(Int(objects / seconds)) /s, \(Int(seconds / objects * 1e9)) ns each")
        }
        print("checksum \(total)")
    }

    /// Client A saves one object through an in-process daemon, client B fetches it by an
    /// indexed attribute: the requests of the shared benchmark's visibility loop, without waits.
    func shared() throws {
        let rounds = rounds ?? 2_000
        let daemon = try SharedBenchmark.Daemon(directory.appendingPathComponent("shared"), durability: .normal)
        defer { daemon.stop() }
        let a = try Skyros(sharedStack: benchSchema, container: daemon.container.url, timeout: 60)
        let b = try Skyros(sharedStack: benchSchema, container: daemon.container.url, timeout: 60)
        let done = DispatchSemaphore(value: 0)
        var found = 0
        let seconds = Clock.seconds {
            for index in 0..<rounds {
                a.writeSync({ context in Item.create(in: context).value = index }, completion: { _ in done.signal() })
                done.wait()
                b.read { context in
                    found += try Item.first(where: #Predicate { $0.value == index }, in: context) == nil ? 0 : 1
                }
            }
        }
        print("save + fetch: \(Int(seconds / Double(rounds) * 1e6)) us each, \(found) found")
    }
}
