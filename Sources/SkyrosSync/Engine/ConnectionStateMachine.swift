/// A machine's connection to the server, as a value: online, offline or in error, with the
/// message an operator reads, and the delay before the next attempt. It takes events (the
/// session came up, it failed and why, a checkpoint could not be applied) and returns what the
/// engine must do (``Action``); it does no I/O, so that every transition is tested as a
/// transcript (`Tests/SkyrosSyncTests`).
///
/// The rules:
/// - Unreachable (the network, the server down, a statement the watchdog timed out): offline;
///   saves go on locally. Refused for something an operator must fix (authentication,
///   privileges, missing tables, a certificate): error. Both try again, after a delay that
///   starts at 100 ms and doubles up to ``maximumRetryDelay``; a session that came up online
///   starts the delay again from 100 ms.
/// - A checkpoint the store cannot apply is an error while it lasts; one applied is online.
/// - Each change of state or message is reported once (``Action/report(_:_:)``), never once
///   per attempt or per change set.
/// - While it waits offline, the engine probes the servers (a connection accepted or refused,
///   nothing sent) at once and every ``probeInterval``: when one that refused accepts again, it
///   connects then, not at the end of a delay of up to ``maximumRetryDelay`` (a server that
///   restarted is noticed within ``probeInterval``). A server that accepts from the first probe
///   is up and failing otherwise (a statement timed out): the delay holds and probing stops
///   for that wait, so that a struggling server gets no more connections than the delay allows.
package struct ConnectionStateMachine: Sendable {
    /// What the engine does.
    package enum Action: Sendable, Equatable {
        /// Open a connection and start a session (then ``sessionStarted()`` or ``failed(_:_:)``).
        case connect
        /// The state changed: log it and tell the daemon.
        case report(SyncEngine.Status.State, String?)
        /// Wait this long (or until a signal), then ``retry()``.
        case retry(after: Duration)
        /// Nothing.
        case none
        /// The engine is stopping: end the loop.
        case stop
    }

    /// The first delay before trying again.
    package static let initialRetryDelay: Duration = .milliseconds(100)
    /// How often the engine probes the servers while it waits offline.
    package static let probeInterval: Duration = .milliseconds(250)
    /// The longest delay before trying again.
    package let maximumRetryDelay: Duration

    /// The state operators see.
    package private(set) var state: SyncEngine.Status.State = .offline
    /// Why it is offline or in error.
    package private(set) var message: String?
    /// The delay before the next attempt.
    package private(set) var retryDelay: Duration = Self.initialRetryDelay
    /// ``stop()`` was called.
    package private(set) var isStopping = false
    /// Whether a probe of the current wait found no server accepting connections.
    private var refusedDuringWait = false
    /// Whether the current wait probes (offline, and no probe found a server up from the start).
    package private(set) var probes = false

    /// A connection, offline until its first session.
    package init(maximumRetryDelay: Duration = .seconds(5)) {
        self.maximumRetryDelay = maximumRetryDelay
    }

    /// The engine starts.
    package func start() -> Action {
        isStopping ? .stop : .connect
    }

    /// The session came up: the connection is open, the server's tables are ready, the
    /// uploads' record is read.
    package mutating func sessionStarted() -> Action {
        retryDelay = Self.initialRetryDelay
        return set(.online, nil)
    }

    /// The session ended with an error: `state` is ``SyncEngine/Status/State/offline`` for
    /// what the network or the server's availability explains, ``SyncEngine/Status/State/error``
    /// for what an operator must fix. Report it (when it changed), then wait and retry.
    package mutating func failed(_ state: SyncEngine.Status.State, _ message: String) -> [Action] {
        if isStopping { return [.stop] }
        let report = set(state, message)
        return (report == .none ? [] : [report]) + [waitToRetry()]
    }

    /// The session ended without an error (the loop was asked to stop, or it returned).
    package mutating func sessionEnded() -> Action {
        isStopping ? .stop : waitToRetry()
    }

    /// The wait of ``Action/retry(after:)`` is over.
    package mutating func retry() -> Action {
        probes = false
        return isStopping ? .stop : .connect
    }

    /// A probe during the wait of ``Action/retry(after:)`` found a server accepting
    /// connections (`reachable`), or none: ``Action/connect`` when one accepts after a probe
    /// of this wait found none (the server came back; the delay starts again from its first),
    /// else ``Action/none`` (go on waiting; see ``probes`` for whether to probe again).
    package mutating func probed(reachable: Bool) -> Action {
        guard probes else { return .none }
        guard !isStopping else {
            probes = false
            return .stop
        }
        guard reachable else {
            refusedDuringWait = true
            return .none
        }
        probes = false
        guard refusedDuringWait else { return .none }  // up all along: the delay holds
        retryDelay = Self.initialRetryDelay
        return .connect
    }

    /// The machine's own store refused sync's work (a checkpoint it cannot apply, a queue it
    /// cannot read; the message says why): an error until a checkpoint is applied.
    package mutating func storeFailed(_ message: String) -> Action {
        set(.error, message)
    }

    /// A checkpoint was applied.
    package mutating func checkpointApplied() -> Action {
        set(.online, nil)
    }

    /// The engine is asked to stop.
    package mutating func stop() {
        isStopping = true
    }

    private mutating func waitToRetry() -> Action {
        defer { retryDelay = min(retryDelay * 2, maximumRetryDelay) }
        refusedDuringWait = false
        probes = state == .offline
        return .retry(after: retryDelay)
    }

    private mutating func set(_ state: SyncEngine.Status.State, _ message: String?) -> Action {
        guard self.state != state || self.message != message else { return .none }
        self.state = state
        self.message = message
        return .report(state, message)
    }
}
