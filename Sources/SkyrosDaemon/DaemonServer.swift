import Foundation
import Skyros
import SkyrosWire
import SkyrosZeroMQ

/// The daemon of one application group, as a library: it owns the group's store, answers
/// requests on `requests.ipc` and publishes committed changes on `events.ipc`
/// (docs/PROTOCOL.md). `skyrosd` wraps it with arguments, signals and logging.
///
/// Bad input never stops it: every malformed or invalid request gets an error reply and the
/// server goes on with the next one.
public final class DaemonServer: @unchecked Sendable {
    /// How a daemon serves its group.
    public struct Configuration: Sendable {
        /// The group container (created with mode 0770 when missing).
        package var container: GroupContainer
        /// The store's durability: `.full` syncs every commit (the default).
        public var durability: Durability
        /// The largest request accepted (a larger frame closes its connection before it is read).
        public var maximumMessageSize: Int
        /// How many change sets the history keeps (at least 1).
        public var historyCount: Int
        /// How long the history keeps a change set, in seconds.
        public var historyAge: TimeInterval
        /// The most change sets committed together in one transaction.
        public var maximumGroupCommit: Int
        /// How many connections the daemon remembers the hello of. Past it, it forgets them
        /// all: each says hello again on its next request, as clients do by themselves when
        /// told `helloRequired`, so a daemon serving short-lived clients for months does not
        /// grow without bound.
        public var maximumConnections: Int
        /// How long, in seconds, the events of a commit may wait while more requests are
        /// already waiting: under load the events of several commits go out together, in one
        /// message that wakes each client once (each client receives every other client's
        /// changes, so under load a publish per commit costs every client a wake-up per
        /// commit). A daemon with nothing more to do publishes at once. 0 publishes after
        /// every commit.
        public var maximumEventDelay: TimeInterval
        /// The most connections open at once on each of the two sockets (a client holds one on
        /// each); nil: sized to the file-descriptor limit, which the daemon raises from its
        /// soft to its hard value when it starts (``DescriptorLimit/maximumClients(forLimit:)``).
        /// A larger number is lowered to that size, so that the store always has descriptors
        /// left. Past it, a new request connection closes the
        /// oldest one that has not said hello, or is closed itself when every open connection
        /// said hello; a new event connection past it is closed.
        public var maximumClients: Int?
        /// How long, in seconds, a request connection may stay without saying hello before the
        /// daemon closes it (``WireProtocol/helloTimeout`` by default).
        public var helloTimeout: TimeInterval
        /// Where the server writes what it does (one line per call).
        public var log: @Sendable (String) -> Void

        /// A configuration; every limit has the protocol's default (`maximumEventDelay` nil:
        /// ``WireProtocol/maximumEventDelay``).
        package init(
            container: GroupContainer, durability: Durability = .full,
            maximumMessageSize: Int = WireProtocol.maximumMessageSize,
            historyCount: Int = 100_000, historyAge: TimeInterval = 7 * 86_400, maximumGroupCommit: Int = 256,
            maximumConnections: Int = 10_000,
            maximumEventDelay: TimeInterval? = nil,
            maximumClients: Int? = nil, helloTimeout: TimeInterval? = nil,
            log: @escaping @Sendable (String) -> Void = { _ in }
        ) {
            self.container = container
            self.durability = durability
            self.maximumMessageSize = maximumMessageSize
            self.historyCount = max(1, historyCount)
            self.historyAge = historyAge
            self.maximumGroupCommit = max(1, maximumGroupCommit)
            self.maximumConnections = max(1, maximumConnections)
            self.maximumEventDelay = max(0, maximumEventDelay ?? WireProtocol.maximumEventDelay.timeInterval)
            self.maximumClients = maximumClients.map { max(1, $0) }
            self.helloTimeout = max(0, helloTimeout ?? WireProtocol.helloTimeout.timeInterval)
            self.log = log
        }
    }

    /// How this daemon serves.
    public let configuration: Configuration
    private let lock: GroupLock
    /// The request (`ROUTER`) and event (`PUB`) sockets.
    private let sockets: ZMTPServer
    /// Keeps the connections of both sockets within the limit (its own thread).
    private var connectionGuard: ConnectionGuard?
    /// The connection limit in force on each socket.
    public let maximumClients: Int
    private var store: SQLiteStore?
    private var sequence: UInt64 = 0
    /// The store's identity (see ``WireMessage/Welcome/storeEpoch``).
    private var epoch = ChangeEvent.noAuthor
    /// The store's schema version, as recorded when it was created.
    private var schemaVersion: UInt64 = 1
    /// The connections that said hello.
    private var sessions: SessionTable
    /// How the sessions of each earlier schema version see the store (its requests, replies
    /// and events are translated; docs/PROTOCOL.md, "Mixed schema versions").
    private var projections: [UInt64: SchemaProjection] = [:]
    private var publisher: EventPublisher
    private let access: PeerAccess
    private var lastHeartbeat = Date.distantPast
    private var lastPrune = Date.distantPast
    /// No history row is left below this sequence (see ``Journal/prune(_:current:byAge:goneBelow:in:)``).
    private var historyGoneBelow: UInt64 = 0
    /// History pruned since the last log line about it, and when that line was written.
    private var unloggedPruning = Journal.Pruned()
    private var lastPruningLog = Date.distantPast
    private let state = NSLock()
    /// Exactly-once decisions, from the save records of the commits since the daemon started.
    private var ledger = SaveLedger()
    private var counters = Statistics()
    /// Answers fetches, counts and faults beside the commits.
    private let reader: ReadWorker
    /// Admin sessions (`skyros … --group`), connection activity, metrics (AdminSession.swift).
    public let admin: AdminSessions

