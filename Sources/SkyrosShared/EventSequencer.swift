import Foundation
import SkyrosWire

/// The client's side of the change-event stream, as a value: what to merge, when to catch up
/// and when to start over, and which save goes out next. It takes what happens (events and
/// heartbeats received, a save sent and its reply, a save whose outcome is unknown, a page of
/// `changes-since`, a welcome, silence, an expired history) and returns actions; the event
/// thread and the savers carry them out. No socket, no clock, no lock.
///
/// Invariants: events are merged in sequence order, each once, none skipped; this client's
/// own change sets are not merged (their sequences are counted from the save replies, or
/// from their events when they come back), except the change set of a save whose outcome was
/// unknown: the app was told the save may not be applied, and its main context forgot what
/// the save touched, so once the save turns out applied its change set is merged like another
/// process's (its event while the outcome is still unknown, or the sequence the resend's reply
/// gives); a gap is closed by `changes-since`, except while
/// a save is in flight (the gap may be that save, whose reply is on its way). Saves are
/// numbered from 1, in order; while a save's outcome is unknown, no new save is numbered:
/// that one is resent first (the daemon applies a client's saves in order).
struct EventSequencer: Equatable {
    /// What the event thread does.
    enum Action: Equatable {
        /// Hand these change sets, in order, to the main context.
        case merge([ChangeEvent])
        /// Ask `changes-since` this sequence (and feed the reply to ``page(_:more:)``).
        case catchUp(after: UInt64)
        /// Say hello again and feed the welcome to ``welcomed(_:startingOver:)``: the history
        /// no longer has what this client missed.
        case sayHelloAgain
        /// Everything the client holds may be stale: refresh it all.
        case startOver
    }

    let clientID: UUID
    /// The last sequence merged, or known to be this client's own.
    private(set) var sequence: UInt64
    /// The store the sequence numbers belong to.
    private(set) var epoch: UUID
    /// Sequences of this client's saves past ``sequence``, from their replies, ascending (a
    /// few at most: a list, which a save's reply does not make hash and allocate).
    private var ownSequences: [UInt64] = []
    /// Sequences past ``sequence`` of this client's saves whose outcome was unknown and that a
    /// resend found applied: their events are merged when they come.
    private var resolvedOwn: [UInt64] = []
    /// Saves sent and not answered yet.
    private(set) var savesInFlight = 0
    /// Change sets past a gap, kept while a save is in flight (the gap may be that save).
    private(set) var held: [ChangeEvent] = []
    /// The number of the last save numbered.
    private(set) var saveNumber: UInt64 = 0
    /// A save sent and never acknowledged (``SkyrosError/Code/outcomeUnknown``): resent until
    /// the daemon answers, by the next saver or in the background.
    private(set) var unknownSave: UnknownSave?

    /// A save whose outcome is unknown: its number and the request that carries it.
    struct UnknownSave: Equatable {
        let number: UInt64
        let body: WireMessage.Body
    }

    /// What a saver sends next.
    enum SaveStep: Equatable {
        /// Resend the save whose outcome is unknown (and report ``unknownSaveResolved()`` once
        /// the daemon answers), then ask again.
        case resend(UnknownSave)
        /// Send the new save with this number.
        case send(number: UInt64)
    }

    init(clientID: UUID, welcome: WireMessage.Welcome) {
        self.clientID = clientID
        self.sequence = welcome.sequence
        self.epoch = welcome.storeEpoch
    }

    /// A saver's next step: the save whose outcome is unknown first, else a new save, with
    /// the next number.
    mutating func nextSave() -> SaveStep {
        if let unknownSave { return .resend(unknownSave) }
        saveNumber += 1
        return .send(number: saveNumber)
    }

    /// The save numbered `number` went out but got no acknowledgement within the timeout:
    /// it may or may not be applied. It is resent before any new save.
    mutating func saveOutcomeUnknown(number: UInt64, body: WireMessage.Body) {
        unknownSave = UnknownSave(number: number, body: body)
    }

    /// The daemon answered the resent save whose outcome was unknown (applied or refused):
    /// new saves may go out.
    mutating func unknownSaveResolved() { unknownSave = nil }

    /// The save numbered `number` was not applied (refused, or never sent): its number is
    /// the next save's, since the daemon refuses a number that skips ahead of its last
    /// applied one + 1 (`saveNumberSkipped`).
    mutating func saveNotApplied(number: UInt64) {
        if number == saveNumber, unknownSave == nil { saveNumber -= 1 }
    }

    /// A save request goes out.
    mutating func saveSent() { savesInFlight += 1 }

    /// A save's reply came (`sequence`), or the save failed or was given up (nil).
    mutating func saveAnswered(sequence saved: UInt64?) -> [Action] {
        savesInFlight = max(0, savesInFlight - 1)
        if let saved, saved > sequence { insertOwnSequence(saved) }
        absorbOwnSequences()
        guard !held.isEmpty else { return [] }
        let waiting = held
        held = []
        return advance(waiting, catchUpOnGap: savesInFlight == 0)
    }

    /// The reply to a resent save whose outcome was unknown came (`sequence`: applied), or the
    /// resend failed or was refused (nil). Unlike ``saveAnswered(sequence:)``, the save's change
    /// set is merged when its event comes: the saver was told its outcome is unknown.
    mutating func unknownSaveAnswered(sequence saved: UInt64?) -> [Action] {
        if let saved, saved > sequence, !resolvedOwn.contains(saved) { resolvedOwn.append(saved) }
        return saveAnswered(sequence: nil)
    }

