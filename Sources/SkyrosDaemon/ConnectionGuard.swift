import Foundation
import SkyrosZeroMQ

/// The process's file-descriptor limit, and the connection limit sized to it.
///
/// libzmq 4.3 aborts the process when its `ipc://` listener's `accept` fails with `EMFILE`
/// (its `ipc_listener_t::accept` asserts), so the daemon must never let its descriptors reach
/// the limit: it keeps the connections of each socket under ``maximumClients(forLimit:)``.
public enum DescriptorLimit {
    /// Raises the soft `RLIMIT_NOFILE` to the hard limit; returns the soft limit after it.
    @discardableResult
    public static func raiseToHardLimit() -> Int {
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
    public static var current: Int {
        var limit = rlimit()
        guard getrlimit(Int32(RLIMIT_NOFILE.rawValue), &limit) == 0 else { return 1_024 }
        return limit.rlim_cur >= rlim_t(Int32.max) ? Int(Int32.max) : Int(limit.rlim_cur)
    }

    /// Descriptors kept for the daemon itself (store, journal, lock, ZeroMQ's own: about 30)
    /// and for connections libzmq accepts while older ones are being closed (under a flood of
    /// connections, libzmq accepts while the guard's thread catches up: 1,100 connections
    /// opened at once to each socket had libzmq hold about 170 more than the limit for a
    /// moment): a quarter of the limit, and at least 384 or half the limit, whichever is less.
    public static func reserve(forLimit limit: Int) -> Int { max(limit / 4, min(384, limit / 2)) }

    /// The most connections on each of the two sockets for a descriptor limit: every client
    /// holds two (requests and events), so half of what the reserve leaves, at most 10,000
    /// and at least 1.
    public static func maximumClients(forLimit limit: Int) -> Int {
        min(10_000, max(1, (limit - reserve(forLimit: limit)) / 2))
    }
}

/// Keeps the connections of the daemon's two sockets within the limit, and closes request
/// connections that say no hello in time, on a thread of its own so that it keeps up with
/// libzmq's accepts whatever the serve loop is doing.
///
/// A ``ConnectionLimiter`` per socket decides; the guard closes what it decides with
/// `shutdown(fd, SHUT_RDWR)`, after which the socket drops the connection and closes its
/// descriptor. The request socket (the daemon's own ``ZMTPRouter``) tells it of each connection
/// accepted and closed (``requestAccepted(_:)``, ``requestClosing(_:)``), on the serve loop;
/// libzmq's socket monitor tells it of the event socket's. The serve loop tells it which request
/// connections said hello (``welcomed(descriptor:)``). A descriptor is shut down only under the
/// guard's lock and while its limiter holds it, and the router reports a connection closing
/// (under that lock) before it closes the descriptor: a descriptor number reused by a new
/// connection is never shut down in place of the old one.
final class ConnectionGuard: @unchecked Sendable {
    private let lock = NSLock()
    private var requests: ConnectionLimiter
    private var events: ConnectionLimiter
    private var stopped = false
    private let finished = DispatchSemaphore(value: 0)
    private let log: @Sendable (String) -> Void
    /// Closings not yet logged, and when the last line about them was written.
    private var unlogged: [ConnectionLimiter.Reason: Int] = [:]
    private var lastLog = -Double.infinity
    /// The most descriptors held by connections at once since the last line (open ones and
    /// those being closed, both sockets).
    private var peakDescriptors = 0
    private let helloTimeout: TimeInterval
    private let maximumClients: Int

    /// How often at most the guard writes a line about the connections it closed: a flood
    /// of connections must not flood the log.
    static let logInterval: TimeInterval = 10

    /// Starts monitoring `eventSocket` (from the thread that owns it, before the serve loop
    /// runs) and the guard's thread.
    init(
        context: ZeroMQContext, eventSocket: ZeroMQSocket, maximumClients: Int,
        helloTimeout: TimeInterval, log: @escaping @Sendable (String) -> Void
    ) throws {
        requests = ConnectionLimiter(maximum: maximumClients, helloTimeout: helloTimeout)
        events = ConnectionLimiter(maximum: maximumClients, helloTimeout: nil)
        self.helloTimeout = helloTimeout
        self.maximumClients = maximumClients
        self.log = log
        let mask = ZeroMQMonitorEvent.accepted | ZeroMQMonitorEvent.disconnected
        let endpoint = "inproc://skyros-monitor-events-\(getpid())-\(UInt64.random(in: 0...UInt64.max))"
        try eventSocket.monitor(endpoint, events: mask)
        // No high-water mark on the monitor's pipe (0: none): past one, libzmq would drop
        // events, and a connection whose acceptance or end is missed is never counted right.
        let monitor = try ZeroMQSocket(context: context, kind: .pair)
        try monitor.setReceiveHighWaterMark(0)
        try monitor.connect(endpoint)
        let socket = MonitorSocket(socket: monitor)
        Thread.detachNewThread { [self] in
            run(socket.socket)
            socket.socket.close()
            finished.signal()
        }
    }

