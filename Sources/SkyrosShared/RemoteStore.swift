import Foundation
import Skyros
import SkyrosWire
import SkyrosZeroMQ

/// The store of a shared stack: the group's daemon, reached over ZeroMQ (docs/PROTOCOL.md).
///
/// The client's two sockets (`DEALER` for requests, `SUB` for events) speak ZMTP 3.0 on the
/// socket files themselves (``ZMTPSocket``), on the threads that use them: a save is one
/// `send` and its reply wakes the saver directly, with no I/O thread between them.
///
/// Requests are answered from the daemon's committed state. Change events of other clients
/// are received on a background thread and handed to ``onChange``, in sequence order, with
/// no gap and no duplicate: a gap, a reconnection or a silent event socket makes the client
/// catch up with the daemon's history.
///
/// A request that gets no answer within ``retryInterval`` is sent again on a new
/// connection (saying hello again when the daemon restarted), until ``timeout`` has passed;
/// then it fails with ``SkyrosError/Code/daemonUnavailable``: no call ever waits forever.
/// A save sent again carries the same client id and save number, so the daemon applies it
/// once and acknowledges it again (exactly-once saves). When a save fails with
/// `daemonUnavailable`, whether the daemon applied it is unknown until the next fetch.
public final class RemoteStore: PersistentStore, @unchecked Sendable {
    /// The client's schema (the group's store has the same fingerprint).
    public let schema: Schema
    /// The group container whose daemon this store talks to.
    public let container: GroupContainer
    /// This client's identity in the group: 128 bits, random, made for each connection
    /// object; saves carry it (with their save number) and its change events name it.
    public let clientID: UUID
    /// The process name the hello gives the daemon.
    public let clientName: String
    /// How long a request waits for the daemon, in all.
    public let timeout: TimeInterval
    /// How long one attempt of a request waits for its reply before it is sent again.
    public let retryInterval: TimeInterval
    /// How long the event socket may stay silent (the daemon sends a heartbeat every
    /// 100 ms) before the client catches up with the history anyway.
    public let silenceInterval: TimeInterval = WireProtocol.silenceInterval.timeInterval
    /// For tests: how many save acknowledgements to drop, as if they were lost on the way.
    var droppedSaveRepliesForTesting = 0

    /// What became of a save reported as ``SkyrosError/Code/outcomeUnknown``, once the
    /// daemon answered the resent request.
    public struct ResolvedSave: Sendable {
        /// The save's number (its ``SkyrosError/Code/outcomeUnknown`` message names it).
        public var saveNumber: UInt64
        /// The sequence it was committed with; nil when it was not applied.
        public var sequence: UInt64?
        /// Why the daemon refused it (when not applied).
        public var error: SkyrosError?
        /// Whether the save is in the store.
        public var isApplied: Bool { sequence != nil }
    }

    /// Called (on a background thread) when a save reported as
    /// ``SkyrosError/Code/outcomeUnknown`` is resolved: the client resends it in the background
    /// until the daemon answers, and before any new save (which waits for the answer: saves
    /// are applied in order). It is called with none of the store's locks held: it may save
    /// through the same stack, or wait for one of its contexts.
    public var onSaveResolved: (@Sendable (ResolvedSave) -> Void)? {
        get { lock.withLock { _onSaveResolved } }
        set { lock.withLock { _onSaveResolved = newValue } }
    }
    private var _onSaveResolved: (@Sendable (ResolvedSave) -> Void)?
    /// A save whose outcome is unknown, resent until the daemon answers (guarded by
    /// `unresolvedLock`, not by `lock`, which a request holds while it waits for its reply:
    /// the event thread looks at it on every wake-up and must not wait for a save in flight).
    private var unresolvedSave: (number: UInt64, body: WireMessage.Body)?
    private let unresolvedLock = NSLock()
    /// Whether the current request's message went out at least once (guarded by `lock`).
    private var requestWentOut = false
    /// Serialises the resolution of an unknown save between the event thread and savers.
    private let resolving = NSLock()

