import Foundation
import Skyros

extension BatchBenchmark {
    /// `importBatch` of `rows` records (chunks of 10,000, each a durable save) against raw
    /// prepared-statement inserts of the same rows in one transaction, each on a new file at
    /// the same durability (synchronous=NORMAL, WAL); `rounds` rounds, the median ratio's
    /// round reported. Peak RSS growth during the import is sampled every 5 ms.
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
            let sampler = PeakSampler()
            var imported = 0
            let skyros = try Clock.seconds {
                imported = try awaitResult {
                    try await store.importBatch(0..<rows, chunkSize: 10_000) { index, context in
                        EmbeddedBenchmark.fill(Item.create(in: context), index)
                    }
                }
            }
            let growth = sampler.stop()
            precondition(imported == rows, "wrong import count")
            let raw = RawSQLite(path: folder.appendingPathComponent("raw.sqlite").path, synchronous: "NORMAL")
            raw.createItemTable()
            let rawSeconds = Clock.seconds { raw.insertItems(rows) }
            measured.append(Round(skyros: skyros, raw: rawSeconds, peakGrowth: growth))
        }
        let median = measured.sorted { $0.raw / $0.skyros < $1.raw / $1.skyros }[measured.count / 2]
        report(Row(name: "importBatch \(rows / 1000)k records (chunks of 10k) vs raw inserts in one transaction", unit: "records/s",
                   skyros: Double(rows) / median.skyros, baseline: Double(rows) / median.raw))
        let growth = measured.map(\.peakGrowth).max() ?? 0
        report(Row(name: "importBatch \(rows / 1000)k records, peak RSS growth (largest round; target < 50)", unit: "MB",
                   skyros: growth, baseline: 0))
        benchmarkAssert(growth < 50, "importBatch of \(rows) records grew the RSS by \(growth) MB (less than 50)")
    }
}

/// Samples this process's resident set size on a thread of its own until stopped; returns the
/// peak growth over the size at the start, in MB.
final class PeakSampler: @unchecked Sendable {
    private let lock = NSLock()
    private var peak: Double
    private var running = true
    private let start: Double
    private let finished = DispatchSemaphore(value: 0)

    init(every interval: TimeInterval = 0.005) {
        start = residentMB()
        peak = start
        Thread.detachNewThread { [self] in
            while lock.withLock({ running }) {
                let now = residentMB()
                lock.withLock { peak = max(peak, now) }
                Thread.sleep(forTimeInterval: interval)
            }
            finished.signal()
        }
    }

    /// Stops sampling; the peak growth in MB.
    func stop() -> Double {
        lock.withLock { running = false }
        finished.wait()
        return lock.withLock { max(peak, residentMB()) } - start
    }
}