    /// The request socket accepted a connection on `descriptor`: the limiter may close it
    /// (refused) or an older one without a hello (evicted) at once.
    func requestAccepted(_ descriptor: Int32) {
        let now = ProcessInfo.processInfo.systemUptime
        lock.withLock {
            close(requests.accepted(descriptor, at: now))
            peakDescriptors = max(peakDescriptors, requests.descriptors + events.descriptors)
        }
    }

    /// The request socket is about to close the connection on `descriptor`.
    func requestClosing(_ descriptor: Int32) {
        lock.withLock { requests.disconnected(descriptor) }
    }

    /// The request connection on `descriptor` said hello: it is kept past the hello timeout.
    func welcomed(descriptor: Int32) {
        guard descriptor >= 0 else { return }
        lock.withLock { requests.welcomed(descriptor) }
    }

    /// Connections open on the request socket and on the event socket.
    var openConnections: (requests: Int, events: Int) { lock.withLock { (requests.open, events.open) } }

    /// Stops the guard's thread and waits for it (before the monitored socket is closed).
    func stop() {
        let wasStopped = lock.withLock {
            defer { stopped = true }
            return stopped
        }
        if !wasStopped { finished.wait() }
    }

    /// The monitor socket, handed to the guard's thread and used by it alone.
    private struct MonitorSocket: @unchecked Sendable {
        let socket: ZeroMQSocket
    }

    private func run(_ monitor: ZeroMQSocket) {
        while !lock.withLock({ stopped }) {
            let now = ProcessInfo.processInfo.systemUptime
            let deadline = lock.withLock { requests.nextDeadline }
            let wait = deadline.map { max(0, min(0.25, $0 - now)) } ?? 0.25
            if (try? monitor.waitForInput(milliseconds: Int((wait * 1000).rounded(.up)))) == true {
                // Every event waiting.
                while let event = try? monitor.receiveMonitorEvent(dontWait: true) { handle(event) }
            }
            lock.withLock {
                close(requests.expired(at: ProcessInfo.processInfo.systemUptime).map { ($0, .helloTimeout) })
            }
            logIfDue(force: false)
        }
        logIfDue(force: true)
    }

    private func handle(_ event: ZeroMQMonitorEvent) {
        switch event.event {
        case ZeroMQMonitorEvent.accepted:
            let now = ProcessInfo.processInfo.systemUptime
            lock.withLock {
                close(events.accepted(event.value, at: now))
                peakDescriptors = max(peakDescriptors, requests.descriptors + events.descriptors)
            }
        case ZeroMQMonitorEvent.disconnected:
            lock.withLock { events.disconnected(event.value) }
        default:
            break
        }
    }

    /// Makes the socket drop these connections: reading end of file, it closes them and their
    /// descriptors, and reports them gone. Called with the lock held.
    private func close(_ connections: [(Int32, ConnectionLimiter.Reason)]) {
        for (descriptor, reason) in connections {
            _ = shutdown(descriptor, Int32(SHUT_RDWR))
            unlogged[reason, default: 0] += 1
        }
    }

    /// One line about the connections closed since the last one, at most every
    /// ``logInterval`` seconds.
    private func logIfDue(force: Bool) {
        let now = ProcessInfo.processInfo.systemUptime
        let due: (closed: [ConnectionLimiter.Reason: Int], peak: Int, requests: Int, events: Int)? = lock.withLock {
            guard !unlogged.isEmpty, force || now - lastLog >= Self.logInterval else { return nil }
            defer {
                unlogged = [:]
                peakDescriptors = 0
                lastLog = now
            }
            return (unlogged, peakDescriptors, requests.open, events.open)
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
        log(parts.joined(separator: "; ") + """
             (open: \(due.requests) request, \(due.events) event connections; at most \(due.peak) \
            descriptors held by connections)
            """)
    }
}