    private let lock = NSLock()
    private let dealer: ZMTPSocket
    private var nextRequestID: UInt64 = 1
    private var saveNumber: UInt64 = 0
    private let events: ZMTPSocket
    private let eventsLock = NSLock()
    private var _onChange: (@Sendable ([ChangeEvent]) -> Void)?
    private var _onRestart: (@Sendable () -> Void)?
    private let helloMessage: WireMessage.Hello
    private var stopped = false
    private var isStopped: Bool { eventsLock.withLock { stopped } }
    private let eventsFinished = DispatchSemaphore(value: 0)
    private var eventThreadStarted = false
    /// The event thread, while it runs (to know when `deinit` runs on it).
    private var eventThread: pthread_t?
    /// A pipe that wakes the event thread from its wait (its read end, then its write end):
    /// to stop, or to change its subscriptions. The thread otherwise sleeps until an event, a
    /// heartbeat, or the end of the silence interval.
    private let wakePipe: (read: Int32, write: Int32) = {
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else { return (-1, -1) }
        for end in ends {
            _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
            _ = fcntl(end, F_SETFD, FD_CLOEXEC)
        }
        return (ends[0], ends[1])
    }()
    /// The sequence of the last change set merged (or known to be this client's own): once
    /// it reads n, ``onChange`` has returned for every change set up to n.
    public var sequence: UInt64 { eventsLock.withLock { delivered } }
    private var delivered: UInt64 = 0
    /// What to merge, when to catch up or start over (see ``EventSequencer``).
    private var sequencer: EventSequencer
    /// Actions decided on a request thread (a save's reply closed a gap), for the event thread.
    private var queuedActions: [EventSequencer.Action] = []
    /// Whether the event thread is carrying out actions (``delivered`` follows it then).
    private var isMerging = false
    /// The event topic of the current connection (from its welcome), and the one the event
    /// socket is subscribed without (nil: subscribed to everything); the event thread
    /// changes its subscriptions when they differ.
    private var eventTopic: UInt8?
    private var unsubscribedTopic: UInt8?
    /// The store's schema version, from the welcome and `schemaChanged` events: while it is
    /// newer than this client's, the daemon serves it through a projection and the events
    /// for it come under its topic followed by its version (docs/PROTOCOL.md, "Mixed schema
    /// versions"); the others are dropped.
    private var storeSchemaVersion: UInt64 = 0
    /// For tests: the event topic of the current connection.
    var eventTopicForTesting: UInt8? { eventsLock.withLock { eventTopic } }
    /// For tests: change events (not heartbeats) received on the event socket.
    var receivedEventsForTesting: Int { eventsLock.withLock { receivedEvents } }
    private var receivedEvents = 0
    /// For tests: requests sent to the daemon (each attempt counts), by kind.
    var requestsSentForTesting: [WireProtocol.Kind: Int] { lock.withLock { requestsSent } }
    private var requestsSent: [WireProtocol.Kind: Int] = [:]

