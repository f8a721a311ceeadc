import Foundation
import Skyros
import SkyrosShared
import SkyrosTestSupport
import SkyrosWire
import SkyrosZeroMQ
import Testing
import ZeroMQReference

/// Clients of two schema versions in one group, with a real `skyrosd` and real client
/// processes (docs/PROTOCOL.md, "Mixed schema versions").
@Suite("Mixed schema versions across processes", .timeLimit(.minutes(3)))
struct MixedVersionProcessTests {
    /// The numbers after each word of a line such as `TOTAL 3 V1 2`.
    static func numbers(_ line: String) -> [String: Int] {
        let words = line.split(whereSeparator: { $0 == " " || $0 == "\n" }).map(String.init)
        var result: [String: Int] = [:]
        for (word, value) in zip(words, words.dropFirst()) {
            if let number = Int(value) { result[word] = number }
        }
        return result
    }

    /// Runs a child to its end (bounded) and returns its output; records its ending if not 0.
    static func run(_ arguments: [String], sourceLocation: SourceLocation = #_sourceLocation) throws -> String {
        let child = try ChildProcess(arguments)
        let ending = child.wait(seconds: 60)
        let output = child.readAll()
        #expect(ending == .exited(0), "\(arguments[0]): \(output)", sourceLocation: sourceLocation)
        return output
    }

    @Test(
        """
        v1 clients write and read while a v2 client connects and the daemon migrates; both versions then \
        read each other's objects, nothing is lost; v1 merges v2's saves; unmigratable and unrecorded hellos are refused
        """)
    func migrateWhileServing() async throws {
        let processes = DaemonProcessTests()
        let groups = processes.groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let daemon = try processes.startDaemon(groups)
        defer {
            kill(daemon.pid, SIGTERM)
            daemon.wait(seconds: 10)
        }
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g")

        // A v1 client in this process: it creates the store and watches what others save.
        let v1 = try Skyros(sharedStack: MixedVersionModels.v1, container: container, timeout: 20)
        try await v1.write { context in
            for index in 0..<10 {
                let task = TaskV1.create(in: context)
                task.title = "a-\(index)"
                task.done = index % 2 == 0
            }
        }
        let changes = v1.changes
        let watcher = Task { () -> (v2Inserts: Int, refreshed: Bool) in
            var inserts = 0
            var refreshed = false
            for await change in changes {
                if change.isRefresh { refreshed = true }
                // In v1's terms: two values, the title first.
                inserts += change.inserted.count { snapshot in
                    guard snapshot.values.count == 2, case .text(let title) = snapshot.values[0] else { return false }
                    return title.hasPrefix("v2-")
                }
                if refreshed && inserts >= 5 { break }
            }
            return (inserts, refreshed)
        }

        // A v1 writer process, half-way through when the v2 client connects.
        let writer = try ChildProcess(["mixed-v1-writer", container.path, "40"])
        #expect(writer.waitForLine("HALF", seconds: 60))
        let first = Self.numbers(try Self.run(["mixed-v2", container.path, "5"]))
        #expect(first["V2"] == 5)
        #expect(first["V2VALUES"] == 5)
        #expect(
            first["V1"] != nil && first["V1"] == first["V1DEFAULTS"], "v1's objects read with v2's defaults: \(first)")
        #expect(
            FileManager.default.createFile(atPath: container.appendingPathComponent("stop-v1").path, contents: Data()))
        #expect(await writer.wait(seconds: 60) == .exited(0))
        let wrote = Self.numbers(writer.readAll())
        let written = try #require(wrote["WROTE"])
        #expect(written >= 40)
        #expect(wrote["SEES"] == 10 + written + 5, "the v1 writer sees every object: \(wrote)")
        #expect(wrote["V2"] == 5)

        // The v1 client in this process: it saw the schema change and v2's inserts (translated).
        let timeout = Task {
            try? await Task.sleep(for: .seconds(30))
            watcher.cancel()
        }
        let seen = await watcher.value
        timeout.cancel()
        #expect(seen.refreshed, "the v1 client was told the schema changed")
        #expect(seen.v2Inserts >= 5, "the v1 client merged v2's inserts: \(seen)")
        let titles = try await v1.read { context in try TaskV1.all(in: context).map(\.title) }
        #expect(titles.count == 15 + written)
        #expect(titles.count { $0.hasPrefix("v2-") } == 5)
        // v1 updates a v2 object: v2's attributes it does not know are left as they were.
        try await v1.write { context in
            try TaskV1.first(where: #Predicate { $0.title == "v2-0" }, in: context)?.done = true
        }
        let after = Self.numbers(try Self.run(["mixed-v2", container.path, "0"]))
        #expect(after["TOTAL"] == 15 + written)
        #expect(after["V1"] == 10 + written && after["V1DEFAULTS"] == 10 + written)
        #expect(after["V2VALUES"] == 5, "v1's update kept v2's priority and due date: \(after)")
        #expect(after["DONE"] == 6)

        // On the wire: the store's own events under a one-byte topic, the copies for version 1
        // (this process's client is connected) under the topic followed by 1 (PROTOCOL.md).
        let zmq = try ZeroMQContext()
        let subscriber = try ZeroMQSocket(context: zmq, kind: .subscriber)
        try subscriber.subscribe()
        try subscriber.connect(GroupContainer(url: container).eventsEndpoint)
        var topicLengths: Set<Int> = []
        let listening = Date()
        while topicLengths.count < 2 && Date().timeIntervalSince(listening) < 10 {
            guard try subscriber.waitForInput(milliseconds: 500) else { continue }
            let frames = try subscriber.receive(dontWait: true)
            guard frames.count == 2, let topic = frames.first else { continue }
            if topic.count == 2 { #expect(topic.last == 1, "a copy for version 1") }
            topicLengths.insert(topic.count)
            #expect((try? WireMessage.decode([UInt8](frames[1]))) != nil)
        }
        #expect(topicLengths == [1, 2], "heartbeats for the store's version and for version 1")
        subscriber.close()

        // A version the daemon cannot migrate to (a type change): refused, the store serves on.
        let refused = try #require(throws: SkyrosError.self) {
            try Skyros(sharedStack: MixedVersionModels.badV3, container: container, timeout: 10)
        }
        #expect(refused.code == .migrationFailed)
        #expect(refused.message.contains("Task.done"), "\(refused.message)")
        // A version 1 that is not the recorded version 1: refused with the reason.
        let unrecorded = try #require(throws: SkyrosError.self) {
            try Skyros(sharedStack: Schema([TaskV2.self], version: 1), container: container, timeout: 10)
        }
        #expect(unrecorded.code == .schemaMismatch)
        #expect(unrecorded.message.contains("version 1"), "\(unrecorded.message)")
        let count = try await v1.read { context in try TaskV1.count(in: context) }
        #expect(count == 15 + written)
        let last = Self.numbers(try Self.run(["mixed-v2", container.path, "1"]))
        #expect(last["TOTAL"] == 16 + written)
        #expect(v1.flush(timeout: 10))
        _ = v1
        let stored = try SQLiteStore.storedSchemaVersion(at: container.appendingPathComponent("store.sqlite"))
        #expect(stored == 2)
    }
}
