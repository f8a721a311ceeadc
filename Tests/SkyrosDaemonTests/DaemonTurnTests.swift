import Foundation
import Skyros
import SkyrosTestSupport
import SkyrosWire
import Testing

@testable import SkyrosDaemon

/// The daemon's turn without sockets: what a test sends, and the actions performed the way
/// ``DaemonServer`` performs them — commits and migrations run against a real store in a
/// temporary directory; replies, reads and publications are recorded in order.
final class TurnTranscript {
    let directory: URL
    var turn: DaemonTurn
    /// What the server would have sent, in order.
    var replies: [(identity: Data, message: WireMessage)] = []
    var reads: [ReadWorker.Job] = []
    var published: [(topic: [UInt8], message: WireMessage, changeSets: Int)] = []
    var welcomed: [Data] = []
    /// Whether requests wait in the socket when the turn asks.
    var requestsWaiting = false
    private var nextID: UInt64 = 1
    private let lines = LogLines()

    init(maximumEventDelay: TimeInterval = 0, maximumConnections: Int = 100) throws {
        directory = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("turn-\(UUID().uuidString)")
        let container = GroupContainer(url: directory.appendingPathComponent("g"))
        try container.prepare()
        let lines = self.lines
        turn = DaemonTurn(
            settings: .init(
                container: container, durability: .normal, maximumMessageSize: WireProtocol.maximumMessageSize,
                retention: .init(count: 100_000, age: 7 * 86_400), maximumEventDelay: maximumEventDelay,
                maximumConnections: maximumConnections, log: { lines.append($0) }),
            store: nil, opened: nil)
    }

    deinit {
        try? turn.store?.close()
        try? FileManager.default.removeItem(at: directory)
    }

    /// The lines the turn logged.
    var log: [String] { lines.all }

    /// Sends a request from the connection `identity`; returns its request ID.
    @discardableResult
    func send(_ identity: String, _ body: WireMessage.Body, refusal: String? = nil) -> UInt64 {
        let id = nextID
        nextID += 1
        arrive([Data(identity.utf8), Data(WireMessage(requestID: id, body: body).encoded())], refusal: refusal)
        return id
    }

    /// Hands the turn raw frames (the identity first).
    func arrive(_ frames: [Data], refusal: String? = nil) {
        perform(turn.received(DaemonTurn.Arrival(frames: frames, refusal: refusal)))
    }

    /// Nothing more waits in the socket: the turn ends.
    func endOfInput() {
        perform(turn.endOfInput(requestsWaiting: { requestsWaiting }))
    }

    /// The replies sent to `identity`, by request ID, taken.
    func takeReplies(_ identity: String) -> [UInt64: WireMessage.Body] {
        var taken: [UInt64: WireMessage.Body] = [:]
        replies.removeAll { reply in
            guard reply.identity == Data(identity.utf8) else { return false }
            taken[reply.message.requestID] = reply.message.body
            return true
        }
        return taken
    }

    func perform(_ actions: [DaemonTurn.Action]) {
        for action in actions {
            switch action {
            case .reply(let identity, let message): replies.append((identity, message))
            case .read(let job): reads.append(job)
            case .commit(let saves, let resetting):
                perform(turn.commit(saves, resetting: resetting, requestsWaiting: { requestsWaiting }))
            case .publish(let topic, let message, let changeSets):
                if let decoded = try? WireMessage.decode(message) { published.append((topic, decoded, changeSets)) }
            case .migrate(let identity, let hello, let requestID):
                perform(turn.migrate(identity, hello: hello, requestID: requestID))
            case .welcomed(let identity, _, _): welcomed.append(identity)
            case .committed, .caughtUp, .queued: break
            }
        }
    }
}

func save(_ client: String, _ number: UInt64, handle: String) -> WireMessage.Body {
    .save(clientID: .named(client), saveNumber: number, changes: ChangeSet(inserted: [userSnapshot(handle)]))
}

func hello(_ name: String, schema: Schema = testSchema) throws -> WireMessage.Body {
    .hello(try WireMessage.Hello(schema: schema, clientName: name))
}

