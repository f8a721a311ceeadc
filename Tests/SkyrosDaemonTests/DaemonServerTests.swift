import Foundation
import Skyros
import SkyrosDaemon
import SkyrosTestSupport
import SkyrosWire
import SkyrosZeroMQ
import Testing
import ZeroMQReference

/// A raw protocol client: a DEALER and a SUB socket.
final class RawClient {
    let context: ZeroMQContext
    let dealer: ZeroMQSocket
    let subscriber: ZeroMQSocket
    var nextID: UInt64 = 1

    init(_ daemon: RunningDaemon) throws {
        context = try ZeroMQContext()
        subscriber = try ZeroMQSocket(context: context, kind: .subscriber)
        try subscriber.subscribe()
        try subscriber.connect(daemon.container.eventsEndpoint)
        dealer = try ZeroMQSocket(context: context, kind: .dealer)
        try dealer.setReceiveTimeout(milliseconds: 5_000)
        try dealer.connect(daemon.container.requestsEndpoint)
    }

    /// The next message on the event socket, with its topic (the first of its two frames).
    func event() throws -> (topic: UInt8, message: WireMessage) {
        let frames = try subscriber.receive()
        #expect(frames.count == 2 && frames[0].count == 1)
        return (frames[0].first ?? 0, try WireMessage.decode([UInt8](frames.last!)))
    }

    func raw(_ frames: [Data]) throws -> WireMessage {
        try dealer.send(frames)
        return try WireMessage.decode([UInt8](try dealer.receive().last!))
    }

    func call(_ body: WireMessage.Body) throws -> WireMessage.Body {
        let id = nextID
        nextID += 1
        let reply = try raw([Data(WireMessage(requestID: id, body: body).encoded())])
        #expect(reply.requestID == id)
        return reply.body
    }

    func hello(_ schema: Schema = testSchema) throws -> WireMessage.Body {
        try call(Self.hello(schema, name: "test"))
    }

    /// The hello of a client of the current protocol with `schema`.
    static func hello(_ schema: Schema = testSchema, name: String) throws -> WireMessage.Body {
        .hello(try WireMessage.Hello(schema: schema, clientName: name))
    }
}

/// The sequence of a welcome in the current protocol version that gives a connection its own
/// event topic; nil for anything else.
func welcomeSequence(_ body: WireMessage.Body) -> UInt64? {
    guard case .welcome(let welcome) = body, welcome.protocolVersion == UInt64(WireProtocol.version),
        welcome.eventTopic != WireProtocol.broadcastTopic
    else { return nil }
    return welcome.sequence
}

extension UUID {
    /// A client ID for tests, the same for the same name.
    static func named(_ name: String) -> UUID {
        var bytes = [UInt8](repeating: 0, count: 16)
        for (index, byte) in name.utf8.enumerated() { bytes[index % 16] ^= byte &+ UInt8(truncatingIfNeeded: index) }
        bytes[15] ^= UInt8(truncatingIfNeeded: name.utf8.count)
        return UUID(
            uuid: (
                bytes[0], bytes[1], bytes[2], bytes[3], bytes[4], bytes[5], bytes[6], bytes[7], bytes[8],
                bytes[9], bytes[10], bytes[11], bytes[12], bytes[13], bytes[14], bytes[15]
            ))
    }
}

func errorCode(_ body: WireMessage.Body) -> String? {
    if case .error(let code, _) = body { return code }
    return nil
}

func userSnapshot(_ handle: String) -> Snapshot {
    Snapshot(
        id: .make(entityName: "User"),
        values: [.text("First"), .text("Last"), .integer(1), .null, .text(handle), .null])
}

