import Foundation

/// Exactly-once saves as a value: for each save of a turn, whether to apply it or answer it
/// with the sequence it got before.
///
/// A save's record is its history row (`skyros_history` has the client and the save number),
/// written in the save's transaction; when the history's retention removes a client's last
/// row, the record is copied into `skyros_saves` in the same transaction
/// (``leaving(below:)``). The ledger knows the last save of every client whose record is a
/// history row — read from the history when the store opens (``init(history:)``), then kept
/// with every commit — so a client it does not know has its record in `skyros_saves`, or none.
/// It holds the saves of the turn in progress apart: they count only once the turn's commit is
/// durable (``commit()``) and are dropped if it fails (``abandon()``).
///
/// The store is read and written by the daemon when the ledger says so: no I/O here.
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
        /// The ledger does not know the client: read its record from `skyros_saves` and decide
        /// with it (``decide(client:save:stored:)``).
        case readStore
    }

    /// The last save of each client whose record is a history row (and of some whose record
    /// was copied to `skyros_saves` since: harmless, it is the same).
    private(set) var known: [UUID: Journal.SaveRecord] = [:]
    private var turn: [UUID: Journal.SaveRecord] = [:]
    /// The saves in the history, oldest first, from `head` on: a client's entry is stale once
    /// it saved again (its record is a later row).
    private var order: [(sequence: UInt64, client: UUID)] = []
    private var head = 0
    /// Entries from `head` whose rows the turn's pruning removes.
    private var leavingCount = 0

    /// A ledger for a store without history.
    init() {}

    /// A ledger for a store whose history records these saves, oldest first.
    init(history: [(client: UUID, record: Journal.SaveRecord)]) {
        order.reserveCapacity(history.count)
        for (client, record) in history {
            known[client] = record
            order.append((record.sequence, client))
        }
    }

    /// The decision for a save from what the ledger knows; `stored` is the client's record in
    /// `skyros_saves`, once read after a ``Decision/readStore`` (nil: the client has none).
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

    /// The turn's pruning removes the history rows below `bound`: the sequences of those that
    /// are still a client's record, to copy into `skyros_saves` before they go. (Rows of the
    /// turn itself among them too: a retention shorter than the turn.)
    mutating func leaving(below bound: UInt64) -> [UInt64] {
        var records: [UInt64] = []
        var index = head + leavingCount
        while index < order.count, order[index].sequence < bound {
            let entry = order[index]
            if turn[entry.client] == nil, known[entry.client]?.sequence == entry.sequence {
                records.append(entry.sequence)
            }
            index += 1
        }
        leavingCount = index - head
        for record in turn.values where record.sequence < bound { records.append(record.sequence) }
        return records
    }

    /// The turn's commit is durable: its saves are known from now on, and the clients whose
    /// record left the history (copied to `skyros_saves`) are left to the store.
    mutating func commit() {
        for (client, record) in turn.sorted(by: { $0.value.sequence < $1.value.sequence }) {
            known[client] = record
            order.append((record.sequence, client))
        }
        turn = [:]
        for entry in order[head..<(head + leavingCount)] where known[entry.client]?.sequence == entry.sequence {
            known[entry.client] = nil
        }
        head += leavingCount
        leavingCount = 0
        if head > 4_096 && head * 2 > order.count {
            order.removeFirst(head)
            head = 0
        }
    }

    /// The turn's commit failed: none of its saves happened, and no record left the history.
    mutating func abandon() {
        turn = [:]
        leavingCount = 0
    }
}
