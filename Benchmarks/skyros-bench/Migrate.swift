import Foundation
import GRDBSQLite
import Skyros

// `skyros-bench migrate`: migrating a store of `rows` rows, Skyros (opening the store with a
// newer schema version) against hand-written SQL doing the same on a copy of the same file,
// in the same run. Two cases: an added attribute with a default and a renamed one (ALTER
// TABLE: constant time), and a change that needs the table rebuilt (optional → non-optional
// with a default, and a removed attribute). Peak memory growth of each side is measured from
// the process's peak resident set (VmHWM, reset through /proc/self/clear_refs).

@Entity(name: "Record") final class RecordV1 {
    var name: String = ""
    @Attribute(.indexed) var value: Int = 0
    var weight: Int? = nil
    var note: String = ""
}

/// Case 1: `name` renamed to `title`, `score` added with a default.
@Entity(name: "Record") final class RecordV2 {
    @Attribute(originalName: "name") var title: String = ""
    @Attribute(.indexed) var value: Int = 0
    var weight: Int? = nil
    var note: String = ""
    var score: Double = 1.5
}

/// Case 2: `weight` becomes non-optional (nil → 0), `note` is removed: a table rebuild.
@Entity(name: "Record") final class RecordV3 {
    var name: String = ""
    @Attribute(.indexed) var value: Int = 0
    var weight: Int = 0
}

struct MigrateBenchmark {
    let directory: URL
    let rows: Int
    let rounds: Int

    func run(report: (Row) -> Void) throws {
        let original = directory.appendingPathComponent("records.sqlite")
        try makeStore(at: original)
        // The constant-time case is a few milliseconds, within the noise of a shared machine:
        // more rounds (each on fresh copies) for a stable median.
        let cases: [(name: String, schema: Schema, rounds: Int, sql: [String])] = [
            (
                "migrate add+rename, \(rows / 1000)k rows", Schema([RecordV2.self], version: 2), rounds * 7,
                [
                    "ALTER TABLE \"Record\" RENAME COLUMN \"name\" TO \"title\"",
                    "ALTER TABLE \"Record\" ADD COLUMN \"score\" REAL NOT NULL DEFAULT 1.5",
                ]
            ),
            (
                "migrate rebuild, \(rows / 1000)k rows", Schema([RecordV3.self], version: 2), rounds,
                [
                    "CREATE TABLE \"new_Record\" (\"_id\" BLOB PRIMARY KEY NOT NULL, \"_version\" INTEGER NOT NULL DEFAULT 1, \"name\" TEXT NOT NULL, \"value\" INTEGER NOT NULL, \"weight\" INTEGER NOT NULL) STRICT, WITHOUT ROWID",
                    "INSERT INTO \"new_Record\" (\"_id\", \"_version\", \"name\", \"value\", \"weight\") SELECT \"_id\", \"_version\", \"name\", \"value\", COALESCE(\"weight\", 0) FROM \"Record\"",
                    "DROP TABLE \"Record\"",
                    "ALTER TABLE \"new_Record\" RENAME TO \"Record\"",
                    "CREATE INDEX \"Record_value\" ON \"Record\" (\"value\")",
                    "PRAGMA foreign_key_check",
                ]
            ),
        ]
        for (name, schema, rounds, sql) in cases {
            var skyros: [Double] = []
            var baseline: [Double] = []
            var skyrosMemory = 0.0
            var baselineMemory = 0.0
            // Round 0 warms both sides up (code paths, caches) and is not counted; the order of
            // the two sides alternates, so neither always runs right after the other.
            for round in 0...rounds {
                let skyrosFirst = round % 2 == 1
                for side in skyrosFirst ? [true, false] : [false, true] {
                    if side {
                        let copy = try fresh(original)
                        let memory = PeakMemory()
                        let seconds = try Clock.seconds {
                            let store = try SQLiteStore(schema: schema, url: copy)
                            try store.close()
                        }
                        skyrosMemory = max(skyrosMemory, memory.growthMB())  // the warm-up's too
                        if round > 0 { skyros.append(seconds) }
                    } else {
                        let raw = try fresh(original)
                        let memory = PeakMemory()
                        let seconds = Clock.seconds {
                            // A hand-written migration: the version checked, the steps, the
                            // version recorded (`user_version`, as hand-written migrations
                            // do), one transaction.
                            let db = RawSQLite(path: raw.path)
                            guard db.userVersion() < 2 else { fatalError("already migrated") }
                            db.execute("PRAGMA foreign_keys = OFF")
                            db.execute("BEGIN IMMEDIATE")
                            for statement in sql { db.execute(statement) }
                            db.execute("PRAGMA user_version = 2")
                            db.execute("COMMIT")
                            db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                        }
                        baselineMemory = max(baselineMemory, memory.growthMB())
                        if round > 0 { baseline.append(seconds) }
                    }
                }
            }
            report(Row(name: name, unit: "ms", skyros: median(skyros) * 1000, baseline: median(baseline) * 1000))
            if schema.entities[0].property(named: "score") != nil {
                // The fixed cost of opening a store, migrated or not: an up-to-date one.
                let copy = try fresh(original)
                try SQLiteStore(schema: schema, url: copy).close()
                sync()
                // The median of 9 alternating pairs, after a warm-up pair.
                var open: [Double] = []
                var rawOpen: [Double] = []
                for round in 0...9 {
                    let skyros = Clock.seconds { try? SQLiteStore(schema: schema, url: copy).close() }
                    let raw = Clock.seconds {
                        // A hand-written open checks the version too.
                        let db = RawSQLite(path: copy.path)
                        _ = db.userVersion()
                        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
                    }
                    if round > 0 {
                        open.append(skyros)
                        rawOpen.append(raw)
                    }
                }
                report(
                    Row(
                        name: "open an up-to-date store (no migration)", unit: "ms", skyros: median(open) * 1000,
                        baseline: median(rawOpen) * 1000))
            }
            report(Row(name: name + ", peak RSS growth", unit: "MB", skyros: skyrosMemory, baseline: baselineMemory))
        }
    }

