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
    /// Which objects: a `#Predicate` over `T`, translated to SQL; nil for all of them.
    public var predicate: Predicate<T>?
    /// The order: attributes and to-ones of `T`, ties broken by object ID (creation order).
    public var sortBy: [SortDescriptor<T>]
    /// At most this many objects; nil for no limit. Negative is refused
    /// (``SkyrosError/Code/unsupportedPredicate``).
    public var fetchLimit: Int?
    /// Skips this many objects of the sorted result first; nil for none.
    public var fetchOffset: Int?

    /// A fetch of `T`s matching `predicate` (all of them when nil), sorted by `sortBy`, at most
    /// `fetchLimit` of them. Nothing is checked until the fetch runs.
    public init(predicate: Predicate<T>? = nil, sortBy: [SortDescriptor<T>] = [], fetchLimit: Int? = nil) {
        self.predicate = predicate
        self.sortBy = sortBy
        self.fetchLimit = fetchLimit
    }

    /// The request a store receives.
    public func storeRequest(schema: Schema) throws -> StoreRequest {
        let (entity, member) = try schema.storage(of: T.self)
        let node = Schema.restricting(
            try predicate.map { try PredicateTranslator.translate($0, schema: schema) }, to: member)
        let keys = try sortBy.map { descriptor -> SortKey in
            guard let keyPath = descriptor.keyPath, let property = entity.property(for: keyPath), property.hasColumn
            else {
                throw SkyrosError(
                    .unsupportedPredicate,
                    "sort descriptor on \(descriptor.keyPath.map { "\($0)" } ?? "a comparator") is not an attribute or to-one of \(entity.name)"
                )
            }
            return SortKey(property: property.name, ascending: descriptor.order == .forward)
        }
        if let fetchLimit, fetchLimit < 0 {
            throw SkyrosError(.unsupportedPredicate, "fetchLimit must not be negative")
        }
        if let fetchOffset, fetchOffset < 0 {
            throw SkyrosError(.unsupportedPredicate, "fetchOffset must not be negative")
        }
        return StoreRequest(
            entityName: entity.name, predicate: node, sortKeys: keys, limit: fetchLimit, offset: fetchOffset ?? 0)
    }
}

/// The result of ``ObjectContext/fetch(_:batchSize:)``: the matching objects, made
/// `batchSize` at a time as the sequence is iterated. Iterate it on its context's queue.
///
/// ```swift
/// for item in try context.fetch(FetchDescriptor<Item>(), batchSize: 1_000) {
///     total += item.value
/// }
/// ```
///
/// When neither the context nor the contexts between it and a SQLite store file have
/// pending changes of the entity, the iteration is a cursor: one SQL statement, stepped a
/// batch at a time on a reading connection of its own, reads the store as it was when the
/// fetch was made (later saves are not seen). Otherwise (pending changes to merge, an
/// in-memory store, a store reached through a daemon) the identifiers are fetched up front
/// and each batch's values loaded by identifier. Either way only the current batch is held:
/// when the next one is made, the objects of the previous one that nothing else holds and
/// that have no changes leave the context, so memory does not grow with the number of rows.
/// A cursor reuses those objects for its next rows when nothing references them at all — no
/// strong, weak or unowned reference — and their class has no stored property of its own
/// (`@Transient`): no allocation per row, and nothing anyone could see (a `deinit` runs once
/// per instance, not once per row).
///
/// Breaking out of the loop ends the statement. Iterating the sequence again runs the fetch
/// again. An error while stepping (the store failing underneath) ends the iteration and is
/// reported to the context's ``ObjectContext/errorHandler``.
public struct FetchResultsCollection<T: ManagedObject>: Sequence {
    let context: ObjectContext
    let request: StoreRequest
    let batchSize: Int
    /// The source opened by the fetch, for the first iteration (the fetch's errors are thrown
    /// by `fetch`); later iterations open their own.
    private let prepared: Prepared

    final class Prepared {
        var source: BatchSource?
        init(_ source: BatchSource) { self.source = source }
    }

    init(context: ObjectContext, request: StoreRequest, batchSize: Int, source: BatchSource) {
        self.context = context
        self.request = request
        self.batchSize = batchSize
        self.prepared = Prepared(source)
    }