    /// Connects to the daemon of `container` and says hello.
    ///
    /// - Throws: ``SkyrosError/Code/schemaMismatch`` when the group's store has another
    ///   schema, ``SkyrosError/Code/permissionDenied`` when this user may not use the group,
    ///   ``SkyrosError/Code/daemonUnavailable`` when no daemon answers in `timeout`.
    ///
    /// - Parameters:
    ///   - timeout: how long a request waits for the daemon, in all.
    ///   - retryInterval: how long one attempt waits for its reply before the request is sent
    ///     again on a new connection.
    ///   - eventQueueLimit: how many received change-event messages the event thread reads
    ///     ahead of merging them; past it, events wait in the kernel's socket buffer, then in
    ///     the daemon's queue for this client (``WireProtocol/highWaterMark`` messages), which
    ///     drops what does not fit: those are fetched from the history instead.
    ///   - eventSocketBufferBytes: the kernel receive buffer of the event socket
    ///     (`SO_RCVBUF`), when not the system's default.
    public init(
        schema: Schema, container: GroupContainer, clientName: String? = nil, timeout: TimeInterval = 5,
        retryInterval: TimeInterval = 1, eventQueueLimit: Int32 = 1_000, eventSocketBufferBytes: Int32? = nil
    ) throws {
        try schema.validate()
        self.schema = schema
        self.container = container
        self.timeout = timeout
        self.retryInterval = min(retryInterval, timeout)
        let name = String(
            decoding: Array((clientName ?? ProcessInfo.processInfo.processName).utf8.prefix(WireProtocol.maximumClientNameBytes)),
            as: UTF8.self)
        let clientID = UUID()
        self.clientID = clientID
        self.clientName = name
        helloMessage = try WireMessage.Hello(schema: schema, clientName: name)
        sequencer = EventSequencer(
            clientID: clientID, welcome: WireMessage.Welcome(sequence: 0, eventTopic: 0, storeEpoch: ChangeEvent.noAuthor, schemaVersion: 0))
        try container.checkAccess()
        // Subscribe first, then ask for the state (ZeroMQ guide, Clone pattern).
        events = try ZMTPSocket(
            kind: .subscriber, endpoint: container.eventsEndpoint, maximumMessageSize: WireProtocol.maximumMessageSize,
            receiveBufferBytes: eventSocketBufferBytes, receiveQueueLimit: Int(eventQueueLimit))
        events.subscribe()
        events.open()
        // The subscription goes out once the daemon's handshake came back: wait for it (a
        // moment, or nothing when there is no daemon), so that no event after the welcome
        // is missed.
        events.waitUntilReady(milliseconds: Int(min(1, self.retryInterval) * 1000))
        dealer = try ZMTPSocket(
            kind: .dealer, endpoint: container.requestsEndpoint, maximumMessageSize: WireProtocol.maximumMessageSize)
        let reply = try request(.hello(helloMessage))
        guard case .welcome(let welcome) = reply else {
            throw SkyrosError(.malformedMessage, "the daemon answered hello with a \(reply.kind) message")
        }
        sequencer = EventSequencer(clientID: clientID, welcome: welcome)
        delivered = welcome.sequence
        eventTopic = welcome.eventTopic
        storeSchemaVersion = welcome.schemaVersion
    }

    /// Whether an event message under this topic frame is in this client's schema version:
    /// the topic alone while the store has its version, the topic followed by its version
    /// while the store has a newer one.
    private func isOwnVersion(topicFrame: Data) -> Bool {
        let projected = eventsLock.withLock { UInt64(schema.version) < storeSchemaVersion }
        guard topicFrame.count > 1 else { return !projected }
        guard projected else { return false }
        var tag = WireWriter()
        tag.uvarint(UInt64(schema.version))
        return Array(topicFrame.dropFirst()) == tag.bytes
    }

    deinit {
        let (started, thread) = eventsLock.withLock { () -> (Bool, pthread_t?) in
            stopped = true
            return (eventThreadStarted, eventThread)
        }
        // The event thread holds this store only while it handles an event: when the last
        // reference goes away there, the thread stops on its own after this returns. A thread
        // that has not recorded itself yet is another one: it is waited for like any.
        let onEventThread = thread.map { pthread_equal($0, pthread_self()) != 0 } ?? false
        if started && !onEventThread {
            wakeEventThread()
            guard eventsFinished.wait(timeout: .now() + 2) == .success else { return }  // keep the pipe it may poll
        }
        if wakePipe.read >= 0 {
            close(wakePipe.read)
            close(wakePipe.write)
        }
    }

    /// Wakes the event thread from its wait.
    private func wakeEventThread() {
        guard wakePipe.write >= 0 else { return }
        var byte: UInt8 = 1
        _ = write(wakePipe.write, &byte, 1)  // a full pipe already wakes it
    }

    /// Called on a background thread with the change events of other clients, in order, a
    /// run of consecutive ones at a time (under load the daemon publishes several commits in
    /// one message: they are merged in one go). Setting it starts listening.
    public var onChange: (@Sendable ([ChangeEvent]) -> Void)? {
        get { eventsLock.withLock { _onChange } }
        set {
            let start = eventsLock.withLock { () -> Bool in
                _onChange = newValue
                defer { eventThreadStarted = true }
                return !eventThreadStarted
            }
            if start { startEventThread() }
        }
    }

