import Foundation

/// Many-to-many relationships: each link between two objects is an object of the
/// relationship's link entity (see ``Schema/linkEntityName(ownerEntity:property:)``), whose
/// identifier is derived from the pair. Both sides read the same links, so they are in step at
/// once; adding or removing a link is inserting or deleting its object, which every context,
/// the store, the daemon and sync already know how to carry.
extension ObjectContext {
    /// The link objects of one side of a many-to-many relationship, as this context sees them:
    /// the parent's, less those deleted here, and those inserted here. The links pending here
    /// are found through ``pendingLinkIndex`` (linking each of 100,000 objects in one write
    /// must not go through every link made before it).
    func linkObjects(of storage: ObjectStorage, _ route: Schema.LinkRoute) throws -> [any ManagedObject] {
        let own = storage.objectID.uuid
        var result: [any ManagedObject] = []
        var pendingIDs = Set<ObjectID>()
        if (pendingCountByEntity[ObjectIdentifier(route.entity)] ?? 0) > 0 {
            if pendingLinkIndex == nil { buildPendingLinkIndex() }
            for id in Set(pendingLinkIndex?[route.entity.name]?[own] ?? []) {
                if let link = inserted[id] ?? promoteRow(id) {
                    pendingIDs.insert(id)
                    if UUID(storedValue: link.skyrosStorage.values[route.own]) == own { result.append(link) }
                } else if deleted[id] != nil {
                    pendingIDs.insert(id)
                }
            }
        }
        guard !storage.isInserted else { return result }
        let request = StoreRequest(
            entityName: route.entity.name, predicate: .equals(route.entity.properties[route.own].name, own.storedValue))
        try streamObjects(request) { link in
            if pendingIDs.isEmpty || !pendingIDs.contains(link.objectID) { result.append(link) }
        }
        return result
    }

    /// Indexes the links pending here (inserted objects and rows, deleted objects) by both of
    /// their objects; kept up to date from then on until the pending changes are cleared.
    func buildPendingLinkIndex() {
        pendingLinkIndex = [:]
        inserted.forEach { id, object in
            if schema.isLinkEntity(id.entityName) { indexPendingLink(id, object.skyrosStorage.values) }
        }
        insertedRows.forEach { id, values in if schema.isLinkEntity(id.entityName) { indexPendingLink(id, values) } }
        for (id, object) in deleted where schema.isLinkEntity(id.entityName) {
            let storage = object.skyrosStorage
            if storage.isFault { fulfill(storage) }
            indexPendingLink(id, storage.values)
        }
    }

    /// Adds a link just inserted or deleted here to ``pendingLinkIndex``, when it is built.
    func indexPendingLink(_ id: ObjectID, _ values: StoredValues) {
        guard pendingLinkIndex != nil else { return }
        for position in 0..<min(2, values.count) {
            if let uuid = UUID(storedValue: values[position]) {
                pendingLinkIndex![id.entityName, default: [:]][uuid, default: []].append(id)
            }
        }
    }

    /// The objects at the other end of a many-to-many relationship, by creation order (their
    /// identifiers' order), loaded in one request for those the context does not hold.
    func linkedObjects(of storage: ObjectStorage, _ route: Schema.LinkRoute, destination: String) throws
        -> [any ManagedObject]
    {
        let links = try linkObjects(of: storage, route)
        guard !links.isEmpty else { return [] }
        let ids = links.compactMap { link in
            UUID(storedValue: link.skyrosStorage.values[route.other]).map {
                ObjectID(entityName: destination, uuid: $0)
            }
        }
        let objects = loadedObjects(ids)
        guard route.isOrdered else { return objects.sorted { $0.objectID.uuid < $1.objectID.uuid } }
        return inOrder(objects, byObject(links, route))
    }

