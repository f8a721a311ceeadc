import Foundation

extension ObjectContext {
    // MARK: - Public fetching

    /// The objects matching a fetch descriptor, pending changes included.
    @inlinable  // specialised in the caller: the result array is built for T, with no generic lookups
    public func fetch<T: ManagedObject>(_ descriptor: FetchDescriptor<T>) throws -> [T] {
        // Every object of the request is of entity T, whose class is T: no dynamic cast needed.
        let request = try descriptor.storeRequest(schema: schema)
        guard !hasPendingChanges(of: request.entityName) else {
            return try fetchObjects(request).map { unsafeDowncast($0 as AnyObject, to: T.self) }
        }
        var result: [T] = []
        try streamObjects(request) { result.append(unsafeDowncast($0 as AnyObject, to: T.self)) }
        return result
    }

    /// The number of objects matching a fetch descriptor, pending changes included.
    public func fetchCount<T: ManagedObject>(_ descriptor: FetchDescriptor<T>) throws -> Int {
        try countObjects(descriptor.storeRequest(schema: schema))
    }

    /// The identifiers of the matching objects, without loading their values: fetching a
    /// million identifiers holds no million rows.
    public func fetchIdentifiers<T: ManagedObject>(_ descriptor: FetchDescriptor<T>) throws -> [ObjectID] {
        try mergedIdentifiers(descriptor.storeRequest(schema: schema))
    }

    /// The matching objects, made `batchSize` at a time as the sequence is iterated, with
    /// memory independent of the number of matching objects.
    ///
    /// ```swift
    /// for item in try context.fetch(FetchDescriptor<Item>(), batchSize: 1_000) {
    ///     total += item.value
    /// }
    /// ```
    ///
    /// With no pending change of the entity in this context nor in the contexts between it
    /// and a SQLite store file, it is a cursor: one statement stepped a batch at a time on a
    /// reading connection of its own, which sees the store as it was at the fetch. Otherwise
    /// the identifiers are fetched now (pending changes merged) and each batch loaded by
    /// identifier. Only the current batch is held: the objects of earlier batches that
    /// nothing else holds and that have no changes leave the context. A cursor makes the
    /// objects that left, when nothing references them at all (no strong, weak or unowned
    /// reference), the objects of its next rows instead of allocating new ones — unseen by
    /// anyone: an object you hold in any way is never reused. See ``FetchResultsCollection``.
    ///
    /// - Parameters:
    ///   - descriptor: what to fetch, as ``fetch(_:)`` takes it.
    ///   - batchSize: the objects made at a time (positive).
    /// - Throws: what the fetch would throw: an unsupported predicate or sort, a store failure.
    public func fetch<T: ManagedObject>(_ descriptor: FetchDescriptor<T>, batchSize: Int) throws
        -> FetchResultsCollection<T>
    {
        precondition(batchSize > 0, "batchSize must be positive")
        let request = try descriptor.storeRequest(schema: schema)
        return FetchResultsCollection(
            context: self, request: request, batchSize: batchSize, source: try batchSource(request))
    }

    /// A cursor over the store's rows when nothing between this context and a SQLite store
    /// file has pending changes of the entity, else the merged identifiers.
    func batchSource(_ request: StoreRequest) throws -> BatchSource {
        noteRead(request.entityName)
        if let cursor = try storeCursor(request) { return .cursor(cursor) }
        return .identifiers(try mergedIdentifiers(request))
    }

    /// A cursor over the rows of a request in the SQLite store under this context, when
    /// neither this context nor any context in between has pending changes of its entity
    /// (each asked on its own queue); nil otherwise.
    func storeCursor(_ request: StoreRequest) throws -> SQLiteStore.Cursor? {
        guard !hasPendingChanges(of: request.entityName) else { return nil }
        if let store = parent as? SQLiteStore { return try store.openCursor(request) }
        if let context = parentContext { return try context.performAndWait { try context.storeCursor(request) } }
        return nil
    }

    /// The object with this identifier as the context sees it, or nil when it does not
    /// exist there (never saved to the parent, or deleted).
    public func object(with id: ObjectID) -> (any ManagedObject)? {
        try? existingObject(with: id)
    }

    /// The object with this identifier, typed.
    public func object<T: ManagedObject>(with id: ObjectID, as type: T.Type) -> T? {
        object(with: id) as? T
    }

    /// The object with this identifier; throws ``SkyrosError/Code/objectNotFound`` when it
    /// does not exist in this context's view.
    public func existingObject(with id: ObjectID) throws -> any ManagedObject {
        noteRead(id.entityName)
        if let object = registered(id) {
            let storage = object.skyrosStorage
            if storage.isDeleted { throw notFound(id) }
            if !storage.isFault { return object }
        }
        if let row = mergedRows.take(id) { return try materialize(id, values: row.values, version: row.version) }
        guard let snapshot = try parent.snapshots(for: [id]).first else { throw notFound(id) }
        return try materialize(id, values: snapshot.values, version: snapshot.version)
    }

