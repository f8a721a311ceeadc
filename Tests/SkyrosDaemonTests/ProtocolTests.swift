import CZeroMQ
import Foundation
import Skyros
import SkyrosDaemon
import SkyrosTestSupport
import SkyrosWire
import SkyrosZeroMQ
import Testing
import ZeroMQReference

/// Protocol 4's rules on the wire, against a daemon over real ZeroMQ sockets.
@Suite("Protocol 4 on the wire", .timeLimit(.minutes(1)))
struct ProtocolTests {
    /// The next change event (not a heartbeat) on the client's event socket, if one comes
    /// within `milliseconds`.
    func nextChangeEvent(_ client: RawClient, milliseconds: Int) throws -> ChangeEvent? {
        let deadline = Date().addingTimeInterval(Double(milliseconds) / 1000)
        while Date() < deadline {
            guard try client.subscriber.waitForInput(milliseconds: 20) else { continue }
            switch try client.event().message.body {
            case .event(let event) where event.isChangeSet: return event
            case .changes(let events, _): return events.first
            default: continue
            }
        }
        return nil
    }

    @Test("error replies carry the request ID of the request they answer, even when it cannot be decoded")
    func errorRepliesCarryTheRequestID() throws {
        let daemon = try RunningDaemon()
        let client = try RawClient(daemon)
        // Before hello.
        var reply = try client.raw([
            Data(WireMessage(requestID: 41, body: .count(StoreRequest(entityName: "User"))).encoded())
        ])
        #expect(reply.requestID == 41 && errorCode(reply.body) == "helloRequired")
        _ = try client.hello()
        // A fetch cut short, an unknown kind, a batch without its body, another protocol version.
        for (bytes, code) in [
            ([WireProtocol.version, 2, 42, 1, 0xFF], "malformedMessage"),
            ([WireProtocol.version, 250, 43], "malformedMessage"),
            ([WireProtocol.version, WireProtocol.Kind.batch.rawValue, 44], "malformedMessage"),
            ([3, 2, 45], "unsupportedProtocolVersion"),
        ] as [([UInt8], String)] {
            reply = try client.raw([Data(bytes)])
            #expect(reply.requestID == UInt64(bytes[2]) && errorCode(reply.body) == code)
        }
        // Not even a header: request ID 0.
        reply = try client.raw([Data([WireProtocol.version])])
        #expect(reply.requestID == 0 && errorCode(reply.body) == "malformedMessage")
    }

    @Test("every hello's description is checked against its announced fingerprint, on an existing store too")
    func fingerprintCheckedAlways() throws {
        let daemon = try RunningDaemon()
        let client = try RawClient(daemon)
        #expect(welcomeSequence(try client.hello()) == 0)  // creates the store
        // The store's fingerprint, announced with another schema's description.
        var lying = try WireMessage.Hello(schema: testSchema, clientName: "liar")
        lying.schemaDescription = try WireMessage.Hello(schema: Schema([User.self, Post.self]), clientName: "x")
            .schemaDescription
        let other = try RawClient(daemon)
        guard case .error(let code, let message) = try other.call(.hello(lying)) else {
            Issue.record("a hello whose description lacks its fingerprint was welcomed")
            return
        }
        #expect(code == "schemaMismatch" && message.contains("announced fingerprint"))
        #expect(welcomeSequence(try other.hello()) == 0)
    }

