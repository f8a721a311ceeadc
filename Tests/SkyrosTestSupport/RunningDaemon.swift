import Foundation
import SkyrosDaemon
import SkyrosSync
import SkyrosWire

/// A daemon served on a background thread, over real ZeroMQ sockets in a short temporary
/// directory, stopped and cleaned even when a test fails.
public final class RunningDaemon: Sendable {
    public let directory: String
    package let container: GroupContainer
    /// The server's handle: its statistics, and stopping it.
    package let server: DaemonServer.Handle
    private let gate = TurnGate()

    /// - Parameters:
    ///   - directory: the directory of a daemon shut down before (a restart), or nil for a new one.
    ///   - historyCount: how many change sets the history keeps.
    ///   - historyAge: how long the history keeps a change set, in seconds.
    ///   - maximumConnections: how many connections' hellos the daemon remembers.
    ///   - maximumGroupCommit: the most change sets committed together.
    ///   - maximumEventDelay: how long events may wait for the next commits' while requests wait.
    ///   - maximumCommitDelay: how long a turn may wait for the saves of clients that saved
    ///     together (nil: the daemon's default).
    ///   - heartbeatInterval: milliseconds between heartbeats (the serve loop's poll interval).
    ///   - sync: the PostgreSQL server the group syncs with (nil: none).
    ///   - syncSettings: how its sync engine paces itself (small snapshot pages, say).
    ///   - log: where the server writes what it does.
    package init(
        directory: String? = nil, historyCount: Int = 100_000, historyAge: TimeInterval = 7 * 86_400,
        maximumConnections: Int = 10_000, maximumGroupCommit: Int = 256,
        maximumEventDelay: TimeInterval = 0.002, maximumCommitDelay: TimeInterval? = nil, heartbeatInterval: Int = 20,
        sync: SyncConfiguration? = nil, syncSettings: SyncEngine.Settings = SyncEngine.Settings(),
        log: @escaping @Sendable (String) -> Void = { _ in }
    ) throws {
        self.directory = directory ?? "/tmp/skd-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        container = GroupContainer(url: URL(fileURLWithPath: self.directory).appendingPathComponent("g"))
        let gate = self.gate
        let log = DaemonLogs.keeping(log, name: (self.directory as NSString).lastPathComponent)
        var configuration = DaemonServer.Configuration(
            container: container, historyCount: historyCount, historyAge: historyAge,
            maximumGroupCommit: maximumGroupCommit, maximumConnections: maximumConnections,
            maximumEventDelay: maximumEventDelay, maximumCommitDelay: maximumCommitDelay, log: log)
        configuration.sync = sync
        configuration.syncSettings = syncSettings
        server = try DaemonServer.detached(
            configuration: configuration,
            pollInterval: heartbeatInterval
        ) { _ in { gate.pass() } }
    }

    /// Holds the serve loop at the start of its next turn, and returns once it waits there
    /// (5 s at most; false when it did not get there): requests sent meanwhile wait in the
    /// sockets, and the turn after ``resume()`` takes them all together (one group commit).
    @discardableResult
    public func pause() -> Bool { gate.hold(milliseconds: 5_000) }

    /// Lets the serve loop go on after ``pause()``.
    public func resume() { gate.release() }

    /// Stops serving and closes the store and sockets, keeping the directory for a restart.
    public func shutDown() {
        gate.release()
        server.stop()
        _ = server.waitUntilFinished(timeout: .seconds(10))
    }

    deinit {
        shutDown()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

/// Where the serve loop of a ``RunningDaemon`` waits at the start of a turn while a test
/// holds it (its per-turn hook, the one `skyrosd` pings systemd's watchdog from).
private final class TurnGate: @unchecked Sendable {  // its state is guarded by `condition`
    private struct State {
        var held = false
        var waiting = false
    }

    private let condition = NSCondition()
    private var state = State()

    /// Called by the serve loop at the start of every turn: waits while the gate is held.
    func pass() {
        condition.withLock {
            guard state.held else { return }
            state.waiting = true
            condition.broadcast()
            while state.held { condition.wait() }
            state.waiting = false
        }
    }

    /// Holds the loop at its next turn; returns once it waits (false after `milliseconds`).
    func hold(milliseconds: Int) -> Bool {
        let deadline = Date().addingTimeInterval(Double(milliseconds) / 1000)
        return condition.withLock {
            state.held = true
            while !state.waiting {
                guard condition.wait(until: deadline) else { return state.waiting }
            }
            return true
        }
    }

    /// Lets the loop go on.
    func release() {
        condition.withLock {
            state.held = false
            condition.broadcast()
        }
    }
}

/// `SKYROS_TEST_DAEMON_LOGS=DIR swift test …` keeps every in-process daemon's log in
/// `DIR/NAME.log` (its directory's name; daemons of one directory one after another), each
/// line with the time it was written: a test that
/// failed on a busy machine can be read back (the sync stalls CI met at the end of 2026-11 were
/// found that way, not by running them again).
private enum DaemonLogs {
    static let directory = ProcessInfo.processInfo.environment["SKYROS_TEST_DAEMON_LOGS"]

    /// `log`, and the file of the daemon `name` when the logs are kept.
    static func keeping(_ log: @escaping @Sendable (String) -> Void, name: String) -> @Sendable (String) -> Void {
        // Appended to: the daemons a test starts one after another in one directory share a file.
        guard let directory,
            FileManager.default.fileExists(atPath: directory + "/" + name + ".log")
                || FileManager.default.createFile(atPath: directory + "/" + name + ".log", contents: nil),
            let handle = FileHandle(forWritingAtPath: directory + "/" + name + ".log")
        else { return log }
        handle.seekToEndOfFile()
        let lock = NSLock()
        return { line in
            let stamped = String(format: "%.3f ", Date().timeIntervalSince1970) + line + "\n"
            lock.withLock { handle.write(Data(stamped.utf8)) }
            log(line)
        }
    }
}
