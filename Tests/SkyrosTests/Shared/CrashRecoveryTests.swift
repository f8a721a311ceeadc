import Foundation
import Skyros
import SkyrosShared
import SkyrosTestSupport
import Testing

/// What a group's store holds, read from its file (the daemon stopped): the tags, the storm
/// users with their post counts (as `skyros-test-child` digests them), the history's
/// sequence numbers and the last sequence given.
struct StoreContents {
    var digest: [String]
    var history: [Int64]
    var lastSequence: Int64
    var users: [String: Int]

    init(_ container: URL) throws {
        let store = try SQLiteStore(schema: testSchema, url: container.appendingPathComponent("store.sqlite"))
        defer { try? store.close() }
        func int(_ value: StoredValue) -> Int64 { if case .integer(let v) = value { v } else { -1 } }
        func text(_ value: StoredValue) -> String { if case .text(let v) = value { v } else { "?" } }
        var lines = try store.rows("SELECT label, uses FROM \"Tag\"").map { "tag \(text($0[0]))=\(int($0[1]))" }
        users = [:]
        for row in try store.rows(
            """
            SELECT u."lastname", (SELECT count(*) FROM "Post" p WHERE p."author" = u."_id") FROM "User" u \
            WHERE u."firstname" = 'storm'
            """)
        {
            lines.append("user \(text(row[0])) posts=\(int(row[1]))")
            users[text(row[0]), default: 0] += 1
        }
        digest = lines.sorted()
        history = try store.rows("SELECT sequence FROM skyros_history ORDER BY sequence").map { int($0[0]) }
        lastSequence = history.last ?? -1
    }
}

/// DESIGN §4's promises, proven with processes that are really killed.
@Suite("Crash recovery and lossless sync", .serialized, .timeLimit(.minutes(3)))
struct CrashRecoveryTests {
    let process = DaemonProcessTests()

    func makeTags(_ container: URL, _ labels: [String]) throws {
        let setup = try Skyros(sharedStack: testSchema, container: container, timeout: 10)
        setup.writeSync { context in
            for label in labels { Tag.create(in: context).label = label }
        }
        #expect(setup.flush(timeout: 10))
    }

    func digest(_ container: URL, _ name: String) -> [String] {
        let text = (try? String(contentsOf: container.appendingPathComponent("digest-\(name)"), encoding: .utf8)) ?? ""
        return text.split(separator: "\n").map(String.init).sorted()
    }