    /// Whether this client's own change set `sequence`, when its event comes, is merged: the
    /// change set of the save whose outcome is unknown (no other save of this client goes out
    /// meanwhile), or of one that a resend found applied.
    func mergesOwn(_ sequence: UInt64) -> Bool {
        unknownSave != nil || resolvedOwn.contains(sequence)
    }

    /// Events (and heartbeats) received on the event socket.
    mutating func received(_ events: [ChangeEvent]) -> [Action] {
        advance(events, catchUpOnGap: savesInFlight == 0)
    }

    /// Nothing heard for ``WireProtocol/silenceInterval``: the daemon may be gone or events
    /// lost; ask what was missed.
    mutating func silence() -> [Action] {
        savesInFlight == 0 ? [.catchUp(after: sequence)] : []
    }

    /// A page of `changes-since`: merged; `more` asks for the next page.
    mutating func page(_ events: [ChangeEvent], more: Bool) -> [Action] {
        var actions = advance(events, catchUpOnGap: false)
        if more && !events.isEmpty { actions.append(.catchUp(after: sequence)) }
        return actions
    }

    /// The daemon no longer has the change sets after ``sequence``.
    mutating func historyExpired() -> [Action] { [.sayHelloAgain] }

    /// A welcome on a new connection (the daemon restarted, forgot this connection, or the
    /// client starts over). Another store (a new epoch), a daemon behind this client, or
    /// `startingOver` make the client take the daemon's sequence and refresh everything.
    mutating func welcomed(_ welcome: WireMessage.Welcome, startingOver: Bool) -> [Action] {
        guard startingOver || welcome.storeEpoch != epoch || welcome.sequence < sequence else { return [] }
        sequence = welcome.sequence
        epoch = welcome.storeEpoch
        ownSequences = []
        resolvedOwn = []
        held = []
        return [.startOver]
    }

    /// Takes events in order: consecutive ones are merged (this client's own only counted),
    /// known ones dropped; at the first gap the rest is held while a save is in flight, or a
    /// catch-up is asked.
    private mutating func advance(_ events: [ChangeEvent], catchUpOnGap: Bool) -> [Action] {
        // While every event so far is merged (the usual message: other clients' change sets,
        // each the next one once this client's own are counted), the merged events are the
        // first `inPlace` of `events`, shared rather than copied one by one; the first event
        // left out starts a copy (`copied`).
        var inPlace = 0
        var copied: [ChangeEvent]?
        var gap = false
        // By index: an event is copied only into `copied` (the event thread's hot path).
        for position in events.indices {
            absorbOwnSequences()
            let next = events[position].sequence
            guard next > sequence else {  // known, or a heartbeat with nothing new
                if copied == nil { copied = Array(events[..<inPlace]) }
                continue
            }
            guard events.isChangeSet(at: position), next == sequence + 1 else {
                if savesInFlight > 0 {
                    held = Self.union(held, events[position...].filter(\.isChangeSet), after: sequence)
                }
                gap = true
                break
            }
            sequence = next
            if events[position].authorID == clientID && !mergesOwn(next) {
                if copied == nil { copied = Array(events[..<inPlace]) }
            } else if copied != nil {
                copied!.append(events[position])
            } else {
                inPlace += 1
            }
        }
        absorbOwnSequences()
        if !resolvedOwn.isEmpty { resolvedOwn.removeAll { $0 <= sequence } }
        let merged = copied ?? (inPlace == events.count ? events : Array(events[..<inPlace]))
        var actions: [Action] = merged.isEmpty ? [] : [.merge(merged)]
        if gap && catchUpOnGap && savesInFlight == 0 { actions.append(.catchUp(after: sequence)) }
        return actions
    }

    /// Puts a sequence of this client's in ``ownSequences``, in order, once.
    private mutating func insertOwnSequence(_ saved: UInt64) {
        var position = ownSequences.endIndex
        while position > 0 && ownSequences[position - 1] > saved { position -= 1 }
        if position > 0 && ownSequences[position - 1] == saved { return }
        ownSequences.insert(saved, at: position)
    }

    /// Counts this client's sequences that come next as merged, and forgets those the events
    /// went past.
    private mutating func absorbOwnSequences() {
        guard !ownSequences.isEmpty else { return }
        var passed = 0
        for own in ownSequences {
            if own == sequence + 1 {
                sequence = own
            } else if own > sequence {
                break
            }
            passed += 1
        }
        if passed == ownSequences.count {
            ownSequences.removeAll(keepingCapacity: true)
        } else if passed > 0 {
            ownSequences.removeFirst(passed)
        }
    }

    /// Held events and new ones, in order, each once, past `sequence`.
    private static func union(_ held: [ChangeEvent], _ new: [ChangeEvent], after sequence: UInt64) -> [ChangeEvent] {
        var bySequence: [UInt64: ChangeEvent] = [:]
        for event in held + new where event.sequence > sequence { bySequence[event.sequence] = event }
        return bySequence.keys.sorted().compactMap { bySequence[$0] }
    }
}

extension [ChangeEvent] {
    /// Whether the event at `index` is a change set (``ChangeEvent/isChangeSet``), read where
    /// it lies: the event thread's loops ask it of every event, and calling that getter of
    /// another module hands it a copy of the event first.
    func isChangeSet(at index: Int) -> Bool { self[index].kind != .heartbeat }
}
