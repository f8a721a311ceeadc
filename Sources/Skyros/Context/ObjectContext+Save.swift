import Foundation

extension ObjectContext {
    /// Validates the pending changes and pushes them one level toward the store: into the
    /// parent context, or into the store for a root context.
    ///
    /// Validation failures throw a typed ``SkyrosError`` (``SkyrosError/Code/deleteDenied``,
    /// ``SkyrosError/Code/missingRequiredRelationship``, ``SkyrosError/Code/valueNotStorable``,
    /// ``SkyrosError/Code/uniqueConstraintViolation``, and for the model's own rules
    /// ``SkyrosError/Code/validationFailed``: see ``ValidatingObject``) and change nothing: the
    /// context keeps its pending changes, the parent is as it was.
    public func save() throws {
        try save(keepingObjects: true)
    }

    /// Saves; when `keepingObjects` is false the context is about to be reset, so saved
    /// objects are not kept registered.
    func save(keepingObjects: Bool) throws {
        if passThrough != nil { return try savePassThrough(keepingObjects: keepingObjects) }
        guard hasChanges else { return }
        // Core Data's order: the edits not processed yet reach the observers of unsaved edits
        // first, so the save itself is news only to .onSave monitors.
        if reference.isObserved && !unprocessedEdits.isEmpty { processPendingChanges() }
        try validateForSave()
        var changes = makeChangeSet()
        let generation = ownWrites?.record(changes)
        do {
            do {
                try send(changes)
            } catch let error as SkyrosError where error.code == .objectNotFound && !unverifiedUpdates.isEmpty {
                // Objects this root took from its child and never read from the store: one of
                // them may have been deleted by another process meanwhile. Their updates are
                // dropped (as they are when the store is read first), the rest sent again.
                guard try dropUpdatesOfMissingObjects() else { throw error }
                changes = makeChangeSet()
                if changes.isEmpty { lastSavedSequence = nil } else { try send(changes) }
            }
        } catch {
            if let generation { ownWrites?.cancel(generation) }
            throw error
        }
        didSave(keepingObjects: keepingObjects, policy: changes.mergePolicy)
        announceOwnSave()
    }

    /// One level toward the store: into the parent context or the store. A main context over
    /// a root context hands it its own values of the objects it updated, so that the root,
    /// which only passes the changed properties on, does not read each one back from its store
    /// (through a daemon, a request).
    func send(_ changes: ChangeSet) throws {
        if let store = sequencedParent {
            lastSavedSequence = try store.saveReturningSequence(changes)
        } else if let root = parentContext, !root.parentIsContext, !updated.isEmpty {
            var known: [ObjectID: Snapshot] = [:]
            known.reserveCapacity(updated.count)
            for (id, object) in updated {
                let storage = object.skyrosStorage
                // A fault's values are placeholders (a fault can carry a pending change: a
                // to-one nullified by a delete), and an object read at no known version (0:
                // through a parent where it was still a pending insert) would take the store's
                // conflict check away: the root reads those from the store.
                guard !storage.isFault && !storage.isDeleted && storage.version > 0 else { continue }
                known[id] = Snapshot(id: id, values: storage.values, version: storage.version)
            }
            try root.save(changes, childValues: known, fromChild: true)
        } else if let context = parentContext {
            try context.save(changes, childValues: [:], fromChild: true)
        } else {
            try parent.save(changes)
        }
    }

    /// After the store said an object of a save does not exist: drops the updates of the
    /// objects taken from the child (``unverifiedUpdates``) that the store no longer has.
    /// False when every one of them exists (the error is about something else).
    func dropUpdatesOfMissingObjects() throws -> Bool {
        let candidates = unverifiedUpdates.filter { updated[$0] != nil }
        unverifiedUpdates = []
        guard !candidates.isEmpty else { return false }
        let existing = Set(try parent.snapshots(for: Array(candidates)).map(\.id))
        var dropped = false
        for id in candidates where !existing.contains(id) {
            guard let object = updated[id] else { continue }
            forgetUpdate(of: object.skyrosStorage)
            dropped = true
        }
        return dropped
    }

