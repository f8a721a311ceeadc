import Foundation
import Skyros
import SkyrosSync
import SkyrosWire
import Synchronization

/// The daemon's side of sync (DESIGN §9): the ``SyncHost`` its ``SyncEngine`` calls, whose
/// work the serve loop performs on its own thread (``DaemonServer``), woken through the
/// descriptor it already waits on.
///
/// It starts the engine once the group has a store: it creates the queue's tables, gives the
/// machine its id the first time (and queues the objects the store already has, so that
/// nothing made before sync was turned on stays on one machine), and reads the last checkpoint.
final class SyncLink: SyncHost {
    /// Work for the serve loop.
    enum Work {
        case apply(Checkpoint, CheckedContinuation<SyncApplyResult, Never>)
        case stage(SnapshotPage, CheckedContinuation<String?, Never>)
        case uploaded(Int64, CheckedContinuation<Void, Never>)
    }

    let configuration: SyncConfiguration
    /// How the engine paces itself (its snapshot page size, for tests).
    private let settings: SyncEngine.Settings
    private let wake: @Sendable () -> Void
    private let log: @Sendable (String) -> Void
    private let inbox = Mutex<(work: [Work], closed: Bool)>(([], false))
    private let engineBox = Mutex<SyncEngine?>(nil)
    /// The schema version the engine was last given.
    private let version = Mutex<Int?>(nil)
    private let lastStatus = Mutex(SyncEngine.Status())

    init(
        configuration: SyncConfiguration, settings: SyncEngine.Settings = SyncEngine.Settings(),
        wake: @escaping @Sendable () -> Void, log: @escaping @Sendable (String) -> Void
    ) {
        self.configuration = configuration
        self.settings = settings
        self.wake = wake
        self.log = log
    }

    /// The running engine, once the group has a store.
    var engine: SyncEngine? { engineBox.withLock { $0 } }

    // MARK: - SyncHost (any thread)

    func apply(_ checkpoint: Checkpoint) async -> SyncApplyResult {
        await withCheckedContinuation { continuation in
            post(.apply(checkpoint, continuation))
        }
    }

    func stage(_ page: SnapshotPage) async -> String? {
        await withCheckedContinuation { continuation in
            post(.stage(page, continuation))
        }
    }

    func uploaded(through number: Int64) async {
        await withCheckedContinuation { continuation in
            post(.uploaded(number, continuation))
        }
    }

    func syncStateChanged(_ status: SyncEngine.Status) {
        lastStatus.withLock { $0 = status }
    }

    private func post(_ work: Work) {
        let refused = inbox.withLock { inbox -> Work? in
            if inbox.closed { return work }
            inbox.work.append(work)
            return nil
        }
        if let refused {
            Self.refuse(refused)
        } else {
            wake()
        }
    }

    private static func refuse(_ work: Work) {
        switch work {
        case .apply(_, let continuation): continuation.resume(returning: .failed("the daemon is stopping"))
        case .stage(_, let continuation): continuation.resume(returning: "the daemon is stopping (a page was not staged)")
        case .uploaded(_, let continuation): continuation.resume()
        }
    }

    // MARK: - The serve loop's side

    /// The work posted since the last call.
    func takeWork() -> [Work] {
        inbox.withLock { inbox in
            defer { inbox.work = [] }
            return inbox.work
        }
    }

    /// Starts the engine when the group has a store, and tells it when the store's schema
    /// changed (a migration). Called by the serve loop after every turn: cheap when nothing changed.
    func refresh(_ turn: inout DaemonTurn) {
        guard let store = turn.store else { return }
        let current = store.schema.version
        guard version.withLock({ $0 }) != current else { return }
        let server = ServerSchema(store.schema, name: configuration.schema)
        if let engine {
            version.withLock { $0 = current }
            engine.schemaChanged(server)
            return
        }
        do {
            let state = try Self.prepare(store, turn: &turn, log: log)
            let engine = SyncEngine(
                configuration: configuration, schema: server, machine: state.machine, checkpoint: state.checkpoint,
                queuedThrough: state.queuedThrough, storePath: turn.settings.container.store.path, host: self, settings: settings, log: log)
            engineBox.withLock { $0 = engine }
            version.withLock { $0 = current }
            log("sync: machine \(state.machine.uuidString.lowercased()) syncs with \(configuration.redacted); \(state.queued) change sets queued")
            engine.start()
        } catch {
            version.withLock { $0 = current }
            log("sync: cannot start: \(SkyrosError.wrap(error).message)")
        }
    }

