import Foundation
import Skyros
import SkyrosWire
import Testing

@testable import SkyrosShared

/// The client's event sequencing as a transcript: what happens, then the action expected.
/// No socket, no thread, no sleep.
@Suite("Client event sequencer (state machine)")
struct EventSequencerTests {
    let me = UUID(uuidString: "00000000-0000-4000-8000-00000000000A")!
    let other = UUID(uuidString: "00000000-0000-4000-8000-00000000000B")!
    let epoch = UUID(uuidString: "00000000-0000-4000-8000-0000000000E1")!

    func welcome(_ sequence: UInt64, epoch: UUID? = nil) -> WireMessage.Welcome {
        WireMessage.Welcome(sequence: sequence, eventTopic: 1, storeEpoch: epoch ?? self.epoch, schemaVersion: 1)
    }

    func event(_ sequence: UInt64, by author: UUID? = nil) -> ChangeEvent {
        ChangeEvent(sequence: sequence, authorID: author ?? other, author: "p")
    }

    @Test("consecutive events are merged in order; known ones and heartbeats with nothing new are dropped")
    func consecutive() {
        var machine = EventSequencer(clientID: me, welcome: welcome(5))
        #expect(machine.received([event(4), event(5)]) == [])  // before the welcome's sequence
        #expect(machine.received([event(6), event(7)]) == [.merge([event(6), event(7)])])
        #expect(machine.received([.heartbeat(7)]) == [])
        #expect(machine.received([event(7)]) == [])  // a duplicate
        #expect(machine.sequence == 7)
    }

    @Test("a gap in events asks changes-since from the last merged, and the page fills it")
    func gap() {
        var machine = EventSequencer(clientID: me, welcome: welcome(0))
        #expect(machine.received([event(1)]) == [.merge([event(1)])])
        #expect(machine.received([event(4)]) == [.catchUp(after: 1)])
        #expect(machine.page([event(2), event(3), event(4)], more: false) == [.merge([event(2), event(3), event(4)])])
        #expect(machine.sequence == 4)
    }

    @Test("a heartbeat past the last merged sequence is a gap (events were dropped)")
    func heartbeatGap() {
        var machine = EventSequencer(clientID: me, welcome: welcome(10))
        #expect(machine.received([.heartbeat(12)]) == [.catchUp(after: 10)])
    }

    @Test("a page with more asks for the next page from where it ends")
    func pages() {
        var machine = EventSequencer(clientID: me, welcome: welcome(0))
        #expect(machine.page([event(1), event(2)], more: true) == [.merge([event(1), event(2)]), .catchUp(after: 2)])
        #expect(machine.page([event(3)], more: false) == [.merge([event(3)])])
    }

    @Test("this client's own change sets are counted from the save replies, never merged")
    func ownSaves() {
        var machine = EventSequencer(clientID: me, welcome: welcome(0))
        machine.saveSent()
        #expect(machine.saveAnswered(sequence: 1) == [])
        #expect(machine.sequence == 1)
        #expect(machine.received([event(2)]) == [.merge([event(2)])])
        // Its own event, when it comes back anyway (subscribed to everything), is only counted.
        #expect(machine.received([event(3, by: me), event(4)]) == [.merge([event(4)])])
        #expect(machine.sequence == 4)
    }

    @Test(
        "own saves answered ahead of the events: counted once the events reach them, in any order, and forgotten once passed"
    )
    func ownSavesAhead() {
        var machine = EventSequencer(clientID: me, welcome: welcome(0))
        machine.saveSent()
        machine.saveSent()
        machine.saveSent()
        // Replies for 5, 3 and 3 again (a resend), before the events of 1, 2 and 4.
        #expect(machine.saveAnswered(sequence: 5) == [])
        #expect(machine.saveAnswered(sequence: 3) == [])
        #expect(machine.sequence == 0)
        // 1 and 2 merged, then 3 (own) counted; 4 merged, then 5 (own) counted.
        #expect(machine.received([event(1), event(2)]) == [.merge([event(1), event(2)])])
        #expect(machine.sequence == 3)
        #expect(machine.received([event(4)]) == [.merge([event(4)])])
        #expect(machine.sequence == 5)
        #expect(machine.received([event(6)]) == [.merge([event(6)])])
        // An own sequence the events went past (a page that carried it) is forgotten, not counted again.
        machine.saveSent()
        #expect(machine.saveAnswered(sequence: 8) == [])
        #expect(machine.page([event(7), event(8, by: me), event(9)], more: false) == [.merge([event(7), event(9)])])
        #expect(machine.sequence == 9)
        #expect(machine.received([event(10)]) == [.merge([event(10)])])
    }

