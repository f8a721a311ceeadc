import Foundation
import GRDB
import Logging
import NIOCore
import NIOPosix
import NIOSSL
import PostgresNIO
import Skyros
import Synchronization

/// What became of a checkpoint handed to the daemon.
package enum SyncApplyResult: Sendable, Equatable {
    /// Applied (or nothing to apply) and recorded.
    case applied
    /// Not applied: change sets are queued that it does not include (they would be hidden
    /// until their upload, and come back: a flicker). Upload them, then read again.
    case pendingUploads
    /// Not applied: the store refused it (the reason).
    case failed(String)
}

/// What the daemon does for its sync engine, on the daemon's own thread.
package protocol SyncHost: AnyObject, Sendable {
    /// Applies a checkpoint to the group's store as one change set, published to the apps like
    /// any other, with the checkpoint recorded in the same transaction; nothing, when the store
    /// has change sets queued that the checkpoint does not include (it would hide them until
    /// their upload: the engine uploads them and reads again). A snapshot checkpoint applies
    /// the pages staged for it (``stage(_:)``), and only when every one of them was.
    func apply(_ checkpoint: Checkpoint) async -> SyncApplyResult
    /// Stages a page of a snapshot checkpoint, out of the apps' sight (the first page drops
    /// whatever was staged before); nil when staged, else why not.
    func stage(_ page: SnapshotPage) async -> String?
    /// The queued change sets through `number` are on the server: the queue may drop them.
    func uploaded(through number: Int64) async
    /// The engine's state changed (for the log and the metrics).
    func syncStateChanged(_ status: SyncEngine.Status)
}

