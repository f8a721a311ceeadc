import Foundation
import Synchronization

/// The process's file-descriptor limit, and the connection limit sized to it.
///
/// The daemon keeps the connections of each socket under ``maximumClients(forLimit:)``, so
/// that its store, journal and backups always have descriptors left (a listener that does run
/// out stops accepting for a moment; libzmq 4.3, which the daemon used before, aborted).
package enum DescriptorLimit {
    /// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit after it.
    @discardableResult
    package static func raiseToHardLimit() -> Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1_024 }
        if limit.rlim_cur < limit.rlim_max {
            var raised = limit
            raised.rlim_cur = limit.rlim_max
            if setrlimit(Int32(RLIMIT_NOFILE.rawValue), &raised) == 0 { limit = raised }
        }
        return limit.rlim_cur >= rlim_t(Int32.max) ? Int(Int32.max) : Int(limit.rlim_cur)
    }

    /// The current soft limit on file descriptors.
    package static var current: Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1_024 }
        return limit.rlim_cur >= rlim_t(Int32.max) ? Int(Int32.max) : Int(limit.rlim_cur)
    }

    /// Descriptors kept for the daemon itself (store, journal, lock, backups: about 30) and for
    /// connections accepted while older ones are being closed (a connection the guard refuses
    /// holds its descriptor until the server reads its end): a quarter of the limit, and at
    /// least 384 or half the limit, whichever is less.
    package static func reserve(forLimit limit: Int) -> Int { max(limit / 4, min(384, limit / 2)) }

    /// The most connections on each of the two sockets for a descriptor limit: every client
    /// holds two (requests and events), so half of what the reserve leaves, at most 10,000
    /// and at least 1.
    package static func maximumClients(forLimit limit: Int) -> Int {
        min(10_000, max(1, (limit - reserve(forLimit: limit)) / 2))
    }
}

/// Keeps the connections of the daemon's two sockets within the limit, and closes request
/// connections that say no hello in time.
///
/// A ``ConnectionLimiter`` per socket decides; the guard closes what it decides with
/// `shutdown(fd, SHUT_RDWR)`, after which the daemon's ``ZMTPServer`` reads end of file, drops
/// the connection and closes its descriptor. The server tells it of each connection accepted
/// and closed (``accepted(_:onRequests:)``, ``closing(_:onRequests:)``) and the serve loop of
/// each request connection that said hello (``welcomed(descriptor:)``); a thread of the
/// guard's own closes the connections whose hello timeout passed, whatever the serve loop is
/// doing. A descriptor is shut down only under the guard's lock and while its limiter holds
/// it, and the server reports a connection closing (under that lock) before it closes the
/// descriptor: a descriptor number reused by a new connection is never shut down in place of
/// the old one.
final class ConnectionGuard: Sendable {
    /// What the guard's lock holds.
    private struct State {
        var requests: ConnectionLimiter
        var events: ConnectionLimiter
        var stopped = false
        /// Closings not yet logged, and when the last line about them was written.
        var unlogged: [ConnectionLimiter.Reason: Int] = [:]
        var lastLog = -Double.infinity
        /// The most descriptors held by connections at once since the last line (open ones and
        /// those being closed, both sockets).
        var peakDescriptors = 0

        /// Makes the socket drop these connections: reading end of file, it closes them and
        /// their descriptors, and reports them gone. Under the lock, so that a descriptor is
        /// never shut down after its connection reported closing.
        mutating func close(_ connections: [(Int32, ConnectionLimiter.Reason)]) {
            for (descriptor, reason) in connections {
                _ = shutdown(descriptor, Int32(SHUT_RDWR))
                unlogged[reason, default: 0] += 1
            }
        }
    }

    private let state: Mutex<State>
    private let wake = DispatchSemaphore(value: 0)
    private let finished = DispatchSemaphore(value: 0)
    private let log: @Sendable (String) -> Void
    private let helloTimeout: TimeInterval
    private let maximumClients: Int