    /// Starts an iteration: the first uses the fetch that made the collection, each later one
    /// runs the fetch again (an error is reported to the context's error handler, and the
    /// iteration is empty).
    public func makeIterator() -> Iterator {
        var source = prepared.source
        prepared.source = nil
        if source == nil {
            do {
                source = try context.batchSource(request)
            } catch {
                context.report(
                    SkyrosError(
                        SkyrosError.wrap(error).code, "could not fetch \(T.self): \(SkyrosError.wrap(error).message)",
                        underlying: error))
            }
        }
        return Iterator(
            BatchIteration(
                context: context, entity: context.schema.entity(for: T.self) ?? T.entityDescription,
                batchSize: batchSize, source: source))
    }

    /// Iterates a batched fetch, one batch of objects held at a time.
    public struct Iterator: IteratorProtocol {
        @usableFromInline let state: BatchIteration
        init(_ state: BatchIteration) { self.state = state }

        /// The next object, making the next batch when the current one is done; nil at the end.
        @inlinable  // specialised in the caller: no generic call per object
        public mutating func next() -> T? {
            guard let object = state.next() else { return nil }
            // Every object of the iteration is of entity T, whose class is T.
            return unsafeDowncast(object, to: T.self)
        }
    }
}

/// The state of a batched fetch's iteration; not generic, so that nothing per row looks up
/// generic metadata. Confined to the context's queue (hence no dynamic exclusivity checks).
@usableFromInline
final class BatchIteration {
    let context: ObjectContext
    let entity: EntityDescription
    let batchSize: Int
    @exclusivity(unchecked) var source: BatchSource?
    /// The position of the next batch in the identifiers of an identifier source.
    @exclusivity(unchecked) var nextIdentifier = 0
    /// The objects of the current batch, `batchCount` of them: a buffer kept from batch to
    /// batch, without an array's bookkeeping per object.
    @exclusivity(unchecked) var batch: UnsafeMutablePointer<AnyObject>
    @exclusivity(unchecked) var batchCount = 0
    @exclusivity(unchecked) var batchCapacity: Int
    @exclusivity(unchecked) var position = 0
    /// The objects a batch by identifier registered (a cursor's batch notes where its
    /// entries start instead, and finds its objects in `batch` if they were indexed since).
    @exclusivity(unchecked) var madeIDs: [ObjectID] = []
    @exclusivity(unchecked) var mark: Registry.Mark?
    /// Whether the objects of a released batch that nothing references any more are made the
    /// objects of the next rows instead of new ones (two allocations and two deallocations
    /// fewer per row; see ``ObjectReuse``): when the entity's class allows it, known once the
    /// first object is made.
    @exclusivity(unchecked) var reuses: Bool?
    /// When it does, the class's metadata: only instances of this very class are reused.
    @exclusivity(unchecked) var objectClass: UnsafeRawPointer?
    /// The rows given a reused object (for tests).
    @exclusivity(unchecked) var reused = 0

    init(context: ObjectContext, entity: EntityDescription, batchSize: Int, source: BatchSource?) {
        self.context = context
        self.entity = entity
        self.batchSize = batchSize
        self.source = source
        batchCapacity = Swift.min(batchSize, 1_024)  // grown as needed: a batch size may be larger than any result
        batch = .allocate(capacity: batchCapacity)
    }

    /// Adds an object to the current batch.
    @inline(__always)
    private func append(_ object: __owned AnyObject) {
        if batchCount == batchCapacity { growBatch() }
        (batch + batchCount).initialize(to: object)
        batchCount += 1
    }

    @inline(never)
    private func growBatch() {
        let capacity = Swift.min(batchSize, Swift.max(batchCapacity * 2, 1))
        precondition(capacity > batchCapacity, "a batch holds at most batchSize objects")
        let grown = UnsafeMutablePointer<AnyObject>.allocate(capacity: capacity)
        grown.moveInitialize(from: batch, count: batchCount)
        batch.deallocate()
        batch = grown
        batchCapacity = capacity
    }

    /// The next object, making the next batch when the current one is done.
    @usableFromInline
    func next() -> AnyObject? {
        if position < batchCount {
            defer { position += 1 }
            return batch[position]
        }
        releaseBatch(keepingSpares: source != nil)  // the last release keeps none
        guard let source else { return nil }
        do {
            switch source {
            case .cursor(let cursor): try loadFromCursor(cursor)
            case .identifiers(let ids): loadByIdentifier(ids)
            }
        } catch {
            self.source = nil
            context.report(
                SkyrosError(
                    SkyrosError.wrap(error).code,
                    "could not fetch a batch of \(entity.name): \(SkyrosError.wrap(error).message)",
                    underlying: error))
        }
        guard batchCount > 0 else {
            self.source = nil
            context.registry.dropSpares()
            return nil
        }
        position = 1
        return batch[0]
    }