@Suite("Daemon server", .timeLimit(.minutes(1)))
struct DaemonServerTests {
    @Test("hello, save, fetch and count over the wire; the save is published")
    func session() throws {
        let daemon = try RunningDaemon()
        let client = try RawClient(daemon)
        guard case .welcome(let welcome) = try client.hello(), welcome.sequence == 0,
            case let topic = welcome.eventTopic, topic != WireProtocol.broadcastTopic
        else {
            Issue.record("no welcome")
            return
        }
        // Wait until the subscription is live: ZeroMQ's slow joiner.
        var saved = try client.call(
            .save(clientID: .named("c1"), saveNumber: 1, changes: ChangeSet(inserted: [userSnapshot("a")])))
        #expect(saved == .saved(sequence: 1))
        saved = try client.call(
            .save(clientID: .named("c1"), saveNumber: 2, changes: ChangeSet(inserted: [userSnapshot("b")])))
        #expect(saved == .saved(sequence: 2))
        #expect(try client.call(.count(StoreRequest(entityName: "User"))) == .countReply(2))
        guard
            case .snapshotsReply(let rows) = try client.call(
                .fetch(
                    StoreRequest(
                        entityName: "User", predicate: .equals("handle", .text("b")))))
        else {
            Issue.record("no snapshots")
            return
        }
        #expect(rows.map { $0.values[4] } == [.text("b")])
        // Events: a subscription becomes live asynchronously (ZeroMQ's slow joiner), so save
        // until one event arrives (bounded), then every later save arrives, in order.
        var number: UInt64 = 2
        var first: ChangeEvent?
        let deadline = Date().addingTimeInterval(5)
        while first == nil && Date() < deadline {
            number += 1
            _ = try client.call(
                .save(
                    clientID: .named("c1"), saveNumber: number,
                    changes: ChangeSet(inserted: [userSnapshot("w\(number)")])))
            if try client.subscriber.waitForInput(milliseconds: 20),
                case (let eventTopic, let message) = try client.event(),
                case .event(let event) = message.body, event.isChangeSet  // not a heartbeat
            {
                // An event of one save comes under its connection's topic, which its own
                // client does not subscribe to (this raw one subscribes to everything).
                #expect(eventTopic == topic)
                first = event
            }
        }
        let firstEvent = try #require(first)
        #expect(firstEvent.authorID == .named("c1") && firstEvent.author == "test" && firstEvent.inserted.count == 1)
        #expect(firstEvent.inserted.first?.values == userSnapshot("a").values)  // the values travel with the event
        for extra in 1...3 {
            #expect(
                try client.call(
                    .save(
                        clientID: .named("c1"), saveNumber: number + UInt64(extra),
                        changes: ChangeSet(
                            inserted: [userSnapshot("e\(extra)")]))) == .saved(sequence: number + UInt64(extra)))
        }
        // The next change events are those three, in order; heartbeats (empty author) come between.
        try client.subscriber.setReceiveTimeout(milliseconds: 5_000)
        var sequences: [UInt64] = []
        var heartbeats = 0
        let eventsDeadline = Date().addingTimeInterval(10)
        while sequences.count < 3 && Date() < eventsDeadline {
            let (eventTopic, message) = try client.event()
            switch message.body {
            case .event(let event) where !event.isChangeSet:
                #expect(eventTopic == WireProtocol.broadcastTopic)
                heartbeats += 1
            case .event(let event):
                if event.sequence > number { sequences.append(event.sequence) }
            case .changes(let events, _):  // a daemon under load may publish several together
                #expect(eventTopic == topic)
                sequences += events.map(\.sequence).filter { $0 > number }
            default:
                Issue.record("not an event: \(message.body)")
                return
            }
        }
        #expect(sequences == [number + 1, number + 2, number + 3])
        // Heartbeats carry the current sequence.
        let heartbeatDeadline = Date().addingTimeInterval(10)
        while Date() < heartbeatDeadline {
            guard case .event(let event) = try client.event().message.body else { break }
            if !event.isChangeSet {
                #expect(event.sequence == number + 3)
                break
            }
        }
        // Changes since a sequence come from the history, in order.
        guard case .changes(let missed, _) = try client.call(.changesSince(number, limit: 0)) else {
            Issue.record("no changes reply")
            return
        }
        #expect(missed.map(\.sequence) == [number + 1, number + 2, number + 3])
    }

    @Test("bad input gets error replies and the daemon keeps serving, losing nothing")
    func badInput() throws {
        let daemon = try RunningDaemon()
        let client = try RawClient(daemon)
        // Before hello.
        #expect(errorCode(try client.call(.count(StoreRequest(entityName: "User")))) == "helloRequired")
        #expect(welcomeSequence(try client.hello()) == 0)
        #expect(
            try client.call(
                .save(clientID: .named("c"), saveNumber: 1, changes: ChangeSet(inserted: [userSnapshot("kept")])))
                == .saved(sequence: 1))
        // Garbage, a wrong version, an unknown type, extra frames.
        #expect(errorCode(try client.raw([Data([0xFF, 0x00, 0x01])]).body) == "unsupportedProtocolVersion")
        #expect(errorCode(try client.raw([Data([WireProtocol.version, 250, 1])]).body) == "malformedMessage")
        #expect(errorCode(try client.raw([Data()]).body) == "malformedMessage")
        #expect(errorCode(try client.raw([Data([1]), Data([2])]).body) == "malformedMessage")
        // Unknown entities and properties, wrong value types and counts, garbage predicates.
        // (A refused save does not use up its number: each one below is save 2 again.)
        #expect(errorCode(try client.call(.count(StoreRequest(entityName: "Nope")))) == "unknownEntity")
        #expect(
            errorCode(
                try client.call(
                    .fetch(
                        StoreRequest(
                            entityName: "User", predicate: .equals("nope", .integer(1)))))) == "unsupportedPredicate")
        var wrongType = userSnapshot("x")
        wrongType.values[2] = .text("not a number")
        #expect(
            errorCode(
                try client.call(.save(clientID: .named("c"), saveNumber: 2, changes: ChangeSet(inserted: [wrongType]))))
                == "typeMismatch")
        var short = userSnapshot("y")
        short.values = StoredValues(short.values.dropLast(3))
        #expect(
            errorCode(
                try client.call(.save(clientID: .named("c"), saveNumber: 2, changes: ChangeSet(inserted: [short]))))
                == "valueNotStorable")
        #expect(
            errorCode(
                try client.call(
                    .save(
                        clientID: .named("c"), saveNumber: 2,
                        changes: ChangeSet(
                            updated: [ChangeSet.Update(id: .make(entityName: "User"), changes: [99: .null])]))))
                == "valueNotStorable")
        // A duplicate unique value fails alone.
        #expect(
            errorCode(
                try client.call(
                    .save(clientID: .named("c"), saveNumber: 2, changes: ChangeSet(inserted: [userSnapshot("kept")]))))
                == "uniqueConstraintViolation")
        // Still serving, nothing committed lost.
        #expect(try client.call(.count(StoreRequest(entityName: "User"))) == .countReply(1))
    }

    @Test("a well-behaved client is served between every kind of bad input, and loses nothing")
    func badInputBesideAGoodClient() throws {
        let daemon = try RunningDaemon()
        let good = try RawClient(daemon)
        #expect(welcomeSequence(try good.hello()) == 0)
        var saved = 0
        /// The good client saves one user and counts them all.
        func goodClientIsServed(_ sourceLocation: SourceLocation = #_sourceLocation) throws {
            saved += 1
            #expect(
                try good.call(
                    .save(
                        clientID: .named("good"), saveNumber: UInt64(saved),
                        changes: ChangeSet(
                            inserted: [userSnapshot("good-\(saved)")]))) == .saved(sequence: UInt64(saved)),
                sourceLocation: sourceLocation)
            #expect(
                try good.call(.count(StoreRequest(entityName: "User"))) == .countReply(saved),
                sourceLocation: sourceLocation)
        }
        let bad = try RawClient(daemon)
        _ = try bad.hello()
        var garbage = SystemRandomNumberGenerator()
        let badInputs: [[Data]] = [
            [Data((0..<64).map { _ in UInt8.random(in: 0...255, using: &garbage) })],  // noise
            [Data([WireProtocol.version, 77, 1])],  // unknown message type
            [Data([WireProtocol.version - 1, 6, 1])],  // the previous protocol version
            [Data([WireProtocol.version, 2, 1, 1, 0xFF])],  // a fetch cut short
            [
                Data(
                    WireMessage(
                        requestID: 9,
                        body: .fetch(
                            StoreRequest(
                                entityName: "User",
                                predicate: .compare(.less, .property(scope: 7, path: ["age"]), .constant(.null))))
                    ).encoded())
            ],
            [Data(WireMessage(requestID: 9, body: .fetch(StoreRequest(entityName: "Nope"))).encoded())],
            [
                Data(
                    WireMessage(
                        requestID: 9,
                        body: .fetch(
                            StoreRequest(
                                entityName: "User", sortKeys: [SortKey(property: "nope", ascending: true)]))
                    ).encoded())
            ],
            [
                Data(
                    WireMessage(
                        requestID: 9,
                        body: .save(
                            clientID: .named("bad"), saveNumber: 1,
                            changes: ChangeSet(
                                updated: [
                                    ChangeSet.Update(id: .make(entityName: "User"), changes: [2: .text("not an int")])
                                ]))
                    ).encoded())
            ],
            [Data(WireMessage(requestID: 9, body: .snapshots([.make(entityName: "Nope")])).encoded())],
        ]
        for frames in badInputs {
            let reply = try bad.raw(frames)
            #expect(errorCode(reply.body) != nil, "\(frames.map(\.count)): \(reply)")
            try goodClientIsServed()
        }
        // Too large to even be read: ZeroMQ drops it and the connection, no reply.
        let huge = try RawClient(daemon)
        try huge.dealer.setReceiveTimeout(milliseconds: 500)
        try huge.dealer.send([Data(count: WireProtocol.maximumMessageSize + 1)])
        #expect(throws: ZeroMQError.self) { _ = try huge.dealer.receive() }
        try goodClientIsServed()
        daemon.shutDown()
        #expect(try historySequences(daemon) == (1...Int64(saved)).map { $0 })
    }

    @Test("a hello with a name over 256 bytes is refused, creates no store, and is not logged whole")
    func longNameCreatesNoStore() throws {
        let lines = LogLines()
        let daemon = try RunningDaemon(log: { lines.append($0) })
        let client = try RawClient(daemon)
        let name = String(repeating: "n", count: 1 << 20)
        #expect(errorCode(try client.call(RawClient.hello(name: name))) == "malformedMessage")
        #expect(!FileManager.default.fileExists(atPath: daemon.container.store.path))
        #expect(welcomeSequence(try client.hello()) == 0)
        #expect(lines.all.allSatisfy { $0.utf8.count < 1_024 })
    }

    @Test("a client with another schema is refused")
    func schemaMismatch() throws {
        let daemon = try RunningDaemon()
        #expect(welcomeSequence(try RawClient(daemon).hello()) == 0)
        let other = try RawClient(daemon)
        #expect(errorCode(try other.hello(Schema([Tag.self]))) == "schemaMismatch")
        #expect(
            errorCode(
                try other.call(
                    .hello(
                        WireMessage.Hello(
                            protocolVersion: UInt64(WireProtocol.version) + 1,
                            schemaFingerprint: testSchema.fingerprint, schemaVersion: 1,
                            clientName: "future", pid: 1, schemaDescription: []))))
                == "unsupportedProtocolVersion")
    }

    @Test("serve calls its turn hook at every turn, idle turns included (skyrosd pings the watchdog from it)")
    func turnHook() throws {
        let directory = "/tmp/skd-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let server = try DaemonServer(
            configuration: .init(
                container: GroupContainer(url: URL(fileURLWithPath: directory).appendingPathComponent("g"))))
        var turns = 0
        let started = Date()
        server.serve(pollInterval: 10) {
            turns += 1
            if turns == 5 { server.handle.stop() }
        }
        server.close()
        #expect(turns == 5)
        #expect(Date().timeIntervalSince(started) < 5)
    }

    @Test("a second daemon for the same group is refused and the first keeps serving")
    func secondDaemon() throws {
        let daemon = try RunningDaemon()
        #expect {
            _ = try DaemonServer(configuration: .init(container: daemon.container))
        } throws: { error in
            (error as? SkyrosError)?.code == .groupLocked
        }
        #expect(welcomeSequence(try RawClient(daemon).hello()) == 0)
    }
}
