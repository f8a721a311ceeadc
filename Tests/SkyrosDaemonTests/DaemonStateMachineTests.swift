import Foundation
import Skyros
import SkyrosWire
import Testing

@testable import SkyrosDaemon

/// The daemon's sessions and publishing as transcripts: an input, then the outcome expected.
/// No socket, no store, no sleep (time is passed in).
@Suite("Daemon state machines")
struct DaemonStateMachineTests {
    func hello(
        _ name: String = "app", fingerprint: String = "f1", version: UInt64 = UInt64(WireProtocol.version),
        schemaVersion: UInt64 = 1
    ) -> WireMessage.Hello {
        WireMessage.Hello(
            protocolVersion: version, schemaFingerprint: fingerprint, schemaVersion: schemaVersion, clientName: name,
            pid: 7, schemaDescription: [])
    }

    @Test("hellos get topics in turn; the same connection keeps its topic; its name and pid are kept")
    func topics() {
        var table = SessionTable(maximumSessions: 10)
        #expect(table.hello(Data([1]), hello(), storeFingerprint: "f1") == .welcome(topic: 1, forgotOthers: false))
        #expect(table.hello(Data([2]), hello(), storeFingerprint: "f1") == .welcome(topic: 2, forgotOthers: false))
        #expect(
            table.hello(Data([1]), hello("again"), storeFingerprint: "f1") == .welcome(topic: 1, forgotOthers: false))
        #expect(table[Data([1])] == SessionTable.Session(name: "again", pid: 7, schemaVersion: 1, topic: 1))
    }

    @Test("a wrong protocol, a long name, another schema and schema version 0 are refused with their codes")
    func refusals() {
        var table = SessionTable(maximumSessions: 10)
        guard case .refuse(let code, _) = table.hello(Data([1]), hello(version: 3), storeFingerprint: "f1") else {
            Issue.record("protocol 3 welcomed")
            return
        }
        #expect(code == .unsupportedProtocolVersion)
        let long = String(repeating: "n", count: WireProtocol.maximumClientNameBytes + 1)
        guard case .refuse(let code, let message) = table.hello(Data([1]), hello(long), storeFingerprint: "f1") else {
            Issue.record("a long name welcomed")
            return
        }
        #expect(code == .malformedMessage && message.count < 200)  // the name is never copied whole
        guard case .refuse(let code, _) = table.hello(Data([1]), hello(fingerprint: "f2"), storeFingerprint: "f1")
        else {
            Issue.record("another schema welcomed")
            return
        }
        #expect(code == .schemaMismatch)
        guard case .refuse(let code, _) = table.hello(Data([1]), hello(schemaVersion: 0), storeFingerprint: "f1") else {
            Issue.record("schema version 0 welcomed")
            return
        }
        #expect(code == .malformedMessage)
        #expect(table.sessions.isEmpty)
    }

    @Test("past the maximum, every session is forgotten (each says hello again when told)")
    func forgetting() {
        var table = SessionTable(maximumSessions: 2)
        _ = table.hello(Data([1]), hello(), storeFingerprint: "f1")
        _ = table.hello(Data([2]), hello(), storeFingerprint: "f1")
        #expect(table.hello(Data([3]), hello(), storeFingerprint: "f1") == .welcome(topic: 3, forgotOthers: true))
        #expect(table.sessions.count == 1 && table[Data([1])] == nil)
    }

    @Test("the schema versions of the sessions follow hellos, a changed version and forgetting")
    func schemaVersions() {
        var table = SessionTable(maximumSessions: 3)
        #expect(table.schemaVersions.isEmpty)
        _ = table.hello(Data([1]), hello(schemaVersion: 1), storeFingerprint: "f1")
        _ = table.hello(Data([2]), hello(schemaVersion: 2), storeFingerprint: "f1")
        #expect(Set(table.schemaVersions) == [1, 2])
        _ = table.hello(Data([1]), hello(schemaVersion: 2), storeFingerprint: "f1")  // the same connection, newer
        #expect(Set(table.schemaVersions) == [2])
        _ = table.hello(Data([3]), hello(schemaVersion: 1), storeFingerprint: "f1")
        #expect(Set(table.schemaVersions) == [1, 2])
        table.forget(schemaVersion: 1)
        #expect(Set(table.schemaVersions) == [2])
        _ = table.hello(Data([4]), hello(schemaVersion: 3), storeFingerprint: "f1")
        _ = table.hello(Data([5]), hello(schemaVersion: 1), storeFingerprint: "f1")  // past the maximum: the others forgotten
        #expect(Set(table.schemaVersions) == [1])
    }

    func committed(_ sequence: UInt64, topic: UInt8?) -> EventPublisher.Committed {
        let event = ChangeEvent(sequence: sequence, authorID: UUID(), author: "a")
        return EventPublisher.Committed(
            event: event, encoded: WireMessage(requestID: 0, body: .event(event)).encoded(), topic: topic)
    }

    @Test("an idle daemon publishes each commit at once, under the saver's topic, as recorded")
    func idle() {
        var publisher = EventPublisher(maximumDelay: .milliseconds(2))
        let one = committed(1, topic: 4)
        #expect(
            publisher.committed([one], requestsWaiting: false, now: .now)
                == EventPublisher.Publication(
                    topic: 4, message: one.encoded, firstSequence: 1, changeSets: 1, events: [one.event]))
    }

    @Test("under load, events wait at most the delay, then go out together, to everyone when saved by several")
    func heldUnderLoad() throws {
        var publisher = EventPublisher(maximumDelay: .milliseconds(2))
        let start = ContinuousClock.now
        #expect(publisher.committed([committed(1, topic: 4)], requestsWaiting: true, now: start) == nil)
        #expect(
            publisher.committed([committed(2, topic: 5)], requestsWaiting: true, now: start + .milliseconds(1)) == nil)
        let due = publisher.committed([], requestsWaiting: true, now: start + .milliseconds(3))
        let publication = try #require(due)
        #expect(publication.topic == WireProtocol.broadcastTopic && publication.changeSets == 2)
        guard case .changes(let events, false) = try WireMessage.decode(publication.message).body else {
            Issue.record("not a changes message")
            return
        }
        #expect(events.map(\.sequence) == [1, 2])
        #expect(publisher.held.isEmpty)
    }

    @Test("held events go out before a heartbeat, whose sequence would otherwise look like a gap")
    func heartbeatAfterHeld() throws {
        var publisher = EventPublisher(maximumDelay: .seconds(1))
        #expect(publisher.committed([committed(1, topic: 4)], requestsWaiting: true, now: .now) == nil)
        let sent = publisher.heartbeat(sequence: 1)
        #expect(sent.count == 2 && sent[0].firstSequence == 1 && sent[0].changeSets == 1)
        guard case .event(let beat) = try WireMessage.decode(sent[1].message).body else {
            Issue.record("no heartbeat")
            return
        }
        #expect(beat.kind == .heartbeat && beat.sequence == 1 && sent[1].topic == WireProtocol.broadcastTopic)
    }

    @Test(
        "exactly-once: a new save is applied; the same save again is answered with its sequence, even in the same turn")
    func ledgerRetries() {
        let client = UUID()
        var ledger = SaveLedger()
        #expect(ledger.decide(client: client, save: 1) == .readStore)  // never seen: its record is in the store, or nowhere
        #expect(ledger.decide(client: client, save: 1, stored: .some(nil)) == .apply)
        ledger.applied(client: client, save: 1, sequence: 7)
        #expect(ledger.decide(client: client, save: 1) == .answer(sequence: 7))  // resent within the same turn
        ledger.commit()
        #expect(ledger.decide(client: client, save: 1) == .answer(sequence: 7))  // resent later
        #expect(ledger.decide(client: client, save: 2) == .apply)
    }

    @Test("an older save than the last is answered from the history; after a restart the store's record decides")
    func ledgerOlderAndRestart() {
        let client = UUID()
        var ledger = SaveLedger()
        ledger.applied(client: client, save: 5, sequence: 40)
        ledger.commit()
        #expect(ledger.decide(client: client, save: 3) == .answerFromHistory)
        let restarted = SaveLedger()
        #expect(restarted.decide(client: client, save: 5) == .readStore)
        let record = Journal.SaveRecord(save: 5, sequence: 40)
        #expect(restarted.decide(client: client, save: 5, stored: .some(record)) == .answer(sequence: 40))
        #expect(restarted.decide(client: client, save: 6, stored: .some(record)) == .apply)
    }

    @Test(
        "a failed commit forgets its turn and the records it was moving; a record that left the history is left to the store"
    )
    func ledgerAbandonAndLeaving() {
        let (a, b) = (UUID(), UUID())
        var ledger = SaveLedger()
        ledger.applied(client: a, save: 1, sequence: 1)
        ledger.abandon()  // the transaction rolled back: save 1 of a never happened
        #expect(ledger.decide(client: a, save: 1) == .readStore)
        ledger.applied(client: a, save: 1, sequence: 1)
        ledger.applied(client: b, save: 1, sequence: 2)
        ledger.commit()
        ledger.applied(client: b, save: 2, sequence: 3)
        ledger.commit()
        // The rows below 3 are pruned: a's record (row 1) is copied; b's row 2 is not its record.
        #expect(ledger.leaving(below: 3) == [1])
        ledger.abandon()  // that pruning rolled back: a's record is still its history row
        #expect(ledger.decide(client: a, save: 1) == .answer(sequence: 1))
        #expect(ledger.leaving(below: 3) == [1])
        ledger.commit()
        #expect(ledger.decide(client: a, save: 1) == .readStore)  // in skyros_saves now
        #expect(ledger.decide(client: b, save: 2) == .answer(sequence: 3))
        // A save of the turn below the bound (a retention shorter than the turn) is copied too.
        ledger.applied(client: b, save: 3, sequence: 4)
        #expect(ledger.leaving(below: 5) == [4])
        ledger.commit()
        #expect(ledger.decide(client: b, save: 3) == .answer(sequence: 4))
        #expect(ledger.leaving(below: 6) == [4])  // copied again (the row is gone: a no-op)
        ledger.commit()
        #expect(ledger.decide(client: b, save: 3) == .readStore)
    }

    @Test("a ledger made from the history knows each client's last save there")
    func ledgerFromHistory() {
        let (a, b) = (UUID(), UUID())
        let ledger = SaveLedger(history: [
            (a, Journal.SaveRecord(save: 1, sequence: 1)), (b, Journal.SaveRecord(save: 1, sequence: 2)),
            (a, Journal.SaveRecord(save: 2, sequence: 3)),
        ])
        #expect(ledger.decide(client: a, save: 2) == .answer(sequence: 3))
        #expect(ledger.decide(client: a, save: 1) == .answerFromHistory)
        #expect(ledger.decide(client: b, save: 3) == .refuseSkipped(expected: 2))
        #expect(ledger.decide(client: UUID(), save: 9) == .readStore)
    }
}
