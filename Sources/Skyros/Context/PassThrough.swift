import Foundation

/// A child's change set held by a stack's main or root context as it came, instead of applied.
///
/// A stack's write goes scratch → main → root → store. The main and root contexts would each
/// make pending rows and objects of the change set their child pushes, only to make the same
/// change set of them again and push it on; after the save they hold nothing of it. When such
/// a context has nothing pending and nothing depends on what it would hold (no observer, no
/// undo, no link, no deletion, no object it holds or keeps as another process's row among
/// those updated, no object of a hierarchy updated, no required to-one changed, updates made
/// on a known version, a merge policy other than ``MergePolicy/storeWins``), it keeps the
/// change set as it is, and its save (``ObjectContext/savePassThrough(keepingObjects:)``)
/// pushes or sends it as it came.
///
/// Anything else that runs on the context's queue in between (a read, a fetch, another child's
/// save, a merge of other processes' changes, a reset) applies it first
/// (``ObjectContext/materializePassThrough()``), so that it sees what it would have seen: only
/// the stack's own save path (``ObjectContext/performSaveAndWait(_:)``,
/// ``ObjectContext/performSave(_:)``) leaves it as it is. Applying it reads nothing from the
/// store (every update becomes a fault carrying its changes, see
/// ``ObjectContext/apply(_:childValues:)``), so it cannot fail.
struct PassThrough {
    /// The child's change set, as its `makeChangeSet` made it.
    var changes: ChangeSet
    /// The child's values of the objects it updated (see ``ObjectContext/save(_:childValues:fromChild:)``).
    var childValues: [ObjectID: Snapshot]
}

extension ObjectContext {
    /// Whether this context can hold `changes` as they came (see ``PassThrough``).
    func canPassThrough(_ changes: ChangeSet) -> Bool {
        guard !hasChanges, !reference.isObserved, recorder == nil, changes.deleted.isEmpty,
            mergePolicy != .storeWins, pendingLinkIndex == nil
        else { return false }
        if !schema.linkEntityNames.isEmpty {
            for snapshot in changes.inserted where schema.isLinkEntity(snapshot.id.entityName) { return false }
        }
        var entity: EntityDescription?  // change sets come grouped by entity: one lookup per group
        for update in changes.updated {
            // At version 0 (read through a parent where it was still a pending insert), applying
            // it reads the object's version from the parent, for the store's conflict check.
            guard update.baseVersion > 0 else { return false }
            // An object held here, or kept as another process's row, takes the change: applied.
            if !registry.isEmpty && registry[update.id] != nil { return false }
            if mergedRows.contains(update.id) { return false }
            if entity?.name != update.id.entityName {
                guard !schema.isLinkEntity(update.id.entityName),
                    let found = schema.entity(named: update.id.entityName), found.hierarchy == nil
                else { return false }
                entity = found
            }
            // A required to-one changed: the save's validation takes its target (registering
            // an object inserted by the same write, which merges then keep current): applied.
            for property in entity?.requiredToOneProperties ?? [] where update.changes[property.index] != nil {
                return false
            }
        }
        return true
    }

    /// Applies the change set passing through, as ``save(_:childValues:fromChild:)`` would
    /// have applied it: before anything else looks at this context.
    func materializePassThrough() {
        guard let held = passThrough else { return }
        passThrough = nil
        apply(held)
    }

    /// Applies a change set that was passing through.
    private func apply(_ held: PassThrough) {
        do {
            try apply(held.changes, childValues: held.childValues)
        } catch {
            // Not expected: applying it reads nothing (see ``PassThrough``).
            report(error)
        }
    }

    /// ``save()`` of a context holding a change set that passes through: pushed into the parent
    /// context, or sent to the store, as it came.
    ///
    /// While it is on its way the context holds nothing: a save reentering the context
    /// meanwhile (a handler the store calls back on this thread, such as
    /// `RemoteStore.onSaveResolved`) applies and saves only its own changes. A change set the
    /// store refuses comes back, for the caller to see what it touched and roll it back. When
    /// the store says an object it updates does not exist (another process deleted it), it is
    /// applied, the updates of the objects the store no longer has are dropped (as the usual
    /// save does), and the rest is saved.
    func savePassThrough(keepingObjects: Bool) throws {
        guard let held = passThrough else { return }
        let changes = makeChangeSet()  // the held change set, with this context's merge policy
        passThrough = nil
        let generation = ownWrites?.record(changes)
        do {
            try send(changes)
        } catch {
            if let generation { ownWrites?.cancel(generation) }
            // Back, held as it was when nothing came meanwhile.
            if hasChanges { apply(held) } else { passThrough = held }
            guard let refusal = error as? SkyrosError, refusal.code == .objectNotFound, !changes.updated.isEmpty else {
                throw error
            }
            materializePassThrough()
            guard try dropUpdatesOfMissingObjects() else { throw error }
            guard hasChanges else {  // every update dropped, nothing else: nothing to send
                lastSavedSequence = nil
                didSave(keepingObjects: keepingObjects, policy: changes.mergePolicy)
                announceOwnSave()
                return
            }
            return try save(keepingObjects: keepingObjects)
        }
        didSave(keepingObjects: keepingObjects, policy: changes.mergePolicy)
        announceOwnSave()
    }
}
