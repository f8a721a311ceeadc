import Foundation

/// A section of a ``FetchedResultsController``'s results: the objects sharing one value of
/// the section key, in the fetch's order.
public struct FetchedResultsSection<T: ManagedObject> {
    /// The section key's value ("" when the controller has no section key path).
    public let name: String
    /// The section's objects, in the fetch's order.
    public let objects: [T]
}

/// How one object of a ``FetchedResultsController``'s results changed. Index paths are as
/// UIKit's batch updates expect them: deletions (and the source of a move) against the results
/// before the change, insertions (and the destination of a move) against the results after it;
/// an update's index path is the one before the change.
public enum FetchedResultsObjectChange<T: ManagedObject> {
    /// The object entered the results (inserted, or it started matching), at its index path in the new results.
    case insert(object: T, indexPath: IndexPath)
    /// The object left the results (deleted, or it stopped matching), from its index path in the old results.
    case delete(object: T, indexPath: IndexPath)
    /// The object stayed in place; some of its properties changed.
    case update(object: T, indexPath: IndexPath)
    /// The object moved across the sort order or to another section (its properties may also have changed).
    case move(object: T, fromIndexPath: IndexPath, toIndexPath: IndexPath)
}

/// How a section of a ``FetchedResultsController``'s results changed: a section deleted
/// (index before the change) or inserted (index after it).
public enum FetchedResultsSectionChange<T: ManagedObject> {
    /// A section that appeared, at its index in the new results, with its objects.
    case insert(section: FetchedResultsSection<T>, index: Int)
    /// A section that disappeared, from its index in the old results, with the objects it had.
    case delete(section: FetchedResultsSection<T>, index: Int)
}

/// Everything one processed change did to a ``FetchedResultsController``'s results.
///
/// `objects` lists deletions first (in descending index path order), then insertions (in
/// ascending order), then moves and updates; applying the deletions and the sources of moves
/// to the old results, then the insertions and the destinations of moves, gives the new results.
public struct FetchedResultsChanges<T: ManagedObject> {
    /// How the objects changed.
    public var objects: [FetchedResultsObjectChange<T>] = []
    /// The sections deleted (descending indexes in the old results), then inserted (ascending
    /// indexes in the new results).
    public var sections: [FetchedResultsSectionChange<T>] = []

    /// Whether nothing changed.
    public var isEmpty: Bool { objects.isEmpty && sections.isEmpty }
}

/// The BNR Core Data Stack's delegate form of ``FetchedResultsController/onChange``. Every
/// method has a default implementation that does nothing.
public protocol FetchedResultsControllerDelegate: AnyObject {
    /// The entity of the controllers this delegate follows.
    associatedtype Object: ManagedObject
    /// After ``FetchedResultsController/performFetch()``.
    func fetchedResultsControllerDidPerformFetch(_ controller: FetchedResultsController<Object>)
    /// Before the section and object changes of one processed change.
    func fetchedResultsControllerWillChangeContent(_ controller: FetchedResultsController<Object>)
    /// After them.
    func fetchedResultsControllerDidChangeContent(_ controller: FetchedResultsController<Object>)
    /// One object change, after the section changes.
    func fetchedResultsController(
        _ controller: FetchedResultsController<Object>, didChangeObject change: FetchedResultsObjectChange<Object>)
    /// One section change.
    func fetchedResultsController(
        _ controller: FetchedResultsController<Object>, didChangeSection change: FetchedResultsSectionChange<Object>)
}

/// Every method of the delegate is optional: these defaults do nothing.
extension FetchedResultsControllerDelegate {
    /// Does nothing by default.
    public func fetchedResultsControllerDidPerformFetch(_ controller: FetchedResultsController<Object>) {}
    /// Does nothing by default.
    public func fetchedResultsControllerWillChangeContent(_ controller: FetchedResultsController<Object>) {}
    /// Does nothing by default.
    public func fetchedResultsControllerDidChangeContent(_ controller: FetchedResultsController<Object>) {}
    /// Does nothing by default.
    public func fetchedResultsController(
        _ controller: FetchedResultsController<Object>, didChangeObject change: FetchedResultsObjectChange<Object>
    ) {}
    /// Does nothing by default.
    public func fetchedResultsController(
        _ controller: FetchedResultsController<Object>, didChangeSection change: FetchedResultsSectionChange<Object>
    ) {}
}

