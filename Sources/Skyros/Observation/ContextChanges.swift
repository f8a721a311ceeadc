import Foundation
import Synchronization

/// What a context processed: its own edits, its own save, a child context's save merged into
/// it, another process's save merged from the daemon, or a reload (Core Data's
/// `NSManagedObjectContextObjectsDidChange`, one notification per processed change).
///
/// Every observer — ``FetchedResultsController``, ``EntityMonitor``, ``Skyros/observe(_:)-1whfw`` —
/// is fed from this one path. It is delivered on the context's queue, to the handlers of
/// ``ObjectContext/addChangeObserver(_:)``; its objects belong to that context.
public struct ContextChanges {
    /// What kind of change the context processed.
    public enum Kind: Sendable, Hashable {
        /// The context's own edits, not saved yet (processed at the end of the block that made them).
        case unsaved
        /// A save: the context's own (its edits reached its parent), or a child context's merged into it.
        case saved
        /// Another process's save (or several, consolidated), merged from the daemon.
        case merged
        /// Anything may have changed (a reset, a rollback, the store emptied, the daemon
        /// restarted or the history this client missed expired): observers start over from a
        /// fresh fetch. The object lists are empty.
        case reloaded
    }

    /// What the context processed.
    public let kind: Kind
    /// Whether this is the context's own save (Core Data's did-save after its objects-did-change):
    /// its edits were already delivered, as ``Kind/unsaved`` changes, when the context processed
    /// them (a save processes the pending ones first). Observers of unsaved edits
    /// (``EntityMonitor/Frequency/onChange`` monitors, ``FetchedResultsController``,
    /// ``Skyros/observe(_:)-1whfw``) skip it; ``EntityMonitor/Frequency/onSave`` monitors report it.
    /// False for a child context's save merged into this one, which observers have not seen.
    public internal(set) var isOwnSave = false
    /// The inserted objects.
    public internal(set) var inserted: [any ManagedObject] = []
    /// The updated objects the context holds. ``updatedProperties`` also names those it does
    /// not hold (another process updated them): ``ObjectContext/object(with:)`` loads them.
    public internal(set) var updated: [any ManagedObject] = []
    /// Every updated object, with the names of its changed properties.
    public internal(set) var updatedProperties: [ObjectID: Set<String>] = [:]
    /// The identifiers of the deleted objects.
    public internal(set) var deleted: [ObjectID] = []
    /// The deleted objects the context held, readable as their last values.
    public internal(set) var deletedObjects: [ObjectID: any ManagedObject] = [:]

    /// Inserted objects named by identifier only, turned into ``inserted`` by `resolved(_:)`.
    var insertedIDs: [ObjectID] = []

    init(kind: Kind) { self.kind = kind }

    /// Whether nothing changed (a reload is never empty).
    public var isEmpty: Bool {
        kind != .reloaded && inserted.isEmpty && updatedProperties.isEmpty && deleted.isEmpty
    }

    /// Whether the change is a save or a merge (what ``EntityMonitor/Frequency/onSave`` sees).
    public var isSave: Bool { kind != .unsaved }

    /// Whether observers of unsaved edits see something new in it: everything but the
    /// context's own save (``isOwnSave``), whose edits they saw when the context processed them.
    var isNewToChangeObservers: Bool { !isOwnSave }

    /// Whether the change may touch objects of the entity. Name an entity hierarchy by its
    /// root (`Vehicle` for cars too): its objects' identifiers carry the root's name (see
    /// ``Schema/entity(for:)``).
    public func touches(entityNamed name: String) -> Bool {
        if kind == .reloaded { return true }
        return inserted.contains { $0.objectID.entityName == name }
            || updatedProperties.keys.contains { $0.entityName == name }
            || deleted.contains { $0.entityName == name }
    }
}

/// A registration of ``ObjectContext/addChangeObserver(_:)``: the handler is called until
/// ``cancel()`` is called or this token is released.
public final class ContextChangeObservation: Sendable {
    private let cancelBlock: @Sendable () -> Void
    private let cancelled = CancelFlag()

    init(cancel: @escaping @Sendable () -> Void) { cancelBlock = cancel }