    func makeChangeSet() -> ChangeSet {
        if let passThrough {  // then nothing else is pending
            var changes = passThrough.changes
            changes.mergePolicy = mergePolicy
            return changes
        }
        var changes = ChangeSet()
        changes.inserted.reserveCapacity(inserted.count + insertedRows.count)
        // Rows passing through, then objects inserted here, each in order; no lookups.
        insertedRows.forEach { id, values in changes.inserted.append(Snapshot(id: id, values: values)) }
        inserted.forEach { id, object in changes.inserted.append(Snapshot(id: id, values: object.skyrosStorage.values))
        }
        for (id, object) in updated {
            let storage = object.skyrosStorage
            var values: [Int: StoredValue] = [:]
            for index in storage.changed where storage.entity.properties[index].hasColumn {
                values[index] = storage.values[index]
            }
            if !values.isEmpty {
                changes.updated.append(ChangeSet.Update(id: id, changes: values, baseVersion: storage.version))
            }
        }
        changes.deleted = Array(deleted.keys)
        changes.mergePolicy = mergePolicy
        return changes
    }

    /// After a save: pending changes are cleared, and the saved objects take the version
    /// the store gives them once the changes reach it: 1 for an insert, one more for an
    /// update (when the parent is a context this is ahead of the store until the parent
    /// saves; if that save fails, the stack forgets these copies). Under
    /// ``MergePolicy/storeWins`` updated objects saved into the store are refreshed instead:
    /// the store may have kept its own values.
    func didSave(keepingObjects: Bool = true, policy: MergePolicy = .saverWins) {
        inserted.forEach { _, object in
            let storage = object.skyrosStorage
            storage.isInserted = false
            storage.version = 1
            if keepingObjects && storage.isExposed && registry[storage.objectID] == nil { register(object) }
        }
        for object in updated.values {
            let storage = object.skyrosStorage
            storage.changed = []
            storage.carriesChildChanges = false
            if !parentIsContext && policy == .storeWins {
                storage.isFault = true
            } else if storage.version > 0 {
                storage.version += 1
                if storage.countedSaves < ObjectStorage.unknownCount { storage.countedSaves += 1 }
            }
            if keepingObjects && storage.isExposed && registry[storage.objectID] == nil { register(object) }
        }
        for (id, object) in deleted {
            registry[id] = nil
            object.skyrosStorage.context = nil
        }
        clearPendingChanges()
        saveGeneration &+= 1
    }

    // MARK: - Validation

    func validateForSave() throws {
        // Over a copy (of the list, not an array of its values): validating may turn pending
        // rows into inserted objects.
        let insertedNow = inserted
        try insertedNow.forEach { _, object in try validate(object.skyrosStorage) }
        for object in updated.values { try validate(object.skyrosStorage) }
        for object in deleted.values {
            let storage = object.skyrosStorage
            for property in storage.entity.relationships where property.deleteRule == .deny {
                let related: [any ManagedObject]
                if property.kind == .toMany {
                    related = try relatedObjects(of: storage, index: property.index)
                } else {
                    related = [storage.relatedObject(at: property.index)].compactMap { $0 }
                }
                if let blocking = related.first(where: { !$0.skyrosStorage.isDeleted }) {
                    throw SkyrosError(
                        .deleteDenied,
                        "\(storage.objectID) cannot be deleted: \(storage.entity.name).\(property.name) still has \(blocking.objectID) (delete rule .deny)"
                    )
                }
            }
        }
        // The model's own rules, when its classes have any.
        if schema.hasValidatingEntities { try runValidationRules() }
    }

    /// The checks of an inserted or updated object: values that could not be stored, required
    /// to-one relationships set and not pointing to a deleted object.
    private func validate(_ storage: ObjectStorage) throws {
        if !storage.valueErrors.isEmpty, let error = storage.valueErrors.min(by: { $0.key < $1.key })?.value {
            throw error
        }
        // An object of a hierarchy: the required to-ones of its own class only.
        let member = storage.entity.hierarchy?.member(of: storage.values)
        for property in storage.entity.requiredToOneProperties where member?.has(property.index) ?? true {
            // A fault's values are placeholders: only what was changed on it is known here
            // (the rest is as its row has it, and its child checked the change set whole).
            if storage.isFault && !storage.changed.contains(property.index) { continue }
            if storage.values[property.index].isNull {
                throw SkyrosError(
                    .missingRequiredRelationship,
                    "\(storage.entity.name).\(property.name) is required but \(storage.objectID) has none")
            }
            if let uuid = UUID(storedValue: storage.values[property.index]),
                let target = registered(ObjectID(entityName: property.destinationName!, uuid: uuid)),
                target.skyrosStorage.isDeleted
            {
                throw SkyrosError(
                    .missingRequiredRelationship,
                    "\(storage.entity.name).\(property.name) of \(storage.objectID) points to a deleted object")
            }
        }
    }

