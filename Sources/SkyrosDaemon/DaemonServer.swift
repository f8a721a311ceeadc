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
    public struct Configuration: Sendable {
        public var container: GroupContainer
        public var durability: Durability
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
        /// Where the server writes what it does (one line per call).
        public var log: @Sendable (String) -> Void

        public init(
            container: GroupContainer, durability: Durability = .full,
            maximumMessageSize: Int = WireMessage.maximumSize,
            historyCount: Int = 100_000, historyAge: TimeInterval = 7 * 86_400, maximumGroupCommit: Int = 256,
            maximumConnections: Int = 10_000, maximumEventDelay: TimeInterval = 0.002,
            log: @escaping @Sendable (String) -> Void = { _ in }
        ) {
            self.container = container
            self.durability = durability
            self.maximumMessageSize = maximumMessageSize
            self.historyCount = max(1, historyCount)
            self.historyAge = historyAge
            self.maximumGroupCommit = max(1, maximumGroupCommit)
            self.maximumConnections = max(1, maximumConnections)
            self.maximumEventDelay = max(0, maximumEventDelay)
            self.log = log
        }
    }

    public let configuration: Configuration
    private let lock: GroupLock
    private let zmq: ZeroMQContext
    private let requests: ZeroMQSocket
    private let events: ZeroMQSocket
    private var store: SQLiteStore?
    private var sequence: UInt64 = 0
    /// A connection that said hello: the name of its process, and its event topic (see
    /// ``WireMessage/broadcastTopic``). Topics are given in turn from 1 to 255: two
    /// connections share one only past 255 of them, and then each receives the other's
    /// events a little later, by catching up.
    private struct Peer {
        var name: String
        var topic: UInt8
    }
    /// The connections that said hello, by identity.
    private var peers: [Data: Peer] = [:]
    private var nextEventTopic: UInt8 = 1
    private let access: PeerAccess
    private var lastHeartbeat = Date.distantPast
    private var lastPrune = Date.distantPast
    private let state = NSLock()
    /// The save records of the commits since the daemon started (see ``lastSave(of:_:)``).
    private var lastSaves: [String: Journal.SaveRecord] = [:]
    private var counters = Statistics()
    /// Committed change sets whose events are not published yet (see
    /// ``Configuration/maximumEventDelay``), and since when the oldest has waited.
    private var unpublished: [Committed] = []
    private var unpublishedSince = ContinuousClock.now

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

        public init(commits: Int = 0, changeSets: Int = 0, welcomes: Int = 0, publishes: Int = 0) {
            self.commits = commits
            self.changeSets = changeSets
            self.welcomes = welcomes
            self.publishes = publishes
        }
    }

    public var statistics: Statistics { state.withLock { counters } }
    private var stopRequested = false

    /// Prepares the container, takes the group's lock (before binding: a second daemon is
    /// refused and never steals the sockets), opens the store if it exists, and binds.
    public init(configuration: Configuration) throws {
        self.configuration = configuration
        let container = configuration.container
        try container.prepare()
        lock = try GroupLock(container)
        if let description = try SQLiteStore.storedSchemaDescription(at: container.store) {
            let store = try SQLiteStore(
                schema: try Schema(description: description), url: container.store, durability: configuration.durability,
                serialAccess: true)
            sequence = try Journal.open(store)
            self.store = store
        }
        access = PeerAccess(container: container)
        zmq = try ZeroMQContext()
        requests = try ZeroMQSocket(context: zmq, kind: .router)
        try requests.setMaximumMessageSize(Int64(configuration.maximumMessageSize))
        events = try ZeroMQSocket(context: zmq, kind: .publisher)
        for path in container.sockets where FileManager.default.fileExists(atPath: path) {
            // A socket file left by a daemon that died is stale: the lock proves nobody serves it.
            try? FileManager.default.removeItem(atPath: path)
        }
        try requests.bind(container.requestsEndpoint)
        try events.bind(container.eventsEndpoint)
        for path in container.sockets { chmod(path, 0o770) }
        configuration.log(
            "serving \(container.url.path)\(store == nil ? " (no store yet)" : " at sequence \(sequence)")")
    }

    /// Serves until ``stop()`` is called; checks for it every `pollInterval` milliseconds.
    ///
    /// Each turn takes every request already waiting: reads are answered at once, and the
    /// saves among them are committed together in one transaction (group commit) and
    /// acknowledged after it is durable.
    public func serve(pollInterval: Int = 100) {
        while !isStopRequested {
            heartbeatIfDue(every: Double(pollInterval) / 1000)
            do {
                guard try requests.waitForInput(milliseconds: pollInterval) else { continue }
                var saves: [PendingSave] = []
                while saves.count < configuration.maximumGroupCommit {
                    let received: (frames: [Data], peer: PeerCredentials?)
                    do {
                        received = try requests.receiveWithCredentials(dontWait: true)
                    } catch let error as ZeroMQError where error.isTimeout {
                        break
                    }
                    handle(received.frames, peer: received.peer, saves: &saves)
                }
                // A commit tells whether requests were waiting before its replies went out (after
                // them, a client that was just answered may already have sent its next request).
                publishUnlessBusy(requestsWaiting: saves.isEmpty ? nil : commit(saves))
            } catch let error as ZeroMQError where error.isTimeout || error.code == EINTR {
                continue
            } catch {
                configuration.log("receive failed: \(error)")
            }
        }
        publishUnpublished()
    }

    /// Asks ``serve(pollInterval:)`` to return once the request in progress is answered.
    public func stop() { state.withLock { stopRequested = true } }

    private var isStopRequested: Bool { state.withLock { stopRequested } }

    /// Closes the sockets, checkpoints and closes the store, and releases the group's lock.
    public func close() {
        requests.close()
        events.close()
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
        var clientID: String
        var saveNumber: UInt64
        var changes: ChangeSet
    }

    /// Answers a request, or adds it to `saves` when it is a save to commit with the others
    /// of this turn.
    private func handle(_ frames: [Data], peer: PeerCredentials?, saves: inout [PendingSave]) {
        guard frames.count == 2 else {
            if frames.count > 2 || frames.count == 1 {
                reply(to: frames[0], WireMessage(requestID: 0, body: .error(
                    code: SkyrosError.Code.malformedMessage.rawValue,
                    message: "a request is exactly one frame, not \(frames.count - 1)")))
            }
            return
        }
        let identity = frames[0]
        if let refusal = access.refusal(of: peer) {
            reply(to: identity, WireMessage(requestID: 0, body: .error(
                code: SkyrosError.Code.permissionDenied.rawValue, message: refusal)))
            return
        }
        let message: WireMessage
        do {
            message = try WireMessage.decode([UInt8](frames[1]), maximumSize: configuration.maximumMessageSize)
        } catch {
            let code: SkyrosError.Code =
                if case .unsupportedVersion = error { .unsupportedProtocolVersion } else { .malformedMessage }
            reply(to: identity, WireMessage(requestID: 0, body: .error(code: code.rawValue, message: error.description)))
            return
        }
        if case .save(let clientID, let saveNumber, let changes) = message.body, peers[identity] != nil,
            store != nil
        {
            saves.append(PendingSave(
                identity: identity, requestID: message.requestID, clientID: clientID, saveNumber: saveNumber,
                changes: changes))
            return
        }
        if case .deleteAll = message.body, !saves.isEmpty {
            _ = commit(saves)  // saves that arrived first are committed first
            saves.removeAll()
        }
        let body: WireMessage.Body
        do {
            body = try respond(to: message.body, from: identity)
        } catch {
            body = Self.errorReply(SkyrosError.wrap(error))
        }
        reply(to: identity, WireMessage(requestID: message.requestID, body: body))
    }

    /// Commits the saves of one turn in one transaction, each in its own savepoint when there
    /// are several: one that fails (a unique constraint, a link to an object another client
    /// deleted) fails alone; a turn of one save that fails is rolled back whole. A save whose
    /// client and save number were applied before is not applied again; its first
    /// acknowledgement is sent again. Replies and events go out once the commit is durable.
    /// - Returns: whether more requests were waiting once the commit was done, before the
    ///   replies (asked only when there are events to publish).
    private func commit(_ saves: [PendingSave]) -> Bool {
        guard let store else { return false }
        var results: [Result<UInt64, SkyrosError>] = []
        var events: [Committed] = []
        var next = sequence
        // Save records of this turn: known to `lastSaves` only once the commit is durable.
        var recorded: [String: Journal.SaveRecord] = [:]
        let isolated = saves.count > 1
        var refusal: SkyrosError?  // the error of a save alone in its transaction
        do {
            try store.transaction { transaction in
                for save in saves {
                    do {
                        if let last = try recorded[save.clientID] ?? lastSave(of: save.clientID, transaction),
                            last.save >= save.saveNumber
                        {
                            results.append(.success(last.sequence))
                            continue
                        }
                        let apply = { () throws -> (ChangeEvent, [UInt8]) in
                            try transaction.apply(save.changes)
                            let event = ChangeEvent(
                                sequence: next + 1, author: save.clientID,
                                changes: self.summary(of: save.changes, in: store.schema))
                            let encoded = try Journal.record(
                                event, process: self.peers[save.identity]?.name ?? "", save: save.saveNumber,
                                in: transaction)
                            return (event, encoded)
                        }
                        let (event, encoded) = try isolated ? transaction.savepoint(apply) : apply()
                        next = event.sequence
                        recorded[save.clientID] = Journal.SaveRecord(save: save.saveNumber, sequence: next)
                        events.append(Committed(event: event, encoded: encoded, topic: peers[save.identity]?.topic))
                        results.append(.success(event.sequence))
                    } catch {
                        // Alone in its transaction, a failed save rolls the transaction back.
                        guard isolated else {
                            refusal = SkyrosError.wrap(error)
                            throw error
                        }
                        results.append(.failure(SkyrosError.wrap(error)))
                    }
                }
                try pruneIfDue(next, transaction)
            }
            sequence = next
            rememberSaves(recorded)
            state.withLock {
                counters.commits += 1
                counters.changeSets += events.count
            }
        } catch {
            if let refusal {
                results = [.failure(refusal)]
                events = []
            } else {
                // The commit itself failed (I/O, disk full): nothing of this turn is stored.
                configuration.log("group commit of \(saves.count) change sets failed: \(error)")
                results = Array(repeating: .failure(SkyrosError.wrap(error)), count: saves.count)
                events = []
            }
        }
        let waiting = !(events.isEmpty && unpublished.isEmpty) && requestsAreWaiting()
        for (save, result) in zip(saves, results) {
            let body: WireMessage.Body =
                switch result {
                case .success(let sequence): .saved(sequence: sequence)
                case .failure(let error): Self.errorReply(error)
                }
            reply(to: save.identity, WireMessage(requestID: save.requestID, body: body))
        }
        if unpublished.isEmpty { unpublishedSince = .now }
        unpublished += events
        return waiting
    }

    /// The last save applied for a client: from memory, or from its record in the store the
    /// first time the client is seen (after a restart, a client may resend an applied save).
    private func lastSave(of client: String, _ transaction: SQLiteStore.Transaction) throws -> Journal.SaveRecord? {
        if let known = lastSaves[client] { return known }
        return try Journal.lastSave(of: client, in: transaction)
    }

    /// Keeps the save records of a durable commit in memory; bounded, since each client
    /// process has its own id: when full, it starts again from the store's records.
    private func rememberSaves(_ records: [String: Journal.SaveRecord]) {
        if lastSaves.count + records.count > 10_000 { lastSaves.removeAll(keepingCapacity: true) }
        lastSaves.merge(records) { _, new in new }
    }

    /// The reply to a failed request: the conflict list of a refused save, or an error.
    static func errorReply(_ error: SkyrosError) -> WireMessage.Body {
        if error.code == .mergeConflict { return .conflicts(message: error.message, error.conflicts) }
        return .error(code: error.code.rawValue, message: error.message)
    }

    /// Applies the history retention at most once a second, inside a commit.
    private func pruneIfDue(_ current: UInt64, _ transaction: SQLiteStore.Transaction) throws {
        let byAge = Date().timeIntervalSince(lastPrune) >= 1
        if byAge { lastPrune = Date() }
        try Journal.prune(
            Journal.Retention(count: configuration.historyCount, age: configuration.historyAge), current: current,
            byAge: byAge, in: transaction)
    }

    private func reply(to identity: Data, _ message: WireMessage) {
        do {
            try requests.send([identity, Data(message.encoded())], dontWait: true)
        } catch {
            configuration.log("could not reply to a client: \(error)")
        }
    }

    private func respond(to body: WireMessage.Body, from identity: Data) throws -> WireMessage.Body {
        if case .hello(let version, let fingerprint, let name, let description) = body {
            return try hello(version: version, fingerprint: fingerprint, name: name, description: description, identity)
        }
        guard peers[identity] != nil, let store else {
            throw SkyrosError(.helloRequired, "say hello first")
        }
        switch body {
        case .fetch(let request): return .snapshotsReply(try store.fetchSnapshots(request))
        case .fetchIdentifiers(let request): return .identifiersReply(try store.fetchIdentifiers(request))
        case .count(let request): return .countReply(try store.count(request))
        case .snapshots(let ids): return .snapshotsReply(try store.snapshots(for: ids))
        case .deleteAll(let clientID):
            let event = ChangeEvent(sequence: sequence + 1, author: clientID, isReset: true, changes: [])
            let encoded = try store.transaction { transaction in
                try transaction.deleteAll()
                return try Journal.record(event, process: peers[identity]?.name ?? "", save: nil, in: transaction)
            }
            sequence = event.sequence
            publishUnpublished()  // the events before it go first
            publish([Committed(event: event, encoded: encoded, topic: peers[identity]?.topic)])
            return .saved(sequence: sequence)
        case .changesSince(let since):
            return .changes(try Journal.changes(since: since, current: sequence, limit: 10_000, in: store))
        default:
            throw SkyrosError(.malformedMessage, "a client cannot send this message")
        }
    }

    private func hello(
        version: UInt64, fingerprint: String, name: String, description: [UInt8], _ identity: Data
    ) throws -> WireMessage.Body {
        guard version == UInt64(WireMessage.protocolVersion) else {
            throw SkyrosError(
                .unsupportedProtocolVersion, "the daemon speaks protocol \(WireMessage.protocolVersion), not \(version)")
        }
        if store == nil {
            let decoded = try JSONDecoder().decode(SchemaDescription.self, from: Data(description))
            let schema = try Schema(description: decoded)
            guard schema.fingerprint == fingerprint else {
                throw SkyrosError(.schemaMismatch, "the schema description does not have the announced fingerprint")
            }
            let created = try SQLiteStore(
                schema: schema, url: configuration.container.store, durability: configuration.durability,
                serialAccess: true)
            sequence = try Journal.open(created)
            store = created
            configuration.log("created the store for schema \(fingerprint)")
        }
        guard let store, store.schema.fingerprint == fingerprint else {
            throw SkyrosError(
                .schemaMismatch,
                "the group's store has schema \(store?.schema.fingerprint ?? "?"), the client \(name) has \(fingerprint)")
        }
        if peers[identity] == nil && peers.count >= configuration.maximumConnections {
            configuration.log("forgetting the \(peers.count) connections that said hello: each says it again")
            peers.removeAll()
        }
        let topic: UInt8
        if let known = peers[identity]?.topic {
            topic = known
        } else {
            topic = nextEventTopic
            nextEventTopic = nextEventTopic == .max ? 1 : nextEventTopic + 1
        }
        peers[identity] = Peer(name: name, topic: topic)
        state.withLock { counters.welcomes += 1 }
        configuration.log("hello from \(name)")
        return .welcome(protocolVersion: UInt64(WireMessage.protocolVersion), sequence: sequence, eventTopic: topic)
    }

    /// A heartbeat is an event with an empty author and the current sequence: clients learn
    /// that their subscription is live and notice gaps even when nothing is saved.
    private func heartbeatIfDue(every interval: TimeInterval) {
        guard Date().timeIntervalSince(lastHeartbeat) >= interval else { return }
        lastHeartbeat = Date()
        publishUnpublished()  // a heartbeat past unpublished events would look like a gap
        let heartbeat = ChangeEvent(sequence: sequence, author: "", changes: [])
        send(
            WireMessage(requestID: 0, body: .event(heartbeat)).encoded(), topic: WireMessage.broadcastTopic,
            firstSequence: heartbeat.sequence)
    }

    /// A committed change set: its event, the bytes of its history row (the encoded `event`
    /// message), and the event topic of the connection that saved it.
    private struct Committed {
        var event: ChangeEvent
        var encoded: [UInt8]
        var topic: UInt8?
    }

    /// Whether a request is waiting in the socket.
    private func requestsAreWaiting() -> Bool { (try? requests.waitForInput(milliseconds: 0)) == true }

    /// Publishes the waiting events, unless more requests were already waiting (nil: ask the
    /// socket) and the oldest event has waited less than ``Configuration/maximumEventDelay``
    /// (and the waiting events are under 1,024 and 1 MiB): the next commits' events then go
    /// out with them.
    private func publishUnlessBusy(requestsWaiting: Bool?) {
        guard !unpublished.isEmpty else { return }
        if ContinuousClock.now - unpublishedSince < .seconds(configuration.maximumEventDelay),
            unpublished.count < 1_024, unpublished.reduce(0, { $0 + $1.encoded.count }) < 1_048_576,
            requestsWaiting ?? requestsAreWaiting()
        {
            return
        }
        publishUnpublished()
    }

    private func publishUnpublished() {
        guard !unpublished.isEmpty else { return }
        publish(unpublished)
        unpublished = []
    }

    /// Publishes committed change sets: one event as recorded, or the consecutive events of a
    /// group commit, or of commits made while requests kept coming, in one `changes` message
    /// (each subscriber wakes up once for all of them); under their author's topic when one
    /// connection saved them all (the author knows them from the replies and does not wake up
    /// for them), to everyone otherwise.
    private func publish(_ committed: [Committed]) {
        guard let first = committed.first else { return }
        state.withLock { counters.publishes += 1 }
        let topic = committed.allSatisfy { $0.topic == first.topic } ? first.topic ?? WireMessage.broadcastTopic
            : WireMessage.broadcastTopic
        let message =
            committed.count == 1
            ? first.encoded : WireMessage(requestID: 0, body: .changes(committed.map(\.event))).encoded()
        send(message, topic: topic, firstSequence: first.event.sequence)
    }

    /// Publishes an encoded `event` or `changes` message: two frames, its topic and itself.
    private func send(_ encoded: [UInt8], topic: UInt8, firstSequence: UInt64) {
        do {
            try events.send([Data([topic]), Data(encoded)], dontWait: true)
        } catch {
            configuration.log("could not publish changes from \(firstSequence): \(error)")
        }
    }

    private func summary(of changes: ChangeSet, in schema: Schema) -> [ObjectChange] {
        var result = changes.inserted.map { ObjectChange(id: $0.id, kind: .inserted) }
        for update in changes.updated {
            let names = update.changes.keys.sorted().compactMap { schema.entity(named: update.id.entityName)?.properties[$0].name }
            result.append(ObjectChange(id: update.id, kind: .updated, properties: names))
        }
        result += changes.deleted.map { ObjectChange(id: $0, kind: .deleted) }
        return result
    }
}