    /// Sets one side of a many-to-many relationship: links to objects no longer in `targets`
    /// are deleted, links to new ones inserted (or, when this context deleted them, restored).
    /// For an ordered side, the objects are then placed in the order of `targets`.
    func setLinks(_ storage: ObjectStorage, _ route: Schema.LinkRoute, to targets: [ObjectStorage]) throws {
        let links = try linkObjects(of: storage, route)
        let wanted = Set(targets.map(\.objectID.uuid))
        var present = Set<UUID>()
        for link in links {
            guard let other = UUID(storedValue: link.skyrosStorage.values[route.other]) else { continue }
            if wanted.contains(other) { present.insert(other) } else { delete(link) }
        }
        var unplaced = Set<ObjectID>()
        appendsToOrder = !route.isOrdered  // an ordered side places its objects below
        defer { appendsToOrder = true }
        for target in targets where present.insert(target.objectID.uuid).inserted {
            if let id = addLink(storage, route, to: target) { unplaced.insert(id) }
        }
        appendsToOrder = true
        if route.isOrdered {
            var seen = Set<UUID>()
            try placeLinks(
                storage, route, targets.filter { seen.insert($0.objectID.uuid).inserted }, unplaced: unplaced)
        }
    }

    /// Links two objects (known not to be linked in this context); returns the link's
    /// identifier. A link of an ordered many-to-many made from its unordered side places the
    /// object last in the ordered side's list.
    @discardableResult
    func addLink(_ storage: ObjectStorage, _ route: Schema.LinkRoute, to target: ObjectStorage) -> ObjectID? {
        let (source, destination) =
            route.own == 0
            ? (storage.objectID.uuid, target.objectID.uuid) : (target.objectID.uuid, storage.objectID.uuid)
        let id = Schema.linkID(route.entity, source: source, target: destination)
        let side = schema.positionSides[route.entity.name]
        // The position of a link made from either side while nothing places it (the list's
        // owner, then, is `target` or `storage`): last in the ordered side's list.
        func appended() -> StoredValue? {
            guard let side, appendsToOrder else { return nil }
            return side == route.own
                ? .integer(appendPosition(route, owner: storage))
                : .integer(appendPosition(route.reversed, owner: target))
        }
        if let removed = deleted[id] {
            // Removed here before this save: the removal is withdrawn.
            restoreDeleted(removed, changed: [])
            if let position = appended() { removed.skyrosStorage.setStored(position, at: 2) }
            return id
        }
        if let old = registry[id]?.object, old.skyrosStorage.isDeleted || old.skyrosStorage.context == nil {
            registry[id] = nil  // a link removed and saved earlier: a new object for it
        }
        var values = StoredValues(repeating: .null, count: route.entity.properties.count)
        values[0] = source.storedValue
        values[1] = destination.storedValue
        if side != nil { values[2] = appended() ?? .integer(0) }
        let link = makeObject(id, of: route.entity, values: values, exposed: true)
        markInserted(link)
        return id
    }

    /// A child's save inserting a link this context has removed and not saved: the removal is
    /// withdrawn (the link is in the store: inserting it again and deleting it would remove it).
    /// A position (an order entity's row) takes the child's position.
    func withdrawRemovedLink(_ snapshot: Snapshot) -> Bool {
        guard schema.isLinkEntity(snapshot.id.entityName), let removed = deleted[snapshot.id] else { return false }
        restoreDeleted(removed, changed: [])
        if schema.hasPositions(snapshot.id.entityName), snapshot.values.count > 2 {
            removed.skyrosStorage.setStored(snapshot.values[2], at: 2)
        }
        return true
    }

    /// What deleting an object does to its side of a many-to-many relationship: its links go
    /// (nullify and cascade), and under cascade the objects at the other end too. Under deny
    /// nothing happens here: the save refuses while links remain.
    func deleteLinks(of storage: ObjectStorage, _ property: PropertyDescription, _ route: Schema.LinkRoute)
        -> [any ManagedObject]
    {
        guard property.deleteRule != .deny else { return [] }
        var cascade: [any ManagedObject] = []
        if property.deleteRule == .cascade,
            let related = try? linkedObjects(of: storage, route, destination: property.destinationName!)
        {
            cascade = related
        }
        for link in (try? linkObjects(of: storage, route)) ?? [] { delete(link) }
        return cascade
    }

    /// Whether links of the entity's many-to-many relationships were added or removed here.
    func hasPendingLinks(of entityName: String) -> Bool {
        guard let routes = schema.links[entityName] else { return false }
        return routes.values.contains { route in (pendingCountByEntity[ObjectIdentifier(route.entity)] ?? 0) > 0 }
    }

