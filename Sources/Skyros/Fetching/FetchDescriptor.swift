import Foundation

/// What to fetch: a Foundation `#Predicate`, `SortDescriptor`s, a limit and an offset.
///
/// ```swift
/// var descriptor = FetchDescriptor<User>(
///     predicate: #Predicate { $0.lastname == "Doe" },
///     sortBy: [SortDescriptor(\.firstname)])
/// descriptor.fetchLimit = 10
/// let users = try context.fetch(descriptor)
/// ```
///
/// Supported in predicates: comparisons, `==`/`!=` (nil-safe), `&&`/`||`/`!`, nil checks and
/// optional chaining, `contains`/`starts(with:)` on strings, `localizedStandardContains`
/// (case-insensitive), `localizedLowercase`, `[…].contains($0.x)`, to-one key paths
/// (`$0.author?.lastname`), and on to-many relationships `contains(where:)`, `allSatisfy`,
/// `isEmpty` and `count`. Anything else is refused with ``SkyrosError/Code/unsupportedPredicate``
/// naming the expression: nothing is ever fetched whole and filtered silently.
/// Sorting is binary for strings ("#" < "1" < "A" < "a"), whatever comparator the sort
/// descriptor names.
public struct FetchDescriptor<T: ManagedObject> {
    public var predicate: Predicate<T>?
    public var sortBy: [SortDescriptor<T>]
    public var fetchLimit: Int?
    public var fetchOffset: Int?

    public init(predicate: Predicate<T>? = nil, sortBy: [SortDescriptor<T>] = [], fetchLimit: Int? = nil) {
        self.predicate = predicate
        self.sortBy = sortBy
        self.fetchLimit = fetchLimit
    }

    /// The request a store receives.
    public func storeRequest(schema: Schema) throws -> StoreRequest {
        let entity = try schema.requireEntity(T.entityDescription.name)
        let node = try predicate.map { try PredicateTranslator.translate($0, schema: schema) }
        let keys = try sortBy.map { descriptor -> SortKey in
            guard let keyPath = descriptor.keyPath, let property = entity.property(for: keyPath), property.hasColumn else {
                throw SkyrosError(
                    .unsupportedPredicate,
                    "sort descriptor on \(descriptor.keyPath.map { "\($0)" } ?? "a comparator") is not an attribute or to-one of \(entity.name)"
                )
            }
            return SortKey(property: property.name, ascending: descriptor.order == .forward)
        }
        if let fetchLimit, fetchLimit < 0 { throw SkyrosError(.unsupportedPredicate, "fetchLimit must not be negative") }
        if let fetchOffset, fetchOffset < 0 { throw SkyrosError(.unsupportedPredicate, "fetchOffset must not be negative") }
        return StoreRequest(
            entityName: entity.name, predicate: node, sortKeys: keys, limit: fetchLimit, offset: fetchOffset ?? 0)
    }
}

/// The result of a batched fetch: the matching identifiers, and the objects loaded one
/// batch at a time as they are accessed. Use it on its context's queue.
public struct FetchResultsCollection<T: ManagedObject>: RandomAccessCollection {
    let context: ObjectContext
    let ids: [ObjectID]
    let batchSize: Int
    private let cache: BatchCache

    final class BatchCache {
        var batchIndex = -1
        var objects: [any ManagedObject] = []
        var ownedIDs: [ObjectID] = []
    }

    init(context: ObjectContext, ids: [ObjectID], batchSize: Int) {
        self.context = context
        self.ids = ids
        self.batchSize = batchSize
        self.cache = BatchCache()
    }

    public var startIndex: Int { 0 }
    public var endIndex: Int { ids.count }

    public subscript(position: Int) -> T {
        let batch = position / batchSize
        if cache.batchIndex != batch { load(batch) }
        return cache.objects[position - batch * batchSize] as! T
    }

    private func load(_ batch: Int) {
        // Release the previous batch's objects that this collection brought in and nobody changed.
        for id in cache.ownedIDs {
            if let object = context.lookup(id), !object.skyrosStorage.hasChanges {
                context.registry[id] = nil
            }
        }
        cache.objects = []
        let range = (batch * batchSize)..<Swift.min(ids.count, (batch + 1) * batchSize)
        let batchIDs = Array(ids[range])
        let missing = batchIDs.filter { context.lookup($0) == nil }
        var snapshots: [ObjectID: Snapshot] = [:]
        do {
            snapshots = Dictionary(
                try context.parent.snapshots(for: missing).map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
        } catch {
            // The batch stays faults: each one touched becomes inaccessible if the store is still away.
            context.report(SkyrosError(
                SkyrosError.wrap(error).code, "could not load a batch of \(T.self): \(SkyrosError.wrap(error).message)",
                underlying: error))
        }
        cache.objects = batchIDs.map { id in
            if let object = try? context.materialize(id, values: snapshots[id]?.values, version: snapshots[id]?.version ?? 0) {
                return object
            }
            // Not of this context's schema (impossible for identifiers this fetch produced): a detached, deleted object.
            let object = context.makeObject(id, of: T.entityDescription, values: nil)
            object.skyrosStorage.makeInaccessible()
            return object
        }
        cache.ownedIDs = missing
        cache.batchIndex = batch
    }
}
