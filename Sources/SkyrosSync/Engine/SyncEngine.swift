import Foundation
import GRDB
import Skyros
import Synchronization

/// A machine's sync with PostgreSQL (docs/SYNC.md): the loop that uploads the store's queued
/// change sets in order, exactly once, and brings the server's checkpoints to the daemon.
///
/// The rules live in three state machines, values that take events and return actions:
/// ``UploadStateMachine`` (what goes up, in which batches), ``CheckpointStateMachine`` (when a
/// checkpoint is read, applied, compacted) and ``ConnectionStateMachine`` (online, offline,
/// error, and the delay before trying again). The engine is the thin loop that performs their
/// actions against a ``SyncServer`` (PostgreSQL itself: ``PostgresSyncServer``) and the daemon
/// (``SyncHost``).
///
/// It runs on Swift concurrency beside the daemon's serve loop. Online it uploads what the
/// daemon queued (woken by ``localCommitted(_:through:)``) and reads a checkpoint when the server
/// notifies a change (LISTEN/NOTIFY), or every ``Settings/pollInterval`` in case a
/// notification was missed. When the server cannot be reached it is offline: saves go on
/// locally, and it tries again with a growing delay (up to ``Settings/maximumRetryDelay``).
/// A server that refuses it (authentication, permissions, missing tables) puts it in the
/// error state with a message an operator can act on; it tries again all the same.
package final class SyncEngine: Sendable {
    /// What `skyros status` tells of sync.
    package struct Status: Sendable, Equatable {
        /// `online`, `offline` or `error`.
        package enum State: String, Sendable, Equatable {
            case online, offline, error
        }

        package var state: State = .offline
        /// Why it is offline or in error.
        package var message: String?
        /// The last checkpoint applied (its snapshot's xmin; 0: none yet).
        package var checkpoint: UInt64 = 0
        /// How old the newest change of the last checkpoint was when it was read.
        package var lagMilliseconds: Int = 0
        /// The highest queue number the server has (0: none).
        package var uploadedThrough: Int64 = 0

        /// Offline, nothing done yet.
        package init() {}
    }

    /// How the engine paces itself.
    package struct Settings: Sendable {
        /// How often it reads a checkpoint when no notification came.
        package var pollInterval: Duration = .seconds(5)
        /// The longest wait between two attempts to reach the server.
        package var maximumRetryDelay: Duration = .seconds(5)
        /// The most change sets uploaded in one statement.
        package var uploadBatch = 1_000
        /// About the most bytes of queued change sets in one statement (a change set larger
        /// than this goes alone).
        package var uploadBatchBytes = 8 << 20
        /// How many rows a snapshot checkpoint reads (and stages) at a time: about the most
        /// rows a snapshot holds in memory, twice (one page staged while the next is read).
        package var snapshotPageSize = 10_000
        /// How often the server's log is compacted.
        package var compactionInterval: Duration = .seconds(600)
        /// The longest one statement may wait for the server's answer before the connection is
        /// dropped and the engine goes offline (a server that vanished without closing the
        /// connection, a network that drops packets).
        package var statementTimeout: Duration = .seconds(10)
        /// Whether the engine may create and migrate the server's tables (false: it checks
        /// that they exist, as `--sync-setup` left them).
        package var createsSchema = true

        /// The default settings.
        package init() {}
    }

    private struct Mutable {
        /// This machine's id on the server (a new one after a restore or copy was found).
        var machine: UUID
        var schema: ServerSchema
        var schemaChanged = false
        var tasks: [Task<Void, Never>] = []
        var upload: UploadStateMachine
        var checkpoints: CheckpointStateMachine
        var connection: ConnectionStateMachine
    }

    private let configuration: SyncConfiguration
    private let settings: Settings
    private let storePath: String
    private weak let host: (any SyncHost)?
    private let log: @Sendable (String) -> Void
    /// Whether the engine logs each step of its uploads (`SKYROS_SYNC_TRACE` set in the
    /// daemon's environment): for post-mortems of the sync fault campaign, which sets it
    /// when it keeps its logs.
    private static let tracing = ProcessInfo.processInfo.environment["SKYROS_SYNC_TRACE"] != nil
    /// The thread the engine's tasks and connections run on.
    private let executor = SyncExecutor()
    private let server: any SyncServer
    private let wakeup: Wakeup
    private let mutable: Mutex<Mutable>
    private let finished = DispatchSemaphore(value: 0)

    /// An engine for the store at `storePath` (read through a read-only connection of its
    /// own), this machine's `machine` id, the checkpoint the store last applied (and the upload
    /// number through which it recorded refusals), and the highest number its queue ever had (`queuedThrough`; nil: unknown, read the queue).
    /// `server`: where it syncs (nil: the PostgreSQL server of `configuration`).
    package init(
        configuration: SyncConfiguration, schema: ServerSchema, machine: UUID, checkpoint: String?,
        rejectedThrough: Int64 = 0, queuedThrough: Int64? = nil,
        storePath: String, host: any SyncHost, settings: Settings = Settings(), server: (any SyncServer)? = nil,
        log: @escaping @Sendable (String) -> Void
    ) {
        self.configuration = configuration
        self.settings = settings
        self.storePath = storePath
        self.host = host
        self.log = log
        if let server {
            self.server = server
        } else if let gateway = configuration.gateway {
            self.server = GatewaySyncServer(
                endpoint: gateway, statementTimeout: settings.statementTimeout, executor: executor)
        } else {
            self.server = PostgresSyncServer(
                configuration: configuration, statementTimeout: settings.statementTimeout,
                createsSchema: settings.createsSchema,
                executor: executor)
        }
        mutable = Mutex(
            Mutable(
                machine: machine, schema: schema,
                upload: UploadStateMachine(
                    queuedThrough: queuedThrough, maximumBatch: settings.uploadBatch,
                    maximumBytes: settings.uploadBatchBytes),
                checkpoints: CheckpointStateMachine(
                    cursor: checkpoint, rejectedThrough: rejectedThrough, pollInterval: settings.pollInterval,
                    compactionInterval: settings.compactionInterval,
                    backlogLimit: settings.uploadBatch),
                connection: ConnectionStateMachine(maximumRetryDelay: settings.maximumRetryDelay)))
        wakeup = Wakeup(eventLoop: executor.eventLoop)
    }

    /// Logs an upload step when ``tracing``.
    private func trace(_ message: @autoclosure () -> String) {
        if Self.tracing { log("sync trace: \(message())") }
    }

    /// The engine's state, for `skyros status`.
    package var status: Status { mutable.withLock { Self.status(of: $0) } }

    private static func status(of state: Mutable) -> Status {
        var status = Status()
        status.state = state.connection.state
        status.message = state.connection.message
        status.checkpoint = state.checkpoints.checkpointNumber
        status.lagMilliseconds = state.checkpoints.lagMilliseconds
        status.uploadedThrough = state.upload.uploadedThrough
        return status
    }

    /// The machine's id on the server.
    package var machineID: UUID { machine }

    /// This machine's id, as the loop uses it now.
    private var machine: UUID { mutable.withLock { $0.machine } }

    /// Starts the loop.
    package func start() {
        let task = Task.detached(executorPreference: executor) { [self] in
            await run()
            finished.signal()
        }
        mutable.withLock { $0.tasks.append(task) }
    }

    /// Stops the loop (the change set being uploaded is either committed on the server or
    /// not: its record makes the next upload skip or apply it) and waits for it, a few
    /// seconds at most.
    package func stop() {
        let tasks = mutable.withLock { state -> [Task<Void, Never>] in
            state.connection.stop()
            return state.tasks
        }
        guard !tasks.isEmpty else { return }
        for task in tasks { task.cancel() }
        wakeup.signal()
        _ = finished.wait(timeout: .now() + 5)
    }

    /// Change sets were queued, `through` the highest number so far: upload them. `handed`:
    /// those change sets themselves, uploaded without reading them back from the queue (a
    /// read that was a tenth of a change's way from one machine to the next).
    package func localCommitted(_ handed: [QueuedEntry] = [], through last: Int64) {
        trace("queued through \(last), \(handed.first.map { "handed \($0.number)…" } ?? "none handed")")
        mutable.withLock { $0.upload.localCommitted(handed, through: last) }
        wakeup.signal()
    }

    /// The group's store was migrated: the server's tables follow before the next upload.
    package func schemaChanged(_ schema: ServerSchema) {
        mutable.withLock {
            $0.schema = schema
            $0.schemaChanged = true
        }
        wakeup.signal()
    }

    /// A notification of the transaction `xid` (nil: of some change), or any other reason to
    /// read the checkpoint: wakes the loop.
    private func notify(_ xid: UInt64?) {
        mutable.withLock { $0.checkpoints.notified(xid) }
        wakeup.signal()
    }

    private var isStopping: Bool { mutable.withLock { $0.connection.isStopping } || Task.isCancelled }

    // MARK: - The loop

    /// Connects, runs sessions and tries again, as the connection machine says.
    private func run() async {
        let queue: DatabaseQueue
        do {
            queue = try SyncTables.reader(of: storePath)
        } catch {
            report(
                mutable.withLock {
                    $0.connection.storeFailed("cannot read the upload queue in \(storePath): \(error)")
                })
            return
        }
        defer { try? queue.close() }
        var action = mutable.withLock { $0.connection.start() }
        while true {
            switch action {
            case .connect:
                do {
                    try await session(queue)
                    action = mutable.withLock { $0.connection.sessionEnded() }
                } catch is Reidentified {
                    action = .connect  // at once, under the new id
                } catch {
                    let (state, message) = isStopping ? (.offline, "stopping") : server.classify(error)
                    let actions = mutable.withLock { mutable in
                        mutable.upload.disconnected()
                        return mutable.connection.failed(state, message)
                    }
                    for next in actions.dropLast() { report(next) }
                    action = actions.last ?? .stop
                }
            case .retry(let delay):
                action = await waitToRetry(delay)
            case .stop:
                return
            case .report, .none:
                report(action)
                action = mutable.withLock { $0.connection.retry() }
            }
        }
    }

    /// Waits `delay` before the next attempt, or until a signal; offline, probes the servers at
    /// once and every ``ConnectionStateMachine/probeInterval`` meanwhile, and connects as soon
    /// as the connection machine says one came back.
    private func waitToRetry(_ delay: Duration) async -> ConnectionStateMachine.Action {
        let deadline = ContinuousClock.now + delay
        while mutable.withLock({ $0.connection.probes }) {
            let reachable = await server.probe()
            let action = mutable.withLock { $0.connection.probed(reachable: reachable) }
            if action != .none { return action == .connect ? .connect : mutable.withLock { $0.connection.retry() } }
            let left = deadline - .now
            guard left > .zero else { break }
            if await wakeup.wait(timeout: min(left, ConnectionStateMachine.probeInterval)) { break }
        }
        let left = deadline - .now
        if left > .zero, mutable.withLock({ !$0.connection.probes }) { await wakeup.wait(timeout: left) }
        return mutable.withLock { $0.connection.retry() }
    }

    /// One connection's life: prepare the schema, then upload and download until it fails.
    private func session(_ queue: DatabaseQueue) async throws {
        // A connection closed while the loop waits (the server restarted) wakes it: the next
        // statement fails at once and the engine goes offline, then connects again.
        let connection = try await server.connect(machine: machine) { [weak self] in self?.notify(nil) }
        defer { connection.close() }
        try await connection.prepare(takeSchema())
        let listener = listen()
        defer { listener.cancel() }
        var uploaded = try await connection.uploadedThrough(machine: machine)
        trace("connected: the server has this machine's change sets through \(uploaded)")
        if uploaded > 0, let diverged = try await divergence(connection, queue, serverThrough: uploaded) {
            try await reidentify(diverged)
            uploaded = try await connection.uploadedThrough(machine: machine)
        }
        let online = mutable.withLock { mutable in
            mutable.upload.connected(uploadedThrough: uploaded)
            mutable.checkpoints.connected(now: .now)
            return mutable.connection.sessionStarted()
        }
        report(online)
        if let name = connection.serverName { log("sync: connected to \(name)") }
        while !isStopping {
            try await prepareChangedSchema(connection)
            try await uploadQueued(connection, queue)
            if isStopping { return }
            try await downloadCheckpoint(connection)
        }
    }

    /// The schema to prepare on the server, taken: a migration since is told again.
    private func takeSchema() -> ServerSchema {
        mutable.withLock { state in
            state.schemaChanged = false
            return state.schema
        }
    }

    /// Prepares the schema the store migrated to since it was last taken, if any, on the
    /// session's connection; the checkpoints then read the new tables.
    private func prepareChangedSchema(_ connection: any SyncServerConnection) async throws {
        let changed = mutable.withLock { state -> ServerSchema? in
            guard state.schemaChanged else { return nil }
            state.schemaChanged = false
            return state.schema
        }
        guard let changed else { return }
        try await connection.prepare(changed)
        mutable.withLock { $0.checkpoints.schemaChanged() }
    }

    /// Upstream: everything queued, in order, as the upload machine batches it.
    private func uploadQueued(_ connection: any SyncServerConnection, _ queue: DatabaseQueue) async throws {
        var action = mutable.withLock { $0.upload.nextBatch() }
        while !isStopping {
            switch action {
            case .idle:
                return
            case .readQueue(let after, let limit, let bytes):
                let entries = try SyncTables.batch(after: after, limit: limit, bytes: bytes, from: queue)
                action = mutable.withLock { $0.upload.queueRead(entries) }
            case .upload:
                // A migration told while uploading: the server's tables follow first, or the
                // change sets queued since (under the new names) would name columns the
                // session does not know, and their values would not be written.
                try await prepareChangedSchema(connection)
                let batch = mutable.withLock { $0.upload.batch }
                let (outcomes, transactions) = try await connection.upload(batch, machine: machine)
                trace(
                    "uploaded \(batch.first?.number ?? 0)…\(batch.last?.number ?? 0) (\(batch.count)): \(outcomes.filter { $0 == .applied }.count) applied, transactions \(transactions.map { "\($0)" } ?? "?")"
                )
                // A change set the server had already under this number must be this one:
                // another store with this machine's id (a copy) may have taken the number.
                let already = zip(batch, outcomes).filter { $0.1 == .alreadyApplied }.map(\.0)
                if !already.isEmpty {
                    let recorded = try await connection.digests(machine: machine, numbers: already.map(\.number))
                    if let other = already.first(where: { entry in
                        recorded[entry.number].map { $0 != entry.changes.digest } ?? false
                    }) {
                        let diverged = try await divergence(connection, queue, serverThrough: other.number)
                        try await reidentify(
                            diverged
                                ?? Divergence(
                                    reason: "the server has another change set \(other.number) of this machine",
                                    dropping: []
                                ))
                        throw Reidentified()
                    }
                }
                action = mutable.withLock { mutable in
                    let next = mutable.upload.uploaded(outcomes: outcomes)
                    let refused = if case .markUploaded(_, let refusals) = next { !refusals.isEmpty } else { false }
                    mutable.checkpoints.uploaded(changeSets: batch.count, transactions: transactions, refused: refused)
                    return next
                }
            case .markUploaded(let last, let refusals):
                trace("marked uploaded through \(last)")
                for refusal in refusals {
                    log("sync: change set \(refusal.number) was refused by the server: \(refusal.reason)")
                }
                await host?.uploaded(through: last)
                action = mutable.withLock { $0.upload.nextBatch() }
            }
        }
    }

    /// Downstream: reads, applies and compacts as the checkpoint machine says, until it waits
    /// or sends the loop back to the uploads.
    private func downloadCheckpoint(_ connection: any SyncServerConnection) async throws {
        var step = mutable.withLock { $0.checkpoints.uploadsDone() }
        var checkpoint: Checkpoint?
        while true {
            switch step {
            case .read(let previous):
                do {
                    // A snapshot's pages are staged by the daemon as they are read.
                    let rejectedAfter = mutable.withLock { $0.checkpoints.rejectedThrough }
                    let read = try await connection.readCheckpoint(
                        after: previous, rejectedAfter: rejectedAfter, machine: machine,
                        pageSize: settings.snapshotPageSize
                    ) { [weak host = self.host, log = self.log] page in
                        for line in page.unreadable { log("sync: \(line)") }
                        guard let host else { return "the sync engine has no daemon any more" }
                        return await host.stage(page)
                    }
                    checkpoint = read
                    step = mutable.withLock { mutable in
                        mutable.checkpoints.read(
                            .init(read), uploadedThrough: mutable.upload.uploadedThrough, now: .now)
                    }
                    accepted(read, step)
                } catch let failure as Checkpoint.StagingFailed {
                    step = mutable.withLock { $0.checkpoints.stagingFailed(failure.reason) }
                }
            case .apply:
                let base = mutable.withLock { $0.checkpoints.staged }
                let result: SyncApplyResult
                if let checkpoint, let host {
                    result =
                        if let base { await host.applyStaged(checkpoint, base: base) } else {
                            await host.apply(checkpoint)
                        }
                } else {
                    result = .failed("the sync engine has no daemon any more")
                }
                step = mutable.withLock { $0.checkpoints.applied(result, now: .now) }
                if let checkpoint { accepted(checkpoint, step) }
            case .compact:
                try await connection.compact(retention: configuration.retention)
                step = mutable.withLock { $0.checkpoints.compacted() }
            case .uploadFirst:
                return
            case .wait(let timeout):
                let signaled = await wakeup.wait(timeout: timeout)
                mutable.withLock { $0.checkpoints.wokeUp(signaled: signaled) }
                return
            case .fail(let message, let delay):
                report(mutable.withLock { $0.connection.storeFailed(message) })
                await wakeup.wait(timeout: delay)
                return
            }
        }
    }

    /// After `checkpoint` was read or applied: when the machine took it (its next step is to
    /// compact or to wait), the engine is online and the rows it could not read are told.
    private func accepted(_ checkpoint: Checkpoint, _ step: CheckpointStateMachine.Action) {
        switch step {
        case .compact, .wait:
            report(mutable.withLock { $0.connection.checkpointApplied() })
            for line in checkpoint.unreadable { log("sync: \(line)") }
        default:
            break
        }
    }

    // MARK: - Identity

    /// The store is not the one whose uploads the server recorded under this machine's id.
    struct Divergence {
        /// Why, for the log.
        var reason: String
        /// The queued change sets the server has, the same (by digest): not uploaded again.
        var dropping: [Int64]
    }

    /// The session ends after a new identity was taken: the next one starts under it.
    struct Reidentified: Error, CustomStringConvertible {
        var description: String { "the store took a new machine id" }
    }

    /// Whether the server's record of this machine, through `serverThrough`, is not this
    /// store's (nil: it is, as far as the digests tell): the server has numbers the store never
    /// gave (a restore from an older backup, or a copy that went ahead), or a change set under
    /// a number the store gave another one (a copy).
    private func divergence(
        _ connection: any SyncServerConnection, _ queue: DatabaseQueue, serverThrough: Int64
    ) async throws -> Divergence? {
        let local = try SyncTables.identity(through: serverThrough, from: queue)
        var numbers = Array(local.queued.keys)
        if let last = local.lastUploaded, last.number <= serverThrough { numbers.append(last.number) }
        numbers.append(serverThrough)
        let recorded = try await connection.digests(machine: machine, numbers: numbers)
        let same = local.queued.filter { recorded[$0.key] == $0.value }.map(\.key).sorted()
        if serverThrough > local.highest {
            return Divergence(
                reason:
                    "the server has change sets of this machine through \(serverThrough), and this store never numbered one past \(local.highest) (a store restored from an older backup, or copied from a machine that went on)",
                dropping: same)
        }
        let differing = local.queued.filter { entry in recorded[entry.key].map { $0 != entry.value } ?? false }
        if let number = differing.keys.min() {
            return Divergence(
                reason:
                    "the server's change set \(number) of this machine is not this store's (a copy of this store synced as this machine)",
                dropping: same)
        }
        if let last = local.lastUploaded, let digest = recorded[last.number], digest != last.digest {
            return Divergence(
                reason:
                    "the server's change set \(last.number) of this machine is not the one this store uploaded (a copy of this store synced as this machine)",
                dropping: same)
        }
        return nil
    }

    /// Goes on under a new machine id: the daemon records it and drops the change sets the
    /// server has; the rest of the queue is uploaded under the new id, once.
    private func reidentify(_ divergence: Divergence) async throws {
        let old = machine
        let new = UUID()
        let reason =
            "sync: this store is not the one the server knows as machine \(old.uuidString.lowercased()): \(divergence.reason). It goes on as machine \(new.uuidString.lowercased()); \(divergence.dropping.count) queued change set(s) the server has already are dropped, the others are uploaded under the new id"
        guard let host, await host.reidentify(as: new, dropping: divergence.dropping, reason: reason) else {
            throw SkyrosError(.storeFailure, "the store could not take a new machine id")
        }
        mutable.withLock { state in
            state.machine = new
            state.upload = UploadStateMachine(
                queuedThrough: nil, maximumBatch: settings.uploadBatch, maximumBytes: settings.uploadBatchBytes)
            state.checkpoints.reidentified()
        }
        log(reason)
    }

    /// Keeps a listener on the server's notifications, each of which wakes the loop.
    private func listen() -> Task<Void, Never> {
        Task(executorPreference: executor) { [self] in
            while !Task.isCancelled {
                do {
                    try await server.listen(machine: machine) { [weak self] xid in self?.notify(xid) }
                } catch {
                    try? await Task.sleep(for: .seconds(1))
                }
            }
        }
    }

    // MARK: - State

    /// Logs a change of state (one line per change, never one per change set) and tells the daemon.
    private func report(_ action: ConnectionStateMachine.Action) {
        guard case .report(let state, let message) = action else { return }
        switch state {
        case .online: log("sync: online with \(server.redacted)")
        case .offline:
            log("sync: offline: \(message ?? "the server cannot be reached"); saves go on locally and are queued")
        case .error: log("sync: error: \(message ?? "")")
        }
        host?.syncStateChanged(status)
    }
}
