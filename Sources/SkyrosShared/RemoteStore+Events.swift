import Foundation
import Skyros
import SkyrosWire
import SkyrosZeroMQ

/// The event thread: change events received, fed to the ``EventSequencer``, and what it
/// decides carried out (merges, catch-ups, hellos, restarts).
extension RemoteStore {
    /// Wakes the event thread from its wait.
    func wakeEventThread() {
        guard wakePipe.write >= 0 else { return }
        var byte: UInt8 = 1
        _ = write(wakePipe.write, &byte, 1)  // a full pipe already wakes it
    }

    /// Whether an event message under this topic frame is in this client's schema version:
    /// the topic alone while the store has its version, the topic followed by its version
    /// while the store has a newer one.
    private func isOwnVersion(topicFrame: Data) -> Bool {
        let projected = state.withLock { UInt64(schema.version) < $0.storeSchemaVersion }
        guard topicFrame.count > 1 else { return !projected }
        guard projected else { return false }
        var tag = WireWriter()
        tag.uvarint(UInt64(schema.version))
        return Array(topicFrame.dropFirst()) == tag.bytes
    }

    /// Takes the store's schema version a `schemaChanged` event among `events` announces:
    /// from then on this client may be served through a projection.
    private func noteSchemaChange(in events: [ChangeEvent]) {
        // By index: an event is not copied to be looked at (the event thread's hot path).
        guard let index = events.indices.last(where: { events[$0].kind == .schemaChanged }) else { return }
        let version = events[index].schemaVersion
        state.withLock { $0.storeSchemaVersion = max($0.storeSchemaVersion, version) }
    }

