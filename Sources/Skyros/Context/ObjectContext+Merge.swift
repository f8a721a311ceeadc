import Foundation

/// What reaches a context from elsewhere: another process's committed changes (a shared
/// stack's main context), a child context's save, and the undoing of a save the store refused.
extension ObjectContext {
    // MARK: - Another process's changes

    /// Merges changes committed elsewhere, in order, in one visit to the queue (waiting for
    /// it when it is busy). Registered objects that changed take the new values (the
    /// properties an object has unsaved changes of keep them); deleted ones are marked deleted
    /// and forgotten; inserted objects are registered when the context has observers, and
    /// otherwise kept as rows (``MergedRows``). A reset forgets every clean object, a refresh
    /// turns them back into faults. Observers get one change for the lot.
    func merge(_ changes: [StoreChange]) {
        performAndWait {
            if !orderTails.isEmpty { orderTails = [:] }  // other processes may have placed objects last
            let observed = reference.isObserved
            var merged = ContextChanges(kind: .merged)
            var reload = false
            for index in changes.indices {
                let (isReset, isRefresh) = (changes[index].isReset, changes[index].isRefresh)
                if isReset {
                    forgetAllClean()
                    mergedRows.removeAll()
                    ownWrites?.forgetSettled()
                    reload = true
                } else if isRefresh {
                    for id in registry.keys { refreshIfClean(id) }
                    mergedRows.removeAll()
                    ownWrites?.forgetSettled()
                    reload = true
                } else if let ownWrites, !changes[index].updated.isEmpty, ownWrites.shields(changes[index]) {
                    // Else passed on as it is, not copied.
                    merge([ownWrites.shielding(changes[index])], at: 0, observed: observed, into: &merged)
                    ownWrites.passed(changes[index].sequence)
                } else {
                    merge(changes, at: index, observed: observed, into: &merged)
                    ownWrites?.passed(changes[index].sequence)
                }
            }
            guard observed else { return }
            if reload {
                announceReload()
            } else {
                announce(resolved(merged))
            }
        }
    }

    /// Merges the change at `index` of `changes`, which lists its objects; what observers are
    /// told is added to `merged`. The change is read where it lies, field by field: handed to
    /// a function, an element of an array is copied first (each of its lists retained and
    /// released), and this runs for every change set another process makes.
    private func merge(_ changes: [StoreChange], at position: Int, observed: Bool, into merged: inout ContextChanges) {
        // Objects for observers (they are handed the inserted objects); rows otherwise, made
        // objects only if someone asks for them.
        // By index: a row is not copied to be read (its values are handed on).
        let inserted = changes[position].inserted
        for index in inserted.indices where registered(inserted[index].id) == nil {
            if observed {
                _ = try? materialize(
                    inserted[index].id, values: inserted[index].values, version: inserted[index].version)
            } else {
                mergedRows.insert(inserted[index].id, values: inserted[index].values, version: inserted[index].version)
            }
        }
        if let encoded = changes[position].encodedInserted {
            // Another process's inserts as its event carried them: rows kept encoded (decoded
            // only if someone reads them), objects for observers.
            let source = encoded.source
            for index in encoded.range {
                let id = source.id(at: index)
                if observed { merged.insertedIDs.append(id) }
                guard registered(id) == nil else { continue }
                if !observed {
                    mergedRows.insert(id, encodedIn: source, at: index)
                } else if let values = source.values(at: index) {
                    _ = try? materialize(id, values: values, version: source.version(at: index))
                }
            }
        }
        let deleted = changes[position].deleted
        for (id, update) in changes[position].updated {
            takeValues(update, of: id)
            mergedRows.update(id, with: update)
            if observed { merged.updatedProperties[id, default: []].formUnion(update.properties) }
        }
        if observed {
            for index in inserted.indices { merged.insertedIDs.append(inserted[index].id) }
            for id in deleted {
                merged.deleted.append(id)
                if let object = registry[id]?.object { merged.deletedObjects[id] = object }
            }
        }
        for id in deleted {
            forgetDeleted(id)
            mergedRows.remove(id)
        }
    }

