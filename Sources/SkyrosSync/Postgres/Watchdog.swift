import Foundation
import PostgresNIO
import Synchronization

/// Bounds the time of every statement on one connection: a statement that gets no answer
/// within its limit (a server that stopped answering, a network that drops packets without a
/// word) fails with ``TimedOut`` at the limit, and the connection is closed, so that the
/// engine goes offline and connects again. Without it a statement can wait for ever: with
/// postgres-nio 1.33.2, a query on a connection whose server shut down was seen waiting with no
/// end, and a black-holed one waits for the system's TCP timeout.
///
/// The statement runs in a task of its own, which the caller stops waiting for at the limit
/// (a statement stuck on a dead connection is abandoned, not awaited).
///
/// A statement waiting when the connection closes (the server ended it, the network reset it)
/// fails at once with ``ServerSession/ConnectionClosed``: postgres-nio 1.33.2 may leave it
/// waiting, and the sync fault campaign saw a statement in flight across a PostgreSQL restart
/// behind a healed black hole wait the whole limit (10 s) before the engine went on.
package final class Watchdog: Sendable {
    private let connection: PostgresConnection
    /// Where the statement's task runs.
    let executor: any TaskExecutor
    /// What fails each waiting statement when the connection closes, by statement.
    private let waiting = Mutex<(next: Int, closed: Bool, failing: [Int: @Sendable () -> Void])>((0, false, [:]))

    /// Watches `connection`, running statements on `executor` (nil: the connection's event
    /// loop, never Swift's cooperative pool, which a process may block for seconds).
    package init(_ connection: PostgresConnection, executor: (any TaskExecutor)? = nil) {
        self.connection = connection
        self.executor = executor ?? SyncExecutor(eventLoop: connection.eventLoop)
        connection.closeFuture.whenComplete { [weak self] _ in self?.connectionClosed() }
    }

    private func connectionClosed() {
        let failing = waiting.withLock { waiting in
            waiting.closed = true
            defer { waiting.failing = [:] }
            return Array(waiting.failing.values)
        }
        for fail in failing { fail() }
    }

    /// Runs `body`, failing with ``TimedOut`` (and closing the connection) when it does not
    /// finish within `limit`.
    package func bounded<T: Sendable>(_ limit: Duration, _ body: @escaping @Sendable () async throws -> T) async throws
        -> T
    {
        let outcome = Once<T>()
        return try await withCheckedThrowingContinuation { continuation in
            outcome.waiting(continuation)
            let work = Task(executorPreference: executor) {
                do {
                    outcome.finish(.success(try await body()))
                } catch {
                    outcome.finish(.failure(error))
                }
            }
            // The timer is a task of the connection's event loop (not a Swift task sleeping).
            let timer = connection.eventLoop.scheduleTask(in: TimeAmount(limit)) { [connection] in
                guard outcome.finish(.failure(TimedOut(limit: limit))) else { return }
                work.cancel()
                connection.closeInBackground()
            }
            // The connection closing ends the wait too (at once when it is closed already).
            let fail: @Sendable () -> Void = {
                guard outcome.finish(.failure(ServerSession.ConnectionClosed())) else { return }
                work.cancel()
            }
            let (key, closed) = waiting.withLock { waiting -> (Int, Bool) in
                waiting.next += 1
                if !waiting.closed { waiting.failing[waiting.next] = fail }
                return (waiting.next, waiting.closed)
            }
            if closed { fail() }
            outcome.onFinish { [weak self] in
                timer.cancel()
                _ = self?.waiting.withLock { $0.failing.removeValue(forKey: key) }
            }
        }
    }

    /// A result delivered once to a waiting continuation.
    private final class Once<T: Sendable>: Sendable {
        private struct State {
            var continuation: CheckedContinuation<T, any Error>?
            var result: Result<T, any Error>?
            var finished = false
            var onFinish: (@Sendable () -> Void)?
        }

        private let state = Mutex(State())

        func waiting(_ continuation: CheckedContinuation<T, any Error>) {
            state.withLock { $0.continuation = continuation }
        }

        /// Runs `action` when the result is in (at once if it is already).
        func onFinish(_ action: @escaping @Sendable () -> Void) {
            let now = state.withLock { state -> Bool in
                if state.finished { return true }
                state.onFinish = action
                return false
            }
            if now { action() }
        }

        /// Delivers `result` unless one was delivered before; true when this one was.
        @discardableResult
        func finish(_ result: Result<T, any Error>) -> Bool {
            let taken = state.withLock { state -> (CheckedContinuation<T, any Error>, (@Sendable () -> Void)?)? in
                guard !state.finished, let continuation = state.continuation else { return nil }
                state.finished = true
                state.continuation = nil
                defer { state.onFinish = nil }
                return (continuation, state.onFinish)
            }
            guard let (continuation, action) = taken else { return false }
            continuation.resume(with: result)
            action?()
            return true
        }
    }

    /// A statement got no answer within its limit.
    struct TimedOut: Error, CustomStringConvertible {
        var limit: Duration
        var description: String { "the server did not answer within \(limit)" }
    }
}

extension PostgresConnection {
    /// Closes the connection without waiting for it, in a task of its event loop (not of Swift's
    /// cooperative pool, which a process may block for seconds).
    package func closeInBackground() {
        Task(executorPreference: SyncExecutor(eventLoop: eventLoop)) { try? await self.close() }
    }
}
