import Foundation

extension FetchedResultsController {
    // MARK: - State

    /// An object's place in the order: its sort values, section and identifier.
    struct RowKey: Equatable {
        var values: [StoredValue]
        var section: String
        var uuid: ObjectID

        static func == (a: RowKey, b: RowKey) -> Bool {
            a.uuid == b.uuid && a.section == b.section && a.values.count == b.values.count
                && a.values == b.values
        }
    }

    struct SectionState {
        var name: String
        var objects: [T]
    }

    struct Results {
        var sections: [SectionState] = []
        var sectionIndex: [String: Int] = [:]
        /// Every object's key, by identifier: where to find it, and whether it is in the results.
        var keys: [ObjectID: RowKey] = [:]

        mutating func reindexSections() {
            sectionIndex = [:]
            for (index, section) in sections.enumerated() { sectionIndex[section.name] = index }
        }

        /// Sorts like the store's ORDER BY: the sort values, then the identifier's bytes.
        static func compare(_ a: RowKey, _ b: RowKey, _ sort: [(index: Int, ascending: Bool)]) -> ComparisonResult {
            for (position, key) in sort.enumerated() {
                switch StoredValue.compare(a.values[position], b.values[position]) {
                case .orderedAscending: return key.ascending ? .orderedAscending : .orderedDescending
                case .orderedDescending: return key.ascending ? .orderedDescending : .orderedAscending
                case .orderedSame: continue
                }
            }
            return ObjectID.compareBytes(a.uuid.uuid, b.uuid.uuid)
        }

        /// The first position in a section whose object sorts after `key`.
        func position(in section: Int, of key: RowKey, _ sort: [(index: Int, ascending: Bool)]) -> Int {
            let objects = sections[section].objects
            var low = 0
            var high = objects.count
            while low < high {
                let middle = (low + high) / 2
                let other = keys[objects[middle].objectID]!
                if Self.compare(other, key, sort) == .orderedAscending { low = middle + 1 } else { high = middle }
            }
            return low
        }

        /// Where an object with this key is, if it is there.
        func locate(_ uuid: ObjectID, _ key: RowKey, _ sort: [(index: Int, ascending: Bool)]) -> IndexPath? {
            guard let section = sectionIndex[key.section] else { return nil }
            let item = position(in: section, of: key, sort)
            guard item < sections[section].objects.count, sections[section].objects[item].objectID == uuid else {
                return nil
            }
            return IndexPath(item: item, section: section)
        }

        /// Inserts an object at its place; a new section goes where the sort puts its first object.
        mutating func insert(_ object: T, _ key: RowKey, _ sort: [(index: Int, ascending: Bool)]) {
            keys[key.uuid] = key
            if let section = sectionIndex[key.section] {
                sections[section].objects.insert(object, at: position(in: section, of: key, sort))
                return
            }
            var low = 0
            var high = sections.count
            while low < high {
                let middle = (low + high) / 2
                let first = keys[sections[middle].objects[0].objectID]!
                if Self.compare(first, key, sort) == .orderedAscending { low = middle + 1 } else { high = middle }
            }
            sections.insert(SectionState(name: key.section, objects: [object]), at: low)
            reindexSections()
        }
    }

    /// Holds a delegate weakly, with its type erased.
    final class DelegateHost {
        let didPerformFetch: (FetchedResultsController<T>) -> Void
        let willChange: (FetchedResultsController<T>) -> Void
        let didChange: (FetchedResultsController<T>) -> Void
        let didChangeObject: (FetchedResultsController<T>, FetchedResultsObjectChange<T>) -> Void
        let didChangeSection: (FetchedResultsController<T>, FetchedResultsSectionChange<T>) -> Void

        init<D: FetchedResultsControllerDelegate>(_ delegate: D) where D.Object == T {
            didPerformFetch = { [weak delegate] in delegate?.fetchedResultsControllerDidPerformFetch($0) }
            willChange = { [weak delegate] in delegate?.fetchedResultsControllerWillChangeContent($0) }
            didChange = { [weak delegate] in delegate?.fetchedResultsControllerDidChangeContent($0) }
            didChangeObject = { [weak delegate] in delegate?.fetchedResultsController($0, didChangeObject: $1) }
            didChangeSection = { [weak delegate] in delegate?.fetchedResultsController($0, didChangeSection: $1) }
        }
    }
}