    /// What the server has committed since it started.
    public struct Statistics: Sendable, Equatable {
        /// Group commits (transactions) of saves.
        public var commits = 0
        /// Change sets stored by them.
        public var changeSets = 0
        /// Hellos answered with a welcome (a client says hello again after a restart, on a
        /// new connection, or when the daemon forgot its connections).
        public var welcomes = 0
        /// Messages of change events published (heartbeats not counted): one per commit when
        /// the daemon is idle between them, fewer under load.
        public var publishes = 0

        /// Statistics with the given counts (for comparisons in tests).
        public init(commits: Int = 0, changeSets: Int = 0, welcomes: Int = 0, publishes: Int = 0) {
            self.commits = commits
            self.changeSets = changeSets
            self.welcomes = welcomes
            self.publishes = publishes
        }
    }

    /// What the daemon has done since it started; readable from any thread.
    public var statistics: Statistics { state.withLock { counters } }
    private var stopRequested = false

    /// Prepares the container, takes the group's lock (before binding: a second daemon is
    /// refused and never steals the sockets), opens the store if it exists, and binds.
    ///
    /// An existing store file is checked first (``StoreCheck``, `PRAGMA quick_check`,
    /// without writing to it): an empty file, a file that is not a Skyros store or a damaged
    /// store is refused with ``SkyrosError/Code/storeFailure`` naming the file and the
    /// problem, and left byte for byte as it was.
    public init(configuration: Configuration) throws {
        self.configuration = configuration
        let container = configuration.container
        try container.prepare()
        lock = try GroupLock(container)
        sessions = SessionTable(maximumSessions: configuration.maximumConnections)
        publisher = EventPublisher(maximumDelay: .seconds(configuration.maximumEventDelay))
        if try StoreCheck.verify(container.store, depth: .quick) {
            guard let description = try SQLiteStore.storedSchemaDescription(at: container.store) else {
                throw SkyrosError(.storeFailure, "the schema of the store at \(container.store.path) cannot be read")
            }
            let store = try SQLiteStore(
                schema: try Schema(description: description, version: try SQLiteStore.storedSchemaVersion(at: container.store) ?? 1),
                url: container.store, durability: configuration.durability,
                serialAccess: false)
            let opened = try Journal.open(store)
            (self.store, sequence, epoch, schemaVersion) = (store, opened.sequence, opened.epoch, opened.schemaVersion)
        }
        access = PeerAccess(container: container)
        admin = AdminSessions(log: configuration.log)
        reader = try ReadWorker()
        maximumClients = Self.clientLimit(configuration)
        // The high-water mark bounds the memory each connection can hold in the queues, both ways.
        sockets = try ZMTPServer(
            maximumMessageSize: configuration.maximumMessageSize, highWaterMark: WireProtocol.highWaterMark)
        for path in container.sockets where FileManager.default.fileExists(atPath: path) {
            // A socket file left by a daemon that died is stale: the lock proves nobody serves it.
            try? FileManager.default.removeItem(atPath: path)
        }
        try sockets.listen(.router, endpoint: container.requestsEndpoint)
        // Events stay in the group even when the container's mode was loosened: the events
        // socket closes a connection from anyone PeerAccess refuses as soon as it is accepted
        // (requests are checked per message, and refused with a reply).
        try sockets.listen(.publisher, endpoint: container.eventsEndpoint) { [access] in access.refusal(of: $0) == nil }
        for path in container.sockets { chmod(path, 0o770) }
        // Last: nothing after it may throw (its thread would go on).
        let connectionGuard = ConnectionGuard(
            maximumClients: maximumClients, helloTimeout: configuration.helloTimeout, log: configuration.log)
        sockets.acceptedConnection = { connectionGuard.accepted($0, onRequests: $1 == .router) }
        sockets.closingConnection = { connectionGuard.closing($0, onRequests: $1 == .router) }
        self.connectionGuard = connectionGuard
        configuration.log(
            "serving \(container.url.path)\(store == nil ? " (no store yet)" : " at sequence \(sequence)")")
        configuration.log("""
            accepting at most \(maximumClients) clients (descriptor limit \(DescriptorLimit.current)); \
            hello timeout \(configuration.helloTimeout) s
            """)
    }

    /// The connection limit: the configured one, or the one sized to the descriptor limit
    /// (raised to its hard value first), whichever is lower.
    private static func clientLimit(_ configuration: Configuration) -> Int {
        let sized = DescriptorLimit.maximumClients(forLimit: DescriptorLimit.raiseToHardLimit())
        guard let wanted = configuration.maximumClients else { return sized }
        if wanted > sized {
            configuration.log("""
                a limit of \(wanted) clients (--max-clients) is more than the descriptor limit \
                \(DescriptorLimit.current) allows: accepting at most \(sized)
                """)
        }
        return min(wanted, sized)
    }

    deinit { connectionGuard?.stop() }