    private func median(_ values: [Double]) -> Double { values.sorted()[values.count / 2] }

    /// A fresh copy of the version-1 store, on disk.
    private func fresh(_ original: URL) throws -> URL {
        let copy = directory.appendingPathComponent("copy.sqlite")
        for suffix in ["", "-wal", "-shm"] {
            try? FileManager.default.removeItem(atPath: copy.path + suffix)
        }
        try FileManager.default.copyItem(at: original, to: copy)
        sync()  // the copy's own writing is not timed (a migration's commit fsyncs the file)
        return copy
    }

    /// The version-1 store: Skyros makes the schema, raw SQL inserts the rows.
    private func makeStore(at url: URL) throws {
        try SQLiteStore(schema: Schema([RecordV1.self]), url: url).close()
        let db = RawSQLite(path: url.path)
        db.execute("BEGIN IMMEDIATE")
        let statement = db.prepare(
            "INSERT INTO \"Record\" (\"_id\", \"name\", \"value\", \"weight\", \"note\") VALUES (?, ?, ?, ?, ?)")
        for index in 0..<rows {
            sqlite3_reset(statement)
            db.bindID(statement, 1, index)
            db.bind(statement, 2, "record \(index)")
            sqlite3_bind_int64(statement, 3, Int64(index % 1000))
            if index % 3 == 0 {
                sqlite3_bind_null(statement, 4)
            } else {
                sqlite3_bind_int64(statement, 4, Int64(index))
            }
            db.bind(statement, 5, "a note about record \(index)")
            db.step(statement)
        }
        sqlite3_finalize(statement)
        db.execute("COMMIT")
        db.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    }
}

/// The growth of the process's peak resident set from now: the peak is reset (Linux's
/// /proc/self/clear_refs), and read back as VmHWM.
struct PeakMemory {
    let start: Double

    init() {
        try? "5".write(toFile: "/proc/self/clear_refs", atomically: false, encoding: .utf8)
        start = residentMB()
    }

    func growthMB() -> Double {
        guard let text = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
            let line = text.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
            let kilobytes = Double(line.split(separator: " ").dropFirst().first ?? "")
        else { return 0 }
        return max(0, kilobytes / 1024 - start)
    }
}