/// Keeps the results of a fetch in step with a context: NSFetchedResultsController, typed
/// (the BNR Core Data Stack's `FetchedResultsController<T>`).
///
/// ```swift
/// let controller = FetchedResultsController<User>(
///     fetch: FetchDescriptor(predicate: #Predicate { $0.age > 30 }, sortBy: [SortDescriptor(\.lastname)]),
///     sectionKeyPath: \.lastnameInitial,
///     context: store.mainContext)
/// controller.onChange = { changes in /* apply changes.sections, changes.objects to a list */ }
/// try controller.performFetch()
/// ```
///
/// After ``performFetch()`` the controller follows every change its context processes — the
/// context's own edits and saves, writes saved through it, other processes' saves merged from
/// the daemon — and calls ``onChange`` once per change that touches its results, on the
/// context's queue. A change is applied incrementally: the changed objects are evaluated
/// against the predicate in memory and placed by binary search, so its cost follows the size of
/// the change, not of the results (with a fetch limit or offset, or after a reload, the fetch
/// is run again and diffed).
///
/// Sections follow the fetch's sort, which must keep each section together (sort by the
/// section key first); the section key may be a computed property.
///
/// The controller is `Sendable`: its properties and methods may be called from any thread
/// (each call runs on the context's queue), and its callbacks run on that queue. The objects
/// it hands out belong to the context: use them there (in its callbacks, or in a `read`).
public final class FetchedResultsController<T: ManagedObject>: @unchecked Sendable {
    /// The fetch whose results are followed.
    public let fetchDescriptor: FetchDescriptor<T>
    /// The key of the sections; nil: one section named "".
    public let sectionKeyPath: KeyPath<T, String>?
    /// The context whose changes are followed.
    public let context: ObjectContext

    private var _onChange: ((FetchedResultsChanges<T>) -> Void)?
    private var delegateHost: DelegateHost?
    private var request: StoreRequest?
    /// Property indexes of the sort keys, with their direction.
    private var sortIndexes: [(index: Int, ascending: Bool)] = []
    /// The properties the predicate reads on the fetched object; nil when it may read anything.
    private var predicateProperties: Set<String>?
    private var state = Results()
    private var observation: ContextChangeObservation?
    /// For a controller of one object's to-many: the object, the relationship's name, and how
    /// to read it.
    private let relationship: (owner: ObjectID, name: String, entityName: String)?

    /// Makes a controller; nothing is fetched before ``performFetch()``.
    public init(fetch: FetchDescriptor<T>, sectionKeyPath: KeyPath<T, String>? = nil, context: ObjectContext) {
        self.fetchDescriptor = fetch
        self.sectionKeyPath = sectionKeyPath
        self.context = context
        self.relationship = nil
    }

    /// Makes a controller of one object's to-many relationship, in the relationship's order:
    /// for an ordered one (`@Relationship(.ordered)`), an object moved in the list (here or in
    /// another process) is reported as a ``FetchedResultsObjectChange/move(object:fromIndexPath:toIndexPath:)``.
    /// One section named ""; nothing is fetched before ``performFetch()``.
    ///
    /// ```swift
    /// let steps = FetchedResultsController(relationship: \Todo.steps, of: todo, context: store.mainContext)
    /// ```
    ///
    /// - Parameters:
    ///   - keyPath: the to-many relationship, `\Todo.steps`.
    ///   - owner: the object whose relationship is followed (its identifier is kept, not the object).
    ///   - context: the context whose changes are followed.
    public init<Owner: ManagedObject>(
        relationship keyPath: KeyPath<Owner, [T]>, of owner: Owner, context: ObjectContext
    ) {
        self.fetchDescriptor = FetchDescriptor<T>()
        self.sectionKeyPath = nil
        self.context = context
        let name = Owner.entityDescription.property(for: keyPath)?.name ?? "\(keyPath)"
        self.relationship = (owner.objectID, name, context.schema.entity(for: T.self)?.name ?? T.entityName)
    }