    /// The event thread: it holds the store only while it handles something, so that the
    /// store goes away (and stops it) when its last user lets go of it.
    private func startEventThread() {
        let (wake, finished, silence) = (wakePipe.read, eventsFinished, silenceInterval)
        let thread = Thread { [weak self] in
            self?.eventsLock.withLock { self?.eventThread = pthread_self() }
            var lastHeard = Date()
            while true {
                // The socket is held while waiting, the store is not.
                let socket: ZMTPSocket
                do {
                    guard let store = self, !store.isStopped else { break }
                    store.subscribeToOthers()
                    socket = store.events
                }
                // Until the end of the silence interval, an event or heartbeat, or a wake-up.
                let left = Int((silence - Date().timeIntervalSince(lastHeard)) * 1000) + 1
                // Without a wake pipe (none could be made), it looks at `stopped` every 50 ms.
                let ready = socket.waitForInput(orDescriptor: wake, milliseconds: wake >= 0 ? max(1, left) : min(50, max(1, left)))
                if ready.descriptor {
                    var bytes = [UInt8](repeating: 0, count: 64)
                    while read(wake, &bytes, bytes.count) > 0 {}
                }
                guard let self, !self.isStopped else { break }
                do {
                    self.resolveInBackground()
                    guard ready.socket else {
                        if Date().timeIntervalSince(lastHeard) > silence {
                            // Silence: the daemon may be gone or events lost; ask what was missed.
                            lastHeard = Date()
                            self.perform { $0.silence() }
                        } else {
                            self.perform { _ in [] }  // actions a save's reply queued
                        }
                        continue
                    }
                    lastHeard = Date()
                    // Two frames: the topic, then the message.
                    guard let frames = socket.receive(), frames.count == 2, let frame = frames.last, self.isOwnVersion(topicFrame: frames[0]) else { continue }
                    let received: [ChangeEvent]
                    switch try WireMessage.decode([UInt8](frame)).body {
                    case .event(let event): received = [event]
                    case .changes(let events, _): received = events  // consecutive events published together
                    default: continue
                    }
                    if let changed = received.last(where: { $0.kind == .schemaChanged }) {
                        // From now on this client may be served through a projection.
                        self.eventsLock.withLock { self.storeSchemaVersion = max(self.storeSchemaVersion, changed.schemaVersion) }
                    }
                    let changeSets = received.count { $0.isChangeSet }
                    self.eventsLock.withLock { self.receivedEvents += changeSets }
                    self.perform { $0.received(received) }
                } catch {
                    continue
                }
            }
            finished.signal()
        }
        thread.name = "skyros.events"
        thread.start()
    }

    /// Subscribes the event socket to every topic but the current connection's own (whose
    /// events are this client's saves), once the topic is known or when it changed (a new
    /// connection said hello). Called on the event thread only, which owns the socket.
    private func subscribeToOthers() {
        let (wanted, current) = eventsLock.withLock { (eventTopic, unsubscribedTopic) }
        guard let wanted, wanted != current else { return }
        eventsLock.withLock { unsubscribedTopic = wanted }
        if let current {
            events.subscribe(Data([current]))  // someone else's now
            events.unsubscribe(Data([wanted]))
        } else {
            for topic in UInt8.min...UInt8.max where topic != wanted { events.subscribe(Data([topic])) }
            events.unsubscribe()  // the prefix "" of the first subscription, to everything
        }
    }

    /// Feeds the sequencer on the event thread and carries out what it decides, with the
    /// actions a request thread queued: merges (``onChange``, in order, this client's own
    /// change sets left out), catch-ups (`changes-since`, page after page), a new hello when
    /// the history expired, and ``onRestart`` when starting over. A failed catch-up is
    /// retried on the next heartbeat or gap.
    private func perform(_ input: (inout EventSequencer) -> [EventSequencer.Action]) {
        var actions = eventsLock.withLock { () -> [EventSequencer.Action] in
            isMerging = true
            defer { queuedActions = [] }
            return queuedActions + input(&sequencer)
        }
        while !actions.isEmpty {
            switch actions.removeFirst() {
            case .merge(let events):
                guard let last = events.last else { break }
                eventsLock.withLock { _onChange }?(events)
                eventsLock.withLock { delivered = max(delivered, last.sequence) }
            case .catchUp(let after):
                do {
                    guard case .changes(let events, let more) = try request(.changesSince(after, limit: 0)) else { break }
                    if let changed = events.last(where: { $0.kind == .schemaChanged }) {
                        // Missed on the event socket: from now on, the events for this version.
                        eventsLock.withLock { storeSchemaVersion = max(storeSchemaVersion, changed.schemaVersion) }
                    }
                    actions += eventsLock.withLock { sequencer.page(events, more: more) }
                } catch let error as SkyrosError where error.code == .historyExpired {
                    actions += eventsLock.withLock { sequencer.historyExpired() }
                } catch {
                    continue
                }
            case .sayHelloAgain:
                guard case .welcome(let welcome)? = try? request(.hello(helloMessage)) else { break }
                actions += welcomed(welcome, startingOver: true)
            case .startOver:
                eventsLock.withLock { _onRestart }?()
            }
        }
        eventsLock.withLock {
            isMerging = false
            delivered = sequencer.sequence
        }
    }