    private func notFound(_ id: ObjectID) -> SkyrosError {
        SkyrosError(.objectNotFound, "\(id) does not exist in context '\(name)'")
    }

    // MARK: - Merging with pending changes

    @usableFromInline
    func fetchObjects(_ request: StoreRequest, localOnly: Bool = false) throws -> [any ManagedObject] {
        noteRead(request.entityName)
        let entity = try schema.requireEntity(request.entityName)
        if !localOnly && !hasPendingChanges(of: request.entityName) {
            var result: [any ManagedObject] = []
            try streamObjects(request) { result.append($0) }
            return result
        }
        let snapshots = try mergedSnapshots(request, localOnly: localOnly)
        var result: [any ManagedObject] = []
        result.reserveCapacity(snapshots.count)
        registry.reserveCapacity(registry.count + snapshots.count)
        // The objects being materialised are held by `result`: pruning now would free nothing.
        registryPurgeThreshold = max(registryPurgeThreshold, registry.count + snapshots.count + 1)
        for snapshot in snapshots {
            result.append(
                try materialize(snapshot.id, values: snapshot.values, version: snapshot.version, entity: entity))
        }
        return result
    }

    /// Makes the objects of a request as the parent's rows stream in, handing each to `body`
    /// in order; for a context with no pending change of the entity (nothing to merge).
    /// Registered objects are reused (a fault is filled from its row). New objects are
    /// registered as they are made, in a list the registry indexes on its first lookup;
    /// when the registry was empty it is not searched at all (a query gives each object once).
    @usableFromInline
    func streamObjects(_ request: StoreRequest, _ body: (any ManagedObject) -> Void) throws {
        noteRead(request.entityName)
        let entity = try schema.requireEntity(request.entityName)
        // Objects of earlier fetches that nobody holds any more leave first (amortised), so
        // that a context whose user holds nothing makes its objects without looking each one up.
        pruneBeforeFetch()
        let mayBeRegistered = !registry.isEmpty || hasChanges
        try parent.forEachSnapshot(request) { id, values, version in
            if mayBeRegistered, let object = registered(id) {
                if object.skyrosStorage.isFault { object.skyrosStorage.fill(values, version: version) }
                body(object)
                return
            }
            let object = makeObject(id, of: entity, values: values, version: version, exposed: true)
            registry.addNew(Entry(object))
            // Merges run on this queue: the row of a merged insert is no newer than the store's.
            if !mergedRows.isEmpty { mergedRows.remove(id) }
            body(object)
        }
    }

    /// The parent's rows merged with this context's pending changes of the entity.
    func mergedSnapshots(_ request: StoreRequest, localOnly: Bool = false) throws -> [Snapshot] {
        let pending = try pendingStorages(of: request.entityName)
        if pending.isEmpty { return localOnly ? [] : try parent.fetchSnapshots(request) }
        var parentRequest = request
        parentRequest.offset = 0
        parentRequest.limit = request.limit.map { $0 + request.offset + pending.count }
        var rows = localOnly ? [] : try parent.fetchSnapshots(parentRequest)
        let pendingIDs = Set(pending.map(\.objectID))
        rows.removeAll { pendingIDs.contains($0.id) }
        for storage in pending where !storage.isDeleted {
            if try matches(request.predicate, storage) {
                rows.append(Snapshot(id: storage.objectID, values: storage.values, version: storage.version))
            }
        }
        try sort(&rows, by: request.sortKeys, entityName: request.entityName)
        return slice(rows, request)
    }

    func mergedIdentifiers(_ request: StoreRequest) throws -> [ObjectID] {
        noteRead(request.entityName)
        if !hasPendingChanges(of: request.entityName) { return try parent.fetchIdentifiers(request) }
        return try mergedSnapshots(request).map(\.id)
    }

    func countObjects(_ request: StoreRequest) throws -> Int {
        noteRead(request.entityName)
        let pending = try pendingStorages(of: request.entityName)
        if pending.isEmpty { return try parent.count(request) }
        var unsliced = request
        unsliced.sortKeys = []
        unsliced.limit = nil
        unsliced.offset = 0
        var ids = Set(try parent.fetchIdentifiers(unsliced))
        for storage in pending {
            ids.remove(storage.objectID)
            if !storage.isDeleted, try matches(request.predicate, storage) { ids.insert(storage.objectID) }
        }
        let afterOffset = max(0, ids.count - request.offset)
        return request.limit.map { min($0, afterOffset) } ?? afterOffset
    }

