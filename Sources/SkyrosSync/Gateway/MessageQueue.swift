import NIOCore
import Synchronization

/// The messages a gateway connection received, taken one at a time (by a gateway's session of a
/// machine, by a machine's request waiting for its answer).
package final class MessageQueue: Sendable {
    private let state = Mutex<
        (messages: [[UInt8]], waiter: CheckedContinuation<[UInt8]?, Never>?, finished: Bool, generation: UInt64)
    >(([], nil, false, 0))
    /// Where the timers of ``next(within:)`` run (a task of the loop, not a Swift task sleeping
    /// on the cooperative pool).
    private let eventLoop: any EventLoop

    /// A queue whose waits are timed on `eventLoop` (its connection's).
    package init(eventLoop: any EventLoop) { self.eventLoop = eventLoop }

    /// Adds a message.
    package func push(_ bytes: [UInt8]) {
        let waiter = state.withLock { state -> CheckedContinuation<[UInt8]?, Never>? in
            if let waiter = state.waiter {
                state.waiter = nil
                return waiter
            }
            state.messages.append(bytes)
            return nil
        }
        waiter?.resume(returning: bytes)
    }

    /// No more messages: a waiting and every later ``next()`` gets nil.
    package func finish() {
        let waiter = state.withLock { state in
            state.finished = true
            defer { state.waiter = nil }
            return state.waiter
        }
        waiter?.resume(returning: nil)
    }

    /// The messages waiting.
    package var count: Int { state.withLock { $0.messages.count } }

    /// The next message within `limit`; nil once the connection ended or when none came in time.
    package func next(within limit: Duration) async -> [UInt8]? {
        // The wait below, if it waits, is the next generation: only it may be ended by this timer.
        let generation = state.withLock { $0.generation &+ 1 }
        let timer = eventLoop.scheduleTask(in: TimeAmount(limit)) { self.expire(generation) }
        defer { timer.cancel() }
        return await next()
    }

    /// Ends the wait of `generation` with nil (its time is up), if it is still under way.
    private func expire(_ generation: UInt64) {
        let waiter = state.withLock { state -> CheckedContinuation<[UInt8]?, Never>? in
            guard state.generation == generation, let waiter = state.waiter else { return nil }
            state.waiter = nil
            return waiter
        }
        waiter?.resume(returning: nil)
    }

    /// The next message; nil once the connection ended.
    package func next() async -> [UInt8]? {
        await withCheckedContinuation { continuation in
            let ready = state.withLock { state -> [UInt8]?? in
                if !state.messages.isEmpty { return .some(state.messages.removeFirst()) }
                if state.finished { return .some(nil) }
                state.waiter = continuation
                state.generation &+= 1
                return nil
            }
            if let ready { continuation.resume(returning: ready) }
        }
    }
}