    /// Checks unique attributes of a change set against what is in memory: the change set
    /// itself and the pending changes of this context and of the contexts above it. The
    /// store is not asked: its unique indexes are the check for what is saved already, at
    /// commit (one round trip per save, also through a daemon), with the same
    /// ``SkyrosError/Code/uniqueConstraintViolation`` naming entity, property and value;
    /// the stack then forgets what the failed save left in its contexts.
    func validateUniqueness(of changes: ChangeSet) throws {
        guard schema.hasUniqueAttributes else { return }
        var candidates: [String: [Int: [(ObjectID, StoredValue)]]] = [:]
        func consider(_ id: ObjectID, _ index: Int, _ value: StoredValue) {
            guard !value.isNull else { return }
            candidates[id.entityName, default: [:]][index, default: []].append((id, value))
        }
        var entity: EntityDescription?  // change sets come grouped by entity: one lookup per group
        for snapshot in changes.inserted {
            if entity?.name != snapshot.id.entityName { entity = schema.entity(named: snapshot.id.entityName) }
            guard let entity else { continue }
            for property in entity.uniqueProperties {
                consider(snapshot.id, property.index, snapshot.values[property.index])
            }
        }
        for update in changes.updated {
            guard let entity = schema.entity(named: update.id.entityName) else { continue }
            for property in entity.uniqueProperties {
                if let value = update.changes[property.index] { consider(update.id, property.index, value) }
            }
        }
        guard !candidates.isEmpty else { return }
        let touched = Set(changes.allIDs)
        for (entityName, byProperty) in candidates {
            let entity = try schema.requireEntity(entityName)
            for (index, values) in byProperty {
                let property = entity.properties[index]
                var seen: [StoredValue: ObjectID] = [:]
                for (id, value) in values {
                    if let other = seen[value] { throw duplicate(entity, property, value, id, other) }
                    seen[value] = id
                }
                var start = 0
                while start < values.count {
                    let chunk = values[start..<min(start + 500, values.count)]
                    start += 500
                    let request = StoreRequest(
                        entityName: entityName,
                        predicate: .isIn(.property(scope: 0, path: [property.name]), chunk.map(\.1)))
                    for row in try pendingSnapshots(request, property: index) where !touched.contains(row.id) {
                        let value = row.values[index]
                        throw duplicate(entity, property, value, seen[value] ?? row.id, row.id)
                    }
                }
            }
        }
    }

    /// The pending objects matching a request in this context and the contexts above it,
    /// each seen as the lowest context that has it (never the store's rows); `index` is the
    /// unique attribute the request tests.
    func pendingSnapshots(_ request: StoreRequest, property index: Int) throws -> [Snapshot] {
        var rows = try mergedSnapshots(request, localOnly: true)
        if !unverifiedUpdates.isEmpty {
            // Objects a root took from its child's values: where the save did not change the
            // property, the value is the child's view of it, not a pending change (the store
            // may have a newer one, and has the last word).
            rows.removeAll { row in
                unverifiedUpdates.contains(row.id) && updated[row.id]?.skyrosStorage.changed.contains(index) != true
            }
        }
        if let parent = parentContext {
            let known = Set(try pendingStorages(of: request.entityName).map(\.objectID))
            rows += try parent.performAndWait { try parent.pendingSnapshots(request, property: index) }.filter {
                !known.contains($0.id)
            }
        }
        return rows
    }

    private func duplicate(
        _ entity: EntityDescription, _ property: PropertyDescription, _ value: StoredValue, _ id: ObjectID,
        _ other: ObjectID
    ) -> SkyrosError {
        SkyrosError(
            .uniqueConstraintViolation,
            "\(entity.name).\(property.name) must be unique: \(id) and \(other) both hold \(value)")
    }
}