    @Test("lost reply and resend: a gap while a save is in flight waits for its reply instead of catching up")
    func gapWhileSaving() {
        var machine = EventSequencer(clientID: me, welcome: welcome(0))
        machine.saveSent()
        // Another client's change set 2 arrives before the reply of this client's save (1).
        #expect(machine.received([event(2)]) == [])
        #expect(machine.held == [event(2)])
        // The first attempt's reply was lost; the resend is answered with the same sequence.
        #expect(machine.saveAnswered(sequence: 1) == [.merge([event(2)])])
        #expect(machine.sequence == 2 && machine.held.isEmpty)
    }

    @Test("a save that fails leaves the gap to a catch-up")
    func failedSaveThenGap() {
        var machine = EventSequencer(clientID: me, welcome: welcome(0))
        machine.saveSent()
        #expect(machine.received([event(2)]) == [])
        #expect(machine.saveAnswered(sequence: nil) == [.catchUp(after: 0)])
    }

    @Test("silence asks what was missed, unless a save is in flight")
    func silence() {
        var machine = EventSequencer(clientID: me, welcome: welcome(3))
        #expect(machine.silence() == [.catchUp(after: 3)])
        machine.saveSent()
        #expect(machine.silence() == [])
    }

    @Test("history expired: hello again, then start over from the welcome's sequence")
    func historyExpired() {
        var machine = EventSequencer(clientID: me, welcome: welcome(3))
        #expect(machine.received([event(9)]) == [.catchUp(after: 3)])
        #expect(machine.historyExpired() == [.sayHelloAgain])
        #expect(machine.welcomed(welcome(20), startingOver: true) == [.startOver])
        #expect(machine.sequence == 20)
        #expect(machine.received([event(21)]) == [.merge([event(21)])])
    }

    @Test("reconnect to the same daemon: nothing to start over, the gap is caught up")
    func reconnect() {
        var machine = EventSequencer(clientID: me, welcome: welcome(5))
        #expect(machine.welcomed(welcome(8), startingOver: false) == [])
        #expect(machine.sequence == 5)
        #expect(machine.received([.heartbeat(8)]) == [.catchUp(after: 5)])
    }

    @Test("reconnect during a save: the save stays in flight across the new hello; its reply closes the gap")
    func reconnectDuringSave() {
        var machine = EventSequencer(clientID: me, welcome: welcome(5))
        machine.saveSent()
        #expect(machine.welcomed(welcome(6), startingOver: false) == [])
        #expect(machine.received([event(7)]) == [])
        #expect(machine.saveAnswered(sequence: 6) == [.merge([event(7)])])
    }

    @Test("daemon restart with a new store epoch: start over, whatever the sequences")
    func newEpoch() {
        var machine = EventSequencer(clientID: me, welcome: welcome(5))
        #expect(machine.welcomed(welcome(50, epoch: UUID()), startingOver: false) == [.startOver])
        #expect(machine.sequence == 50)
    }

    @Test("a daemon behind this client serves another store: start over")
    func daemonBehind() {
        var machine = EventSequencer(clientID: me, welcome: welcome(5))
        #expect(machine.welcomed(welcome(2), startingOver: false) == [.startOver])
        #expect(machine.sequence == 2)
    }

    // MARK: - Saves and their numbers; a save whose outcome is unknown

    func save(_ number: UInt64) -> WireMessage.Body {
        .deleteAll(clientID: me, saveNumber: number)
    }

    @Test("saves are numbered from 1, in order")
    func saveNumbers() {
        var machine = EventSequencer(clientID: me, welcome: welcome(0))
        #expect(machine.nextSave() == .send(number: 1))
        #expect(machine.nextSave() == .send(number: 2))
        #expect(machine.saveNumber == 2)
    }