    /// Takes a store the daemon just created.
    private func open(_ store: SQLiteStore) throws {
        let opened = try Journal.open(store)
        sequence = opened.sequence
        epoch = opened.epoch
        schemaVersion = opened.schemaVersion
        self.store = store
    }

    /// Serves until ``stop()`` is called; checks for it every `pollInterval` milliseconds.
    ///
    /// Each turn takes every request already waiting (up to ``Configuration/maximumGroupCommit``
    /// saves): the saves among them are committed together in one transaction (group commit)
    /// and acknowledged once durable. Fetches, counts and faults go to the daemon's reader
    /// thread (``ReadWorker``), which answers them through a reader connection beside the
    /// commits, so a save never waits behind read work, however much of it members ask for;
    /// this loop sends the reader's replies as they come. Hellos and `changes-since` are
    /// answered in the turn.
    ///
    /// `turn` is called on the serving thread at the start of every turn — at least every
    /// `pollInterval` milliseconds while the loop is alive: `skyrosd` sends systemd's
    /// watchdog ping from it, so a hung loop stops the pings.
    public func serve(pollInterval: Int = 100, turn: () -> Void = {}) {
        while !isStopRequested {
            turn()
            heartbeatIfDue(every: Double(pollInterval) / 1000)
            for (identity, message) in admin.takeReplies() { send(message, to: identity) }
            // Events held under load wait at most their delay: the turn after it publishes them.
            let wait = publisher.held.isEmpty ? admin.pollInterval(pollInterval) : 1
            let ready = sockets.wait(orDescriptor: reader.wakeDescriptor, milliseconds: wait)
            if ready.descriptor { sendReads() }
            guard ready.socket else {
                if !ready.descriptor { publish(publisher.committed([], requestsWaiting: false, now: .now)) }
                continue
            }
            var saves: [PendingSave] = []
            while saves.count < configuration.maximumGroupCommit && reader.pending < Self.maximumPendingReads {
                guard let received = sockets.receive() else { break }
                handle(received.frames, peer: received.peer, descriptor: received.descriptor, saves: &saves)
            }
            // A commit tells whether requests were waiting before its replies went out (after
            // them, a client that was just answered may already have sent its next request).
            if !saves.isEmpty {
                commit(saves)
            } else if !publisher.held.isEmpty {
                publish(publisher.committed([], requestsWaiting: requestsAreWaiting(), now: .now))
            }
        }
        reader.stop()  // answers the reads already submitted
        sendReads()
        publish(publisher.flush())
    }

    /// Before ``serve(pollInterval:turn:)``: takes connections and reads their requests and
    /// subscriptions, without answering any, until `count` requests wait and `subscribers`
    /// event connections have subscribed, or `milliseconds` passed; returns whether they have.
    /// For tests whose requests must all wait when serving starts, so that the first turn takes
    /// them together, and whose subscribers must get the events of that turn.
    package func readAhead(requests count: Int, subscribers: Int = 0, milliseconds: Int) -> Bool {
        sockets.readAhead(until: count, subscribers: subscribers, milliseconds: milliseconds)
    }

    /// The most reads submitted to the reader and not answered yet; past it, the loop takes
    /// no more requests from the socket (they wait in the socket, within its high-water mark) until
    /// the reader catches up.
    static let maximumPendingReads = 1_024

    /// Sends the replies the reader has ready.
    private func sendReads() {
        for answered in reader.takeReplies() {
            sockets.send(to: answered.identity, answered.message)
        }
    }
    /// Asks ``serve(pollInterval:)`` to return once the request in progress is answered.
    public func stop() { state.withLock { stopRequested = true } }

    private var isStopRequested: Bool { state.withLock { stopRequested } }

    /// Closes the sockets, checkpoints and closes the store, and releases the group's lock.
    public func close() {
        reader.stop()
        connectionGuard?.stop()
        sockets.close()
        logPruning(Journal.Pruned(), force: true)
        try? store?.close()
        for path in configuration.container.sockets { try? FileManager.default.removeItem(atPath: path) }
        lock.release()
        configuration.log("stopped")
    }

    // MARK: - Requests

    /// A save waiting for the group commit of this turn.
    private struct PendingSave {
        var identity: Data
        var requestID: UInt64
        var clientID: UUID
        var saveNumber: UInt64
        var changes: ChangeSet
        /// A batch operation instead of a change set.
        var batch: BatchOperation?
        /// When it arrived (for its latency in `skyros status` and the metrics).
        var received = ContinuousClock.now
        /// The session's projection (an earlier schema version): its reply is translated.
        var projection: SchemaProjection? = nil
    }

