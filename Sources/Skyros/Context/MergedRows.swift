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
///
/// A row may be kept as its change event carried it (``EncodedRows``), decoded only when it
/// is read or updated: most are never read.
struct MergedRows {
    struct Row {
        var values: StoredValues
        var version: Int64
    }

    /// A row as kept: decoded, or still encoded (row `index` of its message).
    private enum Kept {
        case decoded(Row)
        case encoded(EncodedRows.Source, index: Int)

        /// The row, decoded; nil when its values are malformed.
        var row: Row? {
            switch self {
            case .decoded(let row): return row
            case .encoded(let source, let index):
                guard let values = source.values(at: index) else { return nil }
                return Row(values: values, version: source.version(at: index))
            }
        }
    }

    /// 256: the rows of the last few hundred objects other processes inserted, the ones a
    /// process is told about and reads next. Every other process's insert passes through here,
    /// on the event thread: a larger table (it was 2,048, 4,096 rows) costs each merge more
    /// cache misses, about 2.5% of a shared-stack client's processor time per save with 8
    /// clients, for rows seldom read (one that is gone is read from the parent).
    static let generationSize = 256
    private var young: [ObjectID: Kept] = [:]
    private var old: [ObjectID: Kept] = [:]

    var isEmpty: Bool { young.isEmpty && old.isEmpty }
    var count: Int { young.count + old.count }

    /// Keeps the row of an object just inserted elsewhere.
    mutating func insert(_ id: ObjectID, values: StoredValues, version: Int64) {
        keep(.decoded(Row(values: values, version: version)), for: id)
    }

    /// Keeps the row of an object just inserted elsewhere as its change event carried it:
    /// row `index` of `source`.
    mutating func insert(_ id: ObjectID, encodedIn source: EncodedRows.Source, at index: Int) {
        keep(.encoded(source, index: index), for: id)
    }

    private mutating func keep(_ kept: Kept, for id: ObjectID) {
        if young.count >= Self.generationSize {
            old = young
            young = [:]
            young.reserveCapacity(Self.generationSize)
        }
        young[id] = kept
    }

    /// Whether the row of an object is kept as its change event carried it (for tests).
    func isKeptEncoded(_ id: ObjectID) -> Bool {
        guard case .encoded? = young[id] ?? old[id] else { return false }
        return true
    }

    /// Whether a row of the object is kept.
    func contains(_ id: ObjectID) -> Bool {
        !isEmpty && (young[id] != nil || old[id] != nil)
    }

    /// The row of an object, kept.
    func peek(_ id: ObjectID) -> Row? {
        (young[id] ?? old[id])?.row
    }

    /// The row of an object, forgotten (it becomes an object's values).
    mutating func take(_ id: ObjectID) -> Row? {
        guard !isEmpty else { return nil }
        return (young.removeValue(forKey: id) ?? old.removeValue(forKey: id))?.row
    }

    /// Takes another process's update of an object kept as a row (decoded first; a row
    /// whose values do not decode is dropped); an update no newer than the row's version is
    /// not taken (see ``ObjectContext/takeValues(_:of:)``).
    mutating func update(_ id: ObjectID, with update: StoreChange.Update) {
        guard !isEmpty else { return }
        func apply(_ kept: inout Kept?) {
            guard var row = kept?.row else {
                kept = nil
                return
            }
            if update.version > 0 && row.version >= update.version { return }
            for (index, value) in update.values where index < row.values.count { row.values[index] = value }
            row.version = update.version
            kept = .decoded(row)
        }
        if young[id] != nil {
            apply(&young[id])
        } else if old[id] != nil {
            apply(&old[id])
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