    /// Turns a registered, unchanged object back into a fault.
    func refreshIfClean(_ id: ObjectID) {
        guard let object = registry[id]?.object, !object.skyrosStorage.hasChanges else { return }
        object.skyrosStorage.isFault = true
    }

    /// Takes another process's new values for a registered object that is not a fault:
    /// the properties it has unsaved changes of keep them (the saver of those wins at its own
    /// save, property by property), and its version becomes the new one only when it has
    /// none (so that an `.error` merge policy still sees the conflict).
    ///
    /// An update no newer than the version the object was read at is not taken: the object
    /// was read after that change was committed, before its event came (a fetch overtakes the
    /// event thread; a client that reconnects is sent the history it missed), and taking it
    /// would show an older value until the next event brings the newer one back. Compared
    /// with the version read, not with one this context counted at its own saves
    /// (``ObjectStorage/countedSaves``): another process's change may carry that number.
    func takeValues(_ update: StoreChange.Update, of id: ObjectID) {
        guard let storage = registry[id]?.object.skyrosStorage, !storage.isFault, !storage.isDeleted else { return }
        if update.version > 0, let read = storage.versionRead, read >= update.version { return }
        for (index, value) in update.values where index < storage.values.count && !storage.changed.contains(index) {
            storage.values[index] = value
        }
        if storage.changed.isEmpty {
            storage.version = update.version
            storage.countedSaves = 0
        }
    }

    /// Marks a registered object deleted by another process, and forgets it.
    func forgetDeleted(_ id: ObjectID) {
        guard let object = registry[id]?.object, !object.skyrosStorage.hasChanges else { return }
        registry[id] = nil
        object.skyrosStorage.isDeleted = true
        object.skyrosStorage.context = nil
    }

    /// Forgets every registered object without changes (the store was emptied).
    func forgetAllClean() {
        for id in registry.keys { forgetDeleted(id) }
    }

    // MARK: - A save the store refused

    /// Forgets the copies of the objects a save below this context touched, when the store
    /// refused it: they are ahead of the store (objects with changes here keep them). What
    /// observers were shown of that save is not in the store: they start over.
    func forgetRefusedSave(touching ids: [ObjectID]) {
        // Undo steps may name objects as saved that the store never had (or still has).
        recorder?.removeAllActions()
        for id in ids {
            guard let object = lookup(id), !object.hasChanges else { continue }
            registry[id] = nil
            object.skyrosStorage.context = nil
        }
        announceReload()
    }

    // MARK: - A child's save (ObjectStore)

    /// Applies a child context's change set to this context, atomically: unique attributes
    /// are checked first, and nothing is applied if they fail.
    public func save(_ changes: ChangeSet) throws {
        try save(changes, childValues: [:])
    }

    /// ``save(_:)``, with the child's values of the objects it updated (`childValues`, at the
    /// version it holds them). A root context makes the ones it does not hold from them
    /// instead of reading them from its store, since it only passes the changed properties
    /// on; until its save, what it shows of them is its child's view. They are kept in
    /// ``unverifiedUpdates``: when the store says one no longer exists, its update is dropped.
    ///
    /// `fromChild`: the change set is a child context's save (made by its `makeChangeSet`),
    /// which a stack's root or main context with nothing pending may hold as it came (``PassThrough``).
    func save(_ changes: ChangeSet, childValues: [ObjectID: Snapshot], fromChild: Bool = false) throws {
        // Not inside a block of this context already running on this thread: that block
        // could look at the pending changes without applying them first.
        let passes = fromChild && passesThroughChildSaves && !isPerformingOnCurrentThread
        try performAndWait {
            try validateUniqueness(of: changes)
            // The child's save being applied is its ledger's latest (it records, then saves).
            defer { if let childWrites { coveredGeneration = childWrites.generation } }
            if passes && canPassThrough(changes) {
                passThrough = PassThrough(changes: changes, childValues: childValues)
                return
            }
            guard reference.isObserved else { return try apply(changes, childValues: childValues) }
            var deletedObjects: [ObjectID: any ManagedObject] = [:]
            for id in changes.deleted { if let object = lookup(id) { deletedObjects[id] = object } }
            applyingChildSave += 1
            defer { applyingChildSave -= 1 }
            try apply(changes, childValues: childValues)
            announce(self.changes(appliedFrom: changes, deletedObjects: deletedObjects))
        }
    }

