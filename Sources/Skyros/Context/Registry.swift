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
    /// Entries added by ``addNew(_:)``, none of them in `index` nor twice.
    private var unindexed: [ObjectContext.Entry] = []
    /// Counts the times `unindexed` was moved into `index` (see ``Mark``).
    private var generation = 0

    var count: Int { index.count + unindexed.count }
    var isEmpty: Bool { index.isEmpty && unindexed.isEmpty }

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
    var values: [ObjectContext.Entry] { Array(index.values) + unindexed }

    /// Makes room for `capacity` objects, growing geometrically: fetches adding a few
    /// objects each must not copy the whole index every time.
    mutating func reserveCapacity(_ capacity: Int) {
        if index.capacity < capacity { index.reserveCapacity(Swift.max(capacity, index.capacity * 2)) }
    }

    /// Registers an object that is not registered yet (a new object of a fetch, which gives
    /// each object once), without indexing it yet.
    mutating func addNew(_ entry: ObjectContext.Entry) {
        unindexed.append(entry)
    }

    /// Removes and returns the entries of objects that only the registry holds and that have
    /// no changes.
    mutating func removeUnused() -> [ObjectContext.Entry] {
        // The unindexed entries in place, without hashing them.
        let kept = Self.keepUsed(&unindexed, from: 0)
        var removed = Array(unindexed[kept...])
        unindexed.removeSubrange(kept...)
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
        return removed
    }

    private mutating func indexAll() {
        guard !unindexed.isEmpty else { return }
        reserveCapacity(count)
        for entry in unindexed { index[entry.object.objectID] = entry }
        unindexed = []
        generation += 1
    }

    /// Where the next entries of ``addNew(_:)`` go: a batch of a cursor notes it before it
    /// adds its objects, and releases them from there (``releaseUnused(since:ids:)``).
    struct Mark {
        fileprivate let generation: Int
        fileprivate let position: Int
    }

    var mark: Mark { Mark(generation: generation, position: unindexed.count) }

    /// Removes the entries added since `mark` (the objects of `ids` when they have been
    /// indexed since) that only the registry holds and that have no changes: the objects of
    /// a batch left behind by an iteration. Without a hash-table operation when nothing
    /// looked an object up by identifier meanwhile.
    mutating func releaseUnused(since mark: Mark, ids: [ObjectID]) {
        if isCurrent(mark) {
            unindexed.removeSubrange(Self.keepUsed(&unindexed, from: mark.position)...)
            return
        }
        releaseUnused(ids)
    }

    /// Whether the entries added since `mark` are still where it says (nothing was indexed
    /// since): then ``releaseUnused(since:ids:)`` needs no identifiers.
    func isCurrent(_ mark: Mark) -> Bool {
        mark.generation == generation && mark.position <= unindexed.count
    }

    /// Moves the entries of `entries[start...]` that something besides the registry holds, or
    /// that have changes, to the front of that range, in place; returns where the others (the
    /// unused ones) begin. Through the buffer: `isKnownUniquelyReferenced(&entries[i].owner)`
    /// checks a copy of the entry (always false); the buffer's element is checked in place.
    private static func keepUsed(_ entries: inout [ObjectContext.Entry], from start: Int) -> Int {
        entries.withUnsafeMutableBufferPointer { buffer in
            var kept = start
            for position in start..<buffer.count {
                if isKnownUniquelyReferenced(&buffer[position].owner), !buffer[position].object.skyrosStorage.hasChanges {
                    continue
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
