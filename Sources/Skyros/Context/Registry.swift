import Foundation

/// The objects registered in a context, by identifier (one instance per object per context).
///
/// A fetch registers every object it makes; a read that only fetches and reads attributes
/// never looks one up by identifier. So the objects a fetch makes are added as a list, and
/// indexed by identifier on the first lookup (a later fetch, `object(with:)`, a relationship,
/// a merge), then kept up to date: fetching 100,000 objects costs no hash-table insertions
/// unless something asks for one of them by identifier.
struct Registry {
    private var index: [ObjectID: ObjectContext.Entry] = [:]
    /// Entries added by ``addNew(_:)``, none of them in `index` nor twice: the first `live`
    /// ones. Past them, spares: objects of a batched fetch's released batch that nothing
    /// references (``ObjectReuse``), not registered, kept for ``reuseSpare(for:values:version:)``.
    private var unindexed: [ObjectContext.Entry] = []
    private var live = 0
    /// The class of the spares (its metadata): every spare is an instance of it, kept by a
    /// batched fetch of that class's entity; nil when there are none.
    private var spareClass: UnsafeRawPointer?
    /// Counts the times `unindexed` was moved into `index` (see ``Mark``).
    private var generation = 0

    var count: Int { index.count + live }
    var isEmpty: Bool { index.isEmpty && live == 0 }

    subscript(id: ObjectID) -> ObjectContext.Entry? {
        mutating get {
            indexAll()
            return index[id]
        }
        set {
            indexAll()
            index[id] = newValue
        }
    }

    @discardableResult
    mutating func removeValue(forKey id: ObjectID) -> ObjectContext.Entry? {
        indexAll()
        return index.removeValue(forKey: id)
    }

    /// The identifiers registered.
    var keys: [ObjectID] {
        mutating get {
            indexAll()
            return Array(index.keys)
        }
    }

    /// The entries, in no particular order.
    var values: [ObjectContext.Entry] { Array(index.values) + unindexed[..<live] }

    /// Makes room for `capacity` objects, growing geometrically: fetches adding a few
    /// objects each must not copy the whole index every time.
    mutating func reserveCapacity(_ capacity: Int) {
        if index.capacity < capacity { index.reserveCapacity(Swift.max(capacity, index.capacity * 2)) }
    }

    /// Registers an object that is not registered yet (a new object of a fetch, which gives
    /// each object once), without indexing it yet.
    @inline(__always)
    mutating func addNew(_ entry: __owned ObjectContext.Entry) {
        if live < unindexed.count {
            unindexed[live] = entry  // in place of a spare, which goes
        } else {
            unindexed.append(entry)
        }
        live += 1
    }

    /// The spares waiting (for tests).
    var spareCount: Int { unindexed.count - live }

    /// Whether a spare instance of the class whose metadata this is waits (see `unindexed`).
    func hasSpare(of objectClass: UnsafeRawPointer) -> Bool { live < unindexed.count && spareClass == objectClass }

    /// Forgets the spares (a batched fetch that kept them ended): nothing holds their objects.
    mutating func dropSpares() {
        if live < unindexed.count { unindexed.removeSubrange(live...) }
        spareClass = nil
    }

    /// Registers a spare object (see `unindexed`; there must be one of the row's class,
    /// ``hasSpare(of:)``) as the object of another row, made that row's in place
    /// (``ObjectReuse/reuse(_:for:values:version:)``).
    mutating func reuseSpare(for id: consuming ObjectID, values: consuming StoredValues, version: Int64) -> AnyObject {
        let object = unindexed[live].owner
        ObjectReuse.reuse(object, for: id, values: values, version: version)
        live += 1
        return object
    }

    /// Removes and returns the entries of objects that only the registry holds and that have
    /// no changes.
    mutating func removeUnused() -> [ObjectContext.Entry] {
        // The unindexed entries in place, without hashing them.
        dropSpares()  // they are not registered
        let kept = Self.keepUsed(&unindexed, from: 0)
        var removed = Array(unindexed[kept...])
        unindexed.removeSubrange(kept...)
        live = kept
        var unused: [ObjectID] = []
        var position = index.values.startIndex
        while position != index.values.endIndex {
            if isKnownUniquelyReferenced(&index.values[position].owner),
                !index.values[position].object.skyrosStorage.hasChanges
            {
                unused.append(index.keys[position])
            }
            index.values.formIndex(after: &position)
        }
        removed += unused.compactMap { index.removeValue(forKey: $0) }
        // Entries moved: the marks of batches being iterated are no longer valid positions
        // (their batch is released by its identifiers instead).
        generation += 1
        return removed
    }

    private mutating func indexAll() {
        guard live > 0 else {
            dropSpares()
            return
        }
        reserveCapacity(count)
        for entry in unindexed[..<live] { index[entry.object.objectID] = entry }
        unindexed = []  // spares too
        spareClass = nil
        live = 0
        generation += 1
    }