    deinit { observation?.cancel() }

    /// Called once per processed change that touches the results, on the context's queue.
    ///
    /// That queue is not the main thread: in main-actor code (top-level code, a `@MainActor`
    /// type), where a closure is isolated to the main actor, write it `{ @Sendable changes in … }`
    /// (Swift checks at run time that a main-actor closure runs on the main actor, and traps).
    /// The controller may be used inside; the objects of the changes belong to the context.
    public var onChange: ((FetchedResultsChanges<T>) -> Void)? {
        get { context.performAndWait { _onChange } }
        set { context.performAndWait { _onChange = newValue } }
    }

    /// Sets the delegate (held weakly), the BNR form of ``onChange``; both are called.
    public func setDelegate<D: FetchedResultsControllerDelegate>(_ delegate: D?) where D.Object == T {
        context.performAndWait { delegateHost = delegate.map { DelegateHost($0) } }
    }

    /// Runs the fetch and starts following the context's changes.
    /// - Throws: ``SkyrosError/Code/unsupportedPredicate`` for a predicate or sort that
    ///   cannot be translated, or sections that the sort does not keep together; the store's errors.
    public func performFetch() throws {
        try context.performAndWait {
            if let relationship {
                guard context.object(with: relationship.owner) != nil else {
                    throw SkyrosError(
                        .objectNotFound,
                        "\(relationship.owner), whose \(relationship.name) this controller follows, is not in context '\(context.name)' or its store"
                    )
                }
                sortIndexes = [(-1, true)]
                state = try relationshipResults()
                if observation == nil {
                    observation = context.addChangeObserver { [weak self] changes in self?.process(changes) }
                }
                delegateHost?.didPerformFetch(self)
                return
            }
            let request = try fetchDescriptor.storeRequest(schema: context.schema)
            let entity = try context.schema.requireEntity(request.entityName)
            sortIndexes = request.sortKeys.map { key in (entity.property(named: key.property)!.index, key.ascending) }
            predicateProperties = request.predicate.flatMap(PredicateReads.properties)
            self.request = request
            state = try makeResults(try context.fetch(fetchDescriptor))
            if observation == nil {
                observation = context.addChangeObserver { [weak self] changes in self?.process(changes) }
            }
            delegateHost?.didPerformFetch(self)
        }
    }

    /// The sections, in order.
    public var sections: [FetchedResultsSection<T>] {
        context.performAndWait { state.sections.map { FetchedResultsSection(name: $0.name, objects: $0.objects) } }
    }

    /// Every fetched object, sections in order.
    public var fetchedObjects: [T] {
        context.performAndWait { state.sections.flatMap(\.objects) }
    }

    /// The object at an index path.
    public func object(at indexPath: IndexPath) -> T {
        context.performAndWait { state.sections[indexPath.section].objects[indexPath.item] }
    }

    /// The index path of an object in the results, or nil when it is not in them.
    public func indexPath(for object: T) -> IndexPath? {
        context.performAndWait {
            state.keys[object.objectID].flatMap { state.locate(object.objectID, $0, sortIndexes) }
        }
    }

    // MARK: - Building

    private func key(of object: T) -> RowKey {
        let storage = object.skyrosStorage
        if storage.isFault { context.fulfill(storage) }
        return RowKey(
            values: sortIndexes.map { storage.values[$0.index] },
            section: sectionKeyPath.map { object[keyPath: $0] } ?? "",
            uuid: object.objectID)
    }

    private func makeResults(_ objects: [T]) throws -> Results {
        var results = Results()
        results.keys.reserveCapacity(objects.count)
        for object in objects {
            let key = key(of: object)
            if results.sections.last?.name != key.section {
                if results.sectionIndex[key.section] != nil {
                    throw SkyrosError(
                        .unsupportedPredicate,
                        "the sort of this FetchedResultsController<\(T.self)> does not keep section \"\(key.section)\" together: sort by the section key first"
                    )
                }
                results.sectionIndex[key.section] = results.sections.count
                results.sections.append(SectionState(name: key.section, objects: []))
            }
            results.sections[results.sections.count - 1].objects.append(object)
            results.keys[key.uuid] = key
        }
        return results
    }

