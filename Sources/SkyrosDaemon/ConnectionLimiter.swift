import Foundation

/// The connections of one listening socket as a value: which descriptors it accepted,
/// which of them said hello, and which to close.
///
/// It decides and does nothing else: no socket, no thread. ``ConnectionGuard`` feeds it what
/// the daemon's sockets report (a connection accepted, a connection gone) and the welcomes of
/// the serve loop, and closes what it is told to close (`shutdown(fd, SHUT_RDWR)`: the socket
/// then drops the connection and its descriptor).
///
/// The rules:
/// - at most `maximum` connections are open; one more makes room by closing the oldest
///   connection that has not said hello yet (an idle or half-open connection), so that a flood
///   of idle connections cannot keep a member out; when every open connection said hello, the
///   new one is closed (refused);
/// - a connection that has not said hello within `helloTimeout` seconds is closed
///   (PostgreSQL's `authentication_timeout`); nil: the connections never say hello (the
///   events socket): each is taken as welcomed, and one past the limit is refused;
/// - a connection being closed still holds its descriptor until its socket reports it gone: it is
///   counted in ``descriptors`` but not in ``open``.
struct ConnectionLimiter {
    /// The most connections open at once (at least 1).
    let maximum: Int
    /// How long a connection may stay without saying hello, in seconds (nil: its connections
    /// never say hello and are never closed but to refuse one past the limit).
    let helloTimeout: TimeInterval?

    /// A connection's state.
    enum State: Equatable {
        /// Accepted at this time, no hello yet.
        case waitingForHello(since: TimeInterval)
        /// It said hello.
        case welcomed
        /// Told to close; its descriptor is held until its socket reports it gone.
        case closing
    }

    /// Why a connection is closed.
    enum Reason: Equatable {
        /// The limit was reached and every open connection said hello: the new one is refused.
        case refused
        /// The limit was reached: the oldest connection without a hello made room for a new one.
        case evicted
        /// No hello within the timeout.
        case helloTimeout
    }

    private(set) var connections: [Int32: State] = [:]
    /// Connections waiting for hello, oldest first (may hold descriptors no longer waiting:
    /// skipped when met).
    private var waiting: [(descriptor: Int32, since: TimeInterval)] = []
    private var waitingStart = 0

    init(maximum: Int, helloTimeout: TimeInterval?) {
        self.maximum = max(1, maximum)
        self.helloTimeout = helloTimeout.map { max(0, $0) }
    }

    /// Connections open and not being closed.
    var open: Int { connections.count - closing }
    /// Descriptors held: open connections and those being closed.
    var descriptors: Int { connections.count }
    private(set) var closing = 0

    /// The socket accepted a connection on `descriptor` at time `now` (seconds on any monotonic
    /// clock): the connections to close now (the new one when it is refused, or the oldest one
    /// without a hello).
    mutating func accepted(_ descriptor: Int32, at now: TimeInterval) -> [(Int32, Reason)] {
        if connections[descriptor] != nil {
            // The descriptor was reused before its end was reported: the old connection is gone.
            disconnected(descriptor)
        }
        var closed: [(Int32, Reason)] = []
        if open >= maximum {
            if let oldest = oldestWaiting() {
                close(oldest)
                closed.append((oldest, .evicted))
            } else {
                connections[descriptor] = .closing
                closing += 1
                return [(descriptor, .refused)]
            }
        }
        if helloTimeout == nil {
            connections[descriptor] = .welcomed
        } else {
            connections[descriptor] = .waitingForHello(since: now)
            waiting.append((descriptor, now))
        }
        return closed
    }

    /// The connection on `descriptor` said hello: it is no longer subject to the hello timeout
    /// nor closed to make room. A descriptor not known is ignored: the socket reports each
    /// acceptance before any message of the connection, and hands out the messages of a
    /// closed connection with no descriptor, so it can only be stale.
    mutating func welcomed(_ descriptor: Int32) {
        if case .waitingForHello? = connections[descriptor] { connections[descriptor] = .welcomed }
    }

    /// The socket reports the connection on `descriptor` gone (its descriptor is being closed).
    mutating func disconnected(_ descriptor: Int32) {
        guard let state = connections.removeValue(forKey: descriptor) else { return }
        if state == .closing { closing -= 1 }
    }

    /// The connections whose hello timeout has passed at `now`, marked as closing.
    mutating func expired(at now: TimeInterval) -> [Int32] {
        guard let helloTimeout else { return [] }
        var expired: [Int32] = []
        while waitingStart < waiting.count {
            let (descriptor, since) = waiting[waitingStart]
            if case .waitingForHello(since)? = connections[descriptor] {
                guard now - since >= helloTimeout else { break }
                close(descriptor)
                expired.append(descriptor)
            }
            waitingStart += 1
        }
        compact()
        return expired
    }

    /// When the next hello timeout is due (nil: none is).
    var nextDeadline: TimeInterval? {
        guard let helloTimeout else { return nil }
        for (descriptor, since) in waiting[waitingStart...] {
            if case .waitingForHello(since)? = connections[descriptor] { return since + helloTimeout }
        }
        return nil
    }

    /// The oldest connection still waiting for its hello, dropping stale entries on the way.
    private mutating func oldestWaiting() -> Int32? {
        defer { compact() }
        while waitingStart < waiting.count {
            let (descriptor, since) = waiting[waitingStart]
            waitingStart += 1
            if case .waitingForHello(since)? = connections[descriptor] { return descriptor }
        }
        return nil
    }

    private mutating func close(_ descriptor: Int32) {
        connections[descriptor] = .closing
        closing += 1
    }

    /// Drops the consumed front of the queue once it is most of it (amortised O(1)), and the
    /// entries of connections that are no longer waiting once they are most of the rest.
    private mutating func compact() {
        if waitingStart > 64 && waitingStart * 2 > waiting.count {
            waiting.removeFirst(waitingStart)
            waitingStart = 0
        }
        if waiting.count > 64 && waiting.count > 4 * max(1, connections.count) {
            waiting = waiting[waitingStart...].filter { entry in
                if case .waitingForHello(entry.since)? = connections[entry.descriptor] { return true }
                return false
            }
            waitingStart = 0
        }
    }
}
