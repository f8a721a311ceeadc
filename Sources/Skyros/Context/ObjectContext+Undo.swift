import Foundation

/// Undo (see ``UndoManager``): the context records the inverse of each change made in it or
/// applied from a child's save, and runs those inverses on ``UndoManager/undo()``.
extension ObjectContext {
    /// The context's undo manager: nil (the default) records nothing. Setting one makes the
    /// changes from then on undoable; a manager serves one context. Thread-safe.
    public var undoManager: UndoManager? {
        get { performAndWait { recorder } }
        set {
            performAndWait {
                if let newValue {
                    precondition(
                        newValue.context == nil || newValue.context === self,
                        "Skyros: an UndoManager serves one context; make another for \(name)")
                    newValue.context = self
                }
                if let old = recorder, old !== newValue {
                    old.removeAllActions()
                    old.context = nil
                }
                recorder = newValue
                reference.isUndoable = newValue != nil
            }
        }
    }

    // MARK: - Recording

    /// Before a property of a registered object takes `newValue` here: records how to put it back.
    /// `object` is the storage's object when the caller has it (it may not be registered yet).
    func recordValueChange(
        _ storage: ObjectStorage, index: Int, newValue: StoredValue, object known: (any ManagedObject)? = nil
    ) {
        guard let undo = recorder, undo.isRecording, !storage.isDeleted,
            let object = known ?? lookup(storage.objectID), object.skyrosStorage === storage
        else { return }
        // A fault's values are placeholders, not what an undo should put back.
        if storage.isFault {
            fulfill(storage)
            guard storage.context === self else { return }
        }
        if registry[storage.objectID] == nil && !storage.isInserted { register(object) }
        undo.record(
            .value(
                object, index: index, value: storage.values[index], error: storage.valueErrors[index],
                changed: storage.changed.contains(index), expected: newValue, generation: saveGeneration))
    }

    /// Before an object goes from `state` to `next` (inserted, deleted, restored): records the way back.
    func recordMembership(_ object: any ManagedObject, from state: Membership, to next: Membership) {
        guard let undo = recorder, undo.isRecording else { return }
        undo.record(.membership(object, state: state, expected: next, generation: saveGeneration))
    }

    /// Where an object stands here.
    func membership(of storage: ObjectStorage) -> Membership {
        if storage.isInserted { return .inserted }
        if storage.isDeleted { return deleted[storage.objectID] != nil ? .deleted : .gone }
        return .live(changed: storage.changed)
    }

    /// A child's save applied with an undo manager: its inserted rows become objects at once,
    /// so that their insertion can be undone (and redone) like one made here.
    func recordChildInserts(_ ids: [ObjectID]) {
        for id in ids {
            guard let object = promoteRow(id) else { continue }
            register(object)
            recordMembership(object, from: .gone, to: .inserted)
        }
    }

    // MARK: - Undoing

    /// Runs one recorded inverse, recording its own inverse in turn (for redo).
    func performUndo(_ action: UndoAction) {
        switch action {
        case .value(let object, let index, let value, let error, let changed, let expected, let generation):
            undoValue(
                object, index: index, value: value, error: error, changed: changed, expected: expected,
                generation: generation)
        case .membership(let object, let state, let expected, let generation):
            undoMembership(object, to: state, expected: expected, generation: generation)
        }
    }

    private func undoValue(
        _ object: any ManagedObject, index: Int, value: StoredValue, error: SkyrosError?, changed: Bool,
        expected: StoredValue, generation: UInt64
    ) {
        guard object.skyrosStorage.context === self else { return }  // gone from here (deleted elsewhere, forgotten)
        // The instance the context holds now (a newer one when this one was let go).
        let current = registry[object.objectID]?.object ?? object
        let storage = current.skyrosStorage
        if storage.isFault { fulfill(storage) }
        // Changed since by another process (merged): its value stays.
        guard storage.context === self, !storage.isDeleted, index < storage.values.count,
            StoredValue.isIdentical(storage.values[index], expected)
        else { return }
        recorder?.record(
            .value(
                current, index: index, value: storage.values[index], error: storage.valueErrors[index],
                changed: storage.changed.contains(index), expected: value, generation: saveGeneration))
        storage.values[index] = value
        if error != nil || !storage.valueErrors.isEmpty { storage.valueErrors[index] = error }
        if changed || generation != saveGeneration || storage.isInserted {
            storage.markChanged(index)
        } else {
            unmarkChanged(storage, index)
            undoneToSaved?[storage.objectID] = current
        }
    }

    /// Before an undo or redo step: starts collecting the objects it brings back to their
    /// saved state.
    func beginUndoStep() {
        undoneToSaved = [:]
        if !orderTails.isEmpty { orderTails = [:] }  // the step may take back or bring back the last positions
    }

