import Foundation
import NIOCore
import Synchronization

/// A signal that wakes one waiting task: set from any thread (a local commit, a NOTIFY),
/// awaited with a timeout by the sync loop. Signals while nobody waits are remembered (once).
///
/// The timeout is a task scheduled on the engine's event loop, and a wait is one
/// continuation: no child tasks to make and cancel at every wake-up (sync's latency is made
/// of such steps).
package final class Wakeup: Sendable {
    private struct State {
        var signaled = false
        var waiter: CheckedContinuation<Bool, Never>?
        /// Which wait the waiter is (a timer of an earlier wait finds another number).
        var generation: UInt64 = 0
        var timer: Scheduled<Void>?
    }

    private let state = Mutex(State())
    private let eventLoop: any EventLoop

    /// A signal whose waits time out on `eventLoop`.
    package init(eventLoop: any EventLoop) {
        self.eventLoop = eventLoop
    }

    /// Wakes the waiter, or the next wait.
    package func signal() {
        resume(nil, returning: true)
    }

    /// Returns at the next signal (at once when one came since the last wait), after `timeout`,
    /// or when the task is cancelled.
    ///
    /// - Returns: true when a signal came (false: the timeout, or a cancellation).
    @discardableResult
    package func wait(timeout: Duration) async -> Bool {
        if state.withLock({ state in
            defer { state.signaled = false }
            return state.signaled
        }) {
            return true
        }
        return await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
                let generation = state.withLock { state -> UInt64? in
                    if state.signaled {
                        state.signaled = false
                        return nil
                    }
                    state.generation &+= 1
                    state.waiter = continuation
                    return state.generation
                }
                guard let generation else {
                    continuation.resume(returning: true)
                    return
                }
                if Task.isCancelled {
                    resume(generation, returning: false)
                    return
                }
                let timer = eventLoop.scheduleTask(in: TimeAmount(timeout)) { [self] in
                    resume(generation, returning: false)
                }
                let stale = state.withLock { state -> Bool in
                    guard state.waiter != nil, state.generation == generation else { return true }
                    state.timer = timer
                    return false
                }
                if stale { timer.cancel() }
            }
        } onCancel: {
            let generation = state.withLock { $0.generation }
            resume(generation, returning: false)
        }
    }

    /// Resumes the waiter with `result`, when it is the wait `generation` (nil: any wait; with
    /// nobody waiting, the signal is kept for the next wait).
    private func resume(_ generation: UInt64?, returning result: Bool) {
        let (waiter, timer) = state.withLock { state -> (CheckedContinuation<Bool, Never>?, Scheduled<Void>?) in
            guard let waiter = state.waiter, generation == nil || generation == state.generation else {
                if generation == nil { state.signaled = true }
                return (nil, nil)
            }
            defer {
                state.waiter = nil
                state.timer = nil
            }
            return (waiter, state.timer)
        }
        timer?.cancel()
        waiter?.resume(returning: result)
    }
}
