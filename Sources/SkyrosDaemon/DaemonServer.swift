import Foundation
import Skyros
import SkyrosSync
import SkyrosWire
import SkyrosZeroMQ

/// The daemon of one application group, as a library: it owns the group's store, answers
/// requests on `requests.ipc` and publishes committed changes on `events.ipc`
/// (docs/PROTOCOL.md). `skyrosd` wraps it with arguments, signals and logging.
///
/// Bad input never stops it: every malformed or invalid request gets an error reply and the
/// server goes on with the next one.
///
/// It is the loop around the daemon's turn (``DaemonTurn``, where the protocol is decided):
/// it waits on the sockets, hands the turn what arrived, and performs the actions the turn
/// returns (replies, reads, group commits, publications). It is confined to the thread that
/// serves: other threads stop it and read its statistics through its ``handle``.
package final class DaemonServer {
    /// How a daemon serves its group.
    package struct Configuration: Sendable {
        /// The group container (created with mode 0770 when missing).
        package var container: GroupContainer
        /// The store's durability: `.full` syncs every commit (the default).
        package var durability: Durability
        /// The largest request accepted (a larger frame closes its connection before it is read).
        package var maximumMessageSize: Int
        /// How many change sets the history keeps (at least 1).
        package var historyCount: Int
        /// How long the history keeps a change set, in seconds.
        package var historyAge: TimeInterval
        /// The most change sets committed together in one transaction.
        package var maximumGroupCommit: Int
        /// How many connections the daemon remembers the hello of. Past it, it forgets them
        /// all: each says hello again on its next request, as clients do by themselves when
        /// told `helloRequired`, so a daemon serving short-lived clients for months does not
        /// grow without bound.
        package var maximumConnections: Int
        /// How long, in seconds, the events of a commit may wait while more requests are
        /// already waiting: under load the events of several commits go out together, in one
        /// message that wakes each client once (each client receives every other client's
        /// changes, so under load a publish per commit costs every client a wake-up per
        /// commit). A daemon with nothing more to do publishes at once. 0 publishes after
        /// every commit.
        package var maximumEventDelay: TimeInterval
        /// How long, in seconds, a turn may wait for more saves before its group commit, while
        /// fewer connections have a save in it than in the largest of the last 16 commits (all
        /// forgotten when no commit came for 100 ms): clients that save in turn then commit
        /// together, one transaction and one sync for all of them, instead of half of them each
        /// time. A client saving alone never waits; every turn waits at most this long (events
        /// held by earlier commits that would be due meanwhile go out first), and a read's
        /// reply ready ends the wait. Their events may wait for the next
        /// commits', as under load (``maximumEventDelay``). 0: each turn commits what is
        /// waiting at once.
        package var maximumCommitDelay: TimeInterval
        /// The most connections open at once on each of the two sockets (a client holds one on
        /// each); nil: sized to the file-descriptor limit, which the daemon raises from its
        /// soft to its hard value when it starts (``DescriptorLimit/maximumClients(forLimit:)``).
        /// A larger number is lowered to that size, so that the store always has descriptors
        /// left. Past it, a new request connection closes the
        /// oldest one that has not said hello, or is closed itself when every open connection
        /// said hello; a new event connection past it is closed.
        package var maximumClients: Int?
        /// How long, in seconds, a request connection may stay without saying hello before the
        /// daemon closes it (``WireProtocol/helloTimeout`` by default).
        package var helloTimeout: TimeInterval
        /// Where the server writes what it does (one line per call).
        package var log: @Sendable (String) -> Void
        /// The PostgreSQL server the group syncs with (docs/SYNC.md); nil: this machine only.
        package var sync: SyncConfiguration? = nil
        /// How the sync engine paces itself (tests make its snapshot pages small).
        package var syncSettings = SyncEngine.Settings()

        /// The default ``maximumCommitDelay``: 150 µs, about a third of a group commit of 8
        /// clients on a 2-core machine (8 clients saving in a loop there commit about 7.4 saves
        /// at a time instead of 4.6; docs/BENCHMARKS.md, the contention figures).
        package static let defaultCommitDelay: TimeInterval = 0.000_150

        /// A configuration; every limit has the protocol's default (`maximumEventDelay` nil:
        /// ``WireProtocol/maximumEventDelay``).
        package init(
            container: GroupContainer, durability: Durability = .full,
            maximumMessageSize: Int = WireProtocol.maximumMessageSize,
            historyCount: Int = 100_000, historyAge: TimeInterval = 7 * 86_400, maximumGroupCommit: Int = 256,
            maximumConnections: Int = 10_000,
            maximumEventDelay: TimeInterval? = nil, maximumCommitDelay: TimeInterval? = nil,
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
            self.maximumCommitDelay = min(0.1, max(0, maximumCommitDelay ?? Self.defaultCommitDelay))
            self.maximumClients = maximumClients.map { max(1, $0) }
            self.helloTimeout = max(0, helloTimeout ?? WireProtocol.helloTimeout.timeInterval)
            self.log = log
        }
    }

    /// How this daemon serves.
    package let configuration: Configuration
    /// What other threads may do with the server: stop it, read its statistics.
    package let handle = Handle()
    private let lock: GroupLock
    /// The request (`ROUTER`) and event (`PUB`) sockets.
    private let sockets: ZMTPServer
    /// Keeps the connections of both sockets within the limit (its own thread).
    private var connectionGuard: ConnectionGuard?
    /// The connection limit in force on each socket.
    package let maximumClients: Int
    /// The protocol: sessions, store, group commit, publishing.
    private var turn: DaemonTurn
    private let access: PeerAccess
    /// Answers fetches, counts and faults beside the commits.
    private let reader: ReadWorker
    /// Admin sessions (`skyros … --group`), connection activity, metrics (AdminSession.swift).
    package let admin: AdminSessions
    /// Sync with PostgreSQL (docs/SYNC.md), when configured.
    private let sync: SyncLink?
    /// Without sync: whether the store was looked at for a machine id (a store that has synced
    /// keeps queueing its commits, uploaded when sync is on again).
    private var queueingChecked = false

    /// What the server has committed since it started.
    package struct Statistics: Sendable, Equatable {
        /// Group commits (transactions) of saves.
        package var commits = 0
        /// Change sets stored by them.
        package var changeSets = 0
        /// Hellos answered with a welcome (a client says hello again after a restart, on a
        /// new connection, or when the daemon forgot its connections).
        package var welcomes = 0
        /// Messages of change events published (heartbeats not counted): one per commit when
        /// the daemon is idle between them, fewer under load.
        package var publishes = 0
        /// Turns that waited for more saves before their group commit
        /// (``Configuration/maximumCommitDelay``).
        package var commitWaits = 0
        /// Fetches, counts and faults not answered because nobody waited for them any more:
        /// their connection closed first (a client whose attempt timed out sends it again on a
        /// new one, or exits; see ``ReadWorker``).
        package var readsDropped = 0

        /// Statistics with the given counts.
        package init(commits: Int = 0, changeSets: Int = 0, welcomes: Int = 0, publishes: Int = 0) {
            self.commits = commits
            self.changeSets = changeSets
            self.welcomes = welcomes
            self.publishes = publishes
        }
    }

    /// Prepares the container, takes the group's lock (before binding: a second daemon is
    /// refused and never steals the sockets), opens the store if it exists, and binds.
    ///
    /// An existing store file is checked first (``StoreCheck``, `PRAGMA quick_check`,
    /// without writing to it): an empty file, a file that is not a Skyros store or a damaged
    /// store is refused with ``SkyrosError/Code/storeFailure`` naming the file and the
    /// problem, and left byte for byte as it was.
    package init(configuration: Configuration) throws {
        self.configuration = configuration
        let container = configuration.container
        try container.prepare()
        lock = try GroupLock(container)
        var store: SQLiteStore?
        var opened: Journal.Opened?
        if try StoreCheck.verify(container.store, depth: .quick) {
            guard let description = try SQLiteStore.storedSchemaDescription(at: container.store) else {
                throw SkyrosError(.storeFailure, "the schema of the store at \(container.store.path) cannot be read")
            }
            let existing = try SQLiteStore(
                schema: try Schema(
                    description: description, version: try SQLiteStore.storedSchemaVersion(at: container.store) ?? 1),
                url: container.store, durability: configuration.durability,
                serialAccess: false)
            (store, opened) = (existing, try Journal.open(existing))
        }
        turn = DaemonTurn(
            settings: DaemonTurn.Settings(
                container: container, durability: configuration.durability,
                maximumMessageSize: configuration.maximumMessageSize,
                retention: Journal.Retention(count: configuration.historyCount, age: configuration.historyAge),
                maximumEventDelay: configuration.maximumEventDelay,
                maximumConnections: configuration.maximumConnections,
                log: configuration.log, maximumCommitDelay: .seconds(configuration.maximumCommitDelay)),
            store: store, opened: opened)
        access = PeerAccess(container: container)
        admin = AdminSessions(log: configuration.log)
        let reader = try ReadWorker()
        self.reader = reader
        sync = configuration.sync.map {
            SyncLink(
                configuration: $0, settings: configuration.syncSettings, wake: { reader.wake() }, log: configuration.log
            )
        }
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
        // On the serve loop, like every request: a closed connection's client leaves the status.
        // The reads it asked and that were not started are dropped: nobody would take them.
        sockets.closedRoutingIdentity = { [admin, reader] identity in
            admin.activity.closed(identity)
            reader.cancel(identity: identity)
        }
        reader.onDropped = { [handle] count in handle.record { $0.readsDropped += count } }
        self.connectionGuard = connectionGuard
        configuration.log(
            "serving \(container.url.path)\(store == nil ? " (no store yet)" : " at sequence \(turn.sequence)")")
        configuration.log(
            """
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
            configuration.log(
                """
                a limit of \(wanted) clients (--max-clients) is more than the descriptor limit \
                \(DescriptorLimit.current) allows: accepting at most \(sized)
                """)
        }
        return min(wanted, sized)
    }

    deinit { connectionGuard?.stop() }

    /// Serves until the ``handle``'s ``Handle/stop()``; checks for it every `pollInterval`
    /// milliseconds.
    ///
    /// Each turn takes every request already waiting (up to ``Configuration/maximumGroupCommit``
    /// saves): the saves among them are committed together in one transaction (group commit)
    /// and acknowledged once durable. While fewer connections have a save in it than in the
    /// recent commits, the turn waits a little for theirs (``Configuration/maximumCommitDelay``).
    /// Fetches, counts and faults go to the daemon's reader
    /// thread (``ReadWorker``), which answers them through a reader connection beside the
    /// commits, so a save never waits behind read work, however much of it members ask for;
    /// this loop sends the reader's replies as they come. Hellos and `changes-since` are
    /// answered in the turn.
    ///
    /// `turn` is called on the serving thread at the start of every turn — at least every
    /// `pollInterval` milliseconds while the loop is alive: `skyrosd` sends systemd's
    /// watchdog ping from it, so a hung loop stops the pings.
    package func serve(pollInterval: Int = 100, turn startOfTurn: () -> Void = {}) {
        while !handle.isStopRequested {
            startOfTurn()
            if let sync {
                sync.refresh(&turn)  // starts sync once the group has a store (at start, or made by a hello)
            } else if !queueingChecked, turn.store != nil {
                queueingChecked = true
                SyncLink.queueWithoutSync(&turn, log: { [settings = turn.settings] in settings.log($0) })
            }
            performSync()  // work whose wake-up a read's reply drained
            perform(turn.heartbeatIfDue(every: Double(pollInterval) / 1000))
            for (identity, message) in admin.takeReplies() { sockets.send(to: identity, message) }
            // Events held under load wait at most their delay: the turn after it publishes them.
            let wait = turn.holdsEvents ? 1 : admin.pollInterval(pollInterval)
            let ready = sockets.wait(orDescriptor: reader.wakeDescriptor, milliseconds: wait)
            if ready.descriptor {
                sendReads()
                performSync()
            }
            guard ready.socket else {
                if !ready.descriptor { perform(turn.idle()) }
                continue
            }
            takeWaiting()
            let commits = collectGroupCommit()
            // A commit tells whether requests were waiting before its replies went out.
            perform(turn.endOfInput(requestsWaiting: { sockets.hasInput }))
            if commits { turn.commitDelay.committed(at: .now) }
        }
        reader.stop()  // answers the reads already submitted (those of closed connections were dropped)
        sendReads()
        perform(turn.stopping())
    }

    /// Waits, at most ``Configuration/maximumCommitDelay``, for the saves of the clients that
    /// saved together lately, before the turn's group commit; notes how many connections it
    /// has. Returns whether the turn has saves to commit.
    private func collectGroupCommit() -> Bool {
        guard !turn.pending.isEmpty else { return false }
        if let wait = turn.commitDelay.wait(connections: Self.connections(in: turn.pending), now: .now) {
            // Events held by earlier commits that would be due meanwhile go out now, not late.
            if let due = turn.heldEventsDue, due < wait.deadline { perform(turn.idle()) }
            handle.record { $0.commitWaits += 1 }
            while !turn.pending.isEmpty, wait.goesOn(connections: Self.connections(in: turn.pending), now: .now),
                turn.pending.count < configuration.maximumGroupCommit, reader.pending < Self.maximumPendingReads
            {
                let left = Int((wait.deadline - ContinuousClock.now) / .microseconds(1))
                guard left > 0 else { break }
                // A read's reply or the sync engine's work ends the wait: they are not held up.
                let ready = sockets.waitBriefly(microseconds: left, orDescriptor: reader.wakeDescriptor)
                if ready.descriptor { break }
                // (Woken for something else, a connection accepted or written to: still waiting.)
                guard ready.socket else { continue }
                takeWaiting()
            }
        }
        turn.commitDelay.collected(connections: Self.connections(in: turn.pending))
        return true
    }

    /// Takes the requests waiting in the socket, up to a full group commit and while the
    /// reader is not too far behind.
    private func takeWaiting() {
        while turn.pending.count < configuration.maximumGroupCommit && reader.pending < Self.maximumPendingReads {
            guard let received = sockets.receive() else { break }
            take(received)
        }
    }

    /// How many connections have a save among `saves`.
    private static func connections(in saves: [GroupCommit.Save]) -> Int {
        guard saves.count > 1 else { return saves.count }
        if saves.count > 16 { return Set(saves.map(\.identity)).count }
        var count = 0
        for (index, save) in saves.enumerated() where !saves[..<index].contains(where: { $0.identity == save.identity })
        {
            count += 1
        }
        return count
    }

    /// The most reads submitted to the reader and not answered yet; past it, the loop takes
    /// no more requests from the socket (they wait in the socket, within its high-water mark) until
    /// the reader catches up.
    static let maximumPendingReads = 1_024

    /// Closes the sockets, checkpoints and closes the store, and releases the group's lock;
    /// then the ``handle`` tells that the server is finished.
    package func close() {
        sync?.stop()
        reader.stop()
        connectionGuard?.stop()
        sockets.close()
        turn.logPruning(Journal.Pruned(), force: true)
        try? turn.store?.close()
        for path in configuration.container.sockets { try? FileManager.default.removeItem(atPath: path) }
        lock.release()
        configuration.log("stopped")
        handle.finish()
    }

    // MARK: - Performing the turn's actions

    /// Hands the turn a request, once the admin sessions had their look at it.
    private func take(_ received: ZMTPServer.Message) {
        var arrival = DaemonTurn.Arrival(frames: received.frames)
        if received.frames.count == 2 {
            let identity = received.frames[0]
            admin.activity.seen(identity, peer: received.peer)
            let outcome = admin.intercept(
                [UInt8](received.frames[1]), identity: identity, peer: received.peer,
                state: adminState(welcomed: { [connectionGuard] in
                    connectionGuard?.welcomed(descriptor: received.descriptor)
                }))
            if case .answered = outcome { return }
            if case .notAdmin = outcome { arrival.refusal = access.refusal(of: received.peer) }
            arrival.isAdmin = admin.isAdmin(identity)
        }
        perform(turn.received(arrival), connection: received.descriptor)
    }

    /// Performs the turn's actions, in order; `connection`: the descriptor of the request's
    /// connection (told to the connection guard when it is welcomed).
    private func perform(_ actions: [DaemonTurn.Action], connection: Int32 = -1) {
        for action in actions {
            switch action {
            case .reply(let identity, let message):
                reply(to: identity, message)
            case .read(let job):
                reader.submit(job)
            case .commit(let saves, let resetting):
                perform(
                    turn.commit(
                        saves, resetting: resetting,
                        requestsWaiting: { [savingInTurn = turn.commitDelay.savingInTurn] in
                            savingInTurn || sockets.hasInput
                        }))
            case .queued(let handed, let through):
                sync?.engine?.localCommitted(handed, through: through)
            case .publish(let topic, let message, let changeSets):
                if changeSets > 0 {
                    handle.record { $0.publishes += 1 }
                    admin.metrics.eventsPublished.increment(by: changeSets)
                }
                sockets.publish([topic, message])
            case .migrate(let identity, let hello, let requestID):
                reader.waitUntilIdle()
                sendReads()
                perform(turn.migrate(identity, hello: hello, requestID: requestID), connection: connection)
                // The sync engine learns the new schema now, before a save later in this turn
                // queues a change set under its names: told after the turn, it went on
                // uploading those with the earlier schema's session, which wrote them without
                // the renamed properties' values (issue 57, a rename rolled out).
                sync?.refresh(&turn)
            case .welcomed(let identity, let hello, let sessions):
                connectionGuard?.welcomed(descriptor: connection)
                handle.record { $0.welcomes += 1 }
                admin.welcomed(identity, hello, requestID: 0, sessions: sessions)
            case .committed(let saves, let changeSets):
                if let changeSets {
                    handle.record {
                        $0.commits += 1
                        $0.changeSets += changeSets
                    }
                }
                admin.committed(saves)
            case .caughtUp:
                admin.metrics.catchUps.increment()
            }
        }
    }

    /// Performs what the sync engine asked of the store (SyncLink.swift): checkpoints to apply,
    /// uploaded change sets to drop from the queue.
    private func performSync() {
        guard let sync else { return }
        for request in sync.channel.take() {
            let answer = turn.answer(request)
            perform(answer.actions)
            if answer.committed { handle.record { $0.commits += 1 } }
            answer.reply()
        }
    }

    /// Sends the replies the reader has ready.
    private func sendReads() {
        for answered in reader.takeReplies() {
            sockets.send(to: answered.identity, answered.message)
        }
    }

    /// Sends a reply on the request socket (an error is counted and logged, see ``AdminSessions``).
    private func reply(to identity: Data, _ message: WireMessage) {
        switch message.body {
        case .error(let code, let text):
            admin.replied(error: code, message: text, to: identity, requestID: message.requestID)
        case .conflicts(let text, _):
            admin.replied(
                error: SkyrosError.Code.mergeConflict.rawValue, message: text, to: identity,
                requestID: message.requestID)
        default: break
        }
        sockets.send(to: identity, message.encoded())
    }

    /// What an admin session's request may read of the server (AdminSession.swift).
    private func adminState(welcomed: @escaping () -> Void) -> AdminSessions.ServerState {
        AdminSessions.ServerState(
            store: turn.store, sequence: turn.sequence, epoch: turn.epoch, schemaVersion: turn.schemaVersion,
            sessions: turn.sessions, container: configuration.container, welcomed: welcomed,
            send: { [unowned self] identity, message in
                if let header = WireHeader(message), header.kind == WireProtocol.Kind.error.rawValue,
                    case .error(let code, let text)? = try? WireMessage.decode(message).body
                {
                    admin.replied(error: code, message: text, to: identity, requestID: header.requestID)
                }
                sockets.send(to: identity, message)
            },
            sync: sync.map { sync in { [store = turn.store] in sync.statusReport(store: store) } })
    }
}