    /// After an undo or redo step: the objects it brought back to their saved state take the
    /// parent's current values for the properties they have no pending change of. While they
    /// had pending changes, other processes' changes of those properties were not merged
    /// into them (see ``takeValues(_:of:)``): the values the step put back may be older.
    func endUndoStep() {
        guard let objects = undoneToSaved else { return }
        undoneToSaved = nil
        let ids = objects.compactMap { id, object -> ObjectID? in
            let storage = object.skyrosStorage
            return storage.context === self && !storage.isInserted && !storage.isDeleted && !storage.isFault ? id : nil
        }
        guard !ids.isEmpty, let snapshots = try? parent.snapshots(for: ids) else { return }
        for snapshot in snapshots {
            guard let storage = objects[snapshot.id]?.skyrosStorage else { continue }
            for index in storage.values.indices
            where index < snapshot.values.count && !storage.changed.contains(index)
                && storage.entity.properties[index].hasColumn
            {
                storage.values[index] = snapshot.values[index]
            }
            if storage.changed.isEmpty { storage.version = snapshot.version }
        }
    }

    /// A property back to its saved value: no longer a pending change.
    private func unmarkChanged(_ storage: ObjectStorage, _ index: Int) {
        storage.changesValidated = false
        if reference.isObserved { noteEdit(storage, property: index) }
        guard storage.changed.remove(index) != nil, storage.changed.isEmpty, !storage.isInserted, !storage.isDeleted,
            updated.removeValue(forKey: storage.objectID) != nil
        else { return }
        adjustPending(storage.entity, -1)
    }

    private func undoMembership(
        _ object: any ManagedObject, to state: Membership, expected: Membership, generation: UInt64
    ) {
        let storage = object.skyrosStorage
        let id = storage.objectID
        if let registered = registry[id]?.object, registered !== object { return }  // another instance took its place
        let saved = generation != saveGeneration
        let now = membership(of: storage)
        // Not where this step left it (seen or not): something else (another process) changed it since.
        guard now.isVisible == expected.isVisible else { return }
        guard storage.context === self || !storage.isInserted && storage.isDeleted else { return }
        let inStore: Bool
        switch now {
        case .live, .deleted: inStore = true
        case .inserted, .gone: inStore = false
        }
        switch (state.isVisible, inStore) {
        case (true, true):  // a pending deletion withdrawn
            var changed: PropertySet = []
            if !saved, case .live(let before) = state { changed = before }
            restoreDeleted(object, changed: changed)
        case (true, false):  // inserted again, with the same identifier and values
            storage.context = self
            storage.isDeleted = false
            storage.changed = []
            markInserted(object)
            register(object)
            if reference.isObserved { noteRestored(id, object, reinserted: true) }
        case (false, _):  // a pending insert withdrawn, or a deletion
            markDeleted(object)
            if !inStore, registry[id]?.object === object { registry[id] = nil }
        }
    }

    /// Withdraws a pending deletion: the object is back with the pending changes it had.
    func restoreDeleted(_ object: any ManagedObject, changed: PropertySet) {
        let storage = object.skyrosStorage
        let id = storage.objectID
        guard deleted.removeValue(forKey: id) != nil else { return }
        recordMembership(object, from: .deleted, to: .live(changed: changed))
        adjustPending(storage.entity, -1)
        storage.isDeleted = false
        storage.changed = changed
        if !changed.isEmpty {
            updated[id] = object
            adjustPending(storage.entity, 1)
        }
        if registry[id] == nil { register(object) }
        if reference.isObserved { noteRestored(id, object, reinserted: false) }
        undoneToSaved?[id] = object
    }

    /// An object whose deletion was undone. Observers that were told of the deletion see it
    /// inserted again; for those that were not (edits not processed yet), nothing happened.
    /// The next save announces an insert only when the object is inserted again
    /// (`reinserted`: its deletion was saved), not for a withdrawn pending deletion.
    private func noteRestored(_ id: ObjectID, _ object: any ManagedObject, reinserted: Bool) {
        guard applyingChildSave == 0 else { return }
        var unprocessed = unprocessedEdits[id] ?? LocalEdit()
        unprocessed.object = object
        if unprocessed.deleted { unprocessed.deleted = false } else { unprocessed.inserted = true }
        unprocessedEdits[id] = unprocessed
        var unsaved = unsavedEdits[id] ?? LocalEdit()
        unsaved.object = object
        unsaved.deleted = false
        unsaved.inserted = reinserted
        unsavedEdits[id] = unsaved
    }
}