    /// Takes a new welcome: its event topic (the event thread subscribes without it) and what
    /// the sequencer decides (a new store epoch, or a daemon behind this client, starts over).
    private func welcomed(_ welcome: WireMessage.Welcome, startingOver: Bool) -> [EventSequencer.Action] {
        let actions = eventsLock.withLock { () -> [EventSequencer.Action] in
            eventTopic = welcome.eventTopic
            storeSchemaVersion = welcome.schemaVersion
            return sequencer.welcomed(welcome, startingOver: startingOver)
        }
        wakeEventThread()
        return actions
    }

    /// Hands actions decided off the event thread to it.
    private func queue(_ actions: [EventSequencer.Action]) {
        let wake = eventsLock.withLock { () -> Bool in
            queuedActions += actions
            if !isMerging && queuedActions.isEmpty { delivered = sequencer.sequence }
            return !queuedActions.isEmpty
        }
        if wake { wakeEventThread() }
    }

    // MARK: - Requests

    /// Sends a request and waits for its reply; error replies become ``SkyrosError``s.
    ///
    /// An attempt that gets no reply within ``retryInterval`` is abandoned and the request is
    /// sent again on a new connection; when the daemon answers that it does not know this
    /// client (it restarted), the client says hello again and resends. When ``timeout`` has
    /// passed: ``SkyrosError/Code/daemonUnavailable``.
    func request(_ body: WireMessage.Body) throws -> WireMessage.Body {
        try lock.withLock {
            var attempts = RequestAttempts(
                now: .now, timeout: .seconds(timeout), retryInterval: .seconds(retryInterval))
            requestWentOut = false
            while true {
                guard case .attempt(let wait, let newConnection, let sayHelloFirst) = attempts.next(now: .now) else {
                    if requestWentOut, case .save(_, let number, _) = body {
                        throw outcomeUnknown(number)
                    }
                    if requestWentOut, case .deleteAll(_, let number) = body {
                        throw outcomeUnknown(number)
                    }
                    if requestWentOut, case .batch(_, let number, _) = body {
                        throw outcomeUnknown(number)
                    }
                    throw SkyrosError(
                        .daemonUnavailable,
                        "the daemon of \(container.url.path) did not answer within \(timeout) seconds (is skyrosd running?)")
                }
                do {
                    if newConnection { dealer.close() }
                    if sayHelloFirst {
                        try sayHelloAgain(wait: wait.timeInterval)
                        attempts.welcomed()
                    }
                    return try exchange(body, wait: wait.timeInterval)
                } catch let error as SkyrosError where error.code == .helloRequired {
                    attempts.helloRequired()
                } catch ExchangeTimeout.timedOut {
                    attempts.timedOut()
                }
            }
        }
    }

    private enum ExchangeTimeout: Error { case timedOut }

    /// One request and its reply, on the current connection (called with `lock` held).
    private func exchange(_ body: WireMessage.Body, wait: TimeInterval) throws -> WireMessage.Body {
        let id = nextRequestID
        requestsSent[body.kind, default: 0] += 1
        nextRequestID += 1
        dealer.send([WireMessage(requestID: id, body: body).encoded()])
        requestWentOut = true
        let deadline = Date().addingTimeInterval(wait)
        while Date() < deadline {
            let remaining = max(1, Int(deadline.timeIntervalSinceNow * 1000))
            guard dealer.waitForInput(milliseconds: remaining) else { break }
            guard let frame = dealer.receive()?.last, let reply = try? WireMessage.decode([UInt8](frame)) else { continue }
            if reply.requestID == 0, case .error(let code, let message) = reply.body {
                throw SkyrosError(SkyrosError.Code(rawValue: code), message)
            }
            guard reply.requestID == id else { continue }  // a late reply to an abandoned request
            if reply.body.kind == .saved || reply.body.kind == .batchDone, droppedSaveRepliesForTesting > 0 {
                droppedSaveRepliesForTesting -= 1
                continue
            }
            if case .error(let code, let message) = reply.body {
                throw SkyrosError(SkyrosError.Code(rawValue: code), message)
            }
            if case .conflicts(let message, let conflicts) = reply.body {
                throw SkyrosError(.mergeConflict, message, conflicts: conflicts)
            }
            return reply.body
        }
        throw ExchangeTimeout.timedOut
    }

