import Foundation

/// Ordered to-many relationships (`@Relationship(.ordered) var steps: [Step]`): the objects
/// are the destination's objects whose to-one points to the owner, as for any to-many; their
/// order is in the rows of the relationship's order entity (``Schema/makeOrderEntity``), one
/// per object, keyed by the pair (owner, object) and holding a gap-numbered position. Setting
/// the list writes the positions of the objects that moved, and only those: the others keep
/// theirs (the longest run of objects whose positions are already in the new order), and the
/// moved ones take positions in the gaps around them. When a gap is used up, the list is
/// spaced out again (every position written once). Objects without a position (placed by a
/// peer that does not know the order, or there before the relationship was ordered) come
/// last, by creation; equal positions (two processes placing at once) by identifier.
extension ObjectContext {
    /// The distance between two positions the context spaces out: room for about 20 objects
    /// inserted one after another between two neighbours before a spacing out.
    static let positionGap: Int64 = 1 << 20

    /// The position rows of an owner's list as this context sees them, by the object placed.
    func positions(of owner: ObjectStorage, _ route: Schema.LinkRoute) throws -> [UUID: any ManagedObject] {
        byObject(try linkObjects(of: owner, route), route)
    }

    /// Rows of an owner's list (links or positions) by the object at their other end.
    func byObject(_ rows: [any ManagedObject], _ route: Schema.LinkRoute) -> [UUID: any ManagedObject] {
        var result: [UUID: any ManagedObject] = [:]
        for row in rows {
            let storage = row.skyrosStorage
            if storage.isFault { fulfill(storage) }
            if let target = UUID(storedValue: storage.values[route.other]) { result[target] = row }
        }
        return result
    }

    /// A position row's position.
    static func position(of row: any ManagedObject) -> Int64 {
        if case .integer(let value) = row.skyrosStorage.values[2] { return value }
        return 0
    }

    /// The objects of an ordered to-many in its order: by position, those without one last;
    /// ties by identifier (creation order).
    func inOrder(_ members: [any ManagedObject], _ rows: [UUID: any ManagedObject]) -> [any ManagedObject] {
        let keyed = members.map { member in (member, rows[member.objectID.uuid].map(Self.position)) }
        return keyed.sorted { a, b in
            switch (a.1, b.1) {
            case (let x?, let y?) where x != y: return x < y
            case (.some, nil): return true
            case (nil, .some): return false
            default: return a.0.objectID.uuid < b.0.objectID.uuid
            }
        }.map(\.0)
    }

    /// Sets an ordered to-many: objects no longer in the list leave it (their to-one is
    /// cleared, their position deleted), new ones join it, and positions are written for the
    /// objects that are not already in order.
    func setOrdered(
        _ storage: ObjectStorage, _ property: PropertyDescription, _ inverse: PropertyDescription,
        _ route: Schema.LinkRoute, to targets: [ObjectStorage]
    ) throws {
        var list: [ObjectStorage] = []
        var listed = Set<ObjectID>()
        for target in targets where listed.insert(target.objectID).inserted { list.append(target) }
        let current = try relatedObjects(of: storage, index: property.index)
        let currentIDs = Set(current.map(\.objectID))
        for object in current where !listed.contains(object.objectID) {
            setToOne(object.skyrosStorage, index: inverse.index, to: nil)
        }
        appendsToOrder = false
        defer { appendsToOrder = true }
        for target in list where !currentIDs.contains(target.objectID) {
            setToOne(target, index: inverse.index, to: storage)
        }
        appendsToOrder = true
        guard !list.isEmpty else { return }
        place(list, in: storage, route, rows: try positions(of: storage, route), unplaced: []) { index, position in
            setPosition(route, owner: storage.objectID, of: list[index], to: position)
        }
    }

    /// Places the objects of an ordered many-to-many in the order of `list` (each linked):
    /// the positions of the links off the longest run already in order are written, and those
    /// of `unplaced` links (just added, or whose removal was withdrawn here) in any case.
    func placeLinks(
        _ storage: ObjectStorage, _ route: Schema.LinkRoute, _ list: [ObjectStorage], unplaced: Set<ObjectID>
    ) throws {
        guard !list.isEmpty else { return }
        let rows = try positions(of: storage, route)
        place(list, in: storage, route, rows: rows, unplaced: unplaced) { index, position in
            rows[list[index].objectID.uuid]?.skyrosStorage.setStored(.integer(position), at: 2)
        }
    }

    /// The placing both kinds of ordered lists share: the positions `list`'s objects have in
    /// the owner's `rows` (none for `unplaced` rows), the new ones of those off the longest run
    /// already in order, each handed to `write` (its index in `list`, its position); the
    /// owner's last position is noted.
    private func place(
        _ list: [ObjectStorage], in owner: ObjectStorage, _ route: Schema.LinkRoute, rows: [UUID: any ManagedObject],
        unplaced: Set<ObjectID>, write: (Int, Int64) -> Void
    ) {
        let old: [Int64?] = list.map { target in
            rows[target.objectID.uuid].flatMap { unplaced.contains($0.objectID) ? nil : Self.position(of: $0) }
        }
        let new = Self.placing(old, kept: Self.keptInOrder(old, list.map(\.objectID.uuid)))
        for index in list.indices where new[index] != old[index] { write(index, new[index]!) }
        let tail = Self.tailKey(route, owner: owner.objectID.uuid)
        orderTails[tail] = max(orderTails[tail] ?? .min, new.last!!)
    }

    /// The key of an owner's list in ``orderTails``: the order (or link) entity's name and the
    /// owner's identifier (an owner may have several ordered relationships).
    static func tailKey(_ route: Schema.LinkRoute, owner: UUID) -> ObjectID {
        ObjectID(entityName: route.entity.name, uuid: owner)
    }