    /// Answers a request, or adds it to `saves` when it is a save to commit with the others
    /// of this turn. Every reply carries the ID of the request it answers: 0 only when the
    /// frame does not even hold a message header.
    private func handle(
        _ frames: [Data], peer: PeerCredentials?, descriptor: Int32 = -1, saves: inout [PendingSave]
    ) {
        guard frames.count == 2 else {
            if frames.count > 2 || frames.count == 1 {
                let header = frames.count > 1 ? WireHeader([UInt8](frames[1])) : nil
                reply(to: frames[0], WireMessage(requestID: header?.requestID ?? 0, body: .error(
                    code: SkyrosError.Code.malformedMessage.rawValue,
                    message: "a request is exactly one frame, not \(frames.count - 1)")))
            }
            return
        }
        let identity = frames[0]
        let bytes = [UInt8](frames[1])
        admin.activity.seen(identity, peer: peer)
        let outcome = admin.intercept(bytes, identity: identity, peer: peer, state: adminState(descriptor))
        if case .answered = outcome { return }
        if case .notAdmin = outcome, let refusal = access.refusal(of: peer) {
            reply(to: identity, WireMessage(requestID: WireHeader(bytes)?.requestID ?? 0, body: .error(
                code: SkyrosError.Code.permissionDenied.rawValue, message: refusal)))
            return
        }
        var message: WireMessage
        do {
            message = try WireMessage.decode(bytes, maximumSize: configuration.maximumMessageSize)
        } catch {
            let code: SkyrosError.Code =
                if case .unsupportedVersion = error { .unsupportedProtocolVersion } else { .malformedMessage }
            reply(to: identity, WireMessage(requestID: WireHeader(bytes)?.requestID ?? 0, body: .error(
                code: code.rawValue, message: error.description)))
            return
        }
        switch message.body {
        case .save(_, 0, _), .deleteAll(_, 0), .batch(_, 0, _):
            reply(to: identity, WireMessage(requestID: message.requestID, body: .error(
                code: SkyrosError.Code.malformedMessage.rawValue, message: "save numbers start at 1")))
            return
        default: break
        }
        // A session of an earlier schema version: its request in the store's terms.
        let projection = projection(of: identity)
        if let projection {
            do {
                message.body = try projection.current(message.body)
            } catch {
                reply(to: identity, WireMessage(requestID: message.requestID, body: Self.errorReply(SkyrosError.wrap(error))))
                return
            }
        }
        if case .save(let clientID, let saveNumber, let changes) = message.body,
            sessions[identity] != nil || admin.isAdmin(identity), store != nil
        {
            saves.append(PendingSave(
                identity: identity, requestID: message.requestID, clientID: clientID, saveNumber: saveNumber,
                changes: changes, projection: projection))
            return
        }
        if case .batch(let clientID, let saveNumber, let operation) = message.body, sessions[identity] != nil, store != nil {
            saves.append(PendingSave(
                identity: identity, requestID: message.requestID, clientID: clientID, saveNumber: saveNumber,
                changes: ChangeSet(), batch: operation, projection: projection))
            return
        }
        if case .deleteAll(let clientID, let saveNumber) = message.body, sessions[identity] != nil, store != nil {
            // Saves that arrived first are committed first; the reset is a change set of its own.
            saves.append(PendingSave(
                identity: identity, requestID: message.requestID, clientID: clientID, saveNumber: saveNumber,
                changes: ChangeSet()))
            commit(saves, resetting: saves.count - 1)
            saves.removeAll()
            return
        }
        if case .hello(let hello) = message.body, hello.schemaVersion > schemaVersion, !saves.isEmpty {
            // A hello of a newer version may migrate the store: the saves that arrived first are
            // committed first, in the schema they were made in (other hellos leave the turn's
            // group commit whole).
            commit(saves)
            saves.removeAll()
        }
        if ReadWorker.answers(message.body), sessions[identity] != nil || admin.isAdmin(identity), let store {
            reader.submit(ReadWorker.Job(
                identity: identity, requestID: message.requestID, body: message.body, store: store, projection: projection))
            return
        }
        let body: WireMessage.Body
        do {
            let answer = try respond(to: message.body, from: identity, descriptor: descriptor)
            body = projection?.old(answer) ?? answer
        } catch {
            body = Self.errorReply(SkyrosError.wrap(error))
        }
        reply(to: identity, WireMessage(requestID: message.requestID, body: body))
    }

