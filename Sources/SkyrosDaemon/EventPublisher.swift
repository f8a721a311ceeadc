import Foundation
import SkyrosWire

/// When and how the daemon publishes committed change sets, as a value: it takes commits,
/// turns and heartbeats, and returns the messages to send on the event socket. No socket,
/// no clock of its own (the caller passes the time).
///
/// The events of a commit go out at once when no request is waiting. Under load (requests
/// were already waiting when the commit was done) they may wait, for at most
/// `maximumDelay`, and the events of several commits go out in one `changes` message, each
/// client waking once for all of them. Events always go out in sequence order, and before a
/// heartbeat (whose sequence would otherwise look like a gap).
struct EventPublisher {
    /// A committed change set: its event, the bytes of its history row (the encoded `event`
    /// message), and the event topic of the connection that saved it.
    struct Committed: Equatable {
        var event: ChangeEvent
        var encoded: [UInt8]
        var topic: UInt8?
    }

    /// A message to publish: two frames, the topic and the message.
    struct Publication: Equatable {
        var topic: UInt8
        var message: [UInt8]
        var firstSequence: UInt64
        /// How many change sets it carries (0 for a heartbeat).
        var changeSets: Int
        /// Its events, as they are in `message` (a heartbeat's included): translated for the
        /// sessions of earlier schema versions without decoding `message` again.
        var events: [ChangeEvent]

        /// The body of `message`: one event, or a `changes` message of several.
        var body: WireMessage.Body { events.count == 1 ? .event(events[0]) : .changes(events, more: false) }
    }

    let maximumDelay: Duration
    /// Held events past these are published whatever the load.
    let maximumHeldEvents = 1_024
    let maximumHeldBytes = 1_048_576
    private(set) var held: [Committed] = []
    private var heldSince: ContinuousClock.Instant?
    /// When the events held are due to go out whatever the load (nil: none held).
    var heldUntil: ContinuousClock.Instant? { held.isEmpty ? nil : heldSince.map { $0 + maximumDelay } }
    private var heldBytes = 0

    init(maximumDelay: Duration) {
        self.maximumDelay = max(.zero, maximumDelay)
    }

    /// Takes the change sets of a commit; returns what to publish now: nothing when requests
    /// were waiting (`requestsWaiting`) and the held events are young and small enough.
    mutating func committed(_ committed: [Committed], requestsWaiting: Bool, now: ContinuousClock.Instant)
        -> Publication?
    {
        if !committed.isEmpty {
            if held.isEmpty { heldSince = now }
            held += committed
            heldBytes += committed.reduce(0) { $0 + $1.encoded.count }
        }
        guard let since = heldSince, !held.isEmpty else { return nil }
        if requestsWaiting, now - since < maximumDelay, held.count < maximumHeldEvents, heldBytes < maximumHeldBytes {
            return nil
        }
        return flush()
    }

    /// Publishes whatever is held (before a reset, a heartbeat, or stopping).
    mutating func flush() -> Publication? {
        guard let first = held.first else { return nil }
        defer {
            held = []
            heldBytes = 0
            heldSince = nil
        }
        return Self.publication(of: held, first: first)
    }

    /// The held events (if any), then a heartbeat at `sequence`.
    mutating func heartbeat(sequence: UInt64) -> [Publication] {
        let beat = Publication(
            topic: WireProtocol.broadcastTopic,
            message: WireMessage(requestID: 0, body: .event(.heartbeat(sequence))).encoded(), firstSequence: sequence,
            changeSets: 0, events: [.heartbeat(sequence)])
        return [flush(), beat].compactMap { $0 }
    }

    /// One event as recorded, or consecutive events in one `changes` message; under their
    /// author's topic when one connection saved them all (the author knows them from the
    /// replies and is not woken for them), to everyone otherwise.
    static func publication(of committed: [Committed], first: Committed) -> Publication {
        let sameTopic = committed.allSatisfy { $0.topic == first.topic }
        let topic = sameTopic ? first.topic ?? WireProtocol.broadcastTopic : WireProtocol.broadcastTopic
        let message =
            committed.count == 1
            ? first.encoded : WireMessage(requestID: 0, body: .changes(committed.map(\.event), more: false)).encoded()
        return Publication(
            topic: topic, message: message, firstSequence: first.event.sequence, changeSets: committed.count,
            events: committed.map(\.event))
    }
}