    // MARK: - Following changes

    /// The objects of the followed relationship, in its order, each keyed by its index.
    private func relationshipResults() throws -> Results {
        guard let relationship else { return Results() }
        guard let owner = context.object(with: relationship.owner) else { return Results() }  // deleted: empty
        let storage = owner.skyrosStorage
        guard let property = storage.entity.property(named: relationship.name), property.kind == .toMany else {
            throw SkyrosError(
                .unsupportedPredicate, "\(storage.entity.name).\(relationship.name) is not a to-many relationship")
        }
        if storage.isFault { context.fulfill(storage) }
        let objects =
            storage.isDeleted
            ? [] : try context.relatedObjects(of: storage, index: property.index).compactMap { $0 as? T }
        var results = Results()
        if !objects.isEmpty {
            results.sections = [SectionState(name: "", objects: objects)]
            results.sectionIndex = ["": 0]
        }
        for (index, object) in objects.enumerated() {
            results.keys[object.objectID] = RowKey(values: [.integer(Int64(index))], section: "", uuid: object.objectID)
        }
        return results
    }

    /// Whether a change may have changed the followed relationship — it names the owner, an
    /// object in the results, an object of the destination whose to-ones changed (it may have
    /// joined), or a new object of the destination — and the objects in the results it updated.
    private func touchesRelationship(
        _ changes: ContextChanges, _ relationship: (owner: ObjectID, name: String, entityName: String)
    )
        -> (touched: Bool, updated: Set<ObjectID>)
    {
        let destination = relationship.entityName
        var updated = Set<ObjectID>()
        var touched =
            changes.updatedProperties[relationship.owner] != nil || changes.deleted.contains(relationship.owner)
        let toOnes = Set(context.schema.entity(named: destination)?.toOneProperties.map(\.name) ?? [])
        for (id, names) in changes.updatedProperties where id.entityName == destination {
            if state.keys[id] != nil {
                updated.insert(id)
            } else if !names.isDisjoint(with: toOnes) {
                touched = true
            }
        }
        for object in changes.updated
        where object.objectID.entityName == destination && state.keys[object.objectID] != nil {
            updated.insert(object.objectID)
        }
        touched =
            touched || !updated.isEmpty
            || changes.deleted.contains { $0.entityName == destination && state.keys[$0] != nil }
            || changes.inserted.contains { $0.objectID.entityName == destination }
            || changes.insertedIDs.contains { $0.entityName == destination }
        return (touched, updated)
    }

    private func process(_ changes: ContextChanges) {
        if let relationship {
            guard changes.isNewToChangeObservers else { return }
            do {
                if changes.kind == .reloaded {
                    try refetch(updated: nil)
                } else {
                    let (touched, updated) = touchesRelationship(changes, relationship)
                    if touched { try refetch(updated: updated) }
                }
            } catch {
                context.report(error)
            }
            return
        }
        guard let request, changes.isNewToChangeObservers else { return }
        do {
            if changes.kind == .reloaded {
                try refetch(updated: nil)
                return
            }
            try apply(changes, request)
        } catch {
            context.report(error)
        }
    }

