import Foundation
import PostgresNIO
import Synchronization

/// Bounds the time of every exchange with the server on one connection: when an exchange
/// outlasts its deadline (a server that stopped answering, a network that drops packets
/// without a word), the watchdog closes the connection, which fails the exchange, and the
/// engine goes offline and tries again. Without it, a query on a connection whose server
/// vanished may wait for the operating system's TCP timeout, minutes.
package final class Watchdog: Sendable {
    /// The deadline of the exchange in progress, and whether one expired.
    private final class State: Sendable {
        let deadline = Mutex<ContinuousClock.Instant?>(nil)
        let expired = Mutex(false)
    }

    private let state = State()
    private let task: Task<Void, Never>

    /// Watches `connection`, checking its deadline every `tick`.
    init(_ connection: PostgresConnection, tick: Duration = .milliseconds(250)) {
        let state = self.state
        task = Task {
            while !Task.isCancelled {
                try? await Task.sleep(for: tick)
                if let due = state.deadline.withLock({ $0 }), ContinuousClock.now >= due {
                    state.expired.withLock { $0 = true }
                    try? await connection.close()
                    return
                }
            }
        }
    }

    deinit { task.cancel() }

    /// Stops watching.
    func cancel() { task.cancel() }

    /// Runs `body` with a deadline `limit` from now.
    func bounded<T>(_ limit: Duration, _ body: () async throws -> T) async throws -> T {
        state.deadline.withLock { $0 = .now + limit }
        defer { state.deadline.withLock { $0 = nil } }
        do {
            return try await body()
        } catch {
            if state.expired.withLock({ $0 }) { throw TimedOut(limit: limit) }
            throw error
        }
    }

    /// An exchange with the server outlasted its deadline.
    struct TimedOut: Error, CustomStringConvertible {
        var limit: Duration
        var description: String { "the server did not answer within \(limit)" }
    }
}
