import Foundation
import Skyros
import SkyrosTestSupport
import SkyrosWire
import SkyrosZeroMQ
import Testing
import ZeroMQReference

@testable import SkyrosShared

@Suite("Exactly-once saves", .timeLimit(.minutes(3)))
struct ExactlyOnceTests {
    @Test("a save whose reply is lost is sent again: applied once, its completion called once, without error")
    func lostReply() throws {
        let daemon = try RunningDaemon()
        let remote = try RemoteStore(schema: testSchema, container: daemon.container, timeout: 5, retryInterval: 0.3)
        let store = Skyros(sharedStack: remote)
        remote.droppedSaveRepliesForTesting = 2  // the first two acknowledgements of the save never arrive
        let probe = CompletionProbe()
        let started = Date()
        store.writeSync({ context in User.create(in: context).handle = "once" }, completion: probe.completion)
        #expect(probe.wait())
        #expect(probe.calls.count == 1)
        #expect(probe.calls.first! == nil)
        #expect(Date().timeIntervalSince(started) >= 0.6, "the save was not sent three times")
        #expect(remote.droppedSaveRepliesForTesting == 0)
        var count = -1
        store.read { count = try User.count(in: $0) }
        #expect(count == 1)
        // Nothing else arrives later: still one completion.
        #expect(!probe.wait(seconds: 0.5))
        #expect(probe.calls.count == 1)
        daemon.shutDown()
        #expect(daemon.server.statistics.changeSets == 1)
    }

