import Foundation
import Skyros
import SkyrosSync
import Synchronization

/// A defect a debug build of `skyrosd` can be told to have, by the environment variable
/// `SKYROS_DEBUG_DEFECT` (its raw value), so that the sync fault campaign's checker is shown
/// to catch each kind of loss (`SyncCheckerTests`). A release build reads no variable and has
/// none of them.
package enum DebugDefect: String, Sendable, CaseIterable {
    /// Every 5th change set queued for upload is numbered, then taken out of the queue before
    /// the engine reads it: the server never records that number.
    case dropChangeSet
    /// Every 8th change set that only updates is queued a second time 12 change sets later:
    /// the server applies it twice.
    case applyTwice
    /// Every 5th change set that only updates is committed and acknowledged but never queued:
    /// its values never go up, and no number is missing.
    case skipUpdate
    /// Every object a checkpoint inserts is stored with its first text value changed: the
    /// machine's store no longer equals the server's table.
    case divergeMachine
    /// Every 4th property value a checkpoint updates is replaced by the value the server sent
    /// for that property two updates before: the apps read a value older than one they read.
    case readStale
    /// Refused change sets are recorded in the rejected log, but the apps are not told.
    case swallowRefusal
}

/// Where the daemon carries out its ``DebugDefect``: one call at each point it acts (the
/// queueing of a change set in ``GroupCommit``, the change set of a checkpoint and its
/// refusals in ``DaemonTurn/applyCheckpoint(_:)``). Without a defect (always, in a release
/// build) each call does exactly what the code did before it.
enum DebugDefects {
    #if DEBUG
        /// The defect asked for by `SKYROS_DEBUG_DEFECT`, read once (nil: none, or a name no
        /// defect has, which is said on standard error).
        static let active: DebugDefect? = {
            guard let name = ProcessInfo.processInfo.environment["SKYROS_DEBUG_DEFECT"], !name.isEmpty else {
                return nil
            }
            guard let defect = DebugDefect(rawValue: name) else {
                FileHandle.standardError.write(Data("skyrosd: SKYROS_DEBUG_DEFECT=\(name): no such defect\n".utf8))
                return nil
            }
            FileHandle.standardError.write(
                Data("skyrosd: DEBUG BUILD WITH A DEFECT ON PURPOSE: \(defect.rawValue)\n".utf8))
            return defect
        }()

        /// The defects' counters and memories (the daemon's thread is the only caller; the
        /// lock makes the static state `Sendable`).
        private struct State {
            var queued = 0
            var updatesQueued = 0
            var replay: (changes: QueuedChangeSet, countdown: Int)?
            var updatesApplied = 0
            /// The values the server sent for each object's property (`uuid/index`), oldest first.
            var sent: [String: [StoredValue]] = [:]
        }

        private static let state = Mutex(State())
    #else
        static var active: DebugDefect? { nil }
    #endif

    /// Queues a committed change set for upload (``SyncTables/enqueue(_:sequence:in:)``) and
    /// returns its number, to hand to the engine; nil when nothing is handed.
    static func enqueue(_ changes: QueuedChangeSet, sequence: Int64, in transaction: SQLiteStore.Transaction)
        throws -> Int64?
    {
        #if DEBUG
            switch active {
            case .dropChangeSet:
                let drop = state.withLock { state in
                    state.queued += 1
                    return state.queued % 5 == 0
                }
                guard let number = try SyncTables.enqueue(changes, sequence: sequence, in: transaction) else {
                    return nil
                }
                guard drop else { return number }
                try transaction.execute("DELETE FROM skyros_sync_queue WHERE number = ?", [.integer(number)])
                return nil
            case .skipUpdate where isUpdateOnly(changes):
                let skip = state.withLock { state in
                    state.updatesQueued += 1
                    return state.updatesQueued % 5 == 0
                }
                if skip { return nil }
            case .applyTwice:
                let again = state.withLock { state -> QueuedChangeSet? in
                    var due: QueuedChangeSet?
                    if let replay = state.replay {
                        if replay.countdown <= 1 {
                            due = replay.changes
                            state.replay = nil
                        } else {
                            state.replay = (replay.changes, replay.countdown - 1)
                        }
                    }
                    if isUpdateOnly(changes) {
                        state.updatesQueued += 1
                        if state.updatesQueued % 8 == 0 && state.replay == nil { state.replay = (changes, 12) }
                    }
                    return due
                }
                if let again { try SyncTables.enqueue(again, sequence: sequence, in: transaction) }
            default:
                break
            }
        #endif
        return try SyncTables.enqueue(changes, sequence: sequence, in: transaction)
    }

    /// The change set that brings the store to a checkpoint's values, as the defect alters it.
    static func applying(_ changes: ChangeSet) -> ChangeSet {
        #if DEBUG
            switch active {
            case .divergeMachine:
                var changes = changes
                for (position, snapshot) in changes.inserted.enumerated() {
                    guard let index = snapshot.values.firstIndex(where: { if case .text = $0 { true } else { false } }),
                        case .text(let text) = snapshot.values[index]
                    else { continue }
                    changes.inserted[position].values[index] = .text(text + " (diverged)")
                }
                return changes
            case .readStale:
                var changes = changes
                state.withLock { state in
                    for (position, update) in changes.updated.enumerated() {
                        for (index, value) in update.changes {
                            let key = "\(update.id.uuid)/\(index)"
                            let sent = state.sent[key, default: []]
                            state.sent[key] = Array((sent + [value]).suffix(3))
                            state.updatesApplied += 1
                            if state.updatesApplied % 4 == 0, sent.count >= 2 {
                                changes.updated[position].changes[index] = sent[sent.count - 2]
                            }
                        }
                    }
                }
                return changes
            default:
                break
            }
        #endif
        return changes
    }

    /// Whether the apps are told of the change sets a checkpoint says the server refused.
    static var tellsRefusals: Bool { active != .swallowRefusal }

    #if DEBUG
        private static func isUpdateOnly(_ changes: QueuedChangeSet) -> Bool {
            changes.inserted.isEmpty && changes.deleted.isEmpty && !changes.updated.isEmpty && !changes.reset
        }
    #endif
}