    @Test(
        "kill storm: 8 clients × 500 change sets while skyrosd is SIGKILLed at random moments; nothing lost, nothing twice"
    )
    func killStorm() throws {
        let groups = process.groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        var daemon = try process.startDaemon(groups)
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g")
        try makeTags(container, (0..<8).map { "board-\($0)" })
        let perWriter = 500
        let writers = try (0..<8).map { try ChildProcess(["storm-writer", container.path, "\($0)", "\(perWriter)"]) }
        for writer in writers { #expect(writer.waitForLine("READY")) }
        #expect(
            FileManager.default.createFile(
                atPath: container.appendingPathComponent("go").path, contents: Data("go\n".utf8)))

        // SIGKILL the daemon at random moments while the writers write, at least 5 times (the
        // writers' work is sized for that: with 300 change sets each, a faster client once
        // finished after 4).
        var random = SystemRandomNumberGenerator()
        var kills = 0
        let deadline = Date().addingTimeInterval(120)
        var done = Set<Int>()
        while done.count < writers.count && Date() < deadline {  // (no kill once they are done)
            usleep(UInt32.random(in: 80_000...500_000, using: &random))  // a random moment, not a synchronisation
            for (index, writer) in writers.enumerated() where !done.contains(index) {
                if writer.waitForLine("DONE", seconds: 0.01) { done.insert(index) }
            }
            if kills < 8 && done.count < writers.count {
                kill(daemon.pid, SIGKILL)
                #expect(daemon.wait(seconds: 10) == .signalled(SIGKILL))
                kills += 1
                daemon = try process.startDaemon(groups)
            }
        }
        #expect(kills >= 5, "the writers were done after \(kills) kills")
        #expect(done.count == writers.count, "writers done: \(done.sorted())")

        // The store, read from its file with the daemon stopped.
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
        let contents = try StoreContents(container)
        #expect(contents.history == Array(1...contents.lastSequence), "the history has a gap or a duplicate")
        #expect(contents.lastSequence >= 8 * perWriter + 1)
        // No partial change set: every user came with its two posts.
        #expect(contents.digest.filter { $0.hasPrefix("user ") && !$0.hasSuffix("posts=2") }.isEmpty)
        // No change set twice.
        #expect(contents.users.values.allSatisfy { $0 == 1 })

        // The writers' main contexts converge on the store once the daemon is back.
        daemon = try process.startDaemon(groups)
        for index in 0..<8 {
            try "\(contents.lastSequence)\n".write(
                to: container.appendingPathComponent("check-\(index)"), atomically: true, encoding: .utf8)
        }
        for (index, writer) in writers.enumerated() {
            #expect(writer.wait(seconds: 40) == .exited(0))
            let output = writer.readAll()
            // Every change set a client saw acknowledged is stored, exactly once.
            let acknowledged = output.split(separator: "\n").filter { $0.hasPrefix("ACK ") }.map {
                String($0.dropFirst(4))
            }
            #expect(acknowledged.count == perWriter)
            let missing = acknowledged.filter { contents.users[$0] != 1 }
            #expect(missing.isEmpty, "writer \(index): acknowledged but not stored once: \(missing.prefix(5))")
            #expect(
                digest(container, "\(index)") == contents.digest,
                """
                writer \(index)'s main context differs from the store; it said: \
                \(output.split(separator: "\n").filter { !$0.hasPrefix("ACK ") }.suffix(5))
                """)
        }
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
    }

    @Test(
        "batch storm: 200 batch updates and deletes while skyrosd is SIGKILLed at random moments; each applied exactly once"
    )
    func batchStorm() throws {
        let groups = process.groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        var daemon = try process.startDaemon(groups)
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g")
        let count = 200
        try makeTags(container, (0..<count).map { "s\($0)" })
        let batcher = try ChildProcess(["batch-storm", container.path, "\(count)"])
        #expect(batcher.waitForLine("READY"))
        #expect(
            FileManager.default.createFile(
                atPath: container.appendingPathComponent("go").path, contents: Data("go\n".utf8)))
        var random = SystemRandomNumberGenerator()
        var kills = 0
        let deadline = Date().addingTimeInterval(90)
        var finished = false
        while !finished && Date() < deadline {
            usleep(UInt32.random(in: 5_000...100_000, using: &random))  // a random moment, not a synchronisation
            finished = batcher.waitForLine("DONE", seconds: 0.001)
            if !finished && kills < 6 {
                kill(daemon.pid, SIGKILL)
                #expect(daemon.wait(seconds: 10) == .signalled(SIGKILL))
                kills += 1
                daemon = try process.startDaemon(groups)
            }
        }
        #expect(finished, "the batches did not finish")
        #expect(batcher.wait(seconds: 30) == .exited(0))
        let output = batcher.readAll()
        #expect(!output.contains("FAIL"), "\(output.split(separator: "\n").filter { $0.hasPrefix("FAIL") })")
        #expect(kills >= 3, "the batches ended before the daemon was killed 3 times")

        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
        let contents = try StoreContents(container)
        // One change set for the tags, then one per batch: none lost, none twice.
        #expect(contents.history == Array(1...Int64(count + 1)), "history: \(contents.history)")
        let expected = (0..<count).filter { $0 % 2 == 0 }.map { "tag s\($0)=\($0 + 1)" }.sorted()
        #expect(contents.digest == expected)
    }

    @Test("a client SIGKILLed in the middle of a save: nothing of it is half stored; the others are served")
    func clientKilledMidSave() throws {
        let groups = process.groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let daemon = try process.startDaemon(groups)
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g")
        let store = try Skyros(sharedStack: testSchema, container: container, timeout: 10)
        var interrupted = 0  // kills that landed before the save was committed
        for delay: UInt32 in [0, 20_000, 60_000] {
            let saver = try ChildProcess(["big-save", container.path, "20000"])
            #expect(saver.waitForLine("SAVING"))
            usleep(delay)  // kill at different points of the send
            kill(saver.pid, SIGKILL)
            saver.wait()
            let big = try store.read { try User.count(where: #Predicate { $0.firstname == "big" }, in: $0) }
            #expect(big == 0 || big == 20_000, "a half-sent save left \(big) users")
            if big == 0 { interrupted += 1 }
            try store.writeAndWait { context in Tag.create(in: context).label = "after-\(delay)" }
            let tags = try store.read { try Tag.count(in: $0) }
            #expect(tags == Int(delay == 0 ? 1 : delay == 20_000 ? 2 : 3))
            if big == 20_000 {
                try store.writeAndWait { context in try User.all(in: context).forEach { context.delete($0) } }
            }
        }
        // Otherwise every save was whole before its kill, and nothing here was tested.
        #expect(interrupted >= 1, "no kill landed before its save was committed")
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
    }

    /// A watcher holds every tag; it is stopped with SIGSTOP while thousands of changes are
    /// made, then resumed: its main context must converge on the store.
    func stoppedWatcher(historyCount: Int, saves: Int) throws {
        let groups = process.groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let notify = try NotifySocket()
        let daemon = try ChildProcess(
            ["--group", "g", "--groups-dir", groups, "--durability", "normal", "--history-count", "\(historyCount)"],
            executable: DaemonProcessTests.skyrosd, environment: ["NOTIFY_SOCKET": notify.path])
        #expect(notify.waitFor("READY=1"))
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g")
        try makeTags(container, (0..<20).map { "t\($0)" })
        let watcher = try ChildProcess(["watcher", container.path, "w"])
        #expect(watcher.waitForLine("READY 20"))
        #expect(watcher.pause())
        let store = try Skyros(sharedStack: testSchema, container: container, timeout: 10)
        for number in 0..<saves {
            let label = "t\(number % 20)"
            store.writeSync { context in
                let tag = try Tag.first(where: #Predicate { $0.label == label }, in: context)
                tag?.uses = number
                User.create(in: context).handle = "h\(number)"
            }
        }
        // `writeSync` saves to the daemon in the background: the store read below must hold
        // every save. (Without this wait, the last save was once still in flight at the
        // SIGTERM; the client sent it again to the restarted daemon, the watcher read it there,
        // and the store read between the two daemons did not have it.)
        #expect(store.flush(timeout: 30), "the saves were not all acknowledged within 30 s")
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
        let contents = try StoreContents(container)
        let restarted = try ChildProcess(
            ["--group", "g", "--groups-dir", groups, "--history-count", "\(historyCount)"],
            executable: DaemonProcessTests.skyrosd, environment: ["NOTIFY_SOCKET": notify.path])
        #expect(notify.waitFor("READY=1"))
        try "\(contents.lastSequence)\n".write(
            to: container.appendingPathComponent("check-w"), atomically: true, encoding: .utf8)
        watcher.resume()
        #expect(watcher.wait(seconds: 40) == .exited(0))
        #expect(digest(container, "w") == contents.digest.filter { $0.hasPrefix("tag ") })
        kill(restarted.pid, SIGTERM)
        #expect(restarted.wait() == .exited(0))
    }

    @Test("a subscriber stopped with SIGSTOP while others write thousands of changes converges after it resumes")
    func stoppedSubscriber() throws {
        try stoppedWatcher(historyCount: 100_000, saves: 1_500)
    }

    @Test("a client offline past the history's retention refreshes completely and converges")
    func historyExpired() throws {
        try stoppedWatcher(historyCount: 10, saves: 300)
    }
}
