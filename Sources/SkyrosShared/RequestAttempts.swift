import Foundation

/// The attempts of one request as a value: when to send it again on a new connection, when
/// to say hello first, when to give up. The request loop feeds it what happened to the last
/// attempt and carries out the next one; the clock is passed in.
///
/// An attempt waits at most `retryInterval` for its reply (never less than 10 ms); one that
/// gets none is abandoned and the next goes out on a new connection (a late reply to the old
/// one is never taken for the new one's). A daemon that does not know the connection
/// (`helloRequired`: it restarted, or forgot it) is greeted again before the next attempt.
/// There is always a first attempt; after `timeout`, the request fails.
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
    private var needsHello = false
    private var needsNewConnection = false

    init(now: ContinuousClock.Instant, timeout: Duration, retryInterval: Duration) {
        deadline = now + timeout
        self.retryInterval = min(retryInterval, timeout)
    }

    /// The next attempt, or the end.
    mutating func next(now: ContinuousClock.Instant) -> Action {
        if attempts > 0 && now >= deadline { return .fail }
        attempts += 1
        defer { needsNewConnection = false }
        return .attempt(
            wait: max(.milliseconds(10), min(retryInterval, deadline - now)), newConnection: needsNewConnection,
            sayHelloFirst: needsHello)
    }

    /// The last attempt got no reply in time.
    mutating func timedOut() { needsNewConnection = true }

    /// The daemon answered that it does not know this connection.
    mutating func helloRequired() { needsHello = true }

    /// The hello said again was welcomed.
    mutating func welcomed() { needsHello = false }
}