    private func apply(_ changes: ContextChanges, _ request: StoreRequest) throws {
        let entityName = request.entityName
        // The changed objects of the entity, each once: inserted, updated, deleted.
        var candidates: [T] = []
        var seen = Set<ObjectID>()
        for object in changes.inserted where object.objectID.entityName == entityName {
            if seen.insert(object.objectID).inserted, let typed = object as? T { candidates.append(typed) }
        }
        var held: [ObjectID: any ManagedObject] = [:]
        for object in changes.updated where object.objectID.entityName == entityName { held[object.objectID] = object }
        var toLoad: [ObjectID] = []
        for (id, names) in changes.updatedProperties where id.entityName == entityName && !seen.contains(id) {
            if state.keys[id] != nil {
                seen.insert(id)
                if let object = (held[id] ?? context.registry[id]?.object) as? T {
                    candidates.append(object)
                } else {
                    toLoad.append(id)
                }
            } else if predicateProperties.map({ !$0.isDisjoint(with: names) }) ?? true {
                // Not in the results: it can only start matching if the predicate reads what changed.
                seen.insert(id)
                if let object = held[id] as? T { candidates.append(object) } else { toLoad.append(id) }
            }
        }
        var removed: [ObjectID] = []
        if !toLoad.isEmpty {
            let loaded = context.loadedObjects(toLoad)
            let found = Set(loaded.map(\.objectID))
            candidates += loaded.compactMap { $0 as? T }
            // Gone from the store meanwhile: treated as deleted.
            removed += toLoad.filter { !found.contains($0) && state.keys[$0] != nil }
        }
        for id in changes.deleted where id.entityName == entityName && state.keys[id] != nil && !seen.contains(id) {
            removed.append(id)
            seen.insert(id)
        }

        var removals: [(uuid: ObjectID, key: RowKey)] = removed.compactMap { uuid in state.keys[uuid].map { (uuid, $0) }
        }
        var moved: [T] = []
        var updatedInPlace: [T] = []
        var inserted: [T] = []
        for object in candidates {
            let storage = object.skyrosStorage
            let uuid = object.objectID
            let matches = try !storage.isDeleted && context.matches(request.predicate, storage)
            if let old = state.keys[uuid] {
                if !matches {
                    removals.append((uuid, old))
                } else if key(of: object) == old {
                    updatedInPlace.append(object)
                } else {
                    removals.append((uuid, old))
                    moved.append(object)
                }
            } else if matches {
                inserted.append(object)
            }
        }
        guard !removals.isEmpty || !inserted.isEmpty || !updatedInPlace.isEmpty else { return }
        if request.limit != nil || request.offset > 0 {
            // What enters or leaves a sliced result depends on rows this change does not name.
            try refetch(updated: Set(updatedInPlace.map(\.objectID)))
            return
        }

        var result = FetchedResultsChanges<T>()
        let oldSectionNames = state.sections.map(\.name)
        // Before any mutation: the old index paths of what leaves its place.
        let movedUUIDs = Set(moved.map(\.objectID))
        var removedAt: [(object: T, path: IndexPath, moved: Bool)] = []
        for (uuid, key) in removals {
            guard let path = state.locate(uuid, key, sortIndexes) else { continue }
            removedAt.append((state.sections[path.section].objects[path.item], path, movedUUIDs.contains(uuid)))
        }
        let updates = updatedInPlace.compactMap { object in
            state.keys[object.objectID].flatMap { state.locate(object.objectID, $0, sortIndexes) }.map { (object, $0) }
        }
        // Remove, highest index path first so that the others stay valid.
        removedAt.sort { $0.path > $1.path }
        for entry in removedAt {
            state.sections[entry.path.section].objects.remove(at: entry.path.item)
            state.keys[entry.object.objectID] = nil
        }
        if state.sections.contains(where: \.objects.isEmpty) {
            state.sections.removeAll { $0.objects.isEmpty }
            state.reindexSections()
        }
        // Insert at the new positions.
        for object in moved + inserted {
            let key = key(of: object)
            state.insert(object, key, sortIndexes)
        }
        // After every mutation: the new index paths.
        var deletions: [FetchedResultsObjectChange<T>] = []
        var moves: [FetchedResultsObjectChange<T>] = []
        for entry in removedAt {
            if entry.moved {
                let key = state.keys[entry.object.objectID]!
                let to = state.locate(key.uuid, key, sortIndexes)!
                moves.append(.move(object: entry.object, fromIndexPath: entry.path, toIndexPath: to))
            } else {
                deletions.append(.delete(object: entry.object, indexPath: entry.path))
            }
        }
        var insertions: [(T, IndexPath)] = inserted.map { object in
            let key = state.keys[object.objectID]!
            return (object, state.locate(key.uuid, key, sortIndexes)!)
        }
        insertions.sort { $0.1 < $1.1 }
        result.objects =
            deletions + insertions.map { .insert(object: $0.0, indexPath: $0.1) } + moves
            + updates.map { .update(object: $0.0, indexPath: $0.1) }
        result.sections = sectionChanges(from: oldSectionNames, removed: removedAt.map { ($0.path, $0.object) })
        deliver(result)
    }

