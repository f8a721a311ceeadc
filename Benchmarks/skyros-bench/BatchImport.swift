import Foundation
import Skyros

extension BatchBenchmark {
    /// `importBatch` of `rows` records (chunks of 10,000, each a durable save) against raw
    /// prepared-statement inserts of the same rows in one transaction, each on a new file at
    /// the same durability (synchronous=NORMAL, WAL); `rounds` rounds, the median ratio's
    /// round reported. Peak RSS growth during the import is the process's peak resident set
    /// (``PeakMemory``).
    func runImport(report: (Row) -> Void) throws {
        struct Round { var skyros: Double, raw: Double, peakGrowth: Double }
        var measured: [Round] = []
        for round in 0..<rounds {
            let folder = directory.appendingPathComponent("import-\(round)")
            try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
            defer { try? FileManager.default.removeItem(at: folder) }
            let store = try Skyros(
                sqliteStack: benchSchema, at: folder.appendingPathComponent("skyros.sqlite"), durability: .normal,
                savesOnStop: false)
            let memory = PeakMemory()
            var imported = 0
            let skyros = try Clock.seconds {
                imported = try awaitResult {
                    try await store.importBatch(0..<rows, chunkSize: 10_000) { index, context in
                        EmbeddedBenchmark.fill(Item.create(in: context), index)
                    }
                }
            }
            let growth = memory.growthMB()
            precondition(imported == rows, "wrong import count")
            let raw = RawSQLite(path: folder.appendingPathComponent("raw.sqlite").path, synchronous: "NORMAL")
            raw.createItemTable()
            let rawSeconds = Clock.seconds { raw.insertItems(rows) }
            measured.append(Round(skyros: skyros, raw: rawSeconds, peakGrowth: growth))
        }
        let median = measured.sorted { $0.raw / $0.skyros < $1.raw / $1.skyros }[measured.count / 2]
        report(
            Row(
                name: "importBatch \(rows / 1000)k records (chunks of 10k) vs raw inserts in one transaction",
                unit: "records/s",
                skyros: Double(rows) / median.skyros, baseline: Double(rows) / median.raw))
        let growth = measured.map(\.peakGrowth).max() ?? 0
        report(
            Row(
                name: "importBatch \(rows / 1000)k records, peak RSS growth (largest round; target < 50)", unit: "MB",
                skyros: growth, baseline: 0))
        benchmarkAssert(growth < 50, "importBatch of \(rows) records grew the RSS by \(growth) MB (less than 50)")
    }
}