/// The daemon's turn as transcripts: requests in, actions out, no socket.
@Suite("Daemon turn")
struct DaemonTurnTests {
    @Test(
        "the first hello creates the store; saves wait for the end of the turn and commit together; replies, then one event"
    )
    func helloAndGroupCommit() throws {
        let t = try TurnTranscript()
        let welcome = t.send("a", try hello("alpha"))
        guard case .welcome(let answer)? = t.takeReplies("a")[welcome] else {
            Issue.record("no welcome")
            return
        }
        #expect(answer.sequence == 0 && t.turn.store != nil && t.welcomed == [Data("a".utf8)])
        _ = t.send("b", try hello("beta"))
        _ = t.takeReplies("b")
        let first = t.send("a", save("a", 1, handle: "a1"))
        let second = t.send("b", save("b", 1, handle: "b1"))
        #expect(t.replies.isEmpty && t.turn.pending.count == 2)  // they wait for the turn's end
        t.endOfInput()
        #expect(t.takeReplies("a") == [first: .saved(sequence: 1)])
        #expect(t.takeReplies("b") == [second: .saved(sequence: 2)])
        // Saved by two connections: one message to everyone.
        #expect(t.published.count == 1 && t.published[0].topic == [WireProtocol.broadcastTopic])
        guard case .changes(let events, false) = t.published[0].message.body else {
            Issue.record("not one changes message")
            return
        }
        #expect(events.map(\.sequence) == [1, 2] && events.map(\.author) == ["alpha", "beta"])
        #expect(t.turn.sequence == 2)
    }

    @Test("requests before a hello are refused with helloRequired, and commit nothing")
    func helloRequired() throws {
        let t = try TurnTranscript()
        let id = t.send("x", save("x", 1, handle: "x1"))
        t.endOfInput()
        #expect(errorCode(t.takeReplies("x")[id]!) == "helloRequired")
        _ = t.send("a", try hello("alpha"))
        let early = t.send("x", .count(StoreRequest(entityName: "User")))
        #expect(errorCode(t.takeReplies("x")[early]!) == "helloRequired")
        #expect(t.reads.isEmpty && t.turn.sequence == 0)
    }

    @Test(
        "malformed frames, undecodable bytes and save number 0 get malformedMessage with the request's ID; a refused peer permissionDenied"
    )
    func badInput() throws {
        let t = try TurnTranscript()
        _ = t.send("a", try hello("alpha"))
        _ = t.takeReplies("a")
        let bytes = Data(WireMessage(requestID: 42, body: .count(StoreRequest(entityName: "User"))).encoded())
        t.arrive([Data("a".utf8), bytes, bytes])
        #expect(t.takeReplies("a").mapValues(errorCode) == [42: "malformedMessage"])
        t.arrive([Data("a".utf8)])
        #expect(t.takeReplies("a").mapValues(errorCode) == [0: "malformedMessage"])
        t.arrive([Data("a".utf8), Data([1, 2, 3])])
        let codes = t.takeReplies("a").values.map { errorCode($0) ?? "" }
        #expect(codes.count == 1 && ["malformedMessage", "unsupportedProtocolVersion"].contains(codes[0]))
        let zero = t.send("a", save("a", 0, handle: "z"))
        #expect(t.takeReplies("a").mapValues(errorCode) == [zero: "malformedMessage"])
        let refused = t.send("a", .count(StoreRequest(entityName: "User")), refusal: "not a member")
        #expect(t.takeReplies("a").mapValues(errorCode) == [refused: "permissionDenied"])
        t.arrive([])  // nothing at all: no reply
        #expect(t.replies.isEmpty && t.reads.isEmpty && t.turn.pending.isEmpty)
    }

    @Test("fetches, counts and faults of sessions go to the reader; changes-since is answered in the turn")
    func readsAndCatchUp() throws {
        let t = try TurnTranscript()
        _ = t.send("a", try hello("alpha"))
        _ = t.send("a", save("a", 1, handle: "a1"))
        t.endOfInput()
        _ = t.takeReplies("a")
        let count = t.send("a", .count(StoreRequest(entityName: "User")))
        #expect(t.reads.map(\.requestID) == [count] && t.replies.isEmpty)
        let since = t.send("a", .changesSince(0, limit: 0))
        guard case .changes(let events, false)? = t.takeReplies("a")[since] else {
            Issue.record("no changes reply")
            return
        }
        #expect(events.map(\.sequence) == [1])
    }