    /// Lets go of the current batch: the objects it registered leave the context unless
    /// something else holds them or they have changes; with `keepingSpares`, those nothing
    /// references stay for the next rows (see ``reuses``).
    private func releaseBatch(keepingSpares: Bool) {
        // A cursor's batch needs identifiers only when the registry was indexed meanwhile: then
        // the batch's objects (some may have been registered before it: released too if nothing
        // holds them, as a pruning of the registry would).
        var ids: [ObjectID] = []
        if let mark, !context.registry.isCurrent(mark) {
            ids = UnsafeBufferPointer(start: batch, count: batchCount).map { ($0 as! any ManagedObject).objectID }
        }
        batch.deinitialize(count: batchCount)
        batchCount = 0
        position = 0
        if let mark {
            context.registry.releaseUnused(since: mark, ids: ids, spareClass: keepingSpares ? objectClass : nil)
            self.mark = nil
        } else if !madeIDs.isEmpty {
            context.registry.releaseUnused(madeIDs)
        }
        madeIDs.removeAll(keepingCapacity: true)
    }

    /// The next rows of the cursor, as objects: registered ones reused (a fault filled
    /// from its row), new ones made and registered.
    private func loadFromCursor(_ cursor: SQLiteStore.Cursor) throws {
        let context = context
        context.pruneBeforeFetch()
        let mayBeRegistered = !context.registry.isEmpty || context.hasChanges
        mark = context.registry.mark
        let more = try cursor.next(batchSize) { id, values, version in
            if mayBeRegistered, let object = context.registered(id) {
                if object.skyrosStorage.isFault { object.skyrosStorage.fill(values, version: version) }
                append(object)
                return
            }
            if let objectClass, context.registry.hasSpare(of: objectClass) {
                append(context.registry.reuseSpare(for: consume id, values: consume values, version: version))
                reused &+= 1
                return
            }
            let object = context.makeObject(id, of: entity, values: values, version: version, exposed: true)
            if reuses == nil {
                // Decided once, on the first object made (a flat entity's class holding nothing but its storage).
                reuses = entity.hierarchy == nil && ObjectReuse.holdsOnlyStorage(object)
                if reuses == true { objectClass = ObjectReuse.objectClass(of: object as AnyObject) }
            }
            context.registry.addNew(ObjectContext.Entry(object))
            append(object)
        }
        if !more { source = nil }
    }

    /// The next batch of identifiers, their values loaded from the parent in one request.
    private func loadByIdentifier(_ ids: [ObjectID]) {
        let range = nextIdentifier..<Swift.min(ids.count, nextIdentifier + batchSize)
        nextIdentifier = range.upperBound
        if range.upperBound >= ids.count { source = nil }
        guard !range.isEmpty else { return }
        let batchIDs = ids[range]
        let missing = batchIDs.filter { context.lookup($0) == nil }
        var snapshots: [ObjectID: Snapshot] = [:]
        do {
            snapshots = Dictionary(
                try context.parent.snapshots(for: missing).map { ($0.id, $0) }, uniquingKeysWith: { a, _ in a })
        } catch {
            // The batch stays faults: each one touched becomes inaccessible if the store is still away.
            context.report(
                SkyrosError(
                    SkyrosError.wrap(error).code,
                    "could not load a batch of \(entity.name): \(SkyrosError.wrap(error).message)",
                    underlying: error))
        }
        madeIDs = missing  // registered through the index: released by identifier
        for id in batchIDs {
            if let object = try? context.materialize(
                id, values: snapshots[id]?.values, version: snapshots[id]?.version ?? 0),
                object.skyrosStorage.entity === entity
            {
                append(object)
                continue
            }
            // Not of this context's schema (impossible for identifiers this fetch produced): a detached, deleted object.
            let object = context.makeObject(id, of: entity, values: nil)
            object.skyrosStorage.makeInaccessible()
            append(object)
        }
    }

    deinit {
        // Left early (a `break`): the statement ends now, and the last batch leaves the
        // context unless held (only on the context's queue, where its registry may be touched).
        if case .cursor(let cursor)? = source { cursor.close() }
        if context.isPerformingOnCurrentThread {
            releaseBatch(keepingSpares: false)
            context.registry.dropSpares()
        }
        batch.deinitialize(count: batchCount)
        batch.deallocate()
    }
}

/// Where a batched fetch's objects come from.
enum BatchSource {
    /// A statement stepped lazily on the store.
    case cursor(SQLiteStore.Cursor)
    /// The identifiers of the matching objects, pending changes included.
    case identifiers([ObjectID])
}