    /// What the store knows of its sync: the machine id, the last checkpoint, the queue.
    private struct Prepared {
        var machine: UUID
        var checkpoint: String?
        var queued: Int
        /// The highest number the queue ever had.
        var queuedThrough: Int64
    }

    /// Creates the queue's tables, the machine id (queueing the objects the store has the first
    /// time), and starts the group commit's queueing.
    private static func prepare(_ store: SQLiteStore, turn: inout DaemonTurn, log: @Sendable (String) -> Void) throws -> Prepared {
        let schema = store.schema
        let prepared = try store.transaction { transaction -> (Prepared, Int64) in
            try transaction.execute(UploadQueue.tableSQL)
            try transaction.execute(UploadQueue.rejectedTableSQL)
            var machine: UUID?
            if case .text(let text)? = try transaction.rows("SELECT value FROM skyros_metadata WHERE key = 'syncMachine'").first?.first {
                machine = UUID(uuidString: text)
            }
            if machine == nil {
                let made = UUID()
                machine = made
                try transaction.execute("INSERT OR REPLACE INTO skyros_metadata (key, value) VALUES ('syncMachine', ?)", [.text(made.uuidString)])
                // The objects made before sync: uploaded as inserts, a change set per 1,000.
                for entity in schema.entities {
                    let table = "\"" + entity.name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
                    var ids: [ObjectID] = []
                    for row in try transaction.rows("SELECT \"_id\" FROM \(table)") {
                        guard case .blob(let data)? = row.first, data.count == 16 else { continue }
                        ids.append(ObjectID(
                            entityName: entity.name, uuid: UUID(uuid: data.withUnsafeBytes { $0.loadUnaligned(as: uuid_t.self) })))
                    }
                    for chunk in stride(from: 0, to: ids.count, by: 1_000) {
                        let snapshots = try store.snapshots(for: Array(ids[chunk..<min(chunk + 1_000, ids.count)]))
                        let event = ChangeEvent(sequence: 0, kind: .changes, inserted: snapshots)
                        guard let changes = UploadQueue.changeSet(of: event, schema: schema) else { continue }
                        try transaction.execute(
                            "INSERT INTO skyros_sync_queue (sequence, timestamp, changes) VALUES (0, ?, ?)",
                            [.real(Date().timeIntervalSince1970), .blob(try changes.encoded())])
                    }
                }
            }
            var checkpoint: String?
            if case .text(let text)? = try transaction.rows("SELECT value FROM skyros_metadata WHERE key = 'syncCheckpoint'").first?.first {
                checkpoint = text
            }
            var last: Int64 = 0
            if case .integer(let number)? = try transaction.rows(
                "SELECT seq FROM sqlite_sequence WHERE name = 'skyros_sync_queue'").first?.first
            {
                last = number
            }
            var count = 0
            if case .integer(let number)? = try transaction.rows("SELECT count(*) FROM skyros_sync_queue").first?.first {
                count = Int(number)
            }
            return (Prepared(machine: machine!, checkpoint: checkpoint, queued: count, queuedThrough: last), last)
        }
        turn.groupCommit.startQueueing(after: prepared.1)
        return prepared.0
    }

    /// Stops the engine and answers the work still posted.
    func stop() {
        engine?.stop()
        let left = inbox.withLock { inbox -> [Work] in
            inbox.closed = true
            defer { inbox.work = [] }
            return inbox.work
        }
        for work in left { Self.refuse(work) }
    }

    /// The `sync` object of `skyros status`: the engine's state with the queue as the store has it.
    func statusReport(store: SQLiteStore?) -> [String: Any] {
        let status = engine?.status ?? lastStatus.withLock { $0 }
        var queue = 0
        var oldest: Double = 0
        var rejected = 0
        if let store, engine != nil,
            let row = (try? store.rows(
                "SELECT count(*), min(timestamp) FROM skyros_sync_queue WHERE number > ?", [.integer(status.uploadedThrough)]))?.first
        {
            if case .integer(let count) = row[0] { queue = Int(count) }
            if case .real(let time) = row[1] { oldest = max(0, Date().timeIntervalSince1970 - time) }
            if case .integer(let count)? = (try? store.rows("SELECT count(*) FROM skyros_sync_rejected"))?.first?.first {
                rejected = Int(count)
            }
        }
        var report: [String: Any] = [
            "state": status.state.rawValue, "uploadQueue": queue, "oldestQueuedSeconds": (oldest * 1000).rounded() / 1000,
            "checkpoint": status.checkpoint, "lagMilliseconds": status.lagMilliseconds, "rejected": rejected,
            "server": configuration.redacted,
        ]
        if let message = status.message { report["message"] = message }
        return report
    }
}