    /// The indexes of a longest run of objects whose positions are already in the list's
    /// order (position, then identifier): they keep them.
    static func keptInOrder(_ positions: [Int64?], _ ids: [UUID]) -> Set<Int> {
        let candidates = positions.indices.filter { positions[$0] != nil }
        let run = PredicateReads.longestIncreasingRun(candidates.count) { x, y in
            let (a, b) = (candidates[x], candidates[y])
            return positions[a]! != positions[b]! ? positions[a]! < positions[b]! : ids[a] < ids[b]
        }
        return Set(run.map { candidates[$0] })
    }

    /// The positions of a list whose `kept` objects keep theirs: the others are spaced evenly
    /// in the gaps between their kept neighbours (a gap's width before the first and after the
    /// last); when a gap is too narrow, every object gets a new position.
    static func placing(_ old: [Int64?], kept: Set<Int>) -> [Int64?] {
        var new = old
        var index = 0
        var low: Int64? = nil
        while index < old.count {
            if kept.contains(index) {
                low = old[index]
                index += 1
                continue
            }
            var end = index
            while end < old.count && !kept.contains(end) { end += 1 }
            let count = Int64(end - index)
            let high = end < old.count ? old[end] : nil
            var first: Int64
            var step = positionGap
            switch (low, high) {
            case (nil, nil): first = positionGap
            case (let low?, nil):
                guard low < Int64.max - (count + 1) * positionGap else { return spacedOut(old.count) }
                first = low + positionGap
            case (nil, let high?):
                guard high > Int64.min + (count + 1) * positionGap else { return spacedOut(old.count) }
                first = high - count * positionGap
            case (let low?, let high?):
                let (width, overflow) = high.subtractingReportingOverflow(low)
                guard !overflow, width / (count + 1) >= 1 else { return spacedOut(old.count) }
                step = width / (count + 1)
                first = low + step
            }
            for offset in 0..<Int(count) { new[index + offset] = first + Int64(offset) * step }
            low = new[end - 1]
            index = end
        }
        return new
    }

    /// Positions one gap apart, for a list spaced out again.
    static func spacedOut(_ count: Int) -> [Int64?] {
        (0..<count).map { Int64($0 + 1) * positionGap }
    }

    /// The position after the last of an owner's list (one gap on), for an object joining it
    /// through its to-one. The last position is read once per owner and save, then followed.
    func appendPosition(_ route: Schema.LinkRoute, owner: ObjectStorage) -> Int64 {
        let tail = Self.tailKey(route, owner: owner.objectID.uuid)
        let last: Int64
        if let known = orderTails[tail] {
            last = known
        } else {
            let rows = (try? positions(of: owner, route)) ?? [:]
            last = rows.values.map(Self.position).max() ?? 0
        }
        let next = last < Int64.max - Self.positionGap ? last + Self.positionGap : last
        orderTails[tail] = next
        return next
    }

    /// Writes an object's position in an owner's list: its row is updated, restored (when
    /// removed here before this save) or inserted.
    func setPosition(_ route: Schema.LinkRoute, owner: ObjectID, of object: ObjectStorage, to position: Int64) {
        let id = Schema.linkID(route.entity, source: owner.uuid, target: object.objectID.uuid)
        var restored = false
        if let removed = deleted[id] {
            // Removed here before this save: the removal is withdrawn, and the position written
            // (the row in memory may hold a position it was given here and never saved).
            restoreDeleted(removed, changed: [])
            restored = true
        }
        if let row = lookup(id), !row.skyrosStorage.isDeleted, row.skyrosStorage.context === self {
            let storage = row.skyrosStorage
            if storage.isFault { fulfill(storage) }
            if !storage.isDeleted {
                if restored || !StoredValue.isIdentical(storage.values[2], .integer(position)) {
                    storage.setStored(.integer(position), at: 2)
                }
                return
            }
        }
        if let old = registry[id]?.object, old.skyrosStorage.isDeleted || old.skyrosStorage.context == nil {
            registry[id] = nil  // a position removed and saved earlier: a new object for it
        }
        var values = StoredValues(repeating: .null, count: 3)
        values[0] = owner.uuid.storedValue
        values[1] = object.objectID.uuid.storedValue
        values[2] = .integer(position)
        markInserted(makeObject(id, of: route.entity, values: values, exposed: true))
    }

    /// Deletes an object's position in an owner's list (it left the list). A row this context
    /// has not read is read first: it may not exist (the object was placed by a peer that does
    /// not know the order), and then there is nothing to delete. A read that fails is reported
    /// (``ObjectContext/errorHandler``) and the row left.
    func removePosition(_ route: Schema.LinkRoute, owner: UUID, of object: ObjectStorage) {
        let id = Schema.linkID(route.entity, source: owner, target: object.objectID.uuid)
        guard deleted[id] == nil, let row = lookup(id) ?? registeredOrFault(id) else { return }
        let storage = row.skyrosStorage
        if storage.isFault {
            let snapshot: Snapshot?
            do {
                snapshot = try parent.snapshots(for: [id]).first
            } catch {
                // The parent cannot answer (a daemon away): the row stays; reported, not thrown
                // (a to-one's setter cannot throw).
                report(
                    SkyrosError(
                        SkyrosError.wrap(error).code,
                        "could not read the position of \(object.objectID) in \(route.entity.name): \(SkyrosError.wrap(error).message)",
                        underlying: error))
                snapshot = nil
            }
            guard let snapshot else {
                registry[id] = nil
                return
            }
            storage.fill(snapshot.values, version: snapshot.version)
        }
        if !storage.isDeleted { delete(row) }
    }
}