    /// How often at most the guard writes a line about the connections it closed: a flood
    /// of connections must not flood the log.
    static let logInterval: TimeInterval = 10

    /// Starts the guard's thread.
    init(maximumClients: Int, helloTimeout: TimeInterval, log: @escaping @Sendable (String) -> Void) {
        state = Mutex(
            State(
                requests: ConnectionLimiter(maximum: maximumClients, helloTimeout: helloTimeout),
                events: ConnectionLimiter(maximum: maximumClients, helloTimeout: nil)))
        self.helloTimeout = helloTimeout
        self.maximumClients = maximumClients
        self.log = log
        Thread.detachNewThread { [self] in
            run()
            finished.signal()
        }
    }

    /// A socket accepted a connection on `descriptor`: the limiter may close it (refused) or
    /// an older one without a hello (evicted) at once.
    func accepted(_ descriptor: Int32, onRequests: Bool) {
        let now = ProcessInfo.processInfo.systemUptime
        state.withLock { state in
            state.close(
                onRequests ? state.requests.accepted(descriptor, at: now) : state.events.accepted(descriptor, at: now))
            state.peakDescriptors = max(state.peakDescriptors, state.requests.descriptors + state.events.descriptors)
        }
    }

    /// A socket is about to close the connection on `descriptor`.
    func closing(_ descriptor: Int32, onRequests: Bool) {
        state.withLock { state in
            if onRequests { state.requests.disconnected(descriptor) } else { state.events.disconnected(descriptor) }
        }
    }

    /// The request connection on `descriptor` said hello: it is kept past the hello timeout.
    func welcomed(descriptor: Int32) {
        guard descriptor >= 0 else { return }
        state.withLock { $0.requests.welcomed(descriptor) }
    }

    /// Stops the guard's thread and waits for it.
    func stop() {
        let wasStopped = state.withLock { state in
            defer { state.stopped = true }
            return state.stopped
        }
        if !wasStopped {
            wake.signal()
            finished.wait()
        }
    }

    private func run() {
        while !state.withLock({ $0.stopped }) {
            let now = ProcessInfo.processInfo.systemUptime
            let deadline = state.withLock { $0.requests.nextDeadline }
            let wait = deadline.map { max(0, min(0.25, $0 - now)) } ?? 0.25
            _ = wake.wait(timeout: .now() + wait)
            state.withLock { state in
                state.close(
                    state.requests.expired(at: ProcessInfo.processInfo.systemUptime).map { ($0, .helloTimeout) })
            }
            logIfDue(force: false)
        }
        logIfDue(force: true)
    }

    /// One line about the connections closed since the last one, at most every
    /// ``logInterval`` seconds.
    private func logIfDue(force: Bool) {
        let now = ProcessInfo.processInfo.systemUptime
        let due: (closed: [ConnectionLimiter.Reason: Int], peak: Int, requests: Int, events: Int)? = state.withLock {
            state in
            guard !state.unlogged.isEmpty, force || now - state.lastLog >= Self.logInterval else { return nil }
            defer {
                state.unlogged = [:]
                state.peakDescriptors = 0
                state.lastLog = now
            }
            return (state.unlogged, state.peakDescriptors, state.requests.open, state.events.open)
        }
        guard let due else { return }
        var parts: [String] = []
        if let count = due.closed[.refused] {
            parts.append("refused \(count) connection\(count == 1 ? "" : "s") past the limit of \(maximumClients)")
        }
        if let count = due.closed[.evicted] {
            parts.append("closed \(count) connection\(count == 1 ? "" : "s") without a hello to make room for new ones")
        }
        if let count = due.closed[.helloTimeout] {
            parts.append(
                "closed \(count) connection\(count == 1 ? "" : "s") that said no hello within \(helloTimeout) s")
        }
        log(
            parts.joined(separator: "; ") + """
                 (open: \(due.requests) request, \(due.events) event connections; at most \(due.peak) \
                descriptors held by connections)
                """)
    }
}
