import Foundation
import Skyros
import SkyrosShared
import SkyrosTestSupport
import SkyrosWire
import Testing

/// Observation across processes: a controller follows what other processes save through a
/// real skyrosd, and converges after the daemon is killed and restarted.
@Suite("Observation across processes", .serialized, .timeLimit(.minutes(3)))
struct ObservationProcessTests {
    let process = DaemonProcessTests()

    /// Waits (bounded) until the controller shows what a fresh fetch gives.
    func converges(_ controller: FetchedResultsController<User>, seconds: Double = 15) throws -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            let fresh = try SectionedIDs(
                fetching: controller.fetchDescriptor, section: { $0.lastnameInitial }, in: controller.context)
            if SectionedIDs(controller.sections) == fresh { return true }
            usleep(20_000)  // changes arrive on the event thread; polled with a bound
        }
        return false
    }

    /// The calls of a controller, each checked: applied to the results before it, a change
    /// must give the results after it.
    final class ChangeLog: @unchecked Sendable {
        var previous = SectionedIDs([FetchedResultsSection<User>]())
        var calls = 0
        var inconsistent: [String] = []
    }

    /// Runs the controller's fetch and checks each of its changes from then on.
    func follow(_ controller: FetchedResultsController<User>) throws -> ChangeLog {
        let log = ChangeLog()
        controller.onChange = { [unowned controller] changes in
            var invalid: [String] = []
            let applied = log.previous.applying(changes, invalid: &invalid)
            let now = SectionedIDs(controller.sections)
            if applied != now || !invalid.isEmpty { log.inconsistent.append("\(invalid) \(applied) vs \(now)") }
            log.previous = now
            log.calls += 1
        }
        try controller.performFetch()
        controller.context.performAndWait { log.previous = SectionedIDs(controller.sections) }
        return log
    }

    @Test(
        "a controller receives another process's saves as the same incremental changes, and converges after the daemon is SIGKILLed and restarted"
    )
    func acrossProcesses() throws {
        let groups = process.groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let notify = try NotifySocket()
        var daemon = try ChildProcess(
            ["--group", "g", "--groups-dir", groups], executable: DaemonProcessTests.skyrosd,
            environment: ["NOTIFY_SOCKET": notify.path])
        #expect(notify.waitFor("READY=1"))
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g")
        let store = try Skyros(sharedStack: testSchema, container: container, timeout: 10, savesOnStop: false)
        let controller = FetchedResultsController<User>(
            fetch: ObservationTests.descriptor, sectionKeyPath: \.lastnameInitial, context: store.mainContext)
        let log = try follow(controller)

        let first = try ChildProcess(["observed-writer", container.path, "1", "120"])
        #expect(first.wait(seconds: 60) == .exited(0))
        #expect(try converges(controller))
        let callsBeforeRestart = store.mainContext.performAndWait { log.calls }
        #expect(callsBeforeRestart >= 20)

        kill(daemon.pid, SIGKILL)
        #expect(daemon.wait() == .signalled(SIGKILL))
        daemon = try ChildProcess(
            ["--group", "g", "--groups-dir", groups], executable: DaemonProcessTests.skyrosd,
            environment: ["NOTIFY_SOCKET": notify.path])
        #expect(notify.waitFor("READY=1"))
        let second = try ChildProcess(["observed-writer", container.path, "2", "60"])
        #expect(second.wait(seconds: 60) == .exited(0))
        #expect(try converges(controller))
        store.mainContext.performAndWait {
            #expect(log.calls > callsBeforeRestart)
            #expect(log.inconsistent.isEmpty, "\(log.inconsistent.prefix(3))")
        }
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
    }

    @Test(
        "a controller whose client missed events (a tiny event queue, the main context held busy) catches up with consistent changes and converges"
    )
    func missedEvents() throws {
        let groups = process.groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let notify = try NotifySocket()
        let daemon = try ChildProcess(
            ["--group", "g", "--groups-dir", groups], executable: DaemonProcessTests.skyrosd,
            environment: ["NOTIFY_SOCKET": notify.path])
        #expect(notify.waitFor("READY=1"))
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g")
        // Events are dropped as soon as this client falls behind: it catches up by changes-since.
        let store = Skyros(
            sharedStack: try RemoteStore(
                schema: testSchema, container: GroupContainer(url: container), timeout: 10, eventQueueLimit: 1,
                eventSocketBufferBytes: 4_096),
            savesOnStop: false)
        let controller = FetchedResultsController<User>(
            fetch: ObservationTests.descriptor, sectionKeyPath: \.lastnameInitial, context: store.mainContext)
        let log = try follow(controller)
        // The main context is held busy while another process writes: the event thread cannot
        // merge, its queue overflows, and events are lost.
        let release = DispatchSemaphore(value: 0)
        let held = DispatchSemaphore(value: 0)
        store.mainContext.perform {
            held.signal()
            _ = release.wait(timeout: .now() + 60)
        }
        #expect(held.wait(timeout: .now() + 5) == .success)
        // More saves than the kernel's socket buffer and the daemon's per-subscriber queue (1,000
        // messages) hold together (about 1,300 events here): some events are dropped.
        let writer = try ChildProcess(["observed-writer", container.path, "3", "2000"])
        #expect(writer.wait(seconds: 60) == .exited(0))
        release.signal()
        #expect(try converges(controller))
        // Events were dropped, and the client caught up: it asked the daemon for changes-since
        // (its only other reason, a second without events, cannot happen: heartbeats come
        // every 100 ms).
        let metrics = try OperatingToolTests.run(["metrics", "--group", "g", "--groups-dir", groups])
        #expect(metrics.status == 0, "\(metrics.stderr)")
        let catchUps =
            metrics.stdout.split(separator: "\n").first { $0.hasPrefix("skyros_catch_ups_total ") }
            .flatMap { Double($0.split(separator: " ").last ?? "") } ?? 0
        #expect(catchUps >= 1, "\(metrics.stdout)")
        store.mainContext.performAndWait {
            #expect(log.calls >= 1)
            // Caught up in consolidated changes (a page of the history at a time), not one per save.
            #expect(log.calls < 1_000, "\(log.calls) calls for 2,000 saves")
            #expect(log.inconsistent.isEmpty, "\(log.inconsistent.prefix(3))")
        }
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
    }
}
