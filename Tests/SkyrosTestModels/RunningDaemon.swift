import Foundation
import SkyrosDaemon
import SkyrosWire

/// A daemon served on a background thread, over real ZeroMQ sockets in a short temporary
/// directory, stopped and cleaned even when a test fails.
public final class RunningDaemon: @unchecked Sendable {
    public let directory: String
    package let container: GroupContainer
    public let server: DaemonServer
    private let finished = DispatchSemaphore(value: 0)
    private let heartbeatInterval: Int
    private let lock = NSLock()
    private var serving = false
    private var closed = false

    /// - Parameters:
    ///   - directory: the directory of a daemon shut down before (a restart), or nil for a new one.
    ///   - historyCount: how many change sets the history keeps.
    ///   - historyAge: how long the history keeps a change set, in seconds.
    ///   - serving: false to start serving later with ``startServing(after:)`` — requests sent
    ///     in between wait in the socket and are all taken in the first turn (a group commit).
    ///   - maximumConnections: how many connections' hellos the daemon remembers.
    ///   - maximumGroupCommit: the most change sets committed together.
    ///   - maximumEventDelay: how long events may wait for the next commits' while requests wait.
    ///   - heartbeatInterval: milliseconds between heartbeats (the serve loop's poll interval).
    ///   - log: where the server writes what it does.
    public init(
        directory: String? = nil, historyCount: Int = 100_000, historyAge: TimeInterval = 7 * 86_400,
        serving: Bool = true, maximumConnections: Int = 10_000, maximumGroupCommit: Int = 256,
        maximumEventDelay: TimeInterval = 0.002, heartbeatInterval: Int = 20,
        log: @escaping @Sendable (String) -> Void = { _ in }
    ) throws {
        self.heartbeatInterval = heartbeatInterval
        self.directory = directory ?? "/tmp/skd-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        container = GroupContainer(url: URL(fileURLWithPath: self.directory).appendingPathComponent("g"))
        server = try DaemonServer(configuration: .init(
            container: container, historyCount: historyCount, historyAge: historyAge,
            maximumGroupCommit: maximumGroupCommit, maximumConnections: maximumConnections,
            maximumEventDelay: maximumEventDelay, log: log))
        if serving { startServing() }
    }

    /// Starts serving; first waits (5 s at most) until `requests` requests were read, so that
    /// the first turn takes them together, and `subscribers` event connections subscribed, so
    /// that they get its events. Returns whether they were.
    @discardableResult
    public func startServing(after requests: Int = 0, subscribers: Int = 0) -> Bool {
        let received = server.readAhead(requests: requests, subscribers: subscribers, milliseconds: 5_000)
        lock.withLock { serving = true }
        let server = self.server
        let finished = self.finished
        let heartbeatInterval = self.heartbeatInterval
        Thread.detachNewThread {
            server.serve(pollInterval: heartbeatInterval)
            finished.signal()
        }
        return received
    }

    /// Stops serving and closes the store and sockets, keeping the directory for a restart.
    public func shutDown() {
        let (wasServing, wasClosed) = lock.withLock { () -> (Bool, Bool) in
            defer { closed = true }
            return (serving, closed)
        }
        guard !wasClosed else { return }
        server.stop()
        if wasServing { _ = finished.wait(timeout: .now() + 10) }
        server.close()
    }

    deinit {
        shutDown()
        try? FileManager.default.removeItem(atPath: directory)
    }
}
