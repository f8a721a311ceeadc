import Foundation

/// What an ``EntityMonitor`` saw in one processed change: the objects of its entity (matching
/// its filter) that were inserted, updated and deleted.
public struct EntityMonitorChange<T: ManagedObject> {
    /// The inserted objects.
    public let inserted: [T]
    /// The updated objects (with another process's change, loaded when a filter must judge them).
    public let updated: [T]
    /// The deleted objects, readable as their last values (an object the context never held,
    /// deleted by another process, reads as its defaults; with a filter it is left out, as its
    /// values are unknown).
    public let deleted: [T]
}

/// Reports the changes of one entity in a context: the BNR Core Data Stack's `EntityMonitor`.
///
/// ```swift
/// let monitor = EntityMonitor<User>(context: store.mainContext, frequency: .onSave,
///                                   filter: #Predicate<User> { $0.age > 30 })
/// monitor.onChange = { change in print(change.inserted, change.updated, change.deleted) }
/// ```
///
/// ``onChange`` is called on the context's queue exactly once per processed change that touches
/// the entity (a save, a merge of another context's or process's save, and with
/// ``Frequency/onChange`` also the context's own edits at the end of the block that made them,
/// and then not again at their save: Core Data's objects-did-change).
/// A reload (reset, daemon restart) is not reported: follow a list with a
/// ``FetchedResultsController``, which turns it into a diff. The monitor runs from its
/// initialization until it is released.
public final class EntityMonitor<T: ManagedObject>: @unchecked Sendable {
    /// When the monitor reports.
    public enum Frequency: Sendable, Hashable {
        /// Saves and merges only.
        case onSave
        /// Also the context's own unsaved edits, when the context processes them; the context's
        /// own save of edits already reported is not reported again.
        case onChange
    }

    /// The context whose changes are reported.
    public let context: ObjectContext
    /// Which changes are reported.
    public let frequency: Frequency
    /// Only objects matching it are reported (judged on their values after the change; a
    /// deleted object on its last values).
    public let filter: Predicate<T>?
    // Confined to the context's queue: every access goes through it.
    private var _onChange: ((EntityMonitorChange<T>) -> Void)?
    private var filterNode: PredicateNode?
    private var filterFailed = false
    private var observation: ContextChangeObservation?

    /// Starts monitoring. A filter that cannot be translated is reported to the context's
    /// ``ObjectContext/errorHandler`` (``SkyrosError/Code/unsupportedPredicate``) and then
    /// matches nothing.
    public init(context: ObjectContext, frequency: Frequency = .onSave, filter: Predicate<T>? = nil) {
        self.context = context
        self.frequency = frequency
        self.filter = filter
        if let filter {
            do {
                filterNode = try PredicateTranslator.translate(filter, schema: context.schema)
            } catch {
                filterFailed = true
                context.report(error)
            }
        }
        observation = context.addChangeObserver { [weak self] changes in self?.process(changes) }
    }

    deinit { observation?.cancel() }

    /// Called with each change, on the context's queue (not the main thread: in main-actor
    /// code write the closure `{ @Sendable change in … }`, see
    /// ``FetchedResultsController/onChange``). The objects of the change belong to the context.
    public var onChange: ((EntityMonitorChange<T>) -> Void)? {
        get { context.performAndWait { _onChange } }
        set { context.performAndWait { _onChange = newValue } }
    }

    private func process(_ changes: ContextChanges) {
        guard let onChange = _onChange, !filterFailed, changes.kind != .reloaded else { return }
        if frequency == .onSave && !changes.isSave { return }
        if frequency == .onChange && !changes.isNewToChangeObservers { return }
        let entity = context.schema.entity(for: T.self) ?? T.entityDescription
        let entityName = entity.name
        let inserted = changes.inserted.compactMap { $0 as? T }.filter(matches)
        var held: [ObjectID: T] = [:]
        for object in changes.updated { if let typed = object as? T { held[object.objectID] = typed } }
        var updated: [T] = []
        var toLoad: [ObjectID] = []
        for id in changes.updatedProperties.keys where id.entityName == entityName {
            if let object = held[id] {
                updated.append(object)
            } else if filterNode == nil, let object = context.registeredOrFault(id) as? T {
                updated.append(object)  // read when touched
            } else {
                toLoad.append(id)
            }
        }
        if !toLoad.isEmpty { updated += context.loadedObjects(toLoad).compactMap { $0 as? T } }
        updated = updated.filter(matches)
        var deleted: [T] = []
        for id in changes.deleted where id.entityName == entityName {
            if let object = changes.deletedObjects[id] as? T {
                if matches(object) { deleted.append(object) }
            } else if filterNode == nil {
                let object = context.makeObject(id, of: entity, values: nil)
                object.skyrosStorage.makeInaccessible()
                object.skyrosStorage.context = nil
                if let typed = object as? T { deleted.append(typed) }
            }
        }
        guard !inserted.isEmpty || !updated.isEmpty || !deleted.isEmpty else { return }
        onChange(EntityMonitorChange(inserted: inserted, updated: updated, deleted: deleted))
    }

    private func matches(_ object: T) -> Bool {
        guard let filterNode else { return true }
        let storage = object.skyrosStorage
        // A deleted object is judged on its last values, without asking the store.
        if storage.isDeleted && storage.isFault { return false }
        return (try? context.matches(filterNode, storage)) ?? false
    }
}