    /// The event thread: it holds the store only while it handles something, so that the
    /// store goes away (and stops it) when its last user lets go of it.
    func startEventThread() {
        let (wake, finished, silence) = (wakePipe.read, eventsFinished, silenceInterval)
        let thread = Thread { [weak self] in
            self?.state.withLock { $0.eventThread = pthread_self() }
            var lastHeard = Date()
            while true {
                // The socket is held while waiting, the store is not.
                let socket: ZMTPSocket
                do {
                    guard let store = self, !store.state.withLock({ $0.isStopped }) else { break }
                    store.subscribeToOthers()
                    socket = store.events
                }
                // Until the end of the silence interval, an event or heartbeat, or a wake-up.
                let left = Int((silence - Date().timeIntervalSince(lastHeard)) * 1000) + 1
                // Without a wake pipe (none could be made), it looks at `isStopped` every 50 ms.
                let ready = socket.waitForInput(
                    orDescriptor: wake, milliseconds: wake >= 0 ? max(1, left) : min(50, max(1, left)))
                if ready.descriptor {
                    var bytes = [UInt8](repeating: 0, count: 64)
                    while read(wake, &bytes, bytes.count) > 0 {}
                }
                guard let self, !self.state.withLock({ $0.isStopped }) else { break }
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
                    guard let frames = socket.receive(), frames.count == 2, let frame = frames.last,
                        self.isOwnVersion(topicFrame: frames[0])
                    else { continue }
                    let received: [ChangeEvent]
                    // Inserted objects' values stay encoded until the main context reads one
                    // (a kept row keeps its message: large messages are decoded whole).
                    let lazily = frame.count <= EncodedRows.maximumMessageBytes
                    switch try WireMessage.decodeReply([UInt8](frame), keepingInsertedValuesEncoded: lazily).body {
                    case .event(let event): received = [event]
                    case .changes(let events, _): received = events  // consecutive events published together
                    default: continue
                    }
                    self.noteSchemaChange(in: received)
                    let changeSets = received.indices.count { received.isChangeSet(at: $0) }
                    self.state.withLock { $0.receivedEvents += changeSets }
                    self.ownChangeSetsNumbered(in: received)
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
        let change = state.withLock { state -> (wanted: UInt8, current: UInt8?)? in
            guard let wanted = state.eventTopic, wanted != state.unsubscribedTopic else { return nil }
            defer { state.unsubscribedTopic = wanted }
            return (wanted, state.unsubscribedTopic)
        }
        guard let change else { return }
        if let current = change.current {
            events.subscribe(Data([current]))  // someone else's now
            events.unsubscribe(Data([change.wanted]))
        } else {
            for topic in UInt8.min...UInt8.max where topic != change.wanted { events.subscribe(Data([topic])) }
            events.unsubscribe()  // the prefix "" of the first subscription, to everything
        }
    }

    /// Feeds the sequencer on the event thread and carries out what it decides, with the
    /// actions a request thread queued: merges (``onChange``, in order, this client's own
    /// change sets left out), catch-ups (`changes-since`, page after page), a new hello when
    /// the history expired, and ``onRestart`` when starting over. A failed catch-up is
    /// retried on the next heartbeat or gap.
    private func perform(_ input: (inout EventSequencer) -> [EventSequencer.Action]) {
        var actions = state.withLock { state -> [EventSequencer.Action] in
            state.isMerging = true
            defer { state.queuedActions = [] }
            return state.queuedActions + input(&state.sequencer)
        }
        while !actions.isEmpty {
            switch actions.removeFirst() {
            case .merge(let events):
                guard !events.isEmpty else { break }
                let last = events[events.count - 1].sequence  // read in place, the event not copied
                let (onChange, takesEncoded) = state.withLock { ($0.onChange, $0.onChangeTakesEncodedInserts) }
                onChange?(
                    events.indices.map { index in
                        let change = StoreChange(events, at: index, schema: schema)
                        return takesEncoded ? change : change.decoded
                    })
                state.withLock { $0.delivered = max($0.delivered, last) }
                let rejecting = events.indices.filter { events[$0].unknownKind == ChangeEvent.syncRejectedKind }
                let rejected = rejecting.flatMap { index in
                    (events[index].syncRejections ?? []).map { rejection in
                        var error = SyncRejection(
                            number: rejection.number ?? 0, date: Date(),
                            reason: rejection.reason, objectIDs: rejection.objects
                        ).error
                        error.rejectionNumber = rejection.number
                        return error
                    }
                }
                if !rejected.isEmpty { state.withLock { $0.onSyncRejected }?(rejected) }
            case .catchUp(let after):
                do {
                    guard case .changes(let events, let more) = try request(.changesSince(after, limit: 0)) else {
                        break
                    }
                    noteSchemaChange(in: events)  // missed on the event socket
                    ownChangeSetsNumbered(in: events)
                    actions += state.withLock { $0.sequencer.page(events, more: more) }
                } catch let error as SkyrosError where error.code == .historyExpired {
                    actions += state.withLock { $0.sequencer.historyExpired() }
                } catch {
                    continue
                }
            case .sayHelloAgain:
                guard case .welcome(let welcome)? = try? request(.hello(helloMessage)) else { break }
                actions += welcomed(welcome, startingOver: true)
            case .startOver:
                state.withLock { $0.onRestart }?()
            }
        }
        state.withLock { state in
            state.isMerging = false
            state.delivered = state.sequencer.sequence
        }
    }

    /// Takes a new welcome: its event topic (the event thread subscribes without it) and what
    /// the sequencer decides (a new store epoch, or a daemon behind this client, starts over).
    func welcomed(_ welcome: WireMessage.Welcome, startingOver: Bool) -> [EventSequencer.Action] {
        let actions = state.withLock { state -> [EventSequencer.Action] in
            state.eventTopic = welcome.eventTopic
            state.storeSchemaVersion = welcome.schemaVersion
            return state.sequencer.welcomed(welcome, startingOver: startingOver)
        }
        wakeEventThread()
        return actions
    }

    /// This client's own change sets among `events`, told to the main context's ledger before
    /// the sequencer merges what follows them (their reply may come later than their event).
    /// The change set of a save whose outcome was unknown is not told: the main context's save
    /// in flight, if any, is a later one.
    func ownChangeSetsNumbered(in events: [ChangeEvent]) {
        guard let ownWrites = state.withLock({ $0.ownWrites }) else { return }
        let own = events.indices.compactMap { index in
            events.isChangeSet(at: index) && events[index].authorID == clientID ? events[index].sequence : nil
        }
        guard !own.isEmpty else { return }
        for sequence in state.withLock({ state in own.filter { !state.sequencer.mergesOwn($0) } }) {
            ownWrites.numbered(sequence)
        }
    }

    /// Hands actions decided off the event thread to it.
    func queue(_ actions: [EventSequencer.Action]) {
        let wake = state.withLock { state -> Bool in
            state.queuedActions += actions
            if !state.isMerging && state.queuedActions.isEmpty { state.delivered = state.sequencer.sequence }
            return !state.queuedActions.isEmpty
        }
        if wake { wakeEventThread() }
    }
}