    /// Says hello to a daemon that restarted. Its sequence numbers go on where they were, so
    /// the event thread catches up with what was missed; a daemon of another store (a new
    /// epoch), or behind this client, makes ``onRestart`` refresh everything.
    private func sayHelloAgain(wait: TimeInterval) throws {
        guard case .welcome(let welcome) = try exchange(.hello(helloMessage), wait: wait) else {
            throw SkyrosError(.malformedMessage, "the daemon did not welcome this client back")
        }
        queue(welcomed(welcome, startingOver: false))
    }

    /// Called when everything this client holds may be stale: the daemon's history no longer
    /// has what the client missed, or the daemon serves another store.
    public var onRestart: (@Sendable () -> Void)? {
        get { eventsLock.withLock { _onRestart } }
        set { eventsLock.withLock { _onRestart = newValue } }
    }

    // MARK: - ObjectStore

    /// The daemon's rows matching a request (see ``ObjectStore/fetchSnapshots(_:)``).
    public func fetchSnapshots(_ request: StoreRequest) throws -> [Snapshot] {
        guard case .snapshotsReply(let rows) = try self.request(.fetch(request)) else { throw unexpected() }
        return rows
    }

    /// The identifiers of the daemon's rows matching a request.
    public func fetchIdentifiers(_ request: StoreRequest) throws -> [ObjectID] {
        guard case .identifiersReply(let ids) = try self.request(.fetchIdentifiers(request)) else { throw unexpected() }
        return ids
    }

    /// The number of the daemon's rows matching a request.
    public func count(_ request: StoreRequest) throws -> Int {
        guard case .countReply(let count) = try self.request(.count(request)) else { throw unexpected() }
        return count
    }

    /// The daemon's rows of these objects (faulting); missing ones are left out.
    public func snapshots(for ids: [ObjectID]) throws -> [Snapshot] {
        guard !ids.isEmpty else { return [] }
        guard case .snapshotsReply(let rows) = try request(.snapshots(ids)) else { throw unexpected() }
        return rows
    }

    /// Sends a change set; returns once the daemon has made it durable.
    public func save(_ changes: ChangeSet) throws {
        try saveRequest { .save(clientID: clientID, saveNumber: $0, changes: changes) }
    }

    /// Empties the group's store (every client's objects), exactly once like a save.
    public func deleteAll() throws {
        try saveRequest { .deleteAll(clientID: clientID, saveNumber: $0) }
    }

    /// Runs a batch update or delete in the daemon: one change set, exactly once like a save
    /// (resent with the same save number when its reply is lost). `naming` is the daemon's
    /// to choose: its change event names at most ``WireProtocol/maximumBatchEventObjects``
    /// objects.
    package func batch(_ operation: BatchOperation, naming: BatchNaming) throws -> BatchOutcome {
        let reply = try saveRequest { .batch(clientID: clientID, saveNumber: $0, operation: operation) }
        guard case .batchDone(let affected, let event) = reply else { throw unexpected() }
        return Self.outcome(of: event, affected: affected, schema)
    }

    /// What a batch's change event says, as the contexts take it.
    static func outcome(of event: ChangeEvent, affected: Int, _ schema: Schema) -> BatchOutcome {
        var outcome = BatchOutcome(count: affected, deleted: event.deleted)
        outcome.isListed = event.kind != .batch || !event.deleted.isEmpty || !event.updated.isEmpty
        for update in event.updated {
            let properties = schema.entity(named: update.id.entityName)?.properties ?? []
            outcome.updated[update.id] = update.values.keys.sorted().compactMap { $0 < properties.count ? properties[$0].name : nil }
            outcome.updatedValues[update.id] = StoreChange.UpdatedValues(version: update.version, values: update.values)
        }
        return outcome
    }