    private func slice(_ rows: [Snapshot], _ request: StoreRequest) -> [Snapshot] {
        guard request.offset > 0 || request.limit != nil else { return rows }
        let start = min(request.offset, rows.count)
        let end = request.limit.map { min(rows.count, start + $0) } ?? rows.count
        return Array(rows[start..<end])
    }

    /// Sorts like the store's `ORDER BY`: the sort keys, then the object ID.
    func sort(_ rows: inout [Snapshot], by keys: [SortKey], entityName: String) throws {
        let entity = try schema.requireEntity(entityName)
        let resolved: [(Int, Bool)] = try keys.map { key in
            guard let property = entity.property(named: key.property), property.hasColumn else {
                throw SkyrosError(.unsupportedPredicate, "cannot sort \(entity.name) by \(key.property)")
            }
            return (property.index, key.ascending)
        }
        rows.sort { a, b in
            for (index, ascending) in resolved {
                switch StoredValue.compare(a.values[index], b.values[index]) {
                case .orderedAscending: return ascending
                case .orderedDescending: return !ascending
                case .orderedSame: continue
                }
            }
            return StoredValue.compare(a.id.uuid.storedValue, b.id.uuid.storedValue) == .orderedAscending
        }
    }

    // MARK: - In-memory evaluation

    /// Evaluates a predicate on an object of this context, with the store's semantics.
    func matches(_ predicate: PredicateNode?, _ storage: ObjectStorage) throws -> Bool {
        guard let predicate else { return true }
        return try evaluate(predicate, [0: storage]).isTruthy
    }

    private func truth(_ value: Bool) -> StoredValue { .integer(value ? 1 : 0) }

    func evaluate(_ node: PredicateNode, _ scopes: [Int: ObjectStorage]) throws -> StoredValue {
        switch node {
        case .constant(let value):
            return value
        case .property(let scope, let path):
            guard var storage = scopes[scope] else { throw invalidPredicate("unknown scope \(scope)") }
            for (position, name) in path.enumerated() {
                if storage.isFault { fulfill(storage) }
                if name == PredicateNode.idProperty { return storage.objectID.uuid.storedValue }
                guard let property = storage.entity.property(named: name) else {
                    throw invalidPredicate("\(storage.entity.name) has no property \(name)")
                }
                let value = storage.values[property.index]
                if position == path.count - 1 { return value }
                guard property.kind == .toOne, let uuid = UUID(storedValue: value),
                    let next = registeredOrFault(ObjectID(entityName: property.destinationName!, uuid: uuid))
                else { return .null }
                storage = next.skyrosStorage
            }
            return .null
        case .compare(let op, let lhs, let rhs):
            let a = try evaluate(lhs, scopes)
            let b = try evaluate(rhs, scopes)
            switch op {
            case .equal: return truth(StoredValue.isIdentical(a, b))
            case .notEqual: return truth(!StoredValue.isIdentical(a, b))
            default:
                if a.isNull || b.isNull { return .null }
                let order = StoredValue.compare(a, b)
                switch op {
                case .less: return truth(order == .orderedAscending)
                case .lessOrEqual: return truth(order != .orderedDescending)
                case .greater: return truth(order == .orderedDescending)
                default: return truth(order != .orderedAscending)
                }
            }
        case .and(let lhs, let rhs):
            let a = try evaluate(lhs, scopes)
            if !a.isNull && !a.isTruthy { return truth(false) }
            let b = try evaluate(rhs, scopes)
            if !b.isNull && !b.isTruthy { return truth(false) }
            return a.isNull || b.isNull ? .null : truth(true)
        case .or(let lhs, let rhs):
            let a = try evaluate(lhs, scopes)
            if a.isTruthy { return truth(true) }
            let b = try evaluate(rhs, scopes)
            if b.isTruthy { return truth(true) }
            return a.isNull || b.isNull ? .null : truth(false)
        case .not(let inner):
            let value = try evaluate(inner, scopes)
            return value.isNull ? .null : truth(!value.isTruthy)
        case .contains(let haystack, let needle, let caseInsensitive):
            guard case .text(var a) = try evaluate(haystack, scopes), case .text(var b) = try evaluate(needle, scopes)
            else {
                return .null
            }
            if caseInsensitive {
                a = Self.asciiLowercase(a)
                b = Self.asciiLowercase(b)
            }
            return truth(b.isEmpty || Self.bytes(a, contain: b))
        case .startsWith(let string, let prefix):
            guard case .text(let a) = try evaluate(string, scopes), case .text(let b) = try evaluate(prefix, scopes)
            else {
                return .null
            }
            return truth(a.utf8.starts(with: b.utf8))
        case .lowercased(let inner):
            guard case .text(let text) = try evaluate(inner, scopes) else { return .null }
            return .text(Self.asciiLowercase(text))
        case .isIn(let value, let list):
            let a = try evaluate(value, scopes)
            if a.isNull { return .null }
            return truth(list.contains { StoredValue.isIdentical(a, $0) })
        case .anyMatch(let scope, let path, let variable, let test):
            for related in try toManyStorages(scopes, scope, path) {
                var inner = scopes
                inner[variable] = related
                if try evaluate(test, inner).isTruthy { return truth(true) }
            }
            return truth(false)
        case .count(let scope, let path):
            return .integer(Int64(try toManyStorages(scopes, scope, path).count))
        }
    }

