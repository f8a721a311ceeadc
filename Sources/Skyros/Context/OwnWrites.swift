import Foundation
import Synchronization

/// A store that tells the position of each save in its sequence of change sets: the
/// daemon's (`RemoteStore`), whose change events carry the same sequence numbers.
package protocol SequencedObjectStore: ObjectStore {
    /// Saves like ``ObjectStore/save(_:)`` and returns the sequence number the store gave the
    /// change set (nil when it did not say).
    func saveReturningSequence(_ changes: ChangeSet) throws -> UInt64?
    /// The ledger of the main context saving into it, told each of this client's change sets
    /// as soon as the store numbers it (``OwnWrites/numbered(_:)``): before any later change
    /// of another process is merged.
    var ownWrites: OwnWrites? { get set }
}

/// The properties a shared stack's main context saved that the store has not passed yet,
/// so that another process's change committed *before* them, whose event arrives after the
/// main context took them, does not put an older value back (read-your-writes).
///
/// A save into the main context marks each property it updated with a generation; the root's
/// save to the daemon then settles the marks it carried with the sequence the daemon gave it.
/// Merging another process's change of sequence `s` skips a marked property whose save is not
/// settled yet, or settled at a sequence after `s`; once the merges pass a mark's sequence,
/// the mark goes. Found by the sync fault campaign's history checker (issue 35): a client
/// read a value another client of its machine had saved before its own save, and kept reading
/// it until the property changed again.
package final class OwnWrites: Sendable {
    private struct Mark {
        var generation: UInt64
        /// The daemon's sequence of the change set that carried it; nil until known.
        var sequence: UInt64?
    }

    private struct State {
        var generation: UInt64 = 0
        var marks: [ObjectID: [Int: Mark]] = [:]
        /// The generations the root's save in flight carries (nil: none in flight).
        var inFlight: UInt64?
        /// The last sequence a save was numbered.
        var lastNumbered: UInt64 = 0
    }

    private let state = Mutex(State())

    package init() {}

    /// The generation of the last save recorded.
    package var generation: UInt64 { state.withLock { $0.generation } }

    /// Marks the properties a save updates (before it goes to the parent context).
    /// - Returns: the save's generation.
    @discardableResult
    package func record(_ changes: ChangeSet) -> UInt64 {
        state.withLock { state in
            state.generation += 1
            for update in changes.updated {
                for index in update.changes.keys {
                    state.marks[update.id, default: [:]][index] = Mark(generation: state.generation, sequence: nil)
                }
            }
            return state.generation
        }
    }

    /// The save of `generation` did not reach the parent context: its marks go.
    package func cancel(_ generation: UInt64) {
        state.withLock { Self.removeMarks(&$0) { $0.generation == generation } }
    }

    /// The root's save carrying the main context's saves through `generation` goes to the store.
    package func sending(through generation: UInt64) {
        state.withLock { $0.inFlight = generation }
    }

    /// The store numbered this client's change set `sequence` (its reply, or its event seen
    /// first on the event stream): the save in flight is settled at once, so that a later
    /// change of another process, merged next, is not taken for an older one. A number not
    /// after the last one (a late event of an earlier save) is ignored.
    package func numbered(_ sequence: UInt64) {
        state.withLock { state in
            guard let generation = state.inFlight, sequence > state.lastNumbered else { return }
            state.lastNumbered = sequence
            Self.settle(&state, through: generation, sequence: sequence)
        }
    }

    /// The saves through `generation` reached the store as the change set `sequence`; nil:
    /// the store did not say, or the save failed (their marks go).
    package func settle(through generation: UInt64, sequence: UInt64?) {
        state.withLock { state in
            state.inFlight = nil
            if let sequence { state.lastNumbered = max(state.lastNumbered, sequence) }
            Self.settle(&state, through: generation, sequence: sequence)
        }
    }

    private static func settle(_ state: inout State, through generation: UInt64, sequence: UInt64?) {
        let carried = { (mark: Mark) in mark.sequence == nil && mark.generation <= generation }
        guard let sequence else { return removeMarks(&state, where: carried) }
        for (id, marks) in state.marks {
            for (index, mark) in marks where carried(mark) { state.marks[id]?[index]?.sequence = sequence }
        }
    }

    /// Removes the marks `remove` picks, and the objects left with none.
    private static func removeMarks(_ state: inout State, where remove: (Mark) -> Bool) {
        guard !state.marks.isEmpty else { return }
        for (id, marks) in state.marks {
            let kept = marks.filter { !remove($0.value) }
            if kept.count != marks.count { state.marks[id] = kept.isEmpty ? nil : kept }
        }
    }

    /// The property indexes of `id` that a change of sequence `sequence` must not overwrite.
    package func shielded(_ id: ObjectID, at sequence: UInt64) -> Set<Int> {
        state.withLock { state in
            guard let marks = state.marks[id] else { return [] }
            return Set(
                marks.compactMap { index, mark in
                    guard let saved = mark.sequence else { return index }
                    return saved > sequence ? index : nil
                })
        }
    }

    /// `change` without the values it must not overwrite here (see ``shielded(_:at:)``).
    package func shielding(_ change: StoreChange) -> StoreChange {
        guard shields(change) else { return change }
        var change = change
        for (id, update) in change.updated {
            let shielded = shielded(id, at: change.sequence)
            guard !shielded.isEmpty else { continue }
            var kept = update
            kept.values = update.values.filter { !shielded.contains($0.key) }
            change.updated[id] = kept
        }
        return change
    }

    /// Whether ``shielding(_:)`` may change `change`: it updates objects while properties are
    /// marked (a merge passes any other change as it is, without copying it).
    package func shields(_ change: StoreChange) -> Bool {
        !change.updated.isEmpty && state.withLock { !$0.marks.isEmpty }
    }

    /// The merges reached `sequence`: the marks settled at or before it go.
    package func passed(_ sequence: UInt64) {
        state.withLock { Self.removeMarks(&$0) { mark in mark.sequence.map { $0 <= sequence } ?? false } }
    }

    /// Forgets the settled marks (the main context refreshes from the store, which has them).
    package func forgetSettled() {
        state.withLock { Self.removeMarks(&$0) { $0.sequence != nil } }
    }

    /// How many properties are marked (for tests).
    package var count: Int { state.withLock { $0.marks.values.reduce(0) { $0 + $1.count } } }
}