    /// Stops the observation. Idempotent; from any thread.
    public func cancel() {
        if cancelled.set() { cancelBlock() }
    }

    deinit { cancel() }

    private final class CancelFlag: Sendable {
        private let isSet = Mutex(false)
        /// Sets the flag; true the first time.
        func set() -> Bool {
            isSet.withLock { isSet in
                defer { isSet = true }
                return !isSet
            }
        }
    }
}

/// An edit recorded for observers: which object, and what happened to it.
struct LocalEdit {
    var object: (any ManagedObject)?
    var inserted = false
    var deleted = false
    var properties = Set<Int>()

    mutating func merge(_ other: LocalEdit) {
        if object == nil { object = other.object }
        inserted = inserted || other.inserted
        deleted = deleted || other.deleted
        properties.formUnion(other.properties)
    }
}

extension ObjectContext {
    // MARK: - Observers

    /// Calls `handler` with every change this context processes, on the context's queue (see
    /// ``ContextChanges``; another thread than the caller's, hence `@Sendable`). Keep the returned token: the observation ends when it is
    /// cancelled or released.
    ///
    /// While a context has observers it records its edits, and processes them at the end of
    /// each `perform`/`performAndWait` block (or at ``processPendingChanges()``).
    public func addChangeObserver(_ handler: @escaping @Sendable (ContextChanges) -> Void) -> ContextChangeObservation {
        let key = performAndWait { () -> Int in
            nextObserverKey += 1
            changeObservers.append((nextObserverKey, handler))
            reference.isObserved = true
            return nextObserverKey
        }
        return ContextChangeObservation { [weak self] in
            guard let self else { return }
            if self.isPerformingOnCurrentThread {
                self.removeChangeObserver(key)
            } else {
                self.perform { self.removeChangeObserver(key) }
            }
        }
    }

    private func removeChangeObserver(_ key: Int) {
        changeObservers.removeAll { $0.key == key }
        if changeObservers.isEmpty {
            reference.isObserved = false
            unprocessedEdits = [:]
            unsavedEdits = [:]
        }
    }

    /// Delivers the edits made since the last call to the observers, as one
    /// ``ContextChanges/Kind/unsaved`` change. Called at the end of every block run on the
    /// context's queue; call it yourself to deliver edits made outside one. Must run on the
    /// context's queue.
    public func processPendingChanges() {
        guard !unprocessedEdits.isEmpty else { return }
        let edits = unprocessedEdits
        unprocessedEdits = [:]
        announce(changes(.unsaved, from: edits))
    }

    /// Records an edit for observers (only called while the context is observed).
    func noteEdit(_ id: ObjectID, object: (any ManagedObject)?, inserted: Bool = false, deleted: Bool = false) {
        guard applyingChildSave == 0 else { return }
        let edit = LocalEdit(object: object, inserted: inserted, deleted: deleted)
        unprocessedEdits[id, default: LocalEdit()].merge(edit)
        unsavedEdits[id, default: LocalEdit()].merge(edit)
    }

    func noteEdit(_ storage: ObjectStorage, property: Int) {
        guard applyingChildSave == 0 else { return }
        var edit = LocalEdit(object: lookup(storage.objectID))
        edit.properties.insert(property)
        unprocessedEdits[storage.objectID, default: LocalEdit()].merge(edit)
        unsavedEdits[storage.objectID, default: LocalEdit()].merge(edit)
    }

    /// After this context's own save: its edits since the last save, as one saved change
    /// marked ``ContextChanges/isOwnSave`` (the save processed the pending edits before).
    func announceOwnSave() {
        guard reference.isObserved else { return }
        unprocessedEdits = [:]
        let edits = unsavedEdits
        unsavedEdits = [:]
        guard !edits.isEmpty else { return }
        var saved = changes(.saved, from: edits)
        saved.isOwnSave = true
        announce(saved)
    }

    /// Tells the observers to start over (after a reset, a rollback, a refresh of everything).
    func announceReload() {
        guard reference.isObserved else { return }
        unprocessedEdits = [:]
        unsavedEdits = [:]
        announce(ContextChanges(kind: .reloaded))
    }