    @Test("an insert or update with a value of the wrong type is refused with typeMismatch naming entity and property")
    func typeMismatch() throws {
        let daemon = try RunningDaemon()
        let client = try RawClient(daemon)
        _ = try client.hello()
        var wrong = userSnapshot("x")
        wrong.values[0] = .integer(5)  // firstname is a String
        guard
            case .error(let code, let message) = try client.call(
                .save(
                    clientID: .named("c"), saveNumber: 1, changes: ChangeSet(inserted: [wrong])))
        else {
            Issue.record("an integer was stored as a firstname")
            return
        }
        #expect(code == "typeMismatch" && message.contains("User.firstname"))
        var toMany = userSnapshot("y")
        toMany.values[5] = .blob(Data(repeating: 1, count: 16))  // posts: a to-many has no value of its own
        #expect(
            errorCode(
                try client.call(.save(clientID: .named("c"), saveNumber: 1, changes: ChangeSet(inserted: [toMany]))))
                == "typeMismatch")
        #expect(
            errorCode(
                try client.call(
                    .save(clientID: .named("c"), saveNumber: 0, changes: ChangeSet(inserted: [userSnapshot("z")]))))
                == "malformedMessage")  // save numbers start at 1
        let user = userSnapshot("kept")
        #expect(
            try client.call(.save(clientID: .named("c"), saveNumber: 2, changes: ChangeSet(inserted: [user])))
                == .saved(sequence: 1))
        for value in [StoredValue.text("12"), .blob(Data([1])), .null] {  // age is a non-optional Int
            guard
                case .error(let code, let message) = try client.call(
                    .save(
                        clientID: .named("c"), saveNumber: 3,
                        changes: ChangeSet(updated: [ChangeSet.Update(id: user.id, changes: [2: value])])))
            else {
                Issue.record("\(value) was stored as an age")
                continue
            }
            #expect(code == "typeMismatch" && message.contains("User.age"))
        }
        guard case .snapshotsReply(let rows) = try client.call(.snapshots([user.id])) else {
            Issue.record("no snapshots")
            return
        }
        #expect(rows.first?.values[2] == .integer(1))
    }

    @Test("an update or delete of an object that does not exist is objectNotFound: nothing committed, no event")
    func objectNotFound() throws {
        let daemon = try RunningDaemon()
        let client = try RawClient(daemon)
        let watcher = try RawClient(daemon)
        _ = try client.hello()
        let missing = ObjectID.make(entityName: "User")
        let kept = userSnapshot("kept")
        for changes in [
            ChangeSet(updated: [ChangeSet.Update(id: missing, changes: [0: .text("ghost")])]),
            ChangeSet(deleted: [missing]),
            ChangeSet(inserted: [kept], deleted: [missing]),  // the whole change set is refused
        ] {
            #expect(
                errorCode(try client.call(.save(clientID: .named("c"), saveNumber: 1, changes: changes)))
                    == "objectNotFound")
        }
        #expect(try client.call(.count(StoreRequest(entityName: "User"))) == .countReply(0))
        #expect(try nextChangeEvent(watcher, milliseconds: 200) == nil)
        // The client's save numbers were not used up by the refusals.
        #expect(
            try client.call(.save(clientID: .named("c"), saveNumber: 1, changes: ChangeSet(inserted: [kept])))
                == .saved(sequence: 1))
    }

    @Test("a retried save older than the last acknowledged one gets its own original sequence")
    func olderRetry() throws {
        let daemon = try RunningDaemon()
        let client = try RawClient(daemon)
        _ = try client.hello()
        let replies = try client.saveUsers(1...3, handlePrefix: "r")
        #expect(replies == [.saved(sequence: 1), .saved(sequence: 2), .saved(sequence: 3)])
        let again = try RawClient(daemon)
        _ = try again.hello()
        #expect(
            try again.call(
                .save(clientID: .named("c"), saveNumber: 2, changes: ChangeSet(inserted: [userSnapshot("r2")])))
                == .saved(sequence: 2))
        #expect(try again.call(.count(StoreRequest(entityName: "User"))) == .countReply(3))
    }

    @Test("events carry the values: inserted objects whole, updates with their new version and changed values")
    func eventsCarryValues() throws {
        let daemon = try RunningDaemon()
        let writer = try RawClient(daemon)
        let reader = try RawClient(daemon)
        _ = try writer.hello()
        let user = userSnapshot("v")
        _ = try writer.call(.save(clientID: .named("w"), saveNumber: 1, changes: ChangeSet(inserted: [user])))
        let inserted = try #require(try nextChangeEvent(reader, milliseconds: 2_000))
        #expect(inserted.inserted == [Snapshot(id: user.id, values: user.values, version: 1)])
        _ = try writer.call(
            .save(
                clientID: .named("w"), saveNumber: 2,
                changes: ChangeSet(
                    updated: [ChangeSet.Update(id: user.id, changes: [2: .integer(40)], baseVersion: 1)])))
        let updated = try #require(try nextChangeEvent(reader, milliseconds: 2_000))
        #expect(updated.updated == [ChangeEvent.Update(id: user.id, version: 2, values: [2: .integer(40)])])
        _ = try writer.call(.save(clientID: .named("w"), saveNumber: 3, changes: ChangeSet(deleted: [user.id])))
        #expect(try nextChangeEvent(reader, milliseconds: 2_000)?.deleted == [user.id])
    }

    @Test("a client that disappears mid-save: its save is committed once, published, and the daemon serves on")
    func clientGoneMidSave() throws {
        let daemon = try RunningDaemon()
        let watcher = try RawClient(daemon)
        _ = try watcher.hello()
        do {
            let gone = try RawClient(daemon)
            _ = try gone.hello()
            try gone.dealer.setOption(ZMQ_LINGER, Int32(0))
            _ = try gone.send(
                .save(clientID: .named("gone"), saveNumber: 1, changes: ChangeSet(inserted: [userSnapshot("orphan")])))
            gone.dealer.close()  // before its reply comes
        }
        let event = try #require(try nextChangeEvent(watcher, milliseconds: 2_000))
        #expect(event.authorID == .named("gone") && event.inserted.count == 1)
        #expect(try watcher.call(.count(StoreRequest(entityName: "User"))) == .countReply(1))
        // Coming back with the same client ID and save number, it learns the save's sequence.
        #expect(
            try watcher.call(
                .save(clientID: .named("gone"), saveNumber: 1, changes: ChangeSet(inserted: [userSnapshot("orphan")])))
                == .saved(sequence: event.sequence))
        #expect(try watcher.call(.count(StoreRequest(entityName: "User"))) == .countReply(1))
    }

    @Test("changes-since answers in pages with a more flag")
    func pages() throws {
        let daemon = try RunningDaemon()
        let client = try RawClient(daemon)
        _ = try client.hello()
        _ = try client.saveUsers(1...5, handlePrefix: "p")
        #expect(try client.call(.changesSince(0, limit: 2)).pageSequences == Page(sequences: [1, 2], more: true))
        #expect(try client.call(.changesSince(2, limit: 2)).pageSequences == Page(sequences: [3, 4], more: true))
        #expect(try client.call(.changesSince(4, limit: 2)).pageSequences == Page(sequences: [5], more: false))
        #expect(
            try client.call(.changesSince(0, limit: 0)).pageSequences == Page(sequences: [1, 2, 3, 4, 5], more: false))
    }
}

extension WireMessage.Body {
    /// The sequences of a `changes` reply and its more flag.
    var pageSequences: Page? {
        guard case .changes(let events, let more) = self else { return nil }
        return Page(sequences: events.map(\.sequence), more: more)
    }
}

struct Page: Equatable {
    var sequences: [UInt64]
    var more: Bool
}
