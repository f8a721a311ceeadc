import Foundation
import SkyrosDaemon
import SkyrosWire

/// A daemon served on a background thread, over real ZeroMQ sockets in a short temporary
/// directory, stopped and cleaned even when a test fails.
public final class RunningDaemon: @unchecked Sendable {
    public let directory: String
    public let container: GroupContainer
    public let server: DaemonServer
    private let finished = DispatchSemaphore(value: 0)

    public init() throws {
        directory = "/tmp/skd-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        container = GroupContainer(url: URL(fileURLWithPath: directory).appendingPathComponent("g"))
        server = try DaemonServer(configuration: .init(container: container))
        let server = self.server
        let finished = self.finished
        Thread.detachNewThread {
            server.serve(pollInterval: 20)
            finished.signal()
        }
    }

    deinit {
        server.stop()
        _ = finished.wait(timeout: .now() + 10)
        server.close()
        try? FileManager.default.removeItem(atPath: directory)
    }
}