    /// The objects of an entity at this end of the links added or removed here, besides those
    /// already pending: a fetch evaluates them in memory (a predicate through the relationship
    /// must see the links as this context has them, not as the parent does).
    func linkEndpoints(of entityName: String, besides pending: [ObjectStorage]) -> [ObjectStorage] {
        guard hasPendingLinks(of: entityName), let routes = schema.links[entityName] else { return [] }
        var seen = Set(pending.map(\.objectID))
        var result: [ObjectStorage] = []
        for route in routes.values {
            for link in (try? pendingStorages(of: route.entity.name)) ?? [] {  // links are never left faults
                guard let uuid = UUID(storedValue: link.values[route.own]) else { continue }
                let id = ObjectID(entityName: entityName, uuid: uuid)
                guard seen.insert(id).inserted, let object = registeredOrFault(id) else { continue }
                let storage = object.skyrosStorage
                if storage.isFault { fulfill(storage) }
                if storage.context === self && !storage.isDeleted { result.append(storage) }
            }
        }
        return result
    }

    /// What observers see of links: not objects of a link entity, but an update of the
    /// relationship on both linked objects (for links removed by another process, when this
    /// context held them: their identifiers alone do not say which objects they linked).
    func linksAsUpdates(_ changes: ContextChanges) -> ContextChanges {
        var result = changes
        var links: [any ManagedObject] = []
        result.inserted.removeAll { object in
            guard schema.isLinkEntity(object.objectID.entityName) else { return false }
            links.append(object)
            return true
        }
        result.deleted.removeAll { id in
            guard schema.isLinkEntity(id.entityName) else { return false }
            if let object = result.deletedObjects.removeValue(forKey: id) { links.append(object) }
            return true
        }
        // A position moved in an ordered to-many: an update of the owner's relationship.
        var moved: [ObjectID] = []
        for id in result.updatedProperties.keys where schema.isLinkEntity(id.entityName) {
            result.updatedProperties[id] = nil
            if schema.hasPositions(id.entityName) { moved.append(id) }
        }
        result.updated.removeAll { schema.isLinkEntity($0.objectID.entityName) }
        var owners: [(ObjectID, String)] = []
        if !moved.isEmpty {
            var rows: [any ManagedObject] = []
            var toLoad: [ObjectID] = []
            for id in moved {
                if let row = registry[id]?.object ?? pendingObject(id), !row.skyrosStorage.isFault {
                    rows.append(row)
                } else {
                    toLoad.append(id)
                }
            }
            if !toLoad.isEmpty { rows += loadedObjects(toLoad) }
            for row in rows {
                guard let side = schema.positionSides[row.objectID.entityName],
                    let end = schema.linkEnds[row.objectID.entityName]?.first(where: { $0.own == side }),
                    let uuid = UUID(storedValue: row.skyrosStorage.values[side])
                else { continue }
                owners.append((ObjectID(entityName: end.entity, uuid: uuid), end.property))
            }
        }
        var listed = Set(result.updated.map(\.objectID)).union(result.inserted.map(\.objectID))
        let deleted = Set(result.deleted)
        for (id, property) in owners where !deleted.contains(id) {
            result.updatedProperties[id, default: []].insert(property)
            if !listed.contains(id), let object = registry[id]?.object, !object.skyrosStorage.isDeleted {
                listed.insert(id)
                result.updated.append(object)
            }
        }
        guard !links.isEmpty else { return result }
        for link in links {
            let values = link.skyrosStorage.values
            for end in schema.linkEnds[link.objectID.entityName] ?? [] where end.own < values.count {
                guard let uuid = UUID(storedValue: values[end.own]) else { continue }
                let id = ObjectID(entityName: end.entity, uuid: uuid)
                if deleted.contains(id) { continue }
                result.updatedProperties[id, default: []].insert(end.property)
                if !listed.contains(id), let object = registry[id]?.object, !object.skyrosStorage.isDeleted {
                    listed.insert(id)
                    result.updated.append(object)
                }
            }
        }
        return result
    }
}
