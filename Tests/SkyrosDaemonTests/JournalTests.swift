import Foundation
import Skyros
import SkyrosDaemon
import SkyrosTestSupport
import SkyrosWire
import SkyrosZeroMQ
import Testing

/// Sends requests without waiting for their replies, then collects the replies by request id.
extension RawClient {
    func send(_ body: WireMessage.Body) throws -> UInt64 {
        let id = nextID
        nextID += 1
        try dealer.send([Data(WireMessage(requestID: id, body: body).encoded())])
        return id
    }

    /// Saves one user per number, as client "c" with that save number; returns the replies.
    func saveUsers(_ numbers: ClosedRange<Int>, handlePrefix: String) throws -> [WireMessage.Body] {
        try numbers.map { number in
            try call(
                .save(
                    clientID: .named("c"), saveNumber: UInt64(number),
                    changes: ChangeSet(
                        inserted: [userSnapshot("\(handlePrefix)\(number)")])))
        }
    }

    func replies(_ count: Int) throws -> [UInt64: WireMessage.Body] {
        var result: [UInt64: WireMessage.Body] = [:]
        while result.count < count {
            let reply = try WireMessage.decode([UInt8](try dealer.receive().last!))
            result[reply.requestID] = reply.body
        }
        return result
    }
}

func historySequences(_ daemon: RunningDaemon) throws -> [Int64] {
    let store = try SQLiteStore(schema: testSchema, url: daemon.container.store)
    defer { try? store.close() }
    return try store.rows("SELECT sequence FROM skyros_history ORDER BY sequence").compactMap {
        if case .integer(let value) = $0[0] { value } else { nil }
    }
}

func teamSnapshot(_ name: String) -> Snapshot {
    Snapshot(id: .make(entityName: "Team"), values: [.text(name), .null, .null])
}

func playerSnapshot(_ name: String, team: ObjectID?) -> Snapshot {
    Snapshot(
        id: .make(entityName: "Player"),
        values: [.text(name), team.map { .blob(withUnsafeBytes(of: $0.uuid.uuid) { Data($0) }) } ?? .null])
}

