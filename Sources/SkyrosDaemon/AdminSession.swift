import Foundation
import Logging
import Skyros
import SkyrosWire
import SkyrosZeroMQ
import Synchronization

/// The daemon's admin sessions (docs/PROTOCOL.md, "Admin sessions"): `skyros … --group ID`
/// asks for the status, history, schema, metrics and backups without a schema of its own.
/// Allowed to root, the daemon's user and the members of ``adminGroups`` only, checked on
/// every request from the connection's peer credentials.
///
/// It also keeps what operators see: each connection's activity, save latencies and the
/// daemon's metrics; and it writes the log lines of connections and errors through
/// swift-log, with metadata, when ``logger`` is set.
package final class AdminSessions: @unchecked Sendable {
    /// Unix groups whose members may open admin sessions (root and the daemon's user always
    /// may). Set before ``DaemonServer/serve(pollInterval:turn:)``.
    package var adminGroups: [gid_t] = []
    /// Where connection and error lines go (with metadata: client name, pid, uid, request
    /// ID); nil: the server's ``DaemonServer/Configuration/log``.
    package var logger: Logger?

    /// How many pages a backup copies per step when the request says 0.
    static let pagesPerStep = 1_024
    /// The nice value of the backup thread (Linux schedules threads one by one).
    static let backupNice: Int32 = 19
    /// The most error lines logged per second (the rest are counted in the next line).
    static let errorLinesPerSecond = 10

    let metrics = DaemonMetrics()
    var activity = ClientActivity()
    private var admins: [Data: String] = [:]
    private let startedAt = Date()
    private let fallbackLog: @Sendable (String) -> Void
    private var decisions: [UInt32: Bool] = [:]
    private var errorSecond = 0
    private var errorLines = 0
    private var unloggedErrors = 0

    /// What the backup's thread shares with the serve loop: the replies it produced, sent by
    /// ``takeReplies()``, and whether it runs. Everything else here is the serve loop's alone.
    private let pending = Mutex<(replies: [(identity: Data, message: [UInt8])], backupRunning: Bool)>(([], false))

    init(log: @escaping @Sendable (String) -> Void) {
        fallbackLog = log
    }

    /// What the server lends the admin handler for one request.
    struct ServerState {
        var store: SQLiteStore?
        var sequence: UInt64
        var epoch: UUID
        var schemaVersion: UInt64
        var sessions: SessionTable
        var container: GroupContainer
        /// Tells the connection guard the connection said hello (it is not closed by the hello timeout).
        var welcomed: () -> Void
        var send: (Data, [UInt8]) -> Void
        /// The `sync` object of the status, for a daemon that syncs (docs/SYNC.md).
        var sync: (() -> [String: Any])? = nil
    }

    /// What became of a request.
    enum Outcome {
        /// Not an admin request: the server handles it as usual.
        case notAdmin
        /// Answered (or refused) here.
        case answered
        /// A client request of an admin session (a fetch, `changesSince`, a save): the server
        /// answers it as for a session, without the member check.
        case clientRequest
    }

    /// Whether the connection opened an admin session.
    func isAdmin(_ identity: Data) -> Bool { admins[identity] != nil }

    /// Takes a request first: admin kinds are answered here, and so are requests of admin
    /// sessions that are not theirs to send.
    func intercept(_ bytes: [UInt8], identity: Data, peer: PeerCredentials?, state: @autoclosure () -> ServerState)
        -> Outcome
    {
        guard let header = WireHeader(bytes), header.version == WireProtocol.version else { return .notAdmin }
        guard AdminMessage.isAdmin(header) else {
            guard let name = admins[identity] else { return .notAdmin }
            switch WireProtocol.Kind(rawValue: header.kind) {
            case .fetch, .fetchIdentifiers, .count, .snapshots, .changesSince, .save, .syncRejections,
                .acknowledgeRejections:
                return allowed(peer) ? .clientRequest : refuse(identity, header.requestID, peer, state().send)
            case .hello:
                admins[identity] = nil  // the connection becomes a client's
                return .notAdmin
            default:
                let state = state()
                reply(
                    identity, header.requestID, error: .malformedMessage,
                    "an admin session (\(name)) cannot send a \(header.kind) request", state.send)
                return .answered
            }
        }
        let state = state()
        guard allowed(peer) else { return refuse(identity, header.requestID, peer, state.send) }
        let message: AdminMessage
        do {
            message = try AdminMessage.decode(bytes).message
        } catch {
            reply(identity, header.requestID, error: .malformedMessage, error.description, state.send)
            return .answered
        }
        if case .hello(let name, let pid) = message {
            guard name.utf8.count <= WireProtocol.maximumClientNameBytes else {
                reply(
                    identity, header.requestID, error: .malformedMessage,
                    "the client name is longer than \(WireProtocol.maximumClientNameBytes) bytes", state.send)
                return .answered
            }
            if admins.count >= 1_024 { admins.removeAll() }
            admins[identity] = name
            state.welcomed()
            logConnection("admin session", name: name, pid: pid, uid: peer?.uid, requestID: header.requestID)
            let welcome = WireMessage.Welcome(
                sequence: state.sequence, eventTopic: WireProtocol.broadcastTopic, storeEpoch: state.epoch,
                schemaVersion: state.schemaVersion)
            state.send(identity, WireMessage(requestID: header.requestID, body: .welcome(welcome)).encoded())
            return .answered
        }
        guard admins[identity] != nil else {
            reply(
                identity, header.requestID, error: .helloRequired, "open an admin session first (adminHello)",
                state.send)
            return .answered
        }
        do {
            if let answer = try answer(message, identity: identity, requestID: header.requestID, state: state) {
                state.send(identity, answer.encoded(requestID: header.requestID))
            }
        } catch {
            let error = SkyrosError.wrap(error)
            reply(identity, header.requestID, error: error.code, error.message, state.send)
        }
        return .answered
    }

    private func answer(_ message: AdminMessage, identity: Data, requestID: UInt64, state: ServerState) throws
        -> AdminMessage?
    {
        switch message {
        case .status:
            return .statusReply(json: try status(state))
        case .history(let since, let limit):
            guard let store = state.store else { return .historyReply([], more: false) }
            let page = try JournalAccess.history(since: since, limit: limit, in: store)
            return .historyReply(page.entries, more: page.more)
        case .describeSchema:
            guard let store = state.store else { return .schemaReply(description: "", fingerprint: "", version: 0) }
            let json = try store.schema.schemaDescription.canonicalText()
            return .schemaReply(description: json, fingerprint: store.schema.fingerprint, version: state.schemaVersion)
        case .metrics:
            updateGauges(state)
            return .metricsReply(metrics.exposition())
        case .backup(let path, let pages):
            guard state.store != nil else {
                throw SkyrosError(.storeFailure, "the group has no store yet: nothing to back up")
            }
            guard path.hasPrefix("/") else {
                throw SkyrosError(.storeFailure, "the backup path must be absolute, not \(path)")
            }
            try startBackup(
                of: state.container.store, to: URL(fileURLWithPath: path),
                pages: pages == 0 ? Self.pagesPerStep : Int(min(pages, 1 << 20)),
                identity: identity, requestID: requestID)
            return nil
        case .hello, .statusReply, .historyReply, .backupProgress, .schemaReply, .metricsReply:
            throw SkyrosError(.malformedMessage, "a client cannot send a \(message.kind) message")
        }
    }

    // MARK: - Status and metrics

    private func status(_ state: ServerState) throws -> String {
        let minute = activity.lastMinute(since: startedAt)
        let formatter = Date.ISO8601FormatStyle(includingFractionalSeconds: true)
        var clients: [[String: Any]] = []
        // The sessions whose connection is open: a client that exited is counted, not listed.
        for (identity, session) in state.sessions.sessions.sorted(by: { $0.value.name < $1.value.name }) {
            guard let connection = activity.connections[identity] else { continue }
            clients.append([
                "name": session.name, "pid": session.pid, "uid": connection.uid.map { Int($0) } as Any? ?? NSNull(),
                "connectedAt": formatter.format(connection.connectedAt),
                "lastSeenAt": formatter.format(connection.lastSeenAt),
                "saves": connection.saves,
            ])
        }
        var historyBytes: Int64 = 0
        if let store = state.store,
            case .integer(let bytes)? = try store.rows("SELECT coalesce(sum(length(event)), 0) FROM skyros_history")
                .first?.first
        {
            historyBytes = bytes
        }
        var object: [String: Any] = [
            "pid": Int(getpid()),
            "uptimeSeconds": Date().timeIntervalSince(startedAt),
            "protocolVersion": Int(WireProtocol.version),
            "schemaVersion": state.schemaVersion,
            "fingerprint": state.store?.schema.fingerprint as Any? ?? NSNull(),
            "sequence": state.sequence,
            "clients": clients,
            "clientsDisconnected": activity.closedCount,
            "savesPerSecond": minute.perSecond,
            "saveLatencyP50Micros": minute.p50 as Any? ?? NSNull(),
            "saveLatencyP99Micros": minute.p99 as Any? ?? NSNull(),
            "storeBytes": Self.size(state.container.store.path),
            "walBytes": Self.size(state.container.store.path + "-wal"),
            "historyBytes": historyBytes,
            "uid": Int(geteuid()),
            "container": state.container.url.path,
        ]
        if let sync = state.sync?() { object["sync"] = sync }
        let data = try JSONSerialization.data(withJSONObject: object, options: [.sortedKeys, .withoutEscapingSlashes])
        return String(decoding: data, as: UTF8.self)
    }

    private func updateGauges(_ state: ServerState) {
        metrics.clients.record(state.sessions.sessions.count)
        metrics.storeBytes.record(Self.size(state.container.store.path))
        metrics.walBytes.record(Self.size(state.container.store.path + "-wal"))
        metrics.sequence.record(Double(state.sequence))
        if let sync = state.sync?() {
            metrics.syncState.record(
                sync["state"] as? String == "online" ? 1 : sync["state"] as? String == "error" ? -1 : 0)
            metrics.syncUploadQueue.record(sync["uploadQueue"] as? Int ?? 0)
            metrics.syncOldestQueuedSeconds.record(sync["oldestQueuedSeconds"] as? Double ?? 0)
            metrics.syncCheckpoint.record(Double(sync["checkpoint"] as? UInt64 ?? 0))
            metrics.syncLagMilliseconds.record(sync["lagMilliseconds"] as? Int ?? 0)
            metrics.syncRejected.record(sync["rejected"] as? Int ?? 0)
        }
    }

    private static func size(_ path: String) -> Int64 {
        var info = stat()
        return stat(path, &info) == 0 ? Int64(info.st_size) : 0
    }

    // MARK: - Hooks of the serve loop

    /// Saves of one turn were answered: `received` is when each arrived.
    func committed(_ saves: [(identity: Data, received: ContinuousClock.Instant, succeeded: Bool)]) {
        let now = ContinuousClock.now
        let date = Date()
        for save in saves where save.succeeded {
            let latency = now - save.received
            activity.saved(save.identity, latency: latency.timeInterval, now: date)
            metrics.saves.increment()
            metrics.saveLatency.recordNanoseconds(Int64(latency.timeInterval * 1e9))
        }
    }

    /// A hello was welcomed.
    func welcomed(_ identity: Data, _ hello: WireMessage.Hello, requestID: UInt64, sessions: Int) {
        metrics.welcomes.increment()
        metrics.clients.record(sessions)
        logConnection(
            "hello", name: hello.clientName, pid: hello.pid, uid: activity.connections[identity]?.uid,
            requestID: requestID)
    }

    /// An error reply goes out.
    func replied(error code: String, message: String, to identity: Data, requestID: UInt64) {
        metrics.error(code)
        let second = Int(Date().timeIntervalSince1970)
        if second != errorSecond {
            errorSecond = second
            errorLines = 0
        }
        guard errorLines < Self.errorLinesPerSecond else {
            unloggedErrors += 1
            return
        }
        errorLines += 1
        let uid = activity.connections[identity]?.uid
        let skipped = unloggedErrors
        unloggedErrors = 0
        if let logger {
            var metadata: Logger.Metadata = ["code": "\(code)", "request": "\(requestID)"]
            if let uid { metadata["uid"] = "\(uid)" }
            if skipped > 0 { metadata["unlogged"] = "\(skipped)" }
            logger.info("error reply: \(message)", metadata: metadata)
        } else {
            fallbackLog("error reply \(code) to request \(requestID)\(uid.map { " of uid \($0)" } ?? ""): \(message)")
        }
    }

    private func logConnection(_ what: String, name: String, pid: UInt64, uid: UInt32?, requestID: UInt64) {
        if let logger {
            var metadata: Logger.Metadata = ["client": "\(name)", "pid": "\(pid)"]
            if requestID > 0 { metadata["request"] = "\(requestID)" }
            if let uid { metadata["uid"] = "\(uid)" }
            logger.info("\(what) from \(name) (pid \(pid))", metadata: metadata)
        } else {
            fallbackLog("\(what) from \(name) (pid \(pid)\(uid.map { ", uid \($0)" } ?? ""))")
        }
    }

    /// How long the serve loop may wait for requests: not long while a backup reports progress.
    func pollInterval(_ interval: Int) -> Int { pending.withLock { $0.backupRunning } ? min(interval, 20) : interval }

    /// Replies produced off the serve loop, to send now.
    func takeReplies() -> [(identity: Data, message: [UInt8])] {
        pending.withLock { pending in
            defer { pending.replies.removeAll() }
            return pending.replies
        }
    }

    // MARK: - Access

    private func allowed(_ peer: PeerCredentials?) -> Bool {
        guard let peer else { return false }
        if peer.uid == 0 || peer.uid == geteuid() { return true }
        if adminGroups.contains(peer.gid) { return true }
        if let decision = decisions[peer.uid] { return decision }
        var decision = false
        if !adminGroups.isEmpty, let entry = getpwuid(peer.uid) {
            var count: Int32 = 64
            var groups = [gid_t](repeating: 0, count: Int(count))
            while getgrouplist(entry.pointee.pw_name, entry.pointee.pw_gid, &groups, &count) < 0 {
                groups = [gid_t](repeating: 0, count: Int(count) * 2)
                count = Int32(groups.count)
            }
            decision = groups.prefix(Int(count)).contains { adminGroups.contains($0) }
        }
        if decisions.count > 1_024 { decisions.removeAll() }
        decisions[peer.uid] = decision
        return decision
    }

    private func refuse(
        _ identity: Data, _ requestID: UInt64, _ peer: PeerCredentials?, _ send: (Data, [UInt8]) -> Void
    ) -> Outcome {
        let who = peer.map { "user \($0.uid)" } ?? "a peer whose credentials cannot be read"
        reply(
            identity, requestID, error: .permissionDenied,
            "\(who) is not an admin of this group: admin sessions are for root, the daemon's user (\(geteuid())) and members of its admin groups (skyrosd --admin-group)",
            send)
        return .answered
    }

    private func reply(
        _ identity: Data, _ requestID: UInt64, error code: SkyrosError.Code, _ message: String,
        _ send: (Data, [UInt8]) -> Void
    ) {
        send(identity, WireMessage(requestID: requestID, body: .error(code: code.rawValue, message: message)).encoded())
    }

    // MARK: - Backups

    private func startBackup(of store: URL, to destination: URL, pages: Int, identity: Data, requestID: UInt64) throws {
        try pending.withLock { pending in
            guard !pending.backupRunning else {
                throw SkyrosError(.storeFailure, "a backup is already running; try again when it ends")
            }
            pending.backupRunning = true
        }
        let backup: OnlineBackup
        do {
            backup = try OnlineBackup(store: store, destination: destination)
        } catch {
            pending.withLock { $0.backupRunning = false }
            throw error
        }
        let log = fallbackLog
        let logger = logger
        let thread = Thread { [self] in
            // A background job: the serve loop and the clients' processes come first, the
            // copy takes the CPU they leave (the writers' save p99 stays within 3× of its
            // value without a backup: `skyros-bench backup`).
            // (On Linux the nice value is per thread: who 0 is the calling thread.)
            _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, Self.backupNice)
            func post(_ message: [UInt8]) { pending.withLock { $0.replies.append((identity, message)) } }
            do {
                var lastReport = Date.distantPast
                while try !backup.step(pages: pages) {
                    if Date().timeIntervalSince(lastReport) >= 0.5 {
                        lastReport = Date()
                        post(AdminMessage.backupProgress(backup.progress).encoded(requestID: requestID))
                    }
                }
                post(AdminMessage.backupProgress(backup.progress).encoded(requestID: requestID))
                let bytes = try backup.finish()
                var done = backup.progress
                done.done = true
                done.bytes = bytes
                post(AdminMessage.backupProgress(done).encoded(requestID: requestID))
                let line =
                    "backup to \(destination.path): \(bytes) bytes, sequence \(backup.sequence), integrity check ok"
                if let logger { logger.info("\(line)") } else { log(line) }
            } catch {
                backup.abandon()
                let error = SkyrosError.wrap(error)
                post(
                    WireMessage(requestID: requestID, body: .error(code: error.code.rawValue, message: error.message))
                        .encoded())
                let line = "backup to \(destination.path) failed: \(error.message)"
                if let logger { logger.error("\(line)") } else { log(line) }
            }
            pending.withLock { $0.backupRunning = false }
        }
        thread.name = "skyrosd.backup"
        thread.start()
    }
}
