import Foundation

/// The attempts of one request as a value: when to send it again on a new connection, when
/// to say hello first, when to give up. The request loop feeds it what happened to the last
/// attempt and carries out the next one; the clock is passed in.
///
/// An attempt waits `retryInterval` for its reply (never past the timeout, never less than
/// 10 ms); one that gets none is abandoned and the next goes out on a new connection (a late
/// reply to the old one is never taken for the new one's). When the daemon held the
/// connection all along, it is there and slow (a big fetch on a busy machine): the next
/// attempt waits twice as long as the last, up to ``maximumBackoff`` times `retryInterval`.
/// Otherwise a read that takes the daemon longer than the interval would never be answered
/// in time (each attempt's reply arrives after it was abandoned), and every client would ask
/// again each second. When the connection was lost (the daemon went away, or restarted), the
/// wait goes back to `retryInterval`: a restarted daemon is asked again soon. A daemon that
/// does not know the connection (`helloRequired`: it restarted, or forgot it) is greeted
/// again before the next attempt. There is always a first attempt; after `timeout`, the
/// request fails.
struct RequestAttempts: Equatable {
    /// What the request loop does next.
    enum Action: Equatable {
        /// Send the request and wait up to `wait` for its reply: first on a new connection when
        /// `newConnection`, after saying hello again when `sayHelloFirst`.
        case attempt(wait: Duration, newConnection: Bool, sayHelloFirst: Bool)
        /// Give up: ``SkyrosError/Code/daemonUnavailable``.
        case fail
    }

    let deadline: ContinuousClock.Instant
    let retryInterval: Duration
    private(set) var attempts = 0
    /// Attempts in a row that got no reply in time from a daemon that held their connection.
    private var timeouts = 0
    private var needsHello = false
    private var needsNewConnection = false

    init(now: ContinuousClock.Instant, timeout: Duration, retryInterval: Duration) {
        deadline = now + timeout
        self.retryInterval = min(retryInterval, timeout)
    }

    /// How many times `retryInterval` an attempt waits at most, however many timed out before.
    static let maximumBackoff = 8

    /// The next attempt, or the end.
    mutating func next(now: ContinuousClock.Instant) -> Action {
        if attempts > 0 && now >= deadline { return .fail }
        attempts += 1
        defer { needsNewConnection = false }
        let interval = retryInterval * min(Self.maximumBackoff, 1 << min(timeouts, 30))
        return .attempt(
            wait: max(.milliseconds(10), min(interval, deadline - now)), newConnection: needsNewConnection,
            sayHelloFirst: needsHello)
    }

    /// The last attempt got no reply in time; `daemonHeldConnection`: its connection stayed
    /// up and ready all along (the daemon is slow, not gone).
    mutating func timedOut(daemonHeldConnection: Bool) {
        needsNewConnection = true
        timeouts = daemonHeldConnection ? timeouts + 1 : 0
    }

    /// The daemon answered that it does not know this connection.
    mutating func helloRequired() { needsHello = true }

    /// The hello said again was welcomed.
    mutating func welcomed() { needsHello = false }
}
