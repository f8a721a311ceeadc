import Foundation
import Skyros
import SkyrosWire
import SkyrosZeroMQ
import Synchronization

/// The store of a shared stack: the group's daemon, reached over ZeroMQ (docs/PROTOCOL.md).
///
/// The client's two sockets (`DEALER` for requests, `SUB` for events) speak ZMTP 3.0 on the
/// socket files themselves, on the threads that use them: a save is one `send` and its reply
/// wakes the saver directly, with no I/O thread between them.
///
/// Requests are answered from the daemon's committed state. Change events of other clients
/// are received on a background thread and handed to ``onChange``, in sequence order, with
/// no gap and no duplicate: a gap, a reconnection or a silent event socket makes the client
/// catch up with the daemon's history.
///
/// A request that gets no answer within ``retryInterval`` is sent again on a new
/// connection (saying hello again when the daemon restarted), until ``timeout`` has passed;
/// while the daemon holds the connection and is only slow, each attempt waits twice as long
/// as the one before (at most 8 × ``retryInterval``);
/// then it fails with ``SkyrosError/Code/daemonUnavailable``: no call ever waits forever.
/// A save sent again carries the same client id and save number, so the daemon applies it
/// once and acknowledges it again (exactly-once saves). When a save fails with
/// `daemonUnavailable`, whether the daemon applied it is unknown until the next fetch.
///
/// Two locks, taken in this order: `connection`, a request's turn on the request socket
/// (held while it waits for its reply), and `state`, everything else, never held while
/// waiting for the daemon or calling out. The event socket is the event thread's alone
/// (hence `@unchecked`: sockets are not `Sendable`).
public final class RemoteStore: PersistentStore, @unchecked Sendable {
    /// The client's schema (the group's store has the same fingerprint).
    public let schema: Schema
    /// The group container whose daemon this store talks to.
    package let container: GroupContainer
    /// This client's identity in the group: 128 bits, random, made for each connection
    /// object; saves carry it (with their save number) and its change events name it.
    public let clientID: UUID
    /// The process name the hello gives the daemon.
    public let clientName: String
    /// How long a request waits for the daemon, in all.
    public let timeout: TimeInterval
    /// How long one attempt of a request waits for its reply before it is sent again.
    public let retryInterval: TimeInterval
    /// ``timeout`` and ``retryInterval`` as durations, made once (a request needs them both,
    /// and making a `Duration` of a `Double` is not cheap).
    let timeoutDuration: Duration
    let retryDuration: Duration
    /// How long the event socket may stay silent (the daemon sends a heartbeat every
    /// 100 ms) before the client catches up with the history anyway.
    public let silenceInterval: TimeInterval = WireProtocol.silenceInterval.timeInterval

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

    /// The request socket and what goes with it, held for the whole of a request: requests
    /// take turns on the socket (a save, for itself and for resolving an unknown one first).
    struct Connection {
        let dealer: ZMTPSocket
        var nextRequestID: UInt64 = 1
        /// Whether the current request's message went out at least once.
        var requestWentOut = false
        /// Requests sent to the daemon (each attempt counts), by kind's tag: a counter per
        /// tag rather than a dictionary to update on each request.
        var requestsSent = [Int](repeating: 0, count: 256)
        /// For tests: how many save acknowledgements to drop, as if lost on the way.
        var droppedSaveReplies = 0
    }

    /// What the event thread and the callers share.
    struct State {
        var onChange: (@Sendable ([StoreChange]) -> Void)?
        /// Whether ``onChange`` takes changes whose inserted objects' values are still encoded
        /// (``StoreChange/encodedInserted``): a stack's merge does; a handler set through the
        /// public property gets them decoded.
        var onChangeTakesEncodedInserts = false
        var onRestart: (@Sendable () -> Void)?
        /// The shared stack's ledger of its main context's saves.
        var ownWrites: OwnWrites?
        var onSaveResolved: (@Sendable (ResolvedSave) -> Void)?
        var onSyncRejected: (@Sendable ([SkyrosError]) -> Void)?
        /// The store is going away: the event thread stops.
        var isStopped = false
        var eventThreadStarted = false
        /// The event thread, while it runs (to know when `deinit` runs on it).
        var eventThread: pthread_t?
        /// ``RemoteStore/sequence``: follows the sequencer once the event thread has carried
        /// out its actions.
        var delivered: UInt64 = 0
        /// What to merge, when to catch up or start over, which save numbers to use and which
        /// save's outcome is unknown (see ``EventSequencer``).
        var sequencer: EventSequencer
        /// Actions decided on a request thread (a save's reply closed a gap), for the event thread.
        var queuedActions: [EventSequencer.Action] = []
        /// Whether the event thread is carrying out actions (``delivered`` follows it then).
        var isMerging = false
        /// The event topic of the current connection (from its welcome), and the one the event
        /// socket is subscribed without (nil: subscribed to everything); the event thread
        /// changes its subscriptions when they differ.
        var eventTopic: UInt8?
        var unsubscribedTopic: UInt8?
        /// The store's schema version, from the welcome and `schemaChanged` events: while it is
        /// newer than this client's, the daemon serves it through a projection and the events
        /// for it come under its topic followed by its version (docs/PROTOCOL.md, "Mixed schema
        /// versions"); the others are dropped.
        var storeSchemaVersion: UInt64 = 0
        /// Change events (not heartbeats) received on the event socket.
        var receivedEvents = 0
    }

