import Foundation

/// The values of objects another process inserted, merged into a context nobody observes,
/// kept as rows until someone asks for one of them: a process that merges every other
/// process's inserts makes no object for those it never reads.
///
/// Reading one (by identifier or through a relationship) takes its row as the values of a new
/// object, with no request to the parent; a child context reads the row as it is (it stays).
/// A later merge updates a row in place or drops it; an object of the context taking over
/// (fetched, registered, updated or deleted by a child's save) drops it: a row only ever
/// stands for an object the context holds nothing else of, so nothing this context saves
/// has one. Bounded: two generations of at most ``generationSize`` rows each, the older
/// dropped whole when the newer fills (a dropped row is simply read from the parent when
/// asked for). Confined to its context's queue, like the registry.
struct MergedRows {
    struct Row {
        var values: StoredValues
        var version: Int64
    }

    static let generationSize = 2_048
    private var young: [ObjectID: Row] = [:]
    private var old: [ObjectID: Row] = [:]

    var isEmpty: Bool { young.isEmpty && old.isEmpty }
    var count: Int { young.count + old.count }

    /// Keeps the row of an object just inserted elsewhere.
    mutating func insert(_ id: ObjectID, values: StoredValues, version: Int64) {
        if young.count >= Self.generationSize {
            old = young
            young = [:]
            young.reserveCapacity(Self.generationSize)
        }
        young[id] = Row(values: values, version: version)
    }

    /// The row of an object, kept.
    func peek(_ id: ObjectID) -> Row? {
        young[id] ?? old[id]
    }

    /// The row of an object, forgotten (it becomes an object's values).
    mutating func take(_ id: ObjectID) -> Row? {
        guard !isEmpty else { return nil }
        return young.removeValue(forKey: id) ?? old.removeValue(forKey: id)
    }

    /// Takes another process's update of an object kept as a row.
    mutating func update(_ id: ObjectID, with update: StoreChange.Update) {
        guard !isEmpty else { return }
        func apply(_ row: inout Row) {
            for (index, value) in update.values where index < row.values.count { row.values[index] = value }
            row.version = update.version
        }
        if young[id] != nil {
            apply(&young[id]!)
        } else if old[id] != nil {
            apply(&old[id]!)
        }
    }

    /// Forgets a row (its object was deleted, or its values are no longer known).
    mutating func remove(_ id: ObjectID) {
        guard !isEmpty else { return }
        young[id] = nil
        old[id] = nil
    }

    mutating func removeAll() {
        young = [:]
        old = [:]
    }
}