    /// Commits the saves of one turn in one transaction. Several are applied in one go first;
    /// when one of them fails (a unique constraint, a link to an object another client
    /// deleted, an object that does not exist), the transaction is rolled back and the turn
    /// applied again with each save in its own savepoint, so that the failing one fails alone
    /// (two statements a save spared in the usual case, where none fails); a turn of one save
    /// that fails is rolled back whole. A save whose client and save number were applied
    /// before is not applied again: it is answered with the sequence it got the first time (an older save
    /// number than the client's last is looked up in the history). Replies go out once the
    /// commit is durable, then its events (held under load, see ``EventPublisher``).
    ///
    /// - Parameter resetting: the index of a `deleteAll` among `saves` (the store is emptied there).
    private func commit(_ saves: [PendingSave], resetting: Int? = nil) {
        guard let store else { return }
        var results: [Result<Answer, SkyrosError>] = []
        var events: [EventPublisher.Committed] = []
        var next = sequence
        var isolated = false  // each save in a savepoint: the second attempt of a turn that failed
        var refusal: SkyrosError?  // the error of a save applied without a savepoint
        var resetLog: String?  // the log line of the reset, written once it is committed
        var pruned = Journal.Pruned()
        attempts: while true {
            (results, events, next, refusal, resetLog, pruned) = ([], [], sequence, nil, nil, Journal.Pruned())
            do {
                try store.transaction { transaction in
                    for (index, save) in saves.enumerated() {
                        do {
                            var decision = ledger.decide(client: save.clientID, save: save.saveNumber)
                            if decision == .readStore {
                                let stored = try Journal.lastSave(of: save.clientID, in: transaction)
                                decision = ledger.decide(client: save.clientID, save: save.saveNumber, stored: .some(stored))
                            }
                            switch decision {
                            case .answer(let sequence):
                                results.append(.success(try Self.answer(save, sequence: sequence, transaction)))
                                continue
                            case .answerFromHistory:
                                let first = try Journal.sequence(ofSave: save.saveNumber, by: save.clientID, in: transaction)
                                results.append(.success(try Self.answer(save, sequence: first ?? 0, transaction)))
                                continue
                            case .apply, .readStore:
                                break
                            }
                            let session = sessions[save.identity]
                            let apply = { () throws -> (ChangeEvent, [UInt8], Int?) in
                                var event = ChangeEvent(
                                    sequence: next + 1, kind: index == resetting ? .reset : .changes,
                                    authorID: save.clientID, author: session?.name ?? "")
                                var deletedObjects: Int?
                                var affected: Int?
                                if let batch = save.batch {
                                    let outcome = try transaction.batch(
                                        batch, naming: .upTo(WireProtocol.maximumBatchEventObjects))
                                    affected = outcome.count
                                    event = Self.batchEvent(outcome, batch, store.schema, event)
                                } else if index == resetting {
                                    deletedObjects = try Self.objectCount(of: store.schema, in: transaction)
                                    try transaction.deleteAll()
                                } else {
                                    let applied = try transaction.apply(save.changes)
                                    event.inserted = save.changes.inserted.map { Snapshot(id: $0.id, values: $0.values, version: 1) }
                                    event.updated = applied.map { ChangeEvent.Update(id: $0.id, version: $0.version, values: $0.changes) }
                                    event.deleted = save.changes.deleted
                                }
                                let encoded = try Journal.record(event, save: save.saveNumber, affected: affected, in: transaction)
                                if let deletedObjects {
                                    resetLog = """
                                        reset (deleteAll) by \(Self.describe(session?.name)) (client \(save.clientID), \
                                        save \(save.saveNumber)): deleted \(deletedObjects) object\(deletedObjects == 1 ? "" : "s"), \
                                        sequence \(event.sequence)
                                        """
                                }
                                return (event, encoded, affected)
                            }
                            let (event, encoded, affected) = try isolated ? transaction.savepoint(apply) : apply()
                            next = event.sequence
                            ledger.applied(client: save.clientID, save: save.saveNumber, sequence: next)
                            events.append(EventPublisher.Committed(event: event, encoded: encoded, topic: session?.topic))
                            results.append(.success(affected.map { .batch(affected: $0, event: event) } ?? .saved(event.sequence)))
                        } catch {
                            // Without a savepoint, a failed save rolls the transaction back (and,
                            // among several, makes the turn start again, a savepoint each).
                            guard isolated else {
                                refusal = SkyrosError.wrap(error)
                                throw error
                            }
                            results.append(.failure(SkyrosError.wrap(error)))
                        }
                    }
                    pruned = try pruneIfDue(next, transaction)
                }
                sequence = next
                if let resetLog { configuration.log(resetLog) }
                logPruning(pruned)
                ledger.commit()
                state.withLock {
                    counters.commits += 1
                    counters.changeSets += events.count
                }
            } catch {
                ledger.abandon()
                if refusal != nil && saves.count > 1 && !isolated {
                    isolated = true
                    continue attempts
                }
                if let refusal {
                    results = [.failure(refusal)]
                } else {
                    // The commit itself failed (I/O, disk full): nothing of this turn is stored.
                    configuration.log("group commit of \(saves.count) change sets failed: \(error)")
                    results = Array(repeating: .failure(SkyrosError.wrap(error)), count: saves.count)
                }
                events = []
            }
            break
        }
        if resetting != nil { publish(publisher.flush()) }  // the events before a reset go first
        // Asked before the replies: after them, a client just answered may already have sent
        // its next request, which is no sign of load.
        let waiting = !events.isEmpty && resetting == nil && requestsAreWaiting()
        for (save, result) in zip(saves, results) {
            let body: WireMessage.Body =
                switch result {
                case .success(.saved(let sequence)): .saved(sequence: sequence)
                case .success(.batch(let affected, let event)): .batchDone(affected: affected, event: event)
                case .failure(let error): Self.errorReply(error)
                }
            reply(to: save.identity, WireMessage(requestID: save.requestID, body: save.projection?.old(body) ?? body))
        }
        admin.committed(zip(saves, results).map { save, result in
            (save.identity, save.received, { if case .success = result { true } else { false } }())
        })
        publish(publisher.committed(events, requestsWaiting: waiting, now: .now))
        if resetting != nil { publish(publisher.flush()) }
    }

    /// The answer to a save of a turn.
    private enum Answer {
        case saved(UInt64)
        case batch(affected: Int, event: ChangeEvent)
    }

    /// The answer to a save applied before (a retry): its sequence, or for a batch its change
    /// set from the history (when the history no longer has it: a batch event with empty
    /// lists, which makes the client refresh what it holds, and 0 objects).
    private static func answer(_ save: PendingSave, sequence: UInt64, _ transaction: SQLiteStore.Transaction) throws -> Answer {
        guard save.batch != nil else { return .saved(sequence) }
        if sequence > 0, let recorded = try Journal.batch(at: sequence, in: transaction) {
            return .batch(affected: recorded.affected, event: recorded.event)
        }
        return .batch(
            affected: 0, event: ChangeEvent(sequence: sequence, kind: .batch, authorID: save.clientID, author: ""))
    }