/// A machine's sync with PostgreSQL (DESIGN §9): the loop that uploads the store's queued
/// change sets in order, exactly once, and brings the server's checkpoints to the daemon.
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
        var status = Status()
        var schema: ServerSchema
        var schemaChanged = false
        var stopping = false
        var tasks: [Task<Void, Never>] = []
        /// The highest number the daemon queued, as it told (nil: not told yet; read the queue).
        var queuedThrough: Int64?
        /// The change sets the daemon handed over as it queued them, oldest first: uploaded
        /// from memory when they follow the last upload, read from the queue otherwise.
        var handed: [(number: Int64, changes: QueuedChangeSet)] = []
        /// The transactions notified since the loop last looked (their ids, the payload of
        /// a NOTIFY); `notifiedUnknown`: a wake-up that may stand for any change (a
        /// notification without an id, the listener connected again, a connection closed).
        var notified: Set<UInt64> = []
        var notifiedUnknown = false
        /// The server transactions of this machine's uploads since the last checkpoint read,
        /// and how many change sets they carried: a notification of one of them needs no read.
        var ownTransactions: Set<UInt64> = []
        var ownChangeSets = 0
    }

    private let configuration: SyncConfiguration
    private let settings: Settings
    private let machine: UUID
    private let storePath: String
    private weak let host: (any SyncHost)?
    private let log: @Sendable (String) -> Void
    private let logger: Logger
    /// The thread the engine's tasks and connections run on.
    private let executor = SyncExecutor()
    private let wakeup: Wakeup
    private let mutable: Mutex<Mutable>
    /// The last checkpoint applied (a `pg_snapshot` text).
    private let cursor: Mutex<String?>
    private let finished = DispatchSemaphore(value: 0)

    /// An engine for the store at `storePath` (read through a read-only connection of its
    /// own), this machine's `machine` id, the checkpoint the store last applied, and the
    /// highest number its queue ever had (`queuedThrough`; nil: unknown, read the queue).
    package init(
        configuration: SyncConfiguration, schema: ServerSchema, machine: UUID, checkpoint: String?, queuedThrough: Int64? = nil,
        storePath: String, host: any SyncHost, settings: Settings = Settings(), log: @escaping @Sendable (String) -> Void
    ) {
        self.configuration = configuration
        self.settings = settings
        self.machine = machine
        self.storePath = storePath
        self.host = host
        self.log = log
        var logger = Logger(label: "skyros.sync")
        logger.logLevel = .critical
        self.logger = logger
        mutable = Mutex(Mutable(schema: schema, queuedThrough: queuedThrough))
        wakeup = Wakeup(eventLoop: executor.eventLoop)
        cursor = Mutex(checkpoint)
    }

    /// The engine's state, for `skyros status`.
    package var status: Status { mutable.withLock { $0.status } }

    /// The machine's id on the server.
    package var machineID: UUID { machine }

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
            state.stopping = true
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
    package func localCommitted(_ handed: [(number: Int64, changes: QueuedChangeSet)] = [], through last: Int64) {
        mutable.withLock { state in
            state.queuedThrough = max(state.queuedThrough ?? 0, last)
            state.handed += handed
            // Held for a moment only: while the server cannot be reached, the queue has them.
            if state.handed.count > Self.handedLimit { state.handed.removeAll() }
        }
        wakeup.signal()
    }

    /// The most change sets held in memory for the uploader.
    static let handedLimit = 256

    /// The change sets to upload after `uploaded`: those handed over when they follow it
    /// without a gap and are all there is; nil to read the queue (or empty: nothing queued).
    private func handedBatch(after uploaded: Int64, limit: Int) -> [(number: Int64, changes: QueuedChangeSet)]? {
        mutable.withLock { state in
            state.handed.removeAll { $0.number <= uploaded }
            guard let known = state.queuedThrough else { return nil }
            if known <= uploaded { return [] }
            guard state.handed.first?.number == uploaded + 1, state.handed.last?.number == known,
                state.handed.count == Int(known - uploaded), state.handed.count <= limit
            else { return nil }
            return state.handed
        }
    }

    /// The group's store was migrated: the server's tables follow before the next upload.
    package func schemaChanged(_ schema: ServerSchema) {
        mutable.withLock {
            $0.schema = schema
            $0.schemaChanged = true
        }
        wakeup.signal()
    }

    private var isStopping: Bool { mutable.withLock { $0.stopping } || Task.isCancelled }

    // MARK: - The loop

    private func run() async {
        var delay: Duration = .milliseconds(100)
        let queue: DatabaseQueue
        do {
            var options = GRDB.Configuration()
            options.readonly = true
            options.busyMode = .timeout(5)
            queue = try DatabaseQueue(path: storePath, configuration: options)
        } catch {
            setState(.error, "cannot read the upload queue in \(storePath): \(error)")
            return
        }
        while !isStopping {
            do {
                try await session(queue) { delay = .milliseconds(100) }
            } catch {
                if isStopping { break }
                let (state, message) = classify(error)
                setState(state, message)
            }
            if isStopping { break }
            await wakeup.wait(timeout: delay)
            delay = min(delay * 2, settings.maximumRetryDelay)
        }
        try? queue.close()
    }

    /// One connection's life: prepare the schema, then upload and download until it fails.
    private func session(_ queue: DatabaseQueue, connected: () -> Void) async throws {
        let (connection, server) = try await connect()
        defer { Task { try? await connection.close() } }
        // A connection closed while the loop waits (the server restarted) wakes it: the next
        // statement fails at once and the engine goes offline, then connects again.
        connection.closeFuture.whenComplete { [weak self] _ in self?.notify(nil) }
        let watchdog = Watchdog(connection, executor: executor)
        var schema = mutable.withLock { state in
            state.schemaChanged = false
            return state.schema
        }
        let statements = PreparedStatements()
        var session = ServerSession(
            connection: connection, schema: schema, logger: logger, watchdog: watchdog, timeout: settings.statementTimeout,
            statements: statements)
        try await session.limitWaits(statementTimeout: settings.statementTimeout)
        try await prepare(session)
        let listener = listen(schema.channel)
        defer { listener.cancel() }
        var uploaded = Int64(try await session.run(
            "SELECT coalesce(max(number), 0)::text FROM \(ServerSchema.quote(schema.name))._skyros_uploads WHERE machine = $1::uuid",
            [machine.uuidString.lowercased()]).first?.first??.description ?? "0") ?? 0
        mutable.withLock { $0.status.uploadedThrough = uploaded }
        setState(.online, nil)
        if configuration.servers.count > 1 { log("sync: connected to \(server)") }
        connected()
        // The first compaction 30 s after connecting (or one interval, when shorter).
        var batchLimit = settings.uploadBatch
        var lastCompaction = ContinuousClock.now - settings.compactionInterval + min(.seconds(30), settings.compactionInterval)
        // Whether the last wait ended with a signal (false: the poll interval passed, or the
        // loop came round without waiting): then the checkpoint may not need reading.
        var signaled = false
        while !isStopping {
            var mustRead = !signaled
            signaled = false
            if let changed = mutable.withLock({ state -> ServerSchema? in
                defer { state.schemaChanged = false }
                return state.schemaChanged ? state.schema : nil
            }) {
                schema = changed
                session = ServerSession(
                    connection: connection, schema: schema, logger: logger, watchdog: watchdog, timeout: settings.statementTimeout,
                    statements: statements)
                try await prepare(session)
                mustRead = true
            }
            // Upstream: everything queued, in order.
            while !isStopping {
                let batch = try handedBatch(after: uploaded, limit: batchLimit)
                    ?? Self.queued(queue, after: uploaded, limit: batchLimit, bytes: settings.uploadBatchBytes)
                guard let last = batch.last?.number else { break }
                let (outcomes, transactions) = try await session.uploadReportingTransactions(batch, machine: machine)
                // A batch with a refusal costs two statements per halving to find it: while
                // refusals come, batches get smaller (a quarter, down to 16), and they grow back
                // (twice as large) with each batch that has none. (The fault campaign, whose
                // writers take unique values from a small pool, saw batches of 1,000 with dozens
                // of refusals each take seconds, and the queues grow without end.)
                if outcomes.contains(where: { if case .rejected = $0 { true } else { false } }) {
                    batchLimit = max(16, batchLimit / 4)
                } else {
                    batchLimit = min(settings.uploadBatch, batchLimit * 2)
                }
                uploaded = last
                mutable.withLock { $0.status.uploadedThrough = last }
                for (index, outcome) in outcomes.enumerated() {
                    if case .rejected(let reason) = outcome {
                        log("sync: change set \(batch[index].number) was refused by the server: \(reason)")
                    }
                }
                await host?.uploaded(through: last)
                // This machine has what it uploaded: the checkpoint that brings it back is read
                // with the next change another writer makes (or at the poll interval), not at
                // once, unless the server refused some of it (the refusal is told now), or the
                // uploads not read back grow past a batch.
                let refused = outcomes.contains { if case .rejected = $0 { true } else { false } }
                let backlog = mutable.withLock { state -> Int in
                    state.ownChangeSets += batch.count
                    if let transactions { state.ownTransactions.formUnion(transactions) }
                    return state.ownChangeSets
                }
                if refused || transactions == nil || backlog >= settings.uploadBatch { mustRead = true }
            }
            // Woken by notifications of this machine's own uploads, or of transactions the last
            // checkpoint has already: nothing to read.
            if !mustRead && notificationsSeen() {
                signaled = await wakeup.wait(timeout: settings.pollInterval)
                continue
            }
            // Downstream: the checkpoint after the last one applied.
            let previous = cursor.withLock { $0 }
            let checkpoint: Checkpoint
            do {
                // A snapshot's pages are staged by the daemon as they are read.
                checkpoint = try await session.readCheckpoint(
                    after: previous, machine: machine, pageSize: settings.snapshotPageSize
                ) { [weak host = self.host, log = self.log] page in
                    for line in page.unreadable { log("sync: \(line)") }
                    guard let host else { return "the sync engine has no daemon any more" }
                    return await host.stage(page)
                }
            } catch let failure as Checkpoint.StagingFailed {
                setState(.error, "the checkpoint cannot be applied to the store: \(failure.reason)")
                await wakeup.wait(timeout: settings.pollInterval)
                continue
            }
            let isEmpty = !checkpoint.isSnapshot && checkpoint.objects.isEmpty && checkpoint.rejected.isEmpty
            // An empty checkpoint moves the cursor in memory only: after a restart, reading
            // again from the one the store recorded finds the same nothing.
            guard checkpoint.uploadedThrough >= uploaded, let host else { continue }
            let result = isEmpty ? .applied : await host.apply(checkpoint)
            switch result {
            case .applied:
                setState(.online, nil)
                cursor.withLock { $0 = checkpoint.snapshot }
                mutable.withLock { state in
                    state.status.checkpoint = checkpoint.number
                    state.status.lagMilliseconds = checkpoint.lagMilliseconds
                    // The uploads this checkpoint brought back are read.
                    state.ownTransactions = state.ownTransactions.filter { Checkpoint.isVisible($0, in: checkpoint.snapshot) != true }
                    if state.ownTransactions.isEmpty { state.ownChangeSets = 0 }
                }
                for line in checkpoint.unreadable { log("sync: \(line)") }
            case .pendingUploads:
                // A change set was queued since: upload it first, then read again.
                continue
            case .failed(let reason):
                setState(.error, "the checkpoint cannot be applied to the store: \(reason)")
                await wakeup.wait(timeout: settings.pollInterval)
                continue
            }
            if ContinuousClock.now - lastCompaction >= settings.compactionInterval {
                lastCompaction = .now
                try await session.compact(retention: configuration.retention)
            }
            signaled = await wakeup.wait(timeout: settings.pollInterval)
        }
    }

    /// Whether every transaction notified since the last call is this machine's own upload
    /// or in the checkpoint applied last (false when one came without its id, or when
    /// something else may have changed: the listener connected again, the connection closed).
    /// True when none was notified: the wake-up was a local commit's, already uploaded.
    /// Forgets them.
    private func notificationsSeen() -> Bool {
        let (notified, unknown, own) = mutable.withLock { state in
            defer {
                state.notified = []
                state.notifiedUnknown = false
            }
            return (state.notified, state.notifiedUnknown, state.ownTransactions)
        }
        guard !unknown else { return false }
        guard !notified.isEmpty else { return true }
        guard let snapshot = cursor.withLock({ $0 }) else { return false }
        return notified.allSatisfy { own.contains($0) || Checkpoint.isVisible($0, in: snapshot) == true }
    }

    /// A notification of the transaction `xid` (nil: of some change), or any other reason to
    /// read the checkpoint: wakes the loop.
    private func notify(_ xid: UInt64?) {
        mutable.withLock { state in
            if let xid, state.notified.count < 1_000 {
                state.notified.insert(xid)
            } else {
                state.notifiedUnknown = true
            }
        }
        wakeup.signal()
    }

    /// Creates or migrates the server's tables, or checks them when the role may not.
    private func prepare(_ session: ServerSession) async throws {
        if settings.createsSchema {
            do {
                try await session.ensureSchema()
                return
            } catch let error as PSQLError where error.serverInfo?[.sqlState] == "42501" {
                // Insufficient privilege: an operator set the schema up (--sync-setup).
            }
        }
        let missing = try await session.missingTablesAndColumns()
        guard missing.isEmpty else {
            // Tables this role may not even see (another group's schema) are not missing.
            if try await session.schemaExistsWithoutUsage() {
                throw NoSchemaUsage(role: configuration.username, schema: session.schema.name)
            }
            throw SetupNeeded(missing: missing, schema: session.schema.name)
        }
    }

    /// The schema exists, and this daemon's role may not use it.
    struct NoSchemaUsage: Error, CustomStringConvertible {
        var role: String
        var schema: String
        var description: String {
            """
            the role \(role) may not use the schema \(schema) (no USAGE privilege) [SQLSTATE 42501]: check the sync \
            schema (--sync-schema, schema=), or grant the role the group's privileges (docs/SYNC.md, Security)
            """
        }
    }

    /// The server lacks tables or columns this daemon's role may not create.
    struct SetupNeeded: Error, CustomStringConvertible {
        var missing: [String]
        var schema: String
        var description: String {
            """
            the server lacks \(missing.prefix(5).joined(separator: ", "))\(missing.count > 5 ? " and \(missing.count - 5) more" : ""), \
            and this role may not create them: run skyrosd --group … --sync URL --sync-setup once with a role that owns \
            the schema \(schema)
            """
        }
    }

    /// Keeps a LISTEN connection open, waking the loop at each notification. The connection
    /// is pinged every second statement timeout: one that stopped answering is replaced.
    private func listen(_ channel: String) -> Task<Void, Never> {
        Task(executorPreference: executor) { [self] in
            while !Task.isCancelled {
                do {
                    let connection = try await connect().connection
                    defer { Task { try? await connection.close() } }
                    let watchdog = Watchdog(connection, executor: executor)
                                let ping = settings.statementTimeout
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        group.addTask {
                            try await connection.listen(on: channel) { notifications in
                                self.notify(nil)  // whatever happened while it was not listening
                                for try await notification in notifications {
                                    // The payload is the transaction's id (empty from a server set up by an older version).
                                    self.notify(UInt64(notification.payload))
                                }
                            }
                        }
                        group.addTask { [logger] in
                            while !Task.isCancelled {
                                try await Task.sleep(for: ping * 2)
                                _ = try await watchdog.bounded(ping) { try await connection.query("SELECT 1", logger: logger).collect().count }
                            }
                        }
                        try await group.next()
                        group.cancelAll()
                    }
                } catch {
                    try? await Task.sleep(for: .seconds(1))
                }
            }
        }
    }

    /// A connection to the configuration's first server that qualifies, in order (see
    /// ``SyncConfiguration/connect(on:id:logger:)``): every connection, after any failure,
    /// starts again at the first server, so both of the engine's find the primary of the moment.
    private func connect() async throws -> (connection: PostgresConnection, server: SyncConfiguration.Server) {
        try await configuration.connect(on: executor.eventLoop, id: Int.random(in: 1...Int.max), logger: logger)
    }

    /// Queued change sets after `number`, oldest first: at most `limit`, and no more than
    /// about `bytes` of them (at least one).
    private static func queued(_ queue: DatabaseQueue, after number: Int64, limit: Int, bytes: Int) throws
        -> [(number: Int64, changes: QueuedChangeSet)]
    {
        try queue.read { db in
            var batch: [(number: Int64, changes: QueuedChangeSet)] = []
            var total = 0
            let rows = try Row.fetchCursor(
                db, sql: "SELECT number, changes FROM skyros_sync_queue WHERE number > ? ORDER BY number LIMIT ?",
                arguments: [number, limit])
            while let row = try rows.next() {
                let data: Data = row["changes"]
                if !batch.isEmpty && total + data.count > bytes { break }
                total += data.count
                batch.append((row["number"], try QueuedChangeSet.decode(data)))
            }
            return batch
        }
    }

    // MARK: - State

    private func setState(_ state: Status.State, _ message: String?) {
        let changed = mutable.withLock { mutable -> Status? in
            guard mutable.status.state != state || mutable.status.message != message else { return nil }
            mutable.status.state = state
            mutable.status.message = message
            return mutable.status
        }
        guard let changed else { return }
        // One line per change of state, never one per change set.
        switch state {
        case .online: log("sync: online with \(configuration.redacted)")
        case .offline: log("sync: offline: \(message ?? "the server cannot be reached"); saves go on locally and are queued")
        case .error: log("sync: error: \(message ?? "")")
        }
        host?.syncStateChanged(changed)
    }

    /// Why the TLS handshake refused the server's certificate (not trusted, expired, not
    /// naming the host), in a few words, or nil for any other error.
    static func certificateRefusal(_ error: any Error) -> String? {
        var candidate: (any Error)? = error
        while let current = candidate {
            if let extra = current as? NIOSSLExtraError, extra == .failedToValidateHostname {
                return "it does not name the host"
            }
            if let ssl = current as? NIOSSLError {
                if case .noCertificateToValidate = ssl { return "the server sent no certificate" }
                // BoringSSL's reason, without the source file it names.
                guard "\(ssl)".contains("CERTIFICATE_VERIFY_FAILED") else { return nil }
                return "CERTIFICATE_VERIFY_FAILED: not signed by a CA the daemon trusts, expired, or not yet valid"
            }
            candidate = (current as? PSQLError)?.underlying
        }
        return nil
    }

    /// Whether an error means offline (the network, the server down) or an error an operator
    /// must fix (authentication, permissions, tables), with its message.
    private func classify(_ error: any Error) -> (Status.State, String) {
        if let setup = error as? SetupNeeded { return (.error, setup.description) }
        if let failure = error as? SyncConfiguration.NoServerAvailable {
            // Each server's reason in the engine's words; an error only when every server
            // refused for something an operator must fix (a wrong password everywhere).
            let verdicts = failure.attempts.map { $0.error.map(classify) ?? (.offline, $0.refusal ?? "not used") }
            let message = failure.description(reasons: verdicts.map(\.1))
            return (verdicts.allSatisfy { $0.0 == .error } ? .error : .offline, message)
        }
        if let usage = error as? NoSchemaUsage { return (.error, usage.description) }
        if let certificate = Self.certificateRefusal(error) {
            let roots = configuration.rootCertificate.map { "the CA certificate \($0) (sslrootcert)" } ?? "the system's CA certificates"
            return (.error, """
                the server's TLS certificate was not accepted (sslmode=\(configuration.tls.rawValue)): \(certificate); \
                it must be signed by \(roots)\(configuration.tls == .verifyFull ? " and name the host \(configuration.host)" : "")
                """)
        }
        if let timeout = error as? Watchdog.TimedOut { return (.offline, timeout.description) }
        if let report = ServerSession.serverReport(error) {
            // 28: authentication; 42: privileges, missing objects; 3D: no such database; 3F: no
            // such schema; 23: a migration of the server's tables that its rows refuse (a
            // change set's own refusals never get here: they are recorded as rejected).
            let text = ServerSession.describe(error)
            if report.state == "28000", report.message?.contains("no encryption") == true {
                // pg_hba.conf has only hostssl lines for us.
                return (.error, """
                    \(text): the server accepts this connection only over TLS; set sslmode=verify-full (with sslrootcert) \
                    or sslmode=require in the sync URL
                    """)
            }
            if ["28", "42", "3D", "3F", "23"].contains(where: { report.state.hasPrefix($0) }) {
                return (.error, text)
            }
            return (.offline, text)
        }
        if let error = error as? PSQLError {
            switch error.code {
            case .server:
                return (.offline, ServerSession.describe(error))
            case .sslUnsupported:
                return (.error, "the server does not offer TLS, which the sync URL requires (sslmode)")
            case .authMechanismRequiresPassword, .unsupportedAuthMechanism, .saslError:
                return (.error, "the server asks for a password: give it with --sync-password-file, SKYROS_SYNC_PASSWORD or the credential skyros-sync-password")
            default:
                let cause = error.underlying.map { "\($0)" } ?? "\(error.code)"
                return (.offline, "cannot reach the server (\(cause))")
            }
        }
        return (.offline, "\(error)")
    }
}