    /// Runs the fetch again and reports the difference (after a reload, or for a sliced fetch).
    /// - Parameter updated: the objects known to be updated; nil: any may have been.
    private func refetch(updated: Set<ObjectID>?) throws {
        let old = state
        let new = relationship != nil ? try relationshipResults() : try makeResults(try context.fetch(fetchDescriptor))
        var result = FetchedResultsChanges<T>()
        var oldPaths: [ObjectID: IndexPath] = [:]
        for (s, section) in old.sections.enumerated() {
            for (i, object) in section.objects.enumerated() {
                oldPaths[object.objectID] = IndexPath(item: i, section: s)
            }
        }
        var deletions: [FetchedResultsObjectChange<T>] = []
        for (s, section) in old.sections.enumerated() {
            for (i, object) in section.objects.enumerated().reversed() where new.keys[object.objectID] == nil {
                deletions.append(.delete(object: object, indexPath: IndexPath(item: i, section: s)))
            }
        }
        deletions.sort { lhs, rhs in
            guard case .delete(_, let a) = lhs, case .delete(_, let b) = rhs else { return false }
            return a > b
        }
        // The objects in both, in the new order; those off the longest run that kept its
        // order (or that changed section) are moves.
        var common: [(object: T, old: IndexPath, new: IndexPath)] = []
        var insertions: [FetchedResultsObjectChange<T>] = []
        for (s, section) in new.sections.enumerated() {
            for (i, object) in section.objects.enumerated() {
                let path = IndexPath(item: i, section: s)
                if let oldPath = oldPaths[object.objectID] {
                    common.append((object, oldPath, path))
                } else {
                    insertions.append(.insert(object: object, indexPath: path))
                }
            }
        }
        let kept = PredicateReads.longestIncreasingRun(common.map(\.old))
        var moves: [FetchedResultsObjectChange<T>] = []
        var updates: [FetchedResultsObjectChange<T>] = []
        for (position, entry) in common.enumerated() {
            let uuid = entry.object.objectID
            let sameSection = old.sections[entry.old.section].name == new.sections[entry.new.section].name
            if !kept.contains(position) || !sameSection {
                moves.append(.move(object: entry.object, fromIndexPath: entry.old, toIndexPath: entry.new))
            } else if updated?.contains(uuid) ?? true {
                updates.append(.update(object: entry.object, indexPath: entry.old))
            }
        }
        state = new
        result.objects = deletions + insertions + moves + updates
        result.sections = sectionChanges(from: old.sections.map(\.name), oldSections: old.sections)
        deliver(result)
    }

    /// Sections deleted (index before) and inserted (index after), by name.
    private func sectionChanges(
        from oldNames: [String], removed: [(IndexPath, T)] = [], oldSections: [SectionState]? = nil
    ) -> [FetchedResultsSectionChange<T>] {
        let newNames = Set(state.sections.map(\.name))
        let oldSet = Set(oldNames)
        var changes: [FetchedResultsSectionChange<T>] = []
        for (index, name) in oldNames.enumerated().reversed() where !newNames.contains(name) {
            let objects = oldSections?[index].objects ?? removed.filter { $0.0.section == index }.map(\.1)
            changes.append(.delete(section: FetchedResultsSection(name: name, objects: objects), index: index))
        }
        for (index, section) in state.sections.enumerated() where !oldSet.contains(section.name) {
            changes.append(
                .insert(section: FetchedResultsSection(name: section.name, objects: section.objects), index: index))
        }
        return changes
    }

    private func deliver(_ changes: FetchedResultsChanges<T>) {
        guard !changes.isEmpty else { return }
        if let host = delegateHost {
            host.willChange(self)
            for change in changes.sections { host.didChangeSection(self, change) }
            for change in changes.objects { host.didChangeObject(self, change) }
            host.didChange(self)
        }
        _onChange?(changes)
    }

}
