import Foundation

/// Undo and redo for a context: Foundation's `UndoManager` API, which Foundation on Linux
/// does not have.
///
/// Give the main context one and the edits made there, and the writes saved into it, become
/// undoable:
///
/// ```swift
/// store.mainContext.undoManager = UndoManager()
/// try store.writeAndWait { context in Todo.create(in: context).title = "buy milk" }
/// store.mainContext.undoManager?.undo()   // the todo is gone from the main context…
/// try store.saveMainContext()             // …and from the store
/// ```
///
/// What is recorded: attribute changes, inserts, deletes (with what their delete rules did)
/// and relationship changes (both sides), made in the context or saved into it by a child
/// context (a `write` block is one change set, so one undo step). Changes merged from other
/// processes are not recorded, and an undo never reverts them: a property another process
/// changed since is left as that process set it, the rest of the step is undone.
///
/// Grouping: like Foundation's manager with `groupsByEvent`, the changes of one
/// `perform`/`performAndWait` block of the context (or of one child's save) are one undo
/// step, unless ``beginUndoGrouping()``/``endUndoGrouping()`` group several. Nested groups
/// are part of the outermost one.
///
/// An undo or redo changes the context like any edit: the context then has pending changes,
/// saved by its next save (``Skyros/saveMainContext()`` for a stack's main context). Undoing
/// every step since the last save leaves the context with no changes. Saving does not empty
/// the stacks (a step undone after a save is saved again); ``ObjectContext/rollback()`` and
/// ``ObjectContext/reset()`` do, as Core Data's do.
///
/// Each step holds the objects it changed (as Foundation's manager holds its targets), so a
/// long history keeps them in memory: bound it with ``levelsOfUndo``, and turn recording off
/// (``disableUndoRegistration()``) around imports nobody will undo.
///
/// Thread-safe: ``undo()`` and ``redo()`` run on their context's queue (reentrant, so they
/// may be called inside one of its blocks). A manager serves one context.
public final class UndoManager: @unchecked Sendable {
    /// One undo or redo step: the context's inverse actions, in the order they were recorded,
    /// and its name.
    struct Group {
        var actions: [UndoAction] = []
        var name = ""
    }

    private let lock = NSLock()
    private var undoStack: [Group] = []
    private var redoStack: [Group] = []
    /// The group being recorded: opened by the first action outside an explicit group (closed
    /// at the end of the context's block), or by ``beginUndoGrouping()``.
    private var open: Group?
    /// Explicit groups open (``beginUndoGrouping()`` not yet ended).
    private var explicitLevel = 0
    private var disabledCount = 0
    private var _levelsOfUndo = 0
    private var undoing = false
    private var redoing = false
    /// Set by ``removeAllActions()`` during an undo or redo: its inverse is not kept.
    private var discarded = false
    private weak var _context: ObjectContext?

    /// The context it records for (set by ``ObjectContext/undoManager``).
    var context: ObjectContext? {
        get { lock.withLock { _context } }
        set { lock.withLock { _context = newValue } }
    }

    /// Makes an empty manager; assign it to a context's ``ObjectContext/undoManager``.
    public init() {}

    // MARK: - State

    /// Whether there is a step to undo (an open group with changes counts).
    public var canUndo: Bool {
        lock.withLock { !undoStack.isEmpty || open?.actions.isEmpty == false }
    }

    /// Whether there is a step to redo.
    public var canRedo: Bool { lock.withLock { !redoStack.isEmpty } }

    /// Whether an ``undo()`` is running.
    public var isUndoing: Bool { lock.withLock { undoing } }

    /// Whether a ``redo()`` is running.
    public var isRedoing: Bool { lock.withLock { redoing } }

    /// The number of explicit groups open (``beginUndoGrouping()`` minus ``endUndoGrouping()``).
    public var groupingLevel: Int { lock.withLock { explicitLevel } }

    /// The most steps kept; the oldest go first. 0 (the default): no limit.
    public var levelsOfUndo: Int {
        get { lock.withLock { _levelsOfUndo } }
        set {
            lock.withLock {
                _levelsOfUndo = max(0, newValue)
                trim()
            }
        }
    }

    /// Whether changes are being recorded (see ``disableUndoRegistration()``).
    public var isUndoRegistrationEnabled: Bool { lock.withLock { disabledCount == 0 } }

    /// The name of the step ``undo()`` would undo ("" when unnamed or none).
    public var undoActionName: String {
        lock.withLock {
            if let open, !open.actions.isEmpty { return open.name }
            return undoStack.last?.name ?? ""
        }
    }

    /// The name of the step ``redo()`` would redo.
    public var redoActionName: String { lock.withLock { redoStack.last?.name ?? "" } }

    /// Names the step being recorded (an application's "Undo Add Todo").
    public func setActionName(_ name: String) {
        lock.withLock {
            if open != nil {
                open!.name = name
            } else if !undoStack.isEmpty {
                undoStack[undoStack.count - 1].name = name
            }
        }
    }

    // MARK: - Grouping

    /// Opens a group: the changes until the matching ``endUndoGrouping()`` are one step,
    /// whatever blocks of the context they are made in. A step being recorded is closed first.
    public func beginUndoGrouping() {
        lock.withLock {
            guard !undoing && !redoing else { return }  // from another thread, during a step: ignored
            if explicitLevel == 0 { closeOpenGroup() }
            explicitLevel += 1
        }
    }