    /// The change event of a batch operation: its objects with their new values, or empty
    /// lists when the outcome does not name them (too many); a batch that selected nothing is
    /// an empty change set.
    static func batchEvent(_ outcome: BatchOutcome, _ operation: BatchOperation, _ schema: Schema, _ base: ChangeEvent) -> ChangeEvent {
        var event = base
        guard outcome.count > 0 || !outcome.deleted.isEmpty else { return event }
        event.kind = .batch
        guard outcome.isListed else { return event }
        event.deleted = outcome.deleted.sorted { ($0.entityName, $0.uuid.uuidString) < ($1.entityName, $1.uuid.uuidString) }
        event.updated = outcome.updatedValues.map { id, update in
            ChangeEvent.Update(id: id, version: update.version, values: update.values)
        }.sorted { ($0.id.entityName, $0.id.uuid.uuidString) < ($1.id.entityName, $1.id.uuid.uuidString) }
        return event
    }

    /// The reply to a failed request: the conflict list of a refused save, or an error.
    static func errorReply(_ error: SkyrosError) -> WireMessage.Body {
        if error.code == .mergeConflict { return .conflicts(message: error.message, error.conflicts) }
        return .error(code: error.code.rawValue, message: error.message)
    }

    /// Applies the history retention inside a commit: by count in every commit, by age at
    /// most once a second.
    private func pruneIfDue(_ current: UInt64, _ transaction: SQLiteStore.Transaction) throws -> Journal.Pruned {
        let now = Date()
        let byAge = now.timeIntervalSince(lastPrune) >= 1
        if byAge { lastPrune = now }
        let retention = Journal.Retention(count: configuration.historyCount, age: configuration.historyAge)
        let pruned = try Journal.prune(retention, current: current, byAge: byAge, goneBelow: historyGoneBelow, in: transaction)
        // Were the transaction rolled back, a later prune's DELETE removes these rows too (the
        // history may hold a few more change sets than its count until then).
        historyGoneBelow = max(historyGoneBelow, UInt64(clamping: retention.keepFrom(current: current)))
        return pruned
    }

    /// How often at most the pruning of the history is logged: with a full history, every
    /// commit prunes a change set, and a line per commit would drown the log.
    static let pruningLogInterval: TimeInterval = 60

    /// Logs committed pruning: at once the first time, then what was pruned since at most
    /// once every ``pruningLogInterval`` (and when the daemon closes).
    private func logPruning(_ pruned: Journal.Pruned, force: Bool = false) {
        unloggedPruning = unloggedPruning + pruned
        guard !unloggedPruning.isEmpty,
            force || Date().timeIntervalSince(lastPruningLog) >= Self.pruningLogInterval
        else { return }
        let changeSets = unloggedPruning.changeSets
        let records = unloggedPruning.saveRecords
        configuration.log("""
            pruned the history (retention: the last \(configuration.historyCount) change sets, none older than \
            \(configuration.historyAge) s): removed \(changeSets) change set\(changeSets == 1 ? "" : "s") and \
            \(records) exactly-once record\(records == 1 ? "" : "s") of silent clients\
            \(lastPruningLog == .distantPast ? "" : " since the last such line")
            """)
        unloggedPruning = Journal.Pruned()
        lastPruningLog = Date()
    }

    /// The number of objects in the store, counted inside a transaction.
    private static func objectCount(of schema: Schema, in transaction: SQLiteStore.Transaction) throws -> Int {
        var total = 0
        for entity in schema.entities {
            let table = "\"" + entity.name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
            if case .integer(let count)? = try transaction.rows("SELECT count(*) FROM \(table)").first?.first {
                total += Int(count)
            }
        }
        return total
    }

    /// A client's name in the log.
    private static func describe(_ name: String?) -> String {
        guard let name, !name.isEmpty else { return "an unnamed client" }
        return "'\(name)'"
    }

    private func reply(to identity: Data, _ message: WireMessage) {
        switch message.body {
        case .error(let code, let text): admin.replied(error: code, message: text, to: identity, requestID: message.requestID)
        case .conflicts(let text, _):
            admin.replied(error: SkyrosError.Code.mergeConflict.rawValue, message: text, to: identity, requestID: message.requestID)
        default: break
        }
        send(message.encoded(), to: identity)
    }

    /// Sends an encoded reply on the request socket.
    private func send(_ message: [UInt8], to identity: Data) {
        sockets.send(to: identity, message)
    }

    /// What an admin session's request may read of the server (AdminSession.swift).
    private func adminState(_ descriptor: Int32) -> AdminSessions.ServerState {
        AdminSessions.ServerState(
            store: store, sequence: sequence, epoch: epoch, schemaVersion: schemaVersion, sessions: sessions,
            container: configuration.container,
            welcomed: { [unowned self] in connectionGuard?.welcomed(descriptor: descriptor) },
            send: { [unowned self] identity, message in
                if let header = WireHeader(message), header.kind == WireProtocol.Kind.error.rawValue,
                    case .error(let code, let text)? = try? WireMessage.decode(message).body
                {
                    admin.replied(error: code, message: text, to: identity, requestID: header.requestID)
                }
                send(message, to: identity)
            })
    }