    @Test(
        "a save with a unique attribute is one round trip: the store's commit is the check, naming entity, property and value"
    )
    func uniqueCheckedAtCommit() throws {
        let daemon = try RunningDaemon()
        let remote = try RemoteStore(schema: testSchema, container: daemon.container)
        let store = Skyros(sharedStack: remote)
        try store.writeAndWait { context in User.create(in: context).handle = "taken" }
        let before = remote.requestsSentForTesting
        try store.writeAndWait { context in User.create(in: context).handle = "free" }
        var sent = remote.requestsSentForTesting
        for (kind, count) in before { sent[kind, default: 0] -= count }
        #expect(sent.filter { $0.value > 0 } == [.save: 1])
        // A duplicate: refused by the daemon's store, and nothing of it is kept in any context.
        #expect {
            try store.writeAndWait { context in
                let user = User.create(in: context)
                user.handle = "taken"
                user.firstname = "Duplicate"
            }
        } throws: { error in
            guard let error = error as? SkyrosError else { return false }
            return error.code == .uniqueConstraintViolation && error.message.contains("User.handle must be unique")
                && error.message.contains("'taken'")
        }
        var names: [String] = []
        store.read { names = try User.all(in: $0).map(\.firstname) }
        #expect(!names.contains("Duplicate") && names.count == 2)
        #expect(try remote.count(StoreRequest(entityName: "User")) == 2)
    }

    @Test(
        "updating objects the main context does not hold: the write's fetch and its save, no request to read them again"
    )
    func updateOfObjectsNotHeld() throws {
        let daemon = try RunningDaemon()
        let remote = try RemoteStore(schema: testSchema, container: daemon.container)
        let store = Skyros(sharedStack: remote)
        try store.writeAndWait { context in
            for index in 0..<20 { User.create(in: context).handle = "user-\(index)" }
        }
        // The main context holds none of them (nobody read them there).
        store.mainContext.performAndWait { store.mainContext.reset() }
        let before = remote.requestsSentForTesting
        try store.writeAndWait { context in
            for user in try User.all(in: context) { user.age = 42 }
        }
        var sent = remote.requestsSentForTesting
        for (kind, count) in before { sent[kind, default: 0] -= count }
        #expect(sent.filter { $0.value > 0 } == [.fetch: 1, .save: 1])
        #expect(
            try remote.count(
                StoreRequest(
                    entityName: "User",
                    predicate: .compare(.equal, .property(scope: 0, path: ["age"]), .constant(.integer(42))))) == 20)
        var ages: Set<Int> = []
        store.read { ages = Set(try User.all(in: $0).map(\.age)) }
        #expect(ages == [42])
    }

    @Test("another process's change reaches the main context in one hop: inserted and updated values, no request")
    func oneHop() async throws {
        let daemon = try RunningDaemon()
        let remoteA = try RemoteStore(schema: testSchema, container: daemon.container)
        let remoteB = try RemoteStore(schema: testSchema, container: daemon.container)
        let a = Skyros(sharedStack: remoteA)
        let b = Skyros(sharedStack: remoteB)
        let bChanges = b.changes
        let id = try await a.write { context in
            let user = User.create(in: context)
            user.handle = "hop"
            user.firstname = "Before"
            return user.objectID
        }
        #expect(try #require(await nextChange(bChanges)).inserted.map(\.id) == [id])
        let before = remoteB.requestsSentForTesting
        // B reads the inserted object and holds it: its values came with the event.
        let first = try await b.read { context in context.object(with: id, as: User.self)?.firstname }
        #expect(first == "Before")
        try await a.write { context in context.object(with: id, as: User.self)?.firstname = "After" }
        let change = try #require(await nextChange(bChanges))
        #expect(change.updated[id]?.properties == ["firstname"])
        let second = try await b.read { context in context.object(with: id, as: User.self)?.firstname }
        #expect(second == "After")
        // No fetch of what the events carried (a catch-up by changes-since, which a loaded
        // machine's late heartbeat may cause, is not one).
        let asked = remoteB.requestsSentForTesting.filter {
            [.fetch, .snapshots, .fetchIdentifiers, .count].contains($0.key)
        }
        #expect(
            asked == before.filter { [.fetch, .snapshots, .fetchIdentifiers, .count].contains($0.key) },
            "B asked the daemon for what the events carried")
    }

    @Test("a client is not sent the events of its own saves: it counts them as merged from their replies")
    func ownEventsStayHome() async throws {
        let daemon = try RunningDaemon()
        let remoteA = try RemoteStore(schema: testSchema, container: daemon.container)
        let a = Skyros(sharedStack: remoteA)
        let remoteB = try RemoteStore(schema: testSchema, container: daemon.container)
        let b = Skyros(sharedStack: remoteB)
        let aChanges = a.changes
        for number in 1...30 {
            try await a.write { User.create(in: $0).handle = "a\(number)" }
            // Counted as merged as soon as the save returns: no event needed.
            #expect(remoteA.sequence == UInt64(number))
        }
        // B merges all of them (bounded).
        let deadline = Date().addingTimeInterval(5)
        while remoteB.sequence < 30 && Date() < deadline { try await Task.sleep(for: .milliseconds(5)) }
        #expect(remoteB.sequence == 30)
        let seenByB = try await b.read { try User.count(in: $0) }
        #expect(seenByB == 30)
        // A was sent (almost) none of its own: only what was on its way before its event
        // socket's subscription reached the daemon.
        #expect(
            remoteA.receivedEventsForTesting <= 3, "A received \(remoteA.receivedEventsForTesting) of its own events")
        // A still hears B.
        try await b.write { User.create(in: $0).handle = "b" }
        let change = try #require(await nextChange(aChanges))
        #expect(change.sequence == 31 && change.inserted.count == 1)
        // `changes` delivers during the merge; the sequence moves once the merge has returned.
        let merged = Date().addingTimeInterval(5)
        while remoteA.sequence < 31 && Date() < merged { try await Task.sleep(for: .milliseconds(5)) }
        #expect(remoteA.sequence == 31)
    }

    @Test("two clients sharing an event topic (past 255 connections) still get each other's changes, by catching up")
    func sharedEventTopic() async throws {
        let daemon = try RunningDaemon()
        let remoteA = try RemoteStore(schema: testSchema, container: daemon.container)
        let a = Skyros(sharedStack: remoteA)
        // 254 more connections say hello: the daemon's topics go round, and B gets A's.
        let description = try WireMessage.Hello(schema: testSchema, clientName: "other").schemaDescription
        let context = try ZeroMQContext()
        var others: [ZeroMQSocket] = []
        defer { for socket in others { socket.close() } }
        for index in 0..<254 {
            let socket = try ZeroMQSocket(context: context, kind: .dealer)
            others.append(socket)
            try socket.setReceiveTimeout(milliseconds: 5_000)
            try socket.connect(daemon.container.requestsEndpoint)
            // (A hello's description must have its fingerprint: the daemon checks every one.)
            try socket.send([
                Data(
                    WireMessage(
                        requestID: 1,
                        body: .hello(
                            WireMessage.Hello(
                                schemaFingerprint: testSchema.fingerprint, schemaVersion: 1,
                                clientName: "other \(index)", pid: 1,
                                schemaDescription: description))
                    ).encoded())
            ])
            _ = try socket.receive()
        }
        let remoteB = try RemoteStore(schema: testSchema, container: daemon.container)
        let b = Skyros(sharedStack: remoteB)
        #expect(remoteA.eventTopicForTesting != nil && remoteA.eventTopicForTesting == remoteB.eventTopicForTesting)
        let aChanges = a.changes
        let id = try await insertUser(handle: "b", into: b)
        // Not sent to A (B's topic is A's own), yet merged: the heartbeat shows the gap.
        let change = try #require(await nextChange(aChanges))
        #expect(change.inserted.map(\.id) == [id])
        #expect(remoteA.receivedEventsForTesting == 0)
        let handle = try await a.read { context in context.object(with: id, as: User.self)?.handle }
        #expect(handle == "b")
    }

    @Test("a daemon that forgets its connections past its maximum keeps serving them: each says hello again")
    func forgottenConnections() async throws {
        let daemon = try RunningDaemon(maximumConnections: 2)
        let a = try Skyros(sharedStack: testSchema, container: daemon.container.url)
        let b = try Skyros(sharedStack: testSchema, container: daemon.container.url)
        let bChanges = b.changes
        // A third connection: the daemon forgets A's and B's.
        let c = try Skyros(sharedStack: testSchema, container: daemon.container.url)
        let id = try await insertUser(handle: "after", into: a)
        let change = try #require(await nextChange(bChanges))
        #expect(change.inserted.map(\.id) == [id])
        let seenByB = try await b.read { try User.count(in: $0) }
        let seenByC = try await c.read { try User.count(in: $0) }
        #expect(seenByB == 1 && seenByC == 1)
        try await c.write { User.create(in: $0).handle = "c" }
        let total = try await a.read { try User.count(in: $0) }
        #expect(total == 2)
        // The clients were forgotten, and said hello again, more than once.
        #expect(daemon.server.statistics.welcomes > 3)
    }

    @Test("a call made while no daemon answers fails with daemonUnavailable after its timeout, not before")
    func unavailable() throws {
        let daemon = try RunningDaemon()
        let remote = try RemoteStore(schema: testSchema, container: daemon.container, timeout: 1, retryInterval: 0.2)
        daemon.shutDown()
        let started = Date()
        #expect {
            _ = try remote.count(StoreRequest(entityName: "User"))
        } throws: { error in
            (error as? SkyrosError)?.code == .daemonUnavailable
        }
        let elapsed = Date().timeIntervalSince(started)
        #expect(elapsed >= 0.9 && elapsed < 5, "waited \(elapsed) s")
    }
}