    @Test(
        "a deleteAll commits the saves that came first, then the reset, in one turn; events before the reset go first")
    func deleteAll() throws {
        let t = try TurnTranscript()
        _ = t.send("a", try hello("alpha"))
        let saved = t.send("a", save("a", 1, handle: "a1"))
        let reset = t.send("a", .deleteAll(clientID: .named("a"), saveNumber: 2))
        // Committed at once, without waiting for the turn's end.
        let replies = t.takeReplies("a")
        #expect(replies[saved] == .saved(sequence: 1) && replies[reset] == .saved(sequence: 2))
        #expect(t.turn.pending.isEmpty)
        let kinds = t.published.flatMap { publication -> [ChangeEvent.Kind] in
            switch publication.message.body {
            case .event(let event): [event.kind]
            case .changes(let events, _): events.map(\.kind)
            default: []
            }
        }
        #expect(kinds == [.changes, .reset])
        #expect(t.log.contains { $0.hasPrefix("reset (deleteAll) by 'alpha'") })
    }

    @Test("a save resent in the same turn, or after its reply was lost, is applied once")
    func exactlyOnce() throws {
        let t = try TurnTranscript()
        _ = t.send("a", try hello("alpha"))
        _ = t.takeReplies("a")
        let first = t.send("a", save("a", 1, handle: "a1"))
        let again = t.send("a", save("a", 1, handle: "a1"))
        t.endOfInput()
        #expect(t.takeReplies("a") == [first: .saved(sequence: 1), again: .saved(sequence: 1)])
        // A new connection of the same client (a reconnect) resends it.
        _ = t.send("a2", try hello("alpha"))
        _ = t.takeReplies("a2")
        let resent = t.send("a2", save("a", 1, handle: "a1"))
        t.endOfInput()
        #expect(t.takeReplies("a2")[resent] == .saved(sequence: 1))
        #expect(t.turn.sequence == 1)
    }

    @Test("a change set that breaks a unique constraint fails alone among the turn's")
    func failsAlone() throws {
        let t = try TurnTranscript()
        _ = t.send("a", try hello("alpha"))
        _ = t.send("b", try hello("beta"))
        _ = t.takeReplies("a")
        _ = t.takeReplies("b")
        let good = t.send("a", save("a", 1, handle: "same"))
        let bad = t.send("b", save("b", 1, handle: "same"))
        let other = t.send("a", save("a", 2, handle: "other"))
        t.endOfInput()
        let a = t.takeReplies("a")
        #expect(a[good] == .saved(sequence: 1) && a[other] == .saved(sequence: 2))
        #expect(errorCode(t.takeReplies("b")[bad]!) == "uniqueConstraintViolation")
    }

    @Test("while requests wait, events are held; a turn that ends with nothing waiting publishes them together")
    func heldEvents() throws {
        let t = try TurnTranscript(maximumEventDelay: 60)
        _ = t.send("a", try hello("alpha"))
        t.requestsWaiting = true
        _ = t.send("a", save("a", 1, handle: "a1"))
        t.endOfInput()
        _ = t.send("a", save("a", 2, handle: "a2"))
        t.endOfInput()
        #expect(t.published.isEmpty && t.turn.holdsEvents)
        t.requestsWaiting = false
        t.endOfInput()
        #expect(t.published.count == 1 && t.published[0].changeSets == 2)
        #expect(!t.turn.holdsEvents)
    }

    @Test("a heartbeat is due every interval and publishes held events first")
    func heartbeat() throws {
        let t = try TurnTranscript(maximumEventDelay: 60)
        let start = Date()
        t.perform(t.turn.heartbeatIfDue(every: 1, now: start))
        t.perform(t.turn.heartbeatIfDue(every: 1, now: start.addingTimeInterval(0.5)))
        #expect(t.published.count == 1 && t.published[0].changeSets == 0)
        _ = t.send("a", try hello("alpha"))
        t.requestsWaiting = true
        _ = t.send("a", save("a", 1, handle: "a1"))
        t.endOfInput()
        t.perform(t.turn.heartbeatIfDue(every: 1, now: start.addingTimeInterval(1)))
        #expect(t.published.map(\.changeSets) == [0, 1, 0])
        guard case .event(let beat) = t.published[2].message.body else {
            Issue.record("no heartbeat")
            return
        }
        #expect(beat.kind == .heartbeat && beat.sequence == 1)
    }