    /// Answers a hello or a `changes-since` (reads go to the reader, see ``ReadWorker``).
    private func respond(to body: WireMessage.Body, from identity: Data, descriptor: Int32) throws -> WireMessage.Body {
        if case .hello(let hello) = body {
            let welcome = try welcome(hello, identity)
            connectionGuard?.welcomed(descriptor: descriptor)
            return welcome
        }
        guard sessions[identity] != nil || admin.isAdmin(identity), let store else {
            throw SkyrosError(.helloRequired, "say hello first")
        }
        switch body {
        case .changesSince(let since, let limit):
            admin.metrics.catchUps.increment()
            let page = try Journal.changes(since: since, current: sequence, limit: limit, in: store)
            return .changes(page.events, more: page.more)
        default:
            throw SkyrosError(.malformedMessage, "a client cannot send a \(body.kind) message")
        }
    }

    /// Answers a hello: the first one of a group with no store creates the store from its
    /// schema description.
    private func welcome(_ hello: WireMessage.Hello, _ identity: Data) throws -> WireMessage.Body {
        // A hello refused for its name (SessionTable) does not create or migrate the store either.
        var accepted = store?.schema.fingerprint ?? ""
        if SessionTable.refusal(of: hello) == nil {
            if store == nil {
                try open(SQLiteStore(
                    schema: try Self.schema(of: hello), url: configuration.container.store,
                    durability: configuration.durability, serialAccess: false))
                configuration.log("created the store for schema \(hello.schemaFingerprint)")
                accepted = hello.schemaFingerprint
            } else if hello.schemaVersion > schemaVersion {
                try migrate(for: hello)
                accepted = store?.schema.fingerprint ?? ""
            } else if hello.schemaVersion < schemaVersion {
                projections[hello.schemaVersion] = try projection(
                    version: hello.schemaVersion, fingerprint: hello.schemaFingerprint)
                accepted = hello.schemaFingerprint
            } else if hello.schemaFingerprint != accepted {
                throw SkyrosError(
                    .schemaMismatch,
                    "the group's store has schema \(accepted) at version \(schemaVersion); the client \(hello.clientName) has \(hello.schemaFingerprint) at the same version: a changed model needs a higher version to be migrated")
            }
        }
        switch sessions.hello(identity, hello, storeFingerprint: accepted) {
        case .refuse(let code, let message):
            throw SkyrosError(code, message)
        case .welcome(let topic, let forgotOthers):
            if forgotOthers {
                configuration.log("forgot the connections that said hello: each says it again")
            }
            state.withLock { counters.welcomes += 1 }
            admin.welcomed(identity, hello, requestID: 0, sessions: sessions.sessions.count)
            return .welcome(WireMessage.Welcome(
                sequence: sequence, eventTopic: topic, storeEpoch: epoch, schemaVersion: schemaVersion))
        }
    }

    /// The schema a hello describes, checked against the fingerprint it announces.
    private static func schema(of hello: WireMessage.Hello) throws -> Schema {
        let decoded: SchemaDescription
        do {
            decoded = try SchemaDescription(json: hello.schemaDescription)
        } catch {
            throw SkyrosError(.schemaMismatch, "the hello's schema description cannot be read: \(error)")
        }
        let schema = try Schema(description: decoded, version: Int(clamping: hello.schemaVersion))
        guard schema.fingerprint == hello.schemaFingerprint else {
            throw SkyrosError(.schemaMismatch, "the schema description does not have the announced fingerprint")
        }
        return schema
    }

    /// The projection of a session, when it has an earlier schema version than the store's.
    private func projection(of identity: Data) -> SchemaProjection? {
        guard let session = sessions[identity], session.schemaVersion < schemaVersion else { return nil }
        return projections[session.schemaVersion]
    }

    /// How a client of an earlier schema version sees the store: its version must be recorded
    /// in the store (`skyros_schema`) with its fingerprint, or its model must be the store's;
    /// throws ``SkyrosError/Code/schemaMismatch`` with the reason otherwise.
    private func projection(version: UInt64, fingerprint: String?) throws -> SchemaProjection {
        guard let store else { throw SkyrosError(.schemaMismatch, "the group has no store") }
        let current = store.schema.schemaDescription
        var chain: [(version: Int, description: SchemaDescription)] = []
        let rows = (try? store.rows(
            "SELECT version, fingerprint, description FROM skyros_schema WHERE version >= ? AND version < ? ORDER BY version",
            [.integer(Int64(clamping: version)), .integer(Int64(clamping: schemaVersion))])) ?? []
        for row in rows {
            guard case .integer(let number) = row[0], case .text(let recorded) = row[1], case .text(let json) = row[2],
                let description = try? SchemaDescription(json: json.utf8).upgradingLegacyTypeNames()
            else { throw SkyrosError(.storeFailure, "a recorded schema version of the store cannot be read") }
            if chain.isEmpty, let fingerprint, UInt64(number) == version {
                let rebuilt = try? Schema(description: description, version: Int(number)).fingerprint
                guard fingerprint == recorded || fingerprint == rebuilt else {
                    throw SkyrosError(
                        .schemaMismatch,
                        "schema version \(version) of the group's store was recorded with fingerprint \(recorded); the client has \(fingerprint): a changed model needs a higher version than the store's (\(schemaVersion))")
                }
            }
            chain.append((Int(number), description))
        }
        if chain.first.map({ UInt64($0.version) != version }) ?? true {
            guard fingerprint == store.schema.fingerprint else {
                throw SkyrosError(
                    .schemaMismatch,
                    "schema version \(version) is not recorded in the group's store (its schema is at version \(schemaVersion)): a client of that version cannot be served")
            }
            chain.insert((Int(clamping: version), current), at: 0)  // the same model under an earlier number
        }
        chain.append((Int(clamping: schemaVersion), current))
        return try SchemaProjection(chain: chain)
    }