    /// Sends a save (or a reset, or a batch) with the next save number, and tells the
    /// sequencer its outcome: the reply's sequence is this client's own, never merged.
    ///
    /// A save whose outcome is still unknown is resolved first: the daemon applies a client's
    /// saves in order, and a newer save must not overtake one that may not have arrived.
    /// When it cannot be resolved, the new save is not sent (``SkyrosError/Code/daemonUnavailable``:
    /// not applied).
    @discardableResult
    private func saveRequest(_ body: (UInt64) -> WireMessage.Body) throws -> WireMessage.Body {
        // Told once `resolving` is released: a handler may save, or wait for a context whose
        // queue is itself waiting for `resolving` (a lock-order deadlock otherwise).
        var resolved: ResolvedSave?
        defer { if let resolved { onSaveResolved?(resolved) } }
        return try resolving.withLock { () throws -> WireMessage.Body in
            resolved = try resolveUnknownSave()
            let number = lock.withLock { () -> UInt64 in
                saveNumber += 1
                return saveNumber
            }
            do {
                return try send(save: body(number))
            } catch let error as SkyrosError where error.code == .outcomeUnknown {
                unresolvedLock.withLock { unresolvedSave = (number, body(number)) }
                wakeEventThread()  // it resends in the background
                throw error
            }
        }
    }

    /// One save request, with the sequencer told of it and of its answer (its sequence);
    /// returns the reply (`saved`, or `batchDone`).
    @discardableResult
    private func send(save body: WireMessage.Body) throws -> WireMessage.Body {
        eventsLock.withLock { sequencer.saveSent() }
        var saved: UInt64?
        defer { queue(eventsLock.withLock { sequencer.saveAnswered(sequence: saved) }) }
        let reply = try request(body)
        switch reply {
        case .saved(let sequence): saved = sequence
        case .batchDone(_, let event): saved = event.sequence
        default: throw unexpected()
        }
        return reply
    }

    /// Resends the save whose outcome is unknown, if any, until the request's timeout; on an
    /// answer, forgets it and returns what to tell ``onSaveResolved`` (which the caller does
    /// after releasing `resolving`). Called with `resolving` held.
    private func resolveUnknownSave() throws -> ResolvedSave? {
        guard let pending = unresolvedLock.withLock({ unresolvedSave }) else { return nil }
        let resolved: ResolvedSave
        do {
            let sequence: UInt64? =
                switch try send(save: pending.body) {
                case .saved(let sequence): sequence
                case .batchDone(_, let event): event.sequence
                default: nil
                }
            resolved = ResolvedSave(saveNumber: pending.number, sequence: sequence)
        } catch let error as SkyrosError where error.code == .outcomeUnknown || error.code == .daemonUnavailable {
            throw SkyrosError(
                .daemonUnavailable,
                "save \(pending.number)'s outcome is still unknown (the daemon of \(container.url.path) does not answer); nothing new was sent")
        } catch {
            // The daemon answered with a refusal: the save is not in the store.
            resolved = ResolvedSave(saveNumber: pending.number, sequence: nil, error: SkyrosError.wrap(error))
        }
        unresolvedLock.withLock { unresolvedSave = nil }
        return resolved
    }

    /// Tries, on the event thread, to resolve a save whose outcome is unknown; a saver doing
    /// it already makes this a no-op.
    private func resolveInBackground() {
        guard unresolvedLock.withLock({ unresolvedSave != nil }), resolving.try() else { return }
        let resolved = try? resolveUnknownSave()
        resolving.unlock()
        if let resolved = resolved ?? nil { onSaveResolved?(resolved) }
    }

    private func outcomeUnknown(_ number: UInt64) -> SkyrosError {
        SkyrosError(
            .outcomeUnknown,
            "save \(number) went out but the daemon of \(container.url.path) did not acknowledge it within \(timeout) seconds: it may or may not have been applied; it is resent until the daemon answers (RemoteStore.onSaveResolved)")
    }

    private func unexpected() -> SkyrosError {
        SkyrosError(.malformedMessage, "the daemon sent an unexpected reply")
    }
}
extension RemoteStore: BatchStore {}
