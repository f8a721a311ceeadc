import Foundation

/// A context's pending inserts by identifier, in the order they came: the objects inserted in
/// it, and the rows a child's save inserted that it has not turned into objects (most only
/// pass through toward the store on the next save).
///
/// Neither inserting nor passing through needs a lookup — entries are appended as they come
/// and handed on in that order — so the identifier index is only built on the first lookup by
/// identifier (a fetch merging pending changes, an object asked for, an update or a delete of
/// a pending entry), then kept up to date. Inserting 100,000 objects and saving them through
/// three contexts then costs appends, not operations on growing 100,000-entry hash tables.
struct PendingList<Value> {
    /// The identifiers of the entries, in order; past ``used``, left from entries removed
    /// (their storage reused by the next entries).
    private var ids: [ObjectID] = []
    /// The value of `ids[i]`; nil once the entry was removed (and past ``used``).
    private var entries: [Value?] = []
    /// The entries of `ids` and `entries` in use.
    private var used = 0
    /// Positions by identifier, once a lookup needed them.
    private var positions: [ObjectID: Int]?
    /// Entries present.
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }

    /// The identifiers present, in order.
    var keys: [ObjectID] { (0..<used).compactMap { entries[$0] == nil ? nil : ids[$0] } }

    /// The values present, in order.
    var values: [Value] { entries[..<used].compactMap { $0 } }

    /// Calls `body` with each entry present, in order.
    func forEach(_ body: (ObjectID, Value) throws -> Void) rethrows {
        for position in 0..<used {
            if let value = entries[position] { try body(ids[position], value) }
        }
    }

    /// Removes every entry, and the storage of those removed before.
    ///
    /// A small list keeps its storage for the next entries (a context that saves one object
    /// at a time would otherwise allocate two arrays for each, and emptying an array in place
    /// costs more than letting go of its values): the values go, the slots stay. A large one
    /// lets its storage go.
    mutating func removeAll() {
        guard used > 0 || positions != nil else { return }
        if ids.count <= Self.keptCapacity && positions == nil {
            for position in 0..<used { entries[position] = nil }
            used = 0
            count = 0
        } else {
            self = PendingList()
        }
    }

    /// The most entries whose storage ``removeAll()`` keeps.
    static var keptCapacity: Int { 64 }

    /// A mark of the entries appended so far: the entries appended after it are
    /// ``values(since:upTo:)``.
    var mark: Int { used }

    /// The values present among the entries appended between two marks, in order.
    func values(since start: Int, upTo end: Int) -> [Value] {
        (Swift.max(0, start)..<Swift.min(end, used)).compactMap { entries[$0] }
    }

    /// Makes room for `capacity` entries, growing geometrically: many small saves into a
    /// context must not copy its pending list each time.
    mutating func reserveCapacity(_ capacity: Int) {
        guard ids.capacity < capacity else { return }
        let grown = Swift.max(capacity, ids.capacity * 2)
        ids.reserveCapacity(grown)
        entries.reserveCapacity(grown)
    }

    /// Appends an entry known not to be here (a new object; the rows of one change set into
    /// an empty list): no lookup.
    mutating func appendNew(_ id: ObjectID, _ value: Value) {
        positions?[id] = used
        if used < ids.count {
            ids[used] = id
            entries[used] = value
        } else {
            ids.append(id)
            entries.append(value)
        }
        used += 1
        count += 1
    }

    /// The value of an entry, if present.
    subscript(id: ObjectID) -> Value? {
        mutating get {
            guard count > 0, let position = position(of: id) else { return nil }
            return entries[position]
        }
    }

    /// Sets the value of an entry, appending it when new; returns the previous value.
    @discardableResult
    mutating func updateValue(_ value: Value, forKey id: ObjectID) -> Value? {
        if count > 0, let position = position(of: id) {
            defer { entries[position] = value }
            return entries[position]
        }
        appendNew(id, value)
        return nil
    }

    /// Removes an entry; returns its value when it was present.
    @discardableResult
    mutating func removeValue(forKey id: ObjectID) -> Value? {
        guard count > 0, let position = position(of: id) else { return nil }
        let value = entries[position]
        entries[position] = nil
        positions?[id] = nil
        count -= 1
        return value
    }

    /// The position of a present entry, building the index on first use.
    private mutating func position(of id: ObjectID) -> Int? {
        if positions == nil {
            var index: [ObjectID: Int] = [:]
            index.reserveCapacity(count)
            for position in 0..<used where entries[position] != nil { index[ids[position]] = position }
            positions = index
        }
        guard let position = positions?[id], entries[position] != nil else { return nil }
        return position
    }
}
