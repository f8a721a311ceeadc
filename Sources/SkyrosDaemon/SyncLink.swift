import Foundation
import Skyros
import SkyrosSync
import SkyrosWire
import Synchronization

/// The daemon's side of sync (docs/SYNC.md): it starts the engine once the group has a store,
/// and holds the ``SyncChannel`` through which the engine's requests reach the serve loop
/// (``DaemonServer``), woken through the descriptor it already waits on, which answers them
/// with the turn (``DaemonTurn/answer(_:)``).
///
/// At start it creates the queue's tables, gives the machine its id the first time (and
/// queues the objects the store already has, so that nothing made before sync was turned on
/// stays on one machine), and reads the last checkpoint.
final class SyncLink: Sendable {
    let configuration: SyncConfiguration
    /// The engine's requests to the store.
    let channel: SyncChannel
    /// How the engine paces itself (its snapshot page size, for tests).
    private let settings: SyncEngine.Settings
    private let log: @Sendable (String) -> Void
    private let engineBox = Mutex<SyncEngine?>(nil)
    /// The schema version the engine was last given.
    private let version = Mutex<Int?>(nil)

    init(
        configuration: SyncConfiguration, settings: SyncEngine.Settings = SyncEngine.Settings(),
        wake: @escaping @Sendable () -> Void, log: @escaping @Sendable (String) -> Void
    ) {
        self.configuration = configuration
        self.settings = settings
        channel = SyncChannel(wake: wake)
        self.log = log
    }

    /// The running engine, once the group has a store.
    var engine: SyncEngine? { engineBox.withLock { $0 } }

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
                rejectedThrough: state.rejectedThrough, queuedThrough: state.queuedThrough,
                storePath: turn.settings.container.store.path, host: channel,
                settings: settings, log: log)
            engineBox.withLock { $0 = engine }
            version.withLock { $0 = current }
            log(
                "sync: machine \(state.machine.uuidString.lowercased()) syncs with \(configuration.redacted); \(state.queued) change set\(state.queued == 1 ? "" : "s") queued"
            )
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
        /// The upload number through which refusals are recorded.
        var rejectedThrough: Int64
        var queued: Int
        /// The highest number the queue ever had.
        var queuedThrough: Int64
    }

    /// Creates the queue's tables, the machine id (queueing the objects the store has the first
    /// time), and starts the group commit's queueing.
    private static func prepare(_ store: SQLiteStore, turn: inout DaemonTurn, log: @Sendable (String) -> Void) throws
        -> Prepared
    {
        let schema = store.schema
        let prepared = try store.transaction { transaction -> (Prepared, Int64) in
            try SyncTables.create(in: transaction)
            var machine = try SyncTables.machine(in: transaction)
            if machine == nil {
                let made = UUID()
                machine = made
                try SyncTables.setMachine(made, in: transaction)
                // The objects made before sync: uploaded as inserts, a change set per 1,000.
                for entity in schema.entities {
                    let table = SQLIdentifier.quote(entity.name)
                    var ids: [ObjectID] = []
                    for row in try transaction.rows("SELECT \"_id\" FROM \(table)") {
                        guard case .blob(let data)? = row.first, data.count == 16 else { continue }
                        ids.append(
                            ObjectID(
                                entityName: entity.name,
                                uuid: UUID(uuid: data.withUnsafeBytes { $0.loadUnaligned(as: uuid_t.self) })))
                    }
                    for chunk in stride(from: 0, to: ids.count, by: 1_000) {
                        let snapshots = try store.snapshots(for: Array(ids[chunk..<min(chunk + 1_000, ids.count)]))
                        let event = ChangeEvent(sequence: 0, kind: .changes, inserted: snapshots)
                        guard let changes = UploadQueue.changeSet(of: event, schema: schema) else { continue }
                        try SyncTables.enqueue(changes, sequence: 0, in: transaction)
                    }
                }
            }
            let checkpoint = try SyncTables.checkpoint(in: transaction)
            let last = try SyncTables.highestNumber(in: transaction)
            let count = try SyncTables.count(in: transaction)
            let rejectedThrough = try SyncTables.rejectedThrough(in: transaction)
            return (
                Prepared(
                    machine: machine!, checkpoint: checkpoint, rejectedThrough: rejectedThrough, queued: count,
                    queuedThrough: last), last
            )
        }
        turn.groupCommit.startQueueing(after: prepared.1)
        return prepared.0
    }

    /// A daemon started without sync on a store that has synced (it has a machine id): its
    /// commits are queued all the same, and uploaded when the daemon syncs again, so that sync
    /// switched off and on loses nothing (a new store, or one that never synced, queues nothing).
    static func queueWithoutSync(_ turn: inout DaemonTurn, log: @Sendable (String) -> Void) {
        guard let store = turn.store else { return }
        do {
            let found = try store.transaction { transaction -> (UUID, Int64, Int)? in
                guard let machine = try SyncTables.machine(in: transaction) else { return nil }
                try SyncTables.create(in: transaction)
                return (
                    machine, try SyncTables.highestNumber(in: transaction), try SyncTables.count(in: transaction)
                )
            }
            guard let (machine, last, count) = found else { return }
            turn.groupCommit.startQueueing(after: last)
            log(
                "sync is off; the store has synced (machine \(machine.uuidString.lowercased())): its commits are queued (\(count) so far) and uploaded when the daemon syncs again"
            )
        } catch {
            log("sync is off; cannot read the store's upload queue: \(SkyrosError.wrap(error).message)")
        }
    }

    /// Stops the engine and answers the work still posted.
    func stop() {
        engine?.stop()
        channel.close()
    }

    /// The `sync` object of `skyros status`: the engine's state with the queue as the store has it.
    func statusReport(store: SQLiteStore?) -> [String: Any] {
        let status = engine?.status ?? channel.status
        var queue = 0
        var oldest: Double = 0
        var rejected = 0
        if let store, engine != nil, let tables = try? SyncTables.status(after: status.uploadedThrough, in: store) {
            queue = tables.queued
            if let time = tables.oldest { oldest = max(0, Date().timeIntervalSince1970 - time.timeIntervalSince1970) }
            rejected = tables.rejected
        }
        var report: [String: Any] = [
            "state": status.state.rawValue, "uploadQueue": queue,
            "oldestQueuedSeconds": (oldest * 1000).rounded() / 1000,
            "checkpoint": status.checkpoint, "lagMilliseconds": status.lagMilliseconds, "rejected": rejected,
            "server": configuration.redacted, "via": configuration.gateway == nil ? "postgresql" : "gateway",
        ]
        if let message = status.message { report["message"] = message }
        return report
    }
}