    func announce(_ changes: ContextChanges) {
        let changes = schema.linkEntityNames.isEmpty ? changes : linksAsUpdates(changes)
        guard !changes.isEmpty else { return }
        for observer in changeObservers { observer.handler(changes) }
    }

    private func changes(_ kind: ContextChanges.Kind, from edits: [ObjectID: LocalEdit]) -> ContextChanges {
        var result = ContextChanges(kind: kind)
        for (id, edit) in edits {
            guard let object = edit.object ?? lookup(id) else { continue }
            if edit.deleted || object.skyrosStorage.isDeleted {
                result.deleted.append(id)
                result.deletedObjects[id] = object
            } else if edit.inserted {
                result.inserted.append(object)
            } else {
                result.updated.append(object)
                let properties = object.skyrosStorage.entity.properties
                result.updatedProperties[id] = Set(
                    edit.properties.lazy.filter { $0 < properties.count }.map { properties[$0].name })
            }
        }
        return result
    }

    /// The change a child's save made when applied here: what observers of this context see.
    func changes(appliedFrom changeSet: ChangeSet, deletedObjects: [ObjectID: any ManagedObject]) -> ContextChanges {
        var result = ContextChanges(kind: .saved)
        result.inserted.reserveCapacity(changeSet.inserted.count)
        for snapshot in changeSet.inserted {
            if let object = registered(snapshot.id) { result.inserted.append(object) }
        }
        for update in changeSet.updated {
            guard let object = registered(update.id) else { continue }
            let properties = object.skyrosStorage.entity.properties
            result.updated.append(object)
            result.updatedProperties[update.id] = Set(
                update.changes.keys.lazy.filter { $0 < properties.count }.map { properties[$0].name })
        }
        result.deleted = changeSet.deleted
        result.deletedObjects = deletedObjects
        return result
    }

    /// A consolidated change with its objects filled in: inserted identifiers become the
    /// registered objects, updated objects the context holds are listed, and an object both
    /// inserted (or updated) and deleted in the consolidated changes counts as deleted only.
    func resolved(_ changes: ContextChanges) -> ContextChanges {
        var result = changes
        let deleted = Set(changes.deleted)
        var inserted = Set<ObjectID>()
        for id in changes.insertedIDs where !deleted.contains(id) && inserted.insert(id).inserted {
            if let object = registered(id) { result.inserted.append(object) }
        }
        result.insertedIDs = []
        for id in Array(result.updatedProperties.keys) {
            if deleted.contains(id) || inserted.contains(id) {
                result.updatedProperties[id] = nil
            } else if let object = registry[id]?.object {
                result.updated.append(object)
            }
        }
        var seen = Set<ObjectID>()
        result.deleted = changes.deleted.filter { seen.insert($0).inserted }
        return result
    }

    // MARK: - Loading what a change names

    /// The objects with these identifiers, loaded in one request to the parent for those the
    /// context does not hold with their values; objects that no longer exist are left out.
    /// On the context's queue.
    func loadedObjects(_ ids: [ObjectID]) -> [any ManagedObject] {
        var result: [any ManagedObject] = []
        var missing: [ObjectID] = []
        for id in ids {
            if let object = registered(id), !object.skyrosStorage.isFault {
                if !object.skyrosStorage.isDeleted { result.append(object) }
            } else if let row = mergedRows.take(id),
                let object = try? materialize(id, values: row.values, version: row.version)
            {
                result.append(object)
            } else {
                missing.append(id)
            }
        }
        guard !missing.isEmpty else { return result }
        do {
            for snapshot in try parent.snapshots(for: missing) {
                if let object = try? materialize(snapshot.id, values: snapshot.values, version: snapshot.version) {
                    result.append(object)
                }
            }
        } catch {
            report(error)
        }
        return result
    }

    // MARK: - Read tracking (observe)

    /// Starts recording the entities this context reads.
    func startTrackingReads() { readEntities = [] }

    /// Stops recording and returns the entities read.
    func stopTrackingReads() -> Set<String> {
        defer { readEntities = nil }
        return readEntities ?? []
    }

    @inline(__always)
    func noteRead(_ entityName: String) {
        if readEntities != nil { readEntities!.insert(entityName) }
    }
}