    /// Forgets every entry (a reset of the context); marks taken before are no longer current.
    mutating func removeAll() {
        index = [:]
        unindexed = []
        spareClass = nil
        live = 0
        generation += 1
    }

    /// Where the next entries of ``addNew(_:)`` go: a batch of a cursor notes it before it
    /// adds its objects, and releases them from there (``releaseUnused(since:ids:)``).
    struct Mark {
        fileprivate let generation: Int
        fileprivate let position: Int
    }

    var mark: Mark { Mark(generation: generation, position: live) }

    /// Removes the entries added since `mark` (the objects of `ids` when they have been
    /// indexed since) that only the registry holds and that have no changes: the objects of
    /// a batch left behind by an iteration. Without a hash-table operation when nothing
    /// looked an object up by identifier meanwhile.
    ///
    /// With `spareClass` (the metadata of a class ``ObjectReuse/holdsOnlyStorage(_:)``
    /// accepted), those that are instances of that very class and that nothing references at
    /// all (no other strong reference, nor any weak or unowned one: ``ObjectReuse``) stay as
    /// spares, for ``reuseSpare(for:values:version:)``; the other spares go.
    mutating func releaseUnused(since mark: Mark, ids: [ObjectID], spareClass: UnsafeRawPointer? = nil) {
        guard isCurrent(mark) else {
            releaseUnused(ids)
            return
        }
        // [0, unused): registered; [unused, live): released; [live, count): spares still.
        let unused = Self.keepUsed(&unindexed, from: mark.position, to: live, storageFirstIn: spareClass)
        var end = unused
        if let spareClass, self.spareClass == nil || self.spareClass == spareClass {
            let owner = MemoryLayout<ObjectContext.Entry>.offset(of: \.owner)!
            unindexed.withUnsafeMutableBufferPointer { buffer in
                let base = UnsafeRawPointer(buffer.baseAddress!)
                for position in unused..<buffer.count {
                    let field = base + position * MemoryLayout<ObjectContext.Entry>.stride + owner
                    // Its class first (the object's first word), then its references.
                    guard ObjectReuse.objectClass(ofInstance: field.load(as: UnsafeRawPointer.self)) == spareClass,
                        ObjectReuse.isUnreferenced(referenceAt: field)
                    else { continue }
                    if end != position { buffer.swapAt(end, position) }
                    end += 1
                }
            }
        }
        unindexed.removeSubrange(end...)
        live = unused
        self.spareClass = end > unused ? spareClass : nil
    }

    /// Whether the entries added since `mark` are still where it says (nothing was indexed
    /// since): then ``releaseUnused(since:ids:)`` needs no identifiers.
    func isCurrent(_ mark: Mark) -> Bool {
        mark.generation == generation && mark.position <= live
    }

    /// Moves the entries of `entries[start..<end]` that something besides the registry holds,
    /// or that have changes, to the front of that range, in place; returns where the others
    /// (the unused ones) begin. Through the buffer: `isKnownUniquelyReferenced(&entries[i].owner)`
    /// checks a copy of the entry (always false); the buffer's element is checked in place.
    ///
    /// Instances of `storageFirstIn` (a class ``ObjectReuse/holdsOnlyStorage(_:)`` accepted)
    /// have their storage read where it is, with no call through the protocol.
    private static func keepUsed(
        _ entries: inout [ObjectContext.Entry], from start: Int, to end: Int? = nil,
        storageFirstIn objectClass: UnsafeRawPointer? = nil
    ) -> Int {
        entries.withUnsafeMutableBufferPointer { buffer in
            var kept = start
            for position in start..<(end ?? buffer.count) {
                if isKnownUniquelyReferenced(&buffer[position].owner) {
                    let object = UnsafeRawPointer(Unmanaged.passUnretained(buffer[position].owner).toOpaque())
                    let hasChanges =
                        objectClass != nil && ObjectReuse.objectClass(ofInstance: object) == objectClass
                        ? ObjectReuse.withStorage(ofInstance: object) { $0.hasChanges }
                        : buffer[position].object.skyrosStorage.hasChanges
                    if !hasChanges { continue }
                }
                if kept != position { buffer.swapAt(kept, position) }
                kept += 1
            }
            return kept
        }
    }

    /// Removes the entries of `ids` that only the registry holds and that have no changes.
    mutating func releaseUnused(_ ids: [ObjectID]) {
        indexAll()
        for id in ids {
            guard let position = index.index(forKey: id) else { continue }
            if isKnownUniquelyReferenced(&index.values[position].owner),
                !index.values[position].object.skyrosStorage.hasChanges
            {
                index.remove(at: position)
            }
        }
    }
}