    /// Migrates the store to the newer schema of a hello, with the same code as an embedded
    /// stack (``SQLiteStore`` infers the migration, in one transaction): the reads submitted
    /// are answered first, the events held are published; then the store is opened with the
    /// new schema, its history restarts with a `schemaChanged` event, which is published, and
    /// the sessions of earlier versions are projected anew (those that cannot be are forgotten).
    /// On failure the store is left as it was and the daemon serves on with it: the hello is
    /// refused with ``SkyrosError/Code/migrationFailed`` (or `schemaMismatch` for a description
    /// that cannot be read).
    private func migrate(for hello: WireMessage.Hello) throws {
        guard let current = store else { return }
        let schema = try Self.schema(of: hello)
        reader.waitUntilIdle()
        sendReads()
        publish(publisher.flush())
        let migrated: SQLiteStore
        do {
            migrated = try SQLiteStore(
                schema: schema, url: configuration.container.store, durability: configuration.durability,
                serialAccess: false)
        } catch {
            let wrapped = SkyrosError.wrap(error)
            configuration.log(
                "refused to migrate the store from schema version \(schemaVersion) to \(hello.schemaVersion) for \(Self.describe(hello.clientName)): \(wrapped.message)")
            throw SkyrosError(
                .migrationFailed,
                wrapped.code == .migrationFailed
                    ? wrapped.message
                    : "the store cannot be migrated from schema version \(schemaVersion) to \(hello.schemaVersion): \(wrapped.code): \(wrapped.message)")
        }
        try? current.close()
        let previous = schemaVersion
        let opened: Journal.Opened
        do {
            opened = try Journal.open(migrated, author: hello.clientName)
        } catch {
            // Migrated, but its journal cannot be opened: serve nothing rather than the wrong schema.
            configuration.log("the migrated store's history cannot be opened: \(error)")
            throw SkyrosError(.storeFailure, "the migrated store's history cannot be opened: \(SkyrosError.wrap(error).message)")
        }
        (store, sequence, epoch, schemaVersion) = (migrated, opened.sequence, opened.epoch, opened.schemaVersion)
        ledger = SaveLedger()
        configuration.log(
            "migrated the store from schema version \(previous) to \(schemaVersion) (\(schema.fingerprint)) for \(Self.describe(hello.clientName)), sequence \(sequence)")
        projections = [:]
        for version in sessions.schemaVersions where version < schemaVersion {
            do {
                projections[version] = try projection(version: version, fingerprint: nil)
            } catch {
                configuration.log("sessions of schema version \(version) cannot be served any more: \(SkyrosError.wrap(error).message)")
                sessions.forget(schemaVersion: version)
            }
        }
        if let event = opened.schemaChanged {
            publish(publisher.committed(
                [EventPublisher.Committed(event: event, encoded: WireMessage(requestID: 0, body: .event(event)).encoded(), topic: nil)],
                requestsWaiting: false, now: .now))
            publish(publisher.flush())
        }
    }

    /// A heartbeat is an event of kind heartbeat with the current sequence: clients learn
    /// that their subscription is live and notice gaps even when nothing is saved.
    private func heartbeatIfDue(every interval: TimeInterval) {
        guard Date().timeIntervalSince(lastHeartbeat) >= interval else { return }
        lastHeartbeat = Date()
        for publication in publisher.heartbeat(sequence: sequence) { publish(publication) }
    }

    /// Whether a request is waiting in the socket.
    private func requestsAreWaiting() -> Bool { sockets.hasInput }

    /// Sends what the publisher decided: two frames, the topic and the message.
    private func publish(_ publication: EventPublisher.Publication?) {
        guard let publication else { return }
        if publication.changeSets > 0 {
            state.withLock { counters.publishes += 1 }
            admin.metrics.eventsPublished.increment(by: publication.changeSets)
        }
        sockets.publish([[publication.topic], publication.message])
        // For the sessions of earlier schema versions: a copy in their terms, under the same
        // topic followed by their version (docs/PROTOCOL.md, "Mixed schema versions").
        let versions = sessions.schemaVersions.filter { $0 < schemaVersion }
        guard !versions.isEmpty, let decoded = try? WireMessage.decode(publication.message) else { return }
        for version in versions.sorted() {
            guard let projection = projections[version] else { continue }
            var topic = WireWriter()
            topic.byte(publication.topic)
            topic.uvarint(version)
            let translated = WireMessage(requestID: decoded.requestID, body: projection.old(decoded.body))
            sockets.publish([topic.bytes, translated.encoded()])
        }
    }
}