@Suite("Daemon journal: history, exactly-once saves, group commit", .timeLimit(.minutes(1)))
struct JournalTests {
    @Test("a save sent again on a new connection is applied once and acknowledged with its first sequence")
    func exactlyOnce() throws {
        let daemon = try RunningDaemon()
        let first = try RawClient(daemon)
        _ = try first.hello()
        let save = WireMessage.Body.save(
            clientID: .named("c1"), saveNumber: 1, changes: ChangeSet(inserted: [userSnapshot("once")]))
        #expect(try first.call(save) == .saved(sequence: 1))
        // The reply was "lost": the client reconnects, says hello again and resends.
        let again = try RawClient(daemon)
        _ = try again.hello()
        #expect(try again.call(save) == .saved(sequence: 1))
        #expect(try again.call(.count(StoreRequest(entityName: "User"))) == .countReply(1))
        // The next save number is a new save.
        #expect(
            try again.call(
                .save(clientID: .named("c1"), saveNumber: 2, changes: ChangeSet(inserted: [userSnapshot("two")])))
                == .saved(sequence: 2))
        daemon.shutDown()
        #expect(try historySequences(daemon) == [1, 2])
    }

    @Test("sequence numbers and exactly-once records continue across a restart, without a gap")
    func restart() throws {
        let first = try RunningDaemon()
        let client = try RawClient(first)
        _ = try client.hello()
        #expect(try client.saveUsers(1...3, handlePrefix: "u") == (1...3).map { .saved(sequence: $0) })
        first.shutDown()
        let second = try RunningDaemon(directory: first.directory)
        let back = try RawClient(second)
        #expect(welcomeSequence(try back.hello()) == 3)
        #expect(
            try back.call(
                .save(clientID: .named("c"), saveNumber: 3, changes: ChangeSet(inserted: [userSnapshot("u3")])))
                == .saved(sequence: 3))
        #expect(
            try back.call(
                .save(clientID: .named("c"), saveNumber: 4, changes: ChangeSet(inserted: [userSnapshot("u4")])))
                == .saved(sequence: 4))
        guard case .changes(let events, _) = try back.call(.changesSince(1, limit: 0)) else {
            Issue.record("no changes reply")
            return
        }
        #expect(events.map(\.sequence) == [2, 3, 4])
        #expect(events.allSatisfy { $0.authorID == .named("c") && $0.inserted.count == 1 })
        second.shutDown()
        #expect(try historySequences(second) == [1, 2, 3, 4])
    }

    @Test("change sets arriving together commit in one transaction; an invalid one fails alone")
    func groupCommit() throws {
        let daemon = try RunningDaemon()
        let clients = try (0..<4).map { _ in try DirectClient(daemon) }
        for (index, client) in clients.enumerated() {
            guard case .welcome? = try client.call(RawClient.hello(name: "c\(index)")) else {
                Issue.record("no welcome")
                return
            }
        }
        // Every save is sent while the serve loop is held: its next turn takes them all.
        #expect(daemon.pause())
        var sent: [(DirectClient, UInt64, Bool)] = []
        for (index, client) in clients.enumerated() {
            for number in 1...5 {
                // The last save of client 2 repeats a unique handle of client 0: it fails alone
                // (its number is free again; a save after it under the next number would skip one).
                let handle = index == 2 && number == 5 ? "c0-1" : "c\(index)-\(number)"
                let id = client.send(
                    .save(
                        clientID: .named("client\(index)"), saveNumber: UInt64(number),
                        changes: ChangeSet(
                            inserted: [userSnapshot(handle)])))
                sent.append((client, id, !(index == 2 && number == 5)))
            }
        }
        daemon.resume()
        let setup = try RawClient(daemon)
        _ = try setup.hello()
        var sequences: [UInt64] = []
        for client in clients {
            let replies = try client.replies(5)
            for (owner, id, valid) in sent where owner === client {
                if valid {
                    guard case .saved(let sequence) = replies[id] else {
                        Issue.record("save \(id) failed: \(String(describing: replies[id]))")
                        continue
                    }
                    sequences.append(sequence)
                } else {
                    #expect(replies[id].flatMap(errorCode) == "uniqueConstraintViolation")
                }
            }
        }
        #expect(sequences.sorted() == Array(1...19))
        #expect(try setup.call(.count(StoreRequest(entityName: "User"))) == .countReply(19))
        daemon.shutDown()
        // 4 clients and the setup said hello; one commit, so one message of events.
        #expect(daemon.server.statistics == .init(commits: 1, changeSets: 19, welcomes: 5, publishes: 1))
        #expect(try historySequences(daemon) == Array(1...19))
    }

    @Test(
        "a save of a client that saved with another waits for the other's, a little: one commit; not once they stopped, nor for a client alone"
    )
    func commitDelay() throws {
        let daemon = try RunningDaemon(maximumCommitDelay: 0.1)
        defer { daemon.shutDown() }
        let (a, b) = (try DirectClient(daemon), try DirectClient(daemon))
        for (name, client) in [("a", a), ("b", b)] {
            guard case .welcome? = try client.call(RawClient.hello(name: name)) else {
                Issue.record("no welcome")
                return
            }
        }
        func save(_ client: String, _ number: UInt64) -> WireMessage.Body {
            .save(
                clientID: .named(client), saveNumber: number,
                changes: ChangeSet(inserted: [userSnapshot("\(client)\(number)")]))
        }
        // Saved together once: the daemon learns that two connections save in turn.
        #expect(daemon.pause())
        let (a1, b1) = (a.send(save("a", 1)), b.send(save("b", 1)))
        daemon.resume()
        #expect(try a.replies(1)[a1] == .saved(sequence: 1))
        #expect(try b.replies(1)[b1] == .saved(sequence: 2))
        // a's next save waits for b's, sent 5 ms later (a commit takes a few): one commit.
        let a2 = a.send(save("a", 2))
        Thread.sleep(forTimeInterval: 0.005)
        let b2 = b.send(save("b", 2))
        #expect(try a.replies(1)[a2] == .saved(sequence: 3))
        #expect(try b.replies(1)[b2] == .saved(sequence: 4))
        #expect(daemon.server.statistics.commitWaits == 1)
        // Once they have not saved for a while (100 ms), a's save alone is not held for b's.
        Thread.sleep(forTimeInterval: 0.3)
        #expect(try a.call(save("a", 3)) == .saved(sequence: 5))
        daemon.shutDown()
        #expect(daemon.server.statistics.commits == 3)
        #expect(daemon.server.statistics.commitWaits == 1)

        // One client saving alone is never waited for.
        let alone = try RunningDaemon(maximumCommitDelay: 0.1)
        defer { alone.shutDown() }
        let client = try DirectClient(alone)
        guard case .welcome? = try client.call(RawClient.hello(name: "alone")) else {
            Issue.record("no welcome")
            return
        }
        for number in 1...5 {
            #expect(try client.call(save("c", UInt64(number))) == .saved(sequence: UInt64(number)))
        }
        alone.shutDown()
        #expect(alone.server.statistics.commits == 5)
        #expect(alone.server.statistics.commitWaits == 0)
    }

    @Test(
        "while requests wait, the events of several commits go out together, in order; with no delay, each commit's alone",
        arguments: [true, false])
    func eventsHeldUnderLoad(held: Bool) throws {
        // One save a commit, so that six saves make six commits; they all wait in the socket
        // when the daemon's turn starts, so that after each commit but the last, requests wait.
        // Heartbeats (which publish what waits) are 3 s apart: the six commits take far less.
        let daemon = try RunningDaemon(
            maximumGroupCommit: 1, maximumEventDelay: held ? 60 : 0, heartbeatInterval: 3_000)
        defer { daemon.shutDown() }
        // Both subscriptions are in before the commits are published.
        let watcher = try DirectClient(daemon)
        let writer = try DirectClient(daemon)
        guard case .welcome(let welcome)? = try writer.call(RawClient.hello(name: "writer")),
            case let writerTopic = welcome.eventTopic
        else {
            Issue.record("no welcome")
            return
        }
        #expect(daemon.pause())
        let sent = (1...6).map { number in
            writer.send(
                .save(
                    clientID: .named("w"), saveNumber: UInt64(number),
                    changes: ChangeSet(
                        inserted: [userSnapshot("h\(number)")])))
        }
        daemon.resume()
        let replies = try writer.replies(6)
        #expect(sent.map { replies[$0] } == (1...6).map { .saved(sequence: UInt64($0)) })
        // The watcher's messages, heartbeats aside, until it has the six events (10 s at most).
        var messages: [[UInt64]] = []
        var topics: Set<UInt8> = []
        let deadline = Date().addingTimeInterval(10)
        while messages.joined().count < 6 && Date() < deadline {
            guard case (let topic, let message)? = try watcher.event() else { continue }
            switch message.body {
            case .event(let event) where event.isChangeSet: messages.append([event.sequence])
            case .changes(let events, _): messages.append(events.map(\.sequence))
            default: continue
            }
            topics.insert(topic)
        }
        #expect(Array(messages.joined()) == Array(1...6))
        #expect(messages.count == (held ? 1 : 6))
        // All saved on one connection: under its topic, so that the writer is not woken up.
        #expect(topics == [writerTopic])
        daemon.shutDown()
        #expect(daemon.server.statistics.commits == 6)
        #expect(daemon.server.statistics.publishes == (held ? 1 : 6))
    }

    @Test("a save linking to an object another client deleted fails; one deleted after a link nullifies it")
    func relationshipIntegrity() throws {
        let daemon = try RunningDaemon()
        let alice = try RawClient(daemon)
        let bob = try RawClient(daemon)
        _ = try alice.hello()
        _ = try bob.hello()
        // Deleted first, linked after: the link is refused, nothing dangling is stored.
        let doomed = teamSnapshot("doomed")
        #expect(
            try alice.call(.save(clientID: .named("a"), saveNumber: 1, changes: ChangeSet(inserted: [doomed])))
                == .saved(sequence: 1))
        #expect(
            try alice.call(.save(clientID: .named("a"), saveNumber: 2, changes: ChangeSet(deleted: [doomed.id])))
                == .saved(sequence: 2))
        #expect(
            errorCode(
                try bob.call(
                    .save(
                        clientID: .named("b"), saveNumber: 1,
                        changes: ChangeSet(
                            inserted: [playerSnapshot("late", team: doomed.id)])))) == "deleteDenied")
        #expect(try bob.call(.count(StoreRequest(entityName: "Player"))) == .countReply(0))
        // Linked first, deleted after: the store applies the nullify rule.
        let team = teamSnapshot("kept")
        let player = playerSnapshot("early", team: team.id)
        #expect(
            try alice.call(.save(clientID: .named("a"), saveNumber: 3, changes: ChangeSet(inserted: [team])))
                == .saved(sequence: 3))
        #expect(
            try bob.call(.save(clientID: .named("b"), saveNumber: 2, changes: ChangeSet(inserted: [player])))
                == .saved(sequence: 4))
        #expect(
            try alice.call(.save(clientID: .named("a"), saveNumber: 4, changes: ChangeSet(deleted: [team.id])))
                == .saved(sequence: 5))
        guard case .snapshotsReply(let rows) = try bob.call(.snapshots([player.id])) else {
            Issue.record("no snapshots")
            return
        }
        #expect(rows.map { $0.values[1] } == [.null])
        // The refused save took no sequence number.
        daemon.shutDown()
        #expect(try historySequences(daemon) == [1, 2, 3, 4, 5])
    }

    @Test("history past its retention is expired: the client is told, and newer history is served")
    func retention() throws {
        let daemon = try RunningDaemon(historyCount: 3)
        let client = try RawClient(daemon)
        _ = try client.hello()
        _ = try client.saveUsers(1...6, handlePrefix: "r")
        #expect(errorCode(try client.call(.changesSince(1, limit: 0))) == "historyExpired")
        guard case .changes(let kept, _) = try client.call(.changesSince(3, limit: 0)) else {
            Issue.record("no changes reply")
            return
        }
        #expect(kept.map(\.sequence) == [4, 5, 6])
        #expect(try client.call(.changesSince(6, limit: 0)) == .changes([], more: false))
    }

    @Test(
        "the count keeps exactly the last N change sets, commit after commit and across a restart with a smaller N (the DELETE skipped while it would remove nothing comes back)"
    )
    func retentionExact() throws {
        let first = try RunningDaemon(historyCount: 3)
        let client = try RawClient(first)
        _ = try client.hello()
        #expect(try client.saveUsers(1...2, handlePrefix: "x") == [.saved(sequence: 1), .saved(sequence: 2)])
        first.shutDown()
        #expect(try historySequences(first) == [1, 2])
        let second = try RunningDaemon(directory: first.directory, historyCount: 3)
        let again = try RawClient(second)
        _ = try again.hello()
        #expect(try again.saveUsers(3...6, handlePrefix: "x") == (3...6).map { .saved(sequence: UInt64($0)) })
        second.shutDown()
        #expect(try historySequences(second) == [4, 5, 6])
        let third = try RunningDaemon(directory: first.directory, historyCount: 2)
        let last = try RawClient(third)
        _ = try last.hello()
        #expect(try last.saveUsers(7...7, handlePrefix: "x") == [.saved(sequence: 7)])
        third.shutDown()
        #expect(try historySequences(third) == [6, 7])
    }

    @Test("history pruned by age keeps its newest change set: a restarted daemon goes on from its sequence")
    func pruningKeepsTheSequence() throws {
        let first = try RunningDaemon()
        let client = try RawClient(first)
        _ = try client.hello()
        _ = try client.saveUsers(1...3, handlePrefix: "p")
        first.shutDown()
        // Every change set is past an age of 0: the first commit prunes all but the newest.
        let second = try RunningDaemon(directory: first.directory, historyAge: 0)
        let again = try RawClient(second)
        #expect(welcomeSequence(try again.hello()) == 3)
        #expect(
            try again.call(
                .save(clientID: .named("c"), saveNumber: 4, changes: ChangeSet(inserted: [userSnapshot("p4")])))
                == .saved(sequence: 4))
        #expect(errorCode(try again.call(.changesSince(1, limit: 0))) == "historyExpired")
        second.shutDown()
        #expect(try historySequences(second) == [4])
        let third = try RunningDaemon(directory: first.directory)
        let last = try RawClient(third)
        #expect(welcomeSequence(try last.hello()) == 4)
        #expect(
            try last.call(
                .save(clientID: .named("c"), saveNumber: 5, changes: ChangeSet(inserted: [userSnapshot("p5")])))
                == .saved(sequence: 5))
        third.shutDown()
        #expect(try historySequences(third) == [4, 5])
    }
}
