import Foundation

/// What another process committed, as merged into a shared stack's main context.
public struct StoreChange: Sendable, Hashable {
    /// The daemon's sequence number of the change set.
    public var sequence: UInt64
    /// Who saved it (client ID and process name).
    public var author: String
    /// The store was emptied.
    public var isReset: Bool
    /// Everything may have changed (the daemon restarted): every registered object was refreshed.
    public var isRefresh: Bool
    public var inserted: [ObjectID]
    /// Updated objects with the names of their changed properties.
    public var updated: [ObjectID: [String]]
    public var deleted: [ObjectID]
    /// The new values of updated objects, when the change carries them (a shared stack's
    /// events do): objects the main context holds take them without asking the store.
    public var updatedValues: [ObjectID: UpdatedValues]
    /// The inserted objects with their values, when the change carries them (a shared
    /// stack's events do): the main context keeps them (as objects when it has observers, as
    /// rows otherwise), so that `object(with:)` has them without asking the store (Core Data's
    /// merge of inserted objects).
    public var insertedSnapshots: [Snapshot]

    /// An updated object's version after the change and its changed properties' values, by
    /// property index.
    public struct UpdatedValues: Sendable, Hashable {
        public var version: Int64
        public var values: [Int: StoredValue]
        public init(version: Int64, values: [Int: StoredValue]) {
            self.version = version
            self.values = values
        }
    }

    public init(
        sequence: UInt64, author: String, isReset: Bool = false, isRefresh: Bool = false, inserted: [ObjectID] = [],
        updated: [ObjectID: [String]] = [:], deleted: [ObjectID] = [], updatedValues: [ObjectID: UpdatedValues] = [:],
        insertedSnapshots: [Snapshot] = []
    ) {
        self.sequence = sequence
        self.author = author
        self.isReset = isReset
        self.isRefresh = isRefresh
        self.inserted = inserted
        self.updated = updated
        self.deleted = deleted
        self.updatedValues = updatedValues
        self.insertedSnapshots = insertedSnapshots
    }
}

extension Skyros {
    /// The changes other processes make to a shared stack, each delivered after it has been
    /// merged into the main context (Core Data's remote-change notification, with the merge
    /// done). Each call makes a new sequence; it ends when the stack is deallocated.
    public var changes: AsyncStream<StoreChange> {
        let (stream, continuation) = AsyncStream<StoreChange>.makeStream(bufferingPolicy: .bufferingNewest(1_024))
        changeObservers.add(continuation)
        return stream
    }

    /// Merges a change committed by another process into the main context: registered
    /// objects that changed take the new values the change carries (without a fetch; the
    /// properties an object has unsaved changes of keep them), or become faults when it carries
    /// none; deleted ones are marked deleted and forgotten; inserted objects whose values the
    /// change carries are registered when the main context has observers (they are handed
    /// the inserted objects), and otherwise kept as rows that become objects only when asked
    /// for (by identifier, through a relationship, from a scratch context), reading them with
    /// no request to the store (fetches see inserts in any case: they ask the store). Updated
    /// objects the context never held are not made.
    /// Then ``changes`` delivers it. Called by the shared stack on its event thread; objects
    /// with unsaved changes in the main context keep them.
    ///
    /// The merge runs synchronously, inside the main context (waiting for it when it is
    /// busy): it returns once the main context has the change. Merging on the caller's thread
    /// spares the thread wake-up of an asynchronous hop on every change.
    public func merge(_ change: StoreChange) { merge([change]) }

    /// Merges consecutive changes in one visit to the main context (one wait for its queue
    /// instead of one per change), in order; ``changes`` delivers each.
    public func merge(_ changes: [StoreChange]) {
        merge(changes, publishing: true)
    }

    /// Merges changes into the main context; `publishing` false keeps them out of ``changes``
    /// (a batch operation of this process is not another process's change).
    func merge(_ changes: [StoreChange], publishing: Bool) {
        guard !changes.isEmpty else { return }
        let main = mainContext
        // ``changes`` delivers them once the main context is free again: a consumer that
        // reads the main context as soon as it is told (the usual thing to do) then finds it
        // idle, instead of waking only to wait for the end of this merge.
        defer { if publishing { for change in changes { changeObservers.yield(change) } } }
        main.performAndWait {
            let observed = main.reference.isObserved
            var merged = ContextChanges(kind: .merged)
            var reload = false
            for change in changes {
                if change.isReset {
                    main.forgetAllClean()
                    main.mergedRows.removeAll()
                    reload = true
                } else if change.isRefresh {
                    for id in main.registry.keys { main.refreshIfClean(id) }
                    main.mergedRows.removeAll()
                    reload = true
                } else {
                    // Objects for observers (they are handed the inserted objects); rows
                    // otherwise, made objects only if someone asks for them.
                    for snapshot in change.insertedSnapshots where main.registered(snapshot.id) == nil {
                        if observed {
                            _ = try? main.materialize(snapshot.id, values: snapshot.values, version: snapshot.version)
                        } else {
                            main.mergedRows.insert(snapshot.id, values: snapshot.values, version: snapshot.version)
                        }
                    }
                    for (id, names) in change.updated {
                        if let update = change.updatedValues[id] {
                            main.takeValues(update, of: id)
                            main.mergedRows.update(id, with: update)
                        } else {
                            main.refreshIfClean(id)
                            main.mergedRows.remove(id)
                        }
                        if observed { merged.updatedProperties[id, default: []].formUnion(names) }
                    }
                    if observed {
                        for id in change.inserted { merged.insertedIDs.append(id) }
                        for id in change.deleted {
                            merged.deleted.append(id)
                            if let object = main.registry[id]?.object { merged.deletedObjects[id] = object }
                        }
                    }
                    for id in change.deleted {
                        main.forgetDeleted(id)
                        main.mergedRows.remove(id)
                    }
                }
            }
            guard observed else { return }
            if reload {
                main.announceReload()
            } else {
                main.announce(main.resolved(merged))
            }
        }
    }
}

/// The continuations of ``Skyros/changes``.
final class ChangeObservers: @unchecked Sendable {
    private let lock = NSLock()
    private var continuations: [UUID: AsyncStream<StoreChange>.Continuation] = [:]

    func add(_ continuation: AsyncStream<StoreChange>.Continuation) {
        let key = UUID()
        lock.withLock { continuations[key] = continuation }
        continuation.onTermination = { [weak self] _ in
            guard let self else { return }
            self.lock.withLock { _ = self.continuations.removeValue(forKey: key) }
        }
    }

    func yield(_ change: StoreChange) {
        for continuation in lock.withLock({ Array(continuations.values) }) { continuation.yield(change) }
    }

    deinit {
        for continuation in continuations.values { continuation.finish() }
    }
}

extension ObjectContext {
    /// Turns a registered, unchanged object back into a fault.
    func refreshIfClean(_ id: ObjectID) {
        guard let object = registry[id]?.object, !object.skyrosStorage.hasChanges else { return }
        object.skyrosStorage.isFault = true
    }

    /// Takes another process's new values for a registered object that is not a fault:
    /// the properties it has unsaved changes of keep them (the saver of those wins at its own
    /// save, property by property), and its version becomes the new one only when it has
    /// none (so that an `.error` merge policy still sees the conflict).
    func takeValues(_ update: StoreChange.UpdatedValues, of id: ObjectID) {
        guard let storage = registry[id]?.object.skyrosStorage, !storage.isFault, !storage.isDeleted else { return }
        for (index, value) in update.values where index < storage.values.count && !storage.changed.contains(index) {
            storage.values[index] = value
        }
        if storage.changed.isEmpty { storage.version = update.version }
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
}
