import Dispatch
import Foundation
import Logging
import ServiceLifecycle
import Skyros

/// Saves Skyros stacks when a swift-service-lifecycle `ServiceGroup` shuts down gracefully:
/// the counterpart of the process-wide save-on-stop handlers for applications that let
/// ServiceLifecycle own SIGTERM and SIGINT.
///
/// ```swift
/// import ServiceLifecycle
/// import Skyros
/// import SkyrosServiceLifecycle
///
/// let store = try Skyros(sqliteStack: schema, at: url, savesOnStop: false)
/// let group = ServiceGroup(configuration: .init(
///     services: [SkyrosService(store), httpServer],   // the stack first: it stops last
///     gracefulShutdownSignals: [.sigterm, .sigint],
///     logger: logger))
/// try await group.run()
/// ```
///
/// ``run()`` waits for graceful shutdown (or cancellation), then flushes every stack —
/// in-flight writes complete and changes left in the main context are saved, see
/// `Skyros.flush(timeout:)` — and returns. A `ServiceGroup` shuts its services down in
/// reverse order, so list the service before the services that write: they stop first,
/// and what they wrote last is saved.
///
/// Make the stacks with `savesOnStop: false`: then Skyros installs no signal handler and no
/// `atexit` hook at all, and the group's signal handling is the only one. A stack made
/// with the default `savesOnStop: true` is taken out of the process-wide handlers' care
/// when given to the service (`Skyros.leaveSaveOnStop()`), but handlers already installed
/// stay for the process's other stacks.
///
/// This lives in its own product, `SkyrosServiceLifecycle`, so that the `Skyros` library
/// does not make every application (command-line tools, tests, apps with their own
/// lifecycle) depend on swift-service-lifecycle and its dependencies.
public struct SkyrosService: Service {
    /// The stacks flushed at graceful shutdown.
    public let stacks: [Skyros]
    /// How long each stack's flush may wait for its in-flight writes, in seconds.
    public let timeout: TimeInterval
    private let logger: Logger?

    /// A service that flushes `stacks` at graceful shutdown.
    ///
    /// - Parameters:
    ///   - stacks: the stacks to save; make them with `savesOnStop: false`.
    ///   - timeout: how long each flush may wait for in-flight writes (seconds).
    ///   - logger: where the service says what it saved, and which flush timed out.
    public init(stacks: [Skyros], timeout: TimeInterval = 10, logger: Logger? = nil) {
        self.stacks = stacks
        self.timeout = timeout
        self.logger = logger
        for stack in stacks { stack.leaveSaveOnStop() }
    }

    /// A service that flushes `stacks` at graceful shutdown.
    public init(_ stacks: Skyros..., timeout: TimeInterval = 10, logger: Logger? = nil) {
        self.init(stacks: stacks, timeout: timeout, logger: logger)
    }

    /// Waits for graceful shutdown, then flushes the stacks and returns. Cancellation (the
    /// group stopping without a graceful shutdown) flushes them too.
    public func run() async throws {
        do {
            try await gracefulShutdown()
        } catch is CancellationError {
            logger?.debug("cancelled: flushing the Skyros stacks anyway")
        }
        let finished = await flush()
        if finished {
            logger?.info("saved \(stacks.count) Skyros stack(s) at shutdown")
        } else {
            logger?.warning("a Skyros stack's in-flight writes did not finish within \(timeout) s at shutdown")
        }
    }

    /// Flushes every stack on a dispatch thread (a flush blocks while writes finish).
    /// - Returns: false when a stack's flush timed out.
    public func flush() async -> Bool {
        let stacks = self.stacks
        let timeout = self.timeout
        return await withCheckedContinuation { (continuation: CheckedContinuation<Bool, Never>) in
            DispatchQueue.global().async {
                var finished = true
                for stack in stacks where !stack.flush(timeout: timeout) { finished = false }
                continuation.resume(returning: finished)
            }
        }
    }
}