    let connection: Mutex<Connection>
    let state: Mutex<State>
    let events: ZMTPSocket
    let helloMessage: WireMessage.Hello
    let eventsFinished = DispatchSemaphore(value: 0)
    /// A pipe that wakes the event thread from its wait (its read end, then its write end):
    /// to stop, or to change its subscriptions. The thread otherwise sleeps until an event, a
    /// heartbeat, or the end of the silence interval.
    let wakePipe: (read: Int32, write: Int32) = {
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
    public var sequence: UInt64 { state.withLock { $0.delivered } }
    /// For tests: how many save acknowledgements to drop, as if they were lost on the way.
    var droppedSaveRepliesForTesting: Int {
        get { connection.withLock { $0.droppedSaveReplies } }
        set { connection.withLock { $0.droppedSaveReplies = newValue } }
    }
    /// For tests: the event topic of the current connection.
    var eventTopicForTesting: UInt8? { state.withLock { $0.eventTopic } }
    /// For tests: change events (not heartbeats) received on the event socket.
    var receivedEventsForTesting: Int { state.withLock { $0.receivedEvents } }
    /// For tests: requests sent to the daemon (each attempt counts), by kind.
    var requestsSentForTesting: [WireProtocol.Kind: Int] {
        let counts = connection.withLock { $0.requestsSent }
        var sent: [WireProtocol.Kind: Int] = [:]
        for (tag, count) in counts.enumerated() where count > 0 {
            if let kind = WireProtocol.Kind(rawValue: UInt8(tag)) { sent[kind] = count }
        }
        return sent
    }

    /// Connects to the daemon of the group container at `container` and says hello.
    ///
    /// - Throws: ``SkyrosError/Code/schemaMismatch`` when the group's store has another
    ///   schema, ``SkyrosError/Code/permissionDenied`` when this user may not use the group,
    ///   ``SkyrosError/Code/daemonUnavailable`` when no daemon answers in `timeout`.
    ///
    /// - Parameters:
    ///   - container: the group's container directory
    ///     (``Skyros/containerURL(forApplicationGroup:)``).
    ///   - clientName: the name the daemon shows for this client (default: the process name).
    ///   - timeout: how long a request waits for the daemon, in all.
    ///   - retryInterval: how long an attempt waits for its reply before the request is sent
    ///     again on a new connection (twice as long as the last, at most 8 times this, while the
    ///     daemon holds the connection and is only slow).
    ///   - eventQueueLimit: how many received change-event messages the event thread reads
    ///     ahead of merging them; past it, events wait in the kernel's socket buffer, then in
    ///     the daemon's queue for this client, which drops what does not fit: those are
    ///     fetched from the history instead.
    ///   - eventSocketBufferBytes: the kernel receive buffer of the event socket
    ///     (`SO_RCVBUF`), when not the system's default.
    public convenience init(
        schema: Schema, container: URL, clientName: String? = nil, timeout: TimeInterval = 5,
        retryInterval: TimeInterval = 1, eventQueueLimit: Int32 = 1_000, eventSocketBufferBytes: Int32? = nil
    ) throws {
        try self.init(
            schema: schema, container: GroupContainer(url: container), clientName: clientName, timeout: timeout,
            retryInterval: retryInterval, eventQueueLimit: eventQueueLimit,
            eventSocketBufferBytes: eventSocketBufferBytes)
    }

    /// Connects to the daemon of `container` and says hello (see
    /// ``init(schema:container:clientName:timeout:retryInterval:eventQueueLimit:eventSocketBufferBytes:)``).
    package init(
        schema: Schema, container: GroupContainer, clientName: String? = nil, timeout: TimeInterval = 5,
        retryInterval: TimeInterval = 1, eventQueueLimit: Int32 = 1_000, eventSocketBufferBytes: Int32? = nil
    ) throws {
        try schema.validate()
        self.schema = schema
        self.container = container
        self.timeout = timeout
        self.retryInterval = min(retryInterval, timeout)
        self.timeoutDuration = .seconds(timeout)
        self.retryDuration = .seconds(self.retryInterval)
        let name = String(
            decoding: Array(
                (clientName ?? ProcessInfo.processInfo.processName).utf8.prefix(WireProtocol.maximumClientNameBytes)),
            as: UTF8.self)
        let clientID = UUID()
        self.clientID = clientID
        self.clientName = name
        helloMessage = try WireMessage.Hello(schema: schema, clientName: name)
        state = Mutex(
            State(
                sequencer: EventSequencer(
                    clientID: clientID,
                    welcome: WireMessage.Welcome(
                        sequence: 0, eventTopic: 0, storeEpoch: ChangeEvent.noAuthor, schemaVersion: 0))))
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
        connection = Mutex(
            Connection(
                dealer: try ZMTPSocket(
                    kind: .dealer, endpoint: container.requestsEndpoint,
                    maximumMessageSize: WireProtocol.maximumMessageSize)))
        let reply = try request(.hello(helloMessage))
        guard case .welcome(let welcome) = reply else {
            throw SkyrosError(.malformedMessage, "the daemon answered hello with a \(reply.kind) message")
        }
        state.withLock { state in
            state.sequencer = EventSequencer(clientID: clientID, welcome: welcome)
            state.delivered = welcome.sequence
            state.eventTopic = welcome.eventTopic
            state.storeSchemaVersion = welcome.schemaVersion
        }
    }

    deinit {
        let (started, thread) = state.withLock { state -> (Bool, pthread_t?) in
            state.isStopped = true
            return (state.eventThreadStarted, state.eventThread)
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

    /// Called on a background thread with the changes of other clients, in order, a run of
    /// consecutive ones at a time (under load the daemon publishes several commits in one
    /// message: they are merged in one go). Setting it starts listening.
    public var onChange: (@Sendable ([StoreChange]) -> Void)? {
        get { state.withLock { $0.onChange } }
        set { setOnChange(newValue, takingEncodedInserts: false) }
    }

    /// Sets ``onChange``; with `takingEncodedInserts`, the handler is handed the inserted
    /// objects of other processes with their values still encoded
    /// (``StoreChange/encodedInserted``, decoded if read): a stack's main context, which
    /// keeps most of them unread.
    package func setOnChange(_ handler: (@Sendable ([StoreChange]) -> Void)?, takingEncodedInserts: Bool) {
        let start = state.withLock { state -> Bool in
            state.onChange = handler
            state.onChangeTakesEncodedInserts = takingEncodedInserts
            defer { state.eventThreadStarted = true }
            return !state.eventThreadStarted
        }
        if start { startEventThread() }
    }

    /// Called when everything this client holds may be stale: the daemon's history no longer
    /// has what the client missed, or the daemon serves another store.
    public var onRestart: (@Sendable () -> Void)? {
        get { state.withLock { $0.onRestart } }
        set { state.withLock { $0.onRestart = newValue } }
    }

    /// Called (on a background thread) when a save reported as
    /// ``SkyrosError/Code/outcomeUnknown`` is resolved: the client resends it in the background
    /// until the daemon answers, and before any new save (which waits for the answer: saves
    /// are applied in order). It is called with none of the store's locks held: it may save
    /// through the same stack, or wait for one of its contexts.
    public var onSaveResolved: (@Sendable (ResolvedSave) -> Void)? {
        get { state.withLock { $0.onSaveResolved } }
        set { state.withLock { $0.onSaveResolved = newValue } }
    }

    /// Called (on the event thread, after the change set is merged) when the group's daemon
    /// syncs with PostgreSQL and the server refused change sets this machine uploaded (a
    /// unique value another machine took, a `.deny` rule, an object deleted on the server):
    /// one ``SkyrosError/Code/syncRejected`` error per refused change set, naming its objects
    /// (``SkyrosError/objectIDs``) and the reason. The merged change set has already brought
    /// those objects back to the server's values. A shared `Skyros` stack sends them to
    /// ``Skyros/handleError(_:)``.
    public var onSyncRejected: (@Sendable ([SkyrosError]) -> Void)? {
        get { state.withLock { $0.onSyncRejected } }
        set { state.withLock { $0.onSyncRejected = newValue } }
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
        _ = try saveReturningSequence(changes)
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
        return BatchOutcome(event, affected: affected, schema: schema)
    }

    func unexpected() -> SkyrosError {
        SkyrosError(.malformedMessage, "the daemon sent an unexpected reply")
    }
}
extension RemoteStore: BatchStore {}

extension RemoteStore: SequencedObjectStore {
    /// The main context's ledger of its saves (see ``OwnWrites``), told each of this client's
    /// change sets as soon as the daemon numbers it.
    package var ownWrites: OwnWrites? {
        get { state.withLock { $0.ownWrites } }
        set { state.withLock { $0.ownWrites = newValue } }
    }

    /// Sends a change set like ``save(_:)`` and returns the sequence the daemon gave it.
    package func saveReturningSequence(_ changes: ChangeSet) throws -> UInt64? {
        guard
            case .saved(let sequence) = try saveRequest({ .save(clientID: clientID, saveNumber: $0, changes: changes) })
        else {
            return nil
        }
        return sequence
    }
}