    @Test("a save whose outcome is unknown is resent before the next save, which then takes the next number")
    func unknownSaveFirst() {
        var machine = EventSequencer(clientID: me, welcome: welcome(0))
        #expect(machine.nextSave() == .send(number: 1))
        machine.saveSent()
        #expect(machine.saveAnswered(sequence: nil) == [])  // no acknowledgement in time
        machine.saveOutcomeUnknown(number: 1, body: save(1))
        // The next saver resends save 1 (same number: the daemon applies it once).
        let unknown = EventSequencer.UnknownSave(number: 1, body: save(1))
        #expect(machine.nextSave() == .resend(unknown))
        machine.saveSent()
        #expect(machine.unknownSaveAnswered(sequence: 1) == [])
        machine.unknownSaveResolved()
        #expect(machine.unknownSave == nil)
        #expect(machine.nextSave() == .send(number: 2))
    }

    @Test(
        "a save whose outcome was unknown and that the resend finds applied is merged when its event comes: the saver was told it may not be"
    )
    func unknownSaveAppliedReplyFirst() {
        var machine = withUnknownSave(after: 3)
        machine.saveSent()
        #expect(machine.unknownSaveAnswered(sequence: 4) == [])
        machine.unknownSaveResolved()
        #expect(machine.sequence == 3)  // not counted as this client's own
        #expect(machine.received([event(4, by: me)]) == [.merge([event(4, by: me)])])
        // The next save is this client's own again: counted, not merged.
        #expect(machine.nextSave() == .send(number: 2))
        machine.saveSent()
        #expect(machine.saveAnswered(sequence: 5) == [])
        #expect(machine.received([event(5, by: me), event(6)]) == [.merge([event(6)])])
        #expect(machine.sequence == 6)
    }

    @Test("the event of a save whose outcome is still unknown is merged (the daemon applied it, its reply was lost)")
    func unknownSaveAppliedEventFirst() {
        var machine = withUnknownSave(after: 3)
        #expect(machine.mergesOwn(4))
        #expect(machine.received([event(4, by: me), event(5)]) == [.merge([event(4, by: me), event(5)])])
        // The resend's reply then says what was merged already.
        machine.saveSent()
        #expect(machine.unknownSaveAnswered(sequence: 4) == [])
        machine.unknownSaveResolved()
        #expect(machine.sequence == 5 && !machine.mergesOwn(6))
        #expect(machine.received([event(6, by: me)]) == [])  // a later save's: own, counted
    }

    @Test("a resolved save's event behind a gap: caught up, and merged in order")
    func unknownSaveAppliedBehindGap() {
        var machine = withUnknownSave(after: 3)
        machine.saveSent()
        #expect(machine.unknownSaveAnswered(sequence: 4) == [])
        machine.unknownSaveResolved()
        #expect(machine.received([event(5)]) == [.catchUp(after: 3)])
        #expect(machine.page([event(4, by: me), event(5)], more: false) == [.merge([event(4, by: me), event(5)])])
        #expect(machine.sequence == 5)
    }

    /// A sequencer whose save 1 went out and got no acknowledgement in time.
    func withUnknownSave(after sequence: UInt64) -> EventSequencer {
        var machine = EventSequencer(clientID: me, welcome: welcome(sequence))
        _ = machine.nextSave()
        machine.saveOutcomeUnknown(number: 1, body: save(1))
        return machine
    }

    @Test("while the daemon does not answer, every saver is told to resend the unknown save, and none is numbered")
    func unknownSaveStillUnknown() {
        var machine = withUnknownSave(after: 0)
        // A resend that times out again: nothing is resolved, nothing new numbered.
        #expect(machine.nextSave() == .resend(EventSequencer.UnknownSave(number: 1, body: save(1))))
        #expect(machine.nextSave() == .resend(EventSequencer.UnknownSave(number: 1, body: save(1))))
        #expect(machine.saveNumber == 1)
    }

    @Test("a refused resend resolves the unknown save too: new saves go out, and a gap waits for no save")
    func unknownSaveRefused() {
        var machine = withUnknownSave(after: 3)
        machine.saveSent()
        #expect(machine.received([event(5)]) == [])  // 4 may be the save: held while it is in flight
        #expect(machine.saveAnswered(sequence: nil) == [.catchUp(after: 3)])  // refused: 4 is someone else's
        machine.unknownSaveResolved()
        #expect(machine.nextSave() == .send(number: 2))
    }

    @Test("an unknown save stays across a new hello (the daemon still knows this client's save numbers)")
    func unknownSaveAcrossHello() {
        var machine = withUnknownSave(after: 3)
        #expect(machine.welcomed(welcome(4), startingOver: false) == [])
        #expect(machine.nextSave() == .resend(EventSequencer.UnknownSave(number: 1, body: save(1))))
    }
}