    private func toManyStorages(_ scopes: [Int: ObjectStorage], _ scope: Int, _ path: [String]) throws
        -> [ObjectStorage]
    {
        guard let storage = scopes[scope], path.count == 1, let property = storage.entity.property(named: path[0]),
            property.kind == .toMany
        else { throw invalidPredicate("\(path.joined(separator: ".")) is not a to-many relationship") }
        return try relatedObjects(of: storage, index: property.index).map(\.skyrosStorage)
    }

    private func invalidPredicate(_ message: String) -> SkyrosError {
        SkyrosError(.unsupportedPredicate, "invalid predicate: \(message)")
    }

    /// SQLite's `lower()`: ASCII only.
    static func asciiLowercase(_ text: String) -> String {
        String(decoding: text.utf8.map { $0 >= 65 && $0 <= 90 ? $0 + 32 : $0 }, as: UTF8.self)
    }

    /// SQLite's `instr() > 0`: byte-wise substring search.
    static func bytes(_ haystack: String, contain needle: String) -> Bool {
        let a = Array(haystack.utf8)
        let b = Array(needle.utf8)
        guard b.count <= a.count else { return false }
        for start in 0...(a.count - b.count) where a[start] == b[0] {
            if a[start..<(start + b.count)].elementsEqual(b) { return true }
        }
        return false
    }

    // MARK: - ObjectStore (this context as the parent of another)

    /// The objects matching `request` as this context sees them, for a child context: the
    /// parent's rows merged with this context's pending changes. Runs on this context's queue.
    public func fetchSnapshots(_ request: StoreRequest) throws -> [Snapshot] {
        try performAndWait { try mergedSnapshots(request) }
    }

    /// The identifiers of the objects matching `request` as this context sees them (pending
    /// changes included), for a child context.
    public func fetchIdentifiers(_ request: StoreRequest) throws -> [ObjectID] {
        try performAndWait { try mergedIdentifiers(request) }
    }

    /// Streams the objects matching `request` to a child context: straight from the parent
    /// when this context has no pending changes of the entity, else merged with them.
    public func forEachSnapshot(
        _ request: StoreRequest, _ body: (ObjectID, StoredValues, Int64) throws -> Void
    ) throws {
        try performAndWait {
            if hasPendingChanges(of: request.entityName) {
                for snapshot in try mergedSnapshots(request) {
                    try body(snapshot.id, snapshot.values, snapshot.version)
                }
            } else {
                try parent.forEachSnapshot(request, body)
            }
        }
    }

    /// The number of objects matching `request` as this context sees them (pending changes
    /// included), for a child context.
    public func count(_ request: StoreRequest) throws -> Int {
        try performAndWait { try countObjects(request) }
    }

    /// The objects with these identifiers as this context holds them (inserted or changed
    /// here), the others from the parent; missing ones are left out. A child's faulting.
    public func snapshots(for ids: [ObjectID]) throws -> [Snapshot] {
        try performAndWait {
            var result: [Snapshot] = []
            var missing: [ObjectID] = []
            var faultsWithChanges: [ObjectStorage] = []  // a child's changes over rows not read yet
            for id in ids {
                if let values = insertedRows[id] {
                    result.append(Snapshot(id: id, values: values))
                    continue
                }
                if let storage = lookup(id)?.skyrosStorage {
                    if storage.isDeleted { continue }
                    if !storage.isFault {
                        result.append(Snapshot(id: id, values: storage.values, version: storage.version))
                        continue
                    }
                    if !storage.changed.isEmpty {
                        faultsWithChanges.append(storage)
                        continue
                    }
                }
                if let row = mergedRows.peek(id) {
                    result.append(Snapshot(id: id, values: row.values, version: row.version))
                    continue
                }
                missing.append(id)
            }
            if !missing.isEmpty { result += try parent.snapshots(for: missing) }
            if !faultsWithChanges.isEmpty {
                try fillFaults(faultsWithChanges)
                for storage in faultsWithChanges where !storage.isFault && !storage.isDeleted {
                    result.append(Snapshot(id: storage.objectID, values: storage.values, version: storage.version))
                }
            }
            return result
        }
    }
}
