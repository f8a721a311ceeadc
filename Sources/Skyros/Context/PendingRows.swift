import Foundation

/// Rows inserted by a child context's save, in the order they came, that this context has not
/// turned into objects: most only pass through toward the store on the next save.
///
/// Passing through needs no lookup — rows are appended as they come and handed on in that
/// order — so the identifier index is only built on the first lookup by identifier (a fetch
/// merging pending changes, an object asked for, an update or delete of one of the rows). A
/// save of 100,000 new objects then costs two appends per context it crosses instead of two
/// operations on a 100,000-entry hash table.
struct PendingRows {
    private var ids: [ObjectID] = []
    /// The values of `ids[i]`; nil once the row was removed (turned into an object, deleted).
    private var rows: [ContiguousArray<StoredValue>?] = []
    /// Positions by identifier, once a lookup needed them.
    private var positions: [ObjectID: Int]?
    /// Rows present.
    private(set) var count = 0

    var isEmpty: Bool { count == 0 }

    /// The identifiers of the rows present, in order.
    var keys: [ObjectID] { ids.indices.compactMap { rows[$0] == nil ? nil : ids[$0] } }

    /// Calls `body` with each row present, in order.
    func forEach(_ body: (ObjectID, ContiguousArray<StoredValue>) throws -> Void) rethrows {
        for position in ids.indices {
            if let values = rows[position] { try body(ids[position], values) }
        }
    }

    mutating func reserveCapacity(_ capacity: Int) {
        ids.reserveCapacity(capacity)
        rows.reserveCapacity(capacity)
    }

    /// Appends rows known not to be here: the rows of one change set, into an empty set.
    mutating func appendNew(_ id: ObjectID, _ values: ContiguousArray<StoredValue>) {
        positions?[id] = ids.count
        ids.append(id)
        rows.append(values)
        count += 1
    }

    /// The values of a row, if present.
    subscript(id: ObjectID) -> ContiguousArray<StoredValue>? {
        mutating get {
            guard count > 0, let position = position(of: id) else { return nil }
            return rows[position]
        }
    }

    /// Sets the values of a row, appending it when new; returns the previous values.
    @discardableResult
    mutating func updateValue(_ values: ContiguousArray<StoredValue>, forKey id: ObjectID) -> ContiguousArray<StoredValue>? {
        if count > 0, let position = position(of: id) {
            defer { rows[position] = values }
            return rows[position]
        }
        appendNew(id, values)
        return nil
    }

    /// Removes a row; returns its values when it was present.
    @discardableResult
    mutating func removeValue(forKey id: ObjectID) -> ContiguousArray<StoredValue>? {
        guard count > 0, let position = position(of: id) else { return nil }
        let values = rows[position]
        rows[position] = nil
        positions?[id] = nil
        count -= 1
        return values
    }

    /// The position of a present row, building the index on first use.
    private mutating func position(of id: ObjectID) -> Int? {
        if positions == nil {
            var index: [ObjectID: Int] = [:]
            index.reserveCapacity(count)
            for position in ids.indices where rows[position] != nil { index[ids[position]] = position }
            positions = index
        }
        guard let position = positions?[id], rows[position] != nil else { return nil }
        return position
    }
}