/// One request's attempts as a transcript: a reply lost, a daemon restarted, the timeout.
@Suite("Client request attempts (state machine)")
struct RequestAttemptsTests {
    let start = ContinuousClock.now

    @Test("the first attempt waits the retry interval on the current connection")
    func first() {
        var attempts = RequestAttempts(now: start, timeout: .seconds(5), retryInterval: .seconds(1))
        #expect(attempts.next(now: start) == .attempt(wait: .seconds(1), newConnection: false, sayHelloFirst: false))
    }

    @Test("lost reply: the request is sent again on a new connection, until the timeout, then it fails")
    func lostReplies() {
        var attempts = RequestAttempts(now: start, timeout: .seconds(2), retryInterval: .seconds(1))
        _ = attempts.next(now: start)
        attempts.timedOut(daemonHeldConnection: false)
        #expect(
            attempts.next(now: start + .seconds(1))
                == .attempt(wait: .seconds(1), newConnection: true, sayHelloFirst: false))
        attempts.timedOut(daemonHeldConnection: false)
        // The last attempt gets what is left of the timeout, never less than 10 ms.
        #expect(
            attempts.next(now: start + .milliseconds(1_995))
                == .attempt(wait: .milliseconds(10), newConnection: true, sayHelloFirst: false))
        attempts.timedOut(daemonHeldConnection: false)
        #expect(attempts.next(now: start + .seconds(2)) == .fail)
        #expect(attempts.attempts == 3)
    }

    @Test("daemon restarted: hello again before the next attempt, once welcomed no more")
    func helloRequired() {
        var attempts = RequestAttempts(now: start, timeout: .seconds(5), retryInterval: .seconds(1))
        _ = attempts.next(now: start)
        attempts.helloRequired()
        #expect(
            attempts.next(now: start + .milliseconds(1))
                == .attempt(wait: .seconds(1), newConnection: false, sayHelloFirst: true))
        attempts.welcomed()
        attempts.timedOut(daemonHeldConnection: false)
        #expect(
            attempts.next(now: start + .seconds(2))
                == .attempt(wait: .seconds(1), newConnection: true, sayHelloFirst: false))
    }

    @Test(
        "a daemon that holds the connection and does not answer (slow) is asked again less and less often: 1, 2, 4, 8, 8 s"
    )
    func backoff() {
        var attempts = RequestAttempts(now: start, timeout: .seconds(30), retryInterval: .seconds(1))
        var now = start
        var waits: [Duration] = []
        while case .attempt(let wait, let newConnection, _) = attempts.next(now: now) {
            #expect(newConnection == !waits.isEmpty)
            waits.append(wait)
            now += wait
            attempts.timedOut(daemonHeldConnection: true)
        }
        #expect(waits == [1, 2, 4, 8, 8, 7].map { Duration.seconds($0) })
    }

    @Test("a connection lost (the daemon went away) brings the wait back to the retry interval")
    func backoffEndsWithTheConnection() {
        var attempts = RequestAttempts(now: start, timeout: .seconds(60), retryInterval: .seconds(1))
        var now = start
        for _ in 0..<3 {
            guard case .attempt(let wait, _, _) = attempts.next(now: now) else { return }
            now += wait
            attempts.timedOut(daemonHeldConnection: true)
        }
        #expect(attempts.next(now: now) == .attempt(wait: .seconds(8), newConnection: true, sayHelloFirst: false))
        now += .seconds(8)
        attempts.timedOut(daemonHeldConnection: false)  // the daemon was killed meanwhile
        #expect(attempts.next(now: now) == .attempt(wait: .seconds(1), newConnection: true, sayHelloFirst: false))
        now += .seconds(1)
        attempts.timedOut(daemonHeldConnection: false)  // not back yet
        #expect(attempts.next(now: now) == .attempt(wait: .seconds(1), newConnection: true, sayHelloFirst: false))
    }

    @Test("a request always gets one attempt, even with a timeout already past")
    func alwaysOneAttempt() {
        var attempts = RequestAttempts(now: start, timeout: .zero, retryInterval: .seconds(1))
        #expect(
            attempts.next(now: start + .seconds(1))
                == .attempt(wait: .milliseconds(10), newConnection: false, sayHelloFirst: false))
        #expect(attempts.next(now: start + .seconds(1)) == .fail)
    }
}