    /// Closes the group ``beginUndoGrouping()`` opened; the outermost one becomes a step.
    /// Without an open group it does nothing.
    public func endUndoGrouping() {
        lock.withLock {
            guard explicitLevel > 0, !undoing && !redoing else { return }
            explicitLevel -= 1
            if explicitLevel == 0 { closeOpenGroup() }
        }
    }

    /// Stops recording (calls nest: each must be balanced by ``enableUndoRegistration()``),
    /// e.g. around an import the user should not undo.
    public func disableUndoRegistration() { lock.withLock { disabledCount += 1 } }

    /// Resumes recording after ``disableUndoRegistration()``.
    public func enableUndoRegistration() { lock.withLock { disabledCount = max(0, disabledCount - 1) } }

    /// Forgets every step, to undo and to redo.
    public func removeAllActions() {
        lock.withLock {
            undoStack = []
            redoStack = []
            explicitLevel = 0
            if undoing || redoing { discarded = true } else { open = nil }
        }
    }

    // MARK: - Undo and redo

    /// Undoes the last step (closing the groups still open first), on the context's queue;
    /// its inverse becomes the step ``redo()`` redoes. Does nothing when there is none.
    public func undo() {
        run(redo: false)
    }

    /// Redoes the last step undone; it becomes a step to undo again.
    public func redo() {
        run(redo: true)
    }

    private func run(redo: Bool) {
        guard let context else { return }
        context.performAndWait {
            let step: Group? = lock.withLock {
                if open != nil || explicitLevel > 0 {
                    explicitLevel = 0
                    closeOpenGroup()
                }
                guard let step = redo ? redoStack.popLast() : undoStack.popLast() else { return nil }
                if redo { redoing = true } else { undoing = true }
                open = Group(name: step.name)
                return step
            }
            guard let step else { return }
            context.beginUndoStep()
            for action in step.actions.reversed() { context.performUndo(action) }
            context.endUndoStep()
            lock.withLock {
                let inverse = discarded ? Group() : open ?? Group(name: step.name)
                open = nil
                discarded = false
                if redo {
                    redoing = false
                    if !inverse.actions.isEmpty { undoStack.append(inverse) }
                    trim()
                } else {
                    undoing = false
                    if !inverse.actions.isEmpty { redoStack.append(inverse) }
                }
            }
        }
    }

    // MARK: - Recording (on the context's queue)

    /// Whether actions are recorded now (registration enabled).
    var isRecording: Bool { lock.withLock { disabledCount == 0 } }

    /// Records the inverse of a change just made. Outside an undo or redo, it clears what
    /// could be redone.
    func record(_ action: UndoAction) {
        lock.withLock {
            guard disabledCount == 0 else { return }
            if !undoing && !redoing && !redoStack.isEmpty { redoStack = [] }
            if open == nil { open = Group() }
            open!.actions.append(action)
        }
    }

    /// The end of a block of the context: the step it recorded is closed, unless an explicit
    /// group or an undo is under way.
    func endOfBlock() {
        lock.withLock {
            guard explicitLevel == 0, !undoing, !redoing else { return }
            closeOpenGroup()
        }
    }

    /// Under the lock.
    private func closeOpenGroup() {
        guard let group = open else { return }
        open = nil
        guard !group.actions.isEmpty else { return }
        undoStack.append(group)
        trim()
    }

    /// Under the lock.
    private func trim() {
        if _levelsOfUndo > 0 && undoStack.count > _levelsOfUndo {
            undoStack.removeFirst(undoStack.count - _levelsOfUndo)
        }
    }
}

/// The inverse of one change, recorded by a context for its ``UndoManager``.
enum UndoAction {
    /// Puts `value` back in property `index` of the object (and the value error it had), if
    /// the property still holds `expected` (otherwise another process changed it since: left
    /// alone). `changed` says whether the property was a pending change before; it is only
    /// restored as unchanged when no save happened since (`generation`).
    case value(
        any ManagedObject, index: Int, value: StoredValue, error: SkyrosError?, changed: Bool, expected: StoredValue,
        generation: UInt64)
    /// Brings the object back to `state` — seen (inserted or live) or not (deleted or gone) —
    /// if it is still seen as `expected` left it (otherwise another process deleted it). What
    /// that means depends on the store: an object seen again is a withdrawn deletion when the
    /// store has it, an insert when it does not. Pending changes are restored when no save
    /// happened since (`generation`).
    case membership(any ManagedObject, state: Membership, expected: Membership, generation: UInt64)
}

/// Where an object stands in its context, for undo.
enum Membership: Equatable {
    /// A pending insert.
    case inserted
    /// Not in the context, nor in the store (an insert undone, or a deletion saved).
    case gone
    /// A pending deletion of an object in the store.
    case deleted
    /// In the store, with these pending changes.
    case live(changed: PropertySet)

    /// Whether the user sees the object (it is inserted or live).
    var isVisible: Bool {
        switch self {
        case .inserted, .live: true
        case .gone, .deleted: false
        }
    }
}
