import Foundation
import Synchronization

extension DaemonServer {
    /// What other threads may do with a server confined to the thread that serves: ask it to
    /// stop, read its statistics, learn when it is closed.
    package final class Handle: Sendable {
        private struct State {
            var stopRequested = false
            var statistics = Statistics()
            var finished = false
            var whenFinished: [@Sendable () -> Void] = []
        }

        private let state = Mutex(State())

        init() {}

        /// Asks ``DaemonServer/serve(pollInterval:turn:)`` to return once the request in
        /// progress is answered.
        package func stop() { state.withLock { $0.stopRequested = true } }

        /// Whether ``stop()`` was called.
        var isStopRequested: Bool { state.withLock { $0.stopRequested } }

        /// What the daemon has done since it started.
        package var statistics: Statistics { state.withLock { $0.statistics } }

        /// Counts what the server did.
        func record(_ change: (inout Statistics) -> Void) {
            state.withLock { change(&$0.statistics) }
        }

        /// Calls `body` once the server is closed (at once when it is already).
        package func whenFinished(_ body: @escaping @Sendable () -> Void) {
            let finished = state.withLock { state in
                if !state.finished { state.whenFinished.append(body) }
                return state.finished
            }
            if finished { body() }
        }

        /// Waits until the server is closed, for at most `timeout`; returns whether it is.
        package func waitUntilFinished(timeout: DispatchTimeInterval) -> Bool {
            let closed = DispatchSemaphore(value: 0)
            whenFinished { closed.signal() }
            return closed.wait(timeout: .now() + timeout) == .success
        }

        /// The server is closed.
        func finish() {
            let waiting = state.withLock { state in
                defer { (state.finished, state.whenFinished) = (true, []) }
                return state.whenFinished
            }
            for body in waiting { body() }
        }
    }

    /// Makes a server on a thread of its own (the server stays there: it is not Sendable),
    /// which serves until its handle's ``Handle/stop()``, then closes it. `setUp` runs on
    /// that thread before serving and returns the hook called at the start of every turn
    /// (see ``serve(pollInterval:turn:)``); when it throws, the server is closed and the
    /// error thrown here.
    ///
    /// - Returns: the server's handle, once it serves (or throws what making it threw).
    package static func detached(
        configuration: Configuration, pollInterval: Int = 100,
        setUp: @escaping @Sendable (DaemonServer) throws -> () -> Void = { _ in {} }
    ) throws -> Handle {
        let box = StartBox()
        Thread.detachNewThread {
            let server: DaemonServer
            let startOfTurn: () -> Void
            do {
                server = try DaemonServer(configuration: configuration)
                do {
                    startOfTurn = try setUp(server)
                } catch {
                    server.close()
                    throw error
                }
            } catch {
                box.result.withLock { $0 = .failure(error) }
                box.ready.signal()
                return
            }
            box.result.withLock { $0 = .success(server.handle) }
            box.ready.signal()
            server.serve(pollInterval: pollInterval, turn: startOfTurn)
            server.close()
        }
        box.ready.wait()
        return try box.result.withLock { $0! }.get()
    }

    /// How ``detached(configuration:pollInterval:setUp:)``'s thread tells the caller that it serves.
    private final class StartBox: Sendable {
        let result = Mutex<Result<Handle, any Error>?>(nil)
        let ready = DispatchSemaphore(value: 0)
    }
}
