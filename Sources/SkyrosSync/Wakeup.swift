import Foundation
import Synchronization

/// A signal that wakes one waiting task: set from any thread (a local commit, a NOTIFY),
/// awaited with a timeout by the sync loop. Signals while nobody waits are remembered (once).
final class Wakeup: Sendable {
    private struct State {
        var signaled = false
        var waiter: CheckedContinuation<Void, Never>?
    }

    private let state = Mutex(State())

    /// Wakes the waiter, or the next wait.
    func signal() {
        let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
            if let waiter = state.waiter {
                state.waiter = nil
                return waiter
            }
            state.signaled = true
            return nil
        }
        waiter?.resume()
    }

    /// Returns at the next signal (at once when one came since the last wait), after `timeout`,
    /// or when the task is cancelled.
    ///
    /// - Returns: true when a signal came (false: the timeout, or a cancellation).
    @discardableResult
    func wait(timeout: Duration) async -> Bool {
        if state.withLock({ state in
            defer { state.signaled = false }
            return state.signaled
        }) { return true }
        return await withTaskGroup(of: Bool.self) { group in
            group.addTask { [self] in
                await withTaskCancellationHandler {
                    await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                        let resumeNow = state.withLock { state -> Bool in
                            if state.signaled || Task.isCancelled {
                                state.signaled = false
                                return true
                            }
                            state.waiter = continuation
                            return false
                        }
                        if resumeNow { continuation.resume() }
                    }
                } onCancel: {
                    let waiter = state.withLock { state -> CheckedContinuation<Void, Never>? in
                        defer { state.waiter = nil }
                        return state.waiter
                    }
                    waiter?.resume()
                }
                return !Task.isCancelled
            }
            group.addTask {
                try? await Task.sleep(for: timeout)
                return false
            }
            let signaled = await group.next() ?? false
            group.cancelAll()
            return signaled
        }
    }
}