    @Test("a hello of a newer schema version commits the turn's saves first, then asks for the migration")
    func newerHelloCommitsFirst() throws {
        let t = try TurnTranscript()
        _ = t.send("a", try hello("alpha"))
        let saved = t.send("a", save("a", 1, handle: "a1"))
        var newer = try WireMessage.Hello(schema: testSchema, clientName: "newer")
        newer.schemaVersion = 2
        let actions = t.turn.received(
            DaemonTurn.Arrival(frames: [
                Data("n".utf8), Data(WireMessage(requestID: 7, body: .hello(newer)).encoded()),
            ]))
        guard actions.count == 2, case .commit(let saves, nil) = actions[0], case .migrate(_, _, 7) = actions[1] else {
            Issue.record("not a commit, then a migration: \(actions)")
            return
        }
        #expect(saves.map(\.requestID) == [saved])
        t.perform([actions[0]])
        #expect(t.takeReplies("a")[saved] == .saved(sequence: 1))
    }

    @Test(
        "a newer hello migrates the store: schemaChanged is published, the older session is projected and gets copies in its terms"
    )
    func migrationAndMixedVersions() throws {
        let t = try TurnTranscript()
        _ = t.send("old", try hello("v1", schema: MixedVersionModels.v1))
        _ = t.send(
            "old",
            .save(
                clientID: .named("old"), saveNumber: 1,
                changes: ChangeSet(inserted: [
                    Snapshot(id: .make(entityName: "Task"), values: [.text("a"), .integer(0)])
                ])))
        let newer = t.send("new", try hello("v2", schema: MixedVersionModels.v2))
        guard case .welcome(let welcome)? = t.takeReplies("new")[newer] else {
            Issue.record("no welcome for v2")
            return
        }
        // The v1 save of the turn was committed first, in v1; then the schemaChanged event.
        #expect(t.takeReplies("old").values.contains(.saved(sequence: 1)))
        #expect(welcome.schemaVersion == 2 && welcome.sequence == 2 && t.turn.schemaVersion == 2)
        // In the store's terms (a one-byte topic), and a copy of schemaChanged for the v1 session.
        let kinds = t.published.compactMap { publication -> String? in
            guard case .event(let event) = publication.message.body else { return nil }
            return "\(event.kind)/\(publication.topic.count)"
        }
        #expect(kinds == ["changes/1", "schemaChanged/1", "schemaChanged/2"])
        #expect(t.log.contains { $0.hasPrefix("migrated the store from schema version 1 to 2") })
        // The v1 session is still served, projected: its save is translated, and its event
        // goes out twice, in the store's terms and, under its topic and version, in v1's.
        t.published = []
        let saved = t.send(
            "old",
            .save(
                clientID: .named("old"), saveNumber: 2,
                changes: ChangeSet(inserted: [
                    Snapshot(id: .make(entityName: "Task"), values: [.text("b"), .integer(1)])
                ])))
        t.endOfInput()
        #expect(t.takeReplies("old")[saved] == .saved(sequence: 3))
        #expect(t.published.count == 2 && t.published[1].topic.count == 2 && t.published[1].topic.last == 1)
        let values = t.published.map { publication -> Int in
            guard case .event(let event) = publication.message.body else { return -1 }
            return event.inserted.first?.values.count ?? -1
        }
        #expect(values == [4, 2])  // v2 has four attributes, v1 two
        // A version the store cannot be migrated to is refused; the store stays at 2.
        let bad = t.send("bad", try hello("v3", schema: MixedVersionModels.badV3))
        #expect(t.takeReplies("bad")[bad].flatMap(errorCode) == "migrationFailed")
        #expect(t.turn.schemaVersion == 2)
    }
}
