import Foundation

/// Exactly-once saves as a value: for each save of a turn, whether to apply it or answer it
/// with the sequence it got before. It knows the last save of every client seen since the
/// daemon started (bounded: past `capacity` clients it forgets them all and asks the store
/// again), and the saves of the turn in progress, which count only once the turn's commit is
/// durable (``commit()``) and are dropped if it fails (``abandon()``).
///
/// The store's records (`skyros_saves`, the history) are read by the daemon when the ledger
/// says so: no I/O here.
struct SaveLedger {
    /// What to do with a save.
    enum Decision: Equatable {
        /// Apply it: it is new.
        case apply
        /// Already applied: answer `saved` with this sequence again.
        case answer(sequence: UInt64)
        /// An older save than the client's last: answer with the sequence the history has for
        /// it (0 when the history no longer has it).
        case answerFromHistory
        /// A save number past the client's last applied one + 1: refused (not applied), so
        /// that a save skipped over can never be answered as applied later.
        case refuseSkipped(expected: UInt64)
        /// The ledger does not know the client: read its record from the store and decide
        /// with it (``decide(client:save:stored:)``).
        case readStore
    }

    let capacity: Int
    private(set) var known: [UUID: Journal.SaveRecord] = [:]
    private var turn: [UUID: Journal.SaveRecord] = [:]

    init(capacity: Int = 10_000) {
        self.capacity = max(1, capacity)
    }

    /// The decision for a save from what the ledger knows; `stored` is the client's record in
    /// the store, once read after a ``Decision/readStore`` (nil: the client has none).
    func decide(client: UUID, save: UInt64, stored: Journal.SaveRecord?? = nil) -> Decision {
        let last: Journal.SaveRecord?
        if let record = turn[client] ?? known[client] {
            last = record
        } else if let stored {
            last = stored
        } else {
            return .readStore
        }
        // A client without a record (new, or silent past the history age) starts anywhere.
        guard let last else { return .apply }
        if save > last.save {
            return save == last.save + 1 ? .apply : .refuseSkipped(expected: last.save + 1)
        }
        return last.save == save ? .answer(sequence: last.sequence) : .answerFromHistory
    }

    /// A save of the turn was applied with this sequence.
    mutating func applied(client: UUID, save: UInt64, sequence: UInt64) {
        turn[client] = Journal.SaveRecord(save: save, sequence: sequence)
    }

    /// The turn's commit is durable: its saves are known from now on.
    mutating func commit() {
        if known.count + turn.count > capacity { known.removeAll(keepingCapacity: true) }
        known.merge(turn) { _, new in new }
        turn = [:]
    }

    /// The turn's commit failed: none of its saves happened.
    mutating func abandon() { turn = [:] }
}