    func apply(_ changes: ChangeSet, childValues: [ObjectID: Snapshot] = [:]) throws {
        if !orderTails.isEmpty { orderTails = [:] }  // the child may have placed objects last
        // Load the objects updated here that are not registered, in one round trip.
        var loaded: [ObjectID: any ManagedObject] = [:]  // updated objects not in this context yet
        var missing = changes.updated.map(\.id).filter { id in
            guard let storage = lookup(id)?.skyrosStorage else { return true }
            // A fault already carrying a child's changes takes these over them too (below).
            return storage.isFault && !(storage.carriesChildChanges && !storage.changed.isEmpty)
        }
        if !mergedRows.isEmpty {
            // Objects kept as merged rows (see ``MergedRows``): their row is their state here,
            // and it goes (the object takes over from it). A registered object has none: it
            // took its row when it was registered.
            missing = missing.filter { id in
                guard lookup(id) == nil, let entity = schema.entity(named: id.entityName), let row = mergedRows.take(id)
                else { return true }
                loaded[id] = makeObject(id, of: entity, values: row.values, version: row.version)
                return false
            }
            for id in changes.deleted { mergedRows.remove(id) }
        }
        if !missing.isEmpty && !childValues.isEmpty && !parentIsContext {
            missing = missing.filter { id in
                guard let known = childValues[id], lookup(id) == nil, let entity = schema.entity(named: id.entityName)
                else { return true }
                loaded[id] = makeObject(id, of: entity, values: known.values, version: known.version)
                unverifiedUpdates.insert(id)
                return false
            }
        }
        if !missing.isEmpty && !reference.isObserved && recorder?.isRecording != true {
            // Objects this context does not hold, whose changed properties only pass through
            // toward the store: made faults carrying the changes, as Core Data's parent
            // context does, instead of reading their rows first. A fault is read if someone
            // looks at it here (a fetch merging pending changes reads them in one request),
            // keeping the version its changes were made on. Not for an observed context (its
            // observers read what changed) or one recording undo (it records the values
            // replaced), nor for the objects of a hierarchy (the class is in the row) or of
            // link and order entities.
            missing = missing.filter { id in
                guard lookup(id) == nil, !schema.isLinkEntity(id.entityName),
                    let entity = schema.entity(named: id.entityName), entity.hierarchy == nil
                else { return true }
                let object = makeObject(id, of: entity, values: nil)
                object.skyrosStorage.carriesChildChanges = true
                loaded[id] = object
                unverifiedUpdates.insert(id)
                hasPendingFaults = true
                return false
            }
        }
        if !missing.isEmpty {
            for snapshot in try parent.snapshots(for: missing) {
                if let object = lookup(snapshot.id) {
                    object.skyrosStorage.fill(snapshot.values, version: snapshot.version)
                } else {
                    loaded[snapshot.id] = makeObject(
                        snapshot.id, of: try schema.requireEntity(snapshot.id.entityName), values: snapshot.values,
                        version: snapshot.version)
                }
            }
        }
        insertedRows.reserveCapacity(insertedRows.count + changes.inserted.count)
        // A change set names each object once: into no pending row, its rows are all new.
        let fresh = insertedRows.isEmpty
        var entity: EntityDescription?
        var added = 0
        let relinks = !deleted.isEmpty && !schema.linkEntityNames.isEmpty
        for snapshot in changes.inserted {
            if let existing = inserted[snapshot.id] {  // no lookup (nor index) while nothing is inserted here
                existing.skyrosStorage.values = snapshot.values
                continue
            }
            if relinks && withdrawRemovedLink(snapshot) { continue }
            if entity?.name != snapshot.id.entityName {
                if let entity, added > 0 { pendingCountByEntity[ObjectIdentifier(entity), default: 0] += added }
                added = 0
                entity = try schema.requireEntity(snapshot.id.entityName)
            }
            if fresh {
                insertedRows.appendNew(snapshot.id, snapshot.values)
            } else if insertedRows.updateValue(snapshot.values, forKey: snapshot.id) != nil {
                continue
            }
            if pendingLinkIndex != nil && schema.isLinkEntity(snapshot.id.entityName) {
                indexPendingLink(snapshot.id, snapshot.values)
            }
            added += 1
        }
        if let entity, added > 0 { pendingCountByEntity[ObjectIdentifier(entity), default: 0] += added }
        let undo = recorder?.isRecording == true
        if undo { recordChildInserts(changes.inserted.map(\.id)) }
        for update in changes.updated {
            if var values = insertedRows[update.id] {
                for (index, value) in update.changes { values[index] = value }
                insertedRows.updateValue(values, forKey: update.id)
                continue
            }
            guard let object = lookup(update.id) ?? loaded[update.id] else { continue }  // deleted here meanwhile
            let storage = object.skyrosStorage
            if storage.isDeleted { continue }
            if updated[update.id] == nil && !storage.isInserted {
                updated[update.id] = object
                pendingCountByEntity[ObjectIdentifier(storage.entity), default: 0] += 1
                // The child ran its validation rules; a change of this context's own keeps it unvalidated.
                storage.changesValidated = true
                // The changes were made on the child's version: that is what the store checks.
                // (The child may have counted it at a save of its own: not known to be read.)
                if update.baseVersion > 0 {
                    storage.version = update.baseVersion
                    storage.countedSaves = ObjectStorage.unknownCount
                }
            } else if update.baseVersion > 0 && storage.version > 0 {
                storage.version = min(storage.version, update.baseVersion)
                storage.countedSaves = ObjectStorage.unknownCount
            }
            for (index, value) in update.changes {
                if undo { recordValueChange(storage, index: index, newValue: value, object: object) }
                storage.values[index] = value
                if !storage.isInserted { storage.changed.insert(index) }
            }
        }
        // Undoing a deletion once it is saved inserts the object again: recorded, the objects
        // deleted that this context has not read are read first, in one request.
        var deletedRows: [ObjectID: Snapshot] = [:]
        if undo && !changes.deleted.isEmpty {
            let unread = changes.deleted.filter { id in lookup(id)?.skyrosStorage.isFault ?? (insertedRows[id] == nil) }
            if !unread.isEmpty { for row in try parent.snapshots(for: unread) { deletedRows[row.id] = row } }
        }
        for id in changes.deleted {
            if insertedRows.removeValue(forKey: id) != nil, let entity = schema.entity(named: id.entityName) {
                pendingCountByEntity[ObjectIdentifier(entity), default: 0] -= 1
                continue
            }
            if let row = deletedRows[id], let storage = lookup(id)?.skyrosStorage, storage.isFault {
                storage.fill(row.values, version: row.version)
            }
            let object =
                try lookup(id)
                ?? makeObject(
                    id, of: try schema.requireEntity(id.entityName), values: deletedRows[id]?.values,
                    version: deletedRows[id]?.version ?? 0)
            if object.skyrosStorage.isDeleted { continue }
            markDeleted(object)
            object.skyrosStorage.changesValidated = true  // by the child
            if inserted[id] == nil && deleted[id] == nil { registry[id] = nil }
        }
    }
}
