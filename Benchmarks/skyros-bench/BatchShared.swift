import Foundation
import Skyros
import SkyrosShared

extension BatchBenchmark {
    /// Batch update and delete through a group's daemon (run on a thread of this process, over
    /// real ipc:// sockets, at the same durability), beside the embedded figures of the same
    /// run: the target is at least half the embedded speed.
    func runShared(embeddedUpdate: Double, embeddedDelete: Double, report: (Row) -> Void) throws {
        let container = directory.appendingPathComponent("batch-group")
        try FileManager.default.createDirectory(at: container, withIntermediateDirectories: true)
        let daemon = try SharedBenchmark.Daemon(container, durability: .normal)
        defer { daemon.stop() }
        let store = try Skyros(sharedStack: benchSchema, container: container, timeout: 120, savesOnStop: false)
        let imported = try awaitResult {
            try await store.importBatch(0..<rows, chunkSize: 10_000) { index, context in
                let item = Item.create(in: context)
                item.name = "n\(index % 1_000)"
                item.value = index
                item.score = Double(index % 97) / 4
                item.flag = index % 3 == 0
            }
        }
        precondition(imported == rows, "wrong import count")
        let tenth = rows / 10
        var update = 0.0
        var delete = 0.0
        for round in 0..<2 {  // the first run warms the daemon's connection; the second is reported
            let (low, high) = (round * 2 * tenth, (round * 2 + 1) * tenth)
            var updated = 0
            update = try Clock.seconds {
                updated = try awaitResult {
                    try await store.batchUpdate(
                        Item.self, where: #Predicate { $0.value >= low && $0.value < high }, .set(\.score, to: 1.5))
                }
            }
            precondition(updated == tenth, "wrong update count")
            let (deleteLow, deleteHigh) = ((4 + round * 2) * tenth, (5 + round * 2) * tenth)
            var deleted = 0
            delete = try Clock.seconds {
                deleted = try awaitResult {
                    try await store.batchDelete(
                        Item.self, where: #Predicate { $0.value >= deleteLow && $0.value < deleteHigh })
                }
            }
            precondition(deleted == tenth, "wrong delete count")
        }
        report(
            Row(
                name: "batch update of \(tenth / 1000)k of \(rows / 1000)k rows, daemon vs embedded", unit: "Mrows/s",
                skyros: Double(tenth) / 1e6 / update, baseline: Double(tenth) / 1e6 / embeddedUpdate))
        report(
            Row(
                name: "batch delete of \(tenth / 1000)k of \(rows / 1000)k rows, daemon vs embedded", unit: "Mrows/s",
                skyros: Double(tenth) / 1e6 / delete, baseline: Double(tenth) / 1e6 / embeddedDelete))
    }
}
