import Foundation
import Synchronization

extension ObjectContext {
    // MARK: - Relationships

    /// Sets a to-one, keeping a one-to-one inverse in sync.
    func setToOne(_ storage: ObjectStorage, index: Int, to target: ObjectStorage?) {
        let property = storage.entity.properties[index]
        let newValue = target?.objectID.uuid.storedValue ?? .null
        if let inverse = schema.inverse(of: property, in: storage.entity), inverse.kind == .toOne {
            if let old = storage.relatedObject(at: index), old.objectID != target?.objectID {
                old.skyrosStorage.setStored(.null, at: inverse.index)
            }
            if let target {
                if target.isFault { fulfill(target) }
                if let previousUUID = UUID(storedValue: target.values[inverse.index]),
                    previousUUID != storage.objectID.uuid,
                    let previous = registeredOrFault(ObjectID(entityName: storage.entity.name, uuid: previousUUID))
                {
                    previous.skyrosStorage.setStored(.null, at: index)
                }
                if !StoredValue.isIdentical(target.values[inverse.index], storage.objectID.uuid.storedValue) {
                    target.setStored(storage.objectID.uuid.storedValue, at: inverse.index)
                }
            }
        }
        if !schema.orderedInverses.isEmpty, let ordered = schema.orderedInverses[storage.entity.name]?[index] {
            // The to-one of an object of an ordered to-many: its position leaves with it, and a
            // new owner places it last (unless its caller, setting the list, places it).
            if storage.isFault { fulfill(storage) }
            let old = UUID(storedValue: storage.values[index])
            if old != target?.objectID.uuid {
                if let old { removePosition(ordered.route, owner: old, of: storage) }
                if let target, appendsToOrder {
                    let owner = ObjectID(entityName: ordered.owner.name, uuid: target.objectID.uuid)
                    setPosition(
                        ordered.route, owner: owner, of: storage, to: appendPosition(ordered.route, owner: target))
                }
            }
        }
        storage.setStored(newValue, at: index)
    }

    /// Sets a to-many by setting the inverse to-one of the objects added and removed.
    func setToMany(_ storage: ObjectStorage, index: Int, to targets: [ObjectStorage]) throws {
        let property = storage.entity.properties[index]
        if let route = schema.linkRoute(of: property, in: storage.entity) {
            return try setLinks(storage, route, to: targets)
        }
        guard let inverse = schema.inverse(of: property, in: storage.entity) else { return }
        if let route = schema.orderRoute(of: property, in: storage.entity) {
            return try setOrdered(storage, property, inverse, route, to: targets)
        }
        let current = try relatedObjects(of: storage, index: index)
        let newIDs = Set(targets.map(\.objectID))
        for object in current where !newIDs.contains(object.objectID) {
            setToOne(object.skyrosStorage, index: inverse.index, to: nil)
        }
        for target in targets { setToOne(target, index: inverse.index, to: storage) }
    }

    /// The objects of a to-many relationship, as this context sees them, by creation order.
    func relatedObjects(of storage: ObjectStorage, index: Int) throws -> [any ManagedObject] {
        let property = storage.entity.properties[index]
        if let route = schema.linkRoute(of: property, in: storage.entity) {
            return try linkedObjects(of: storage, route, destination: property.destinationName!)
        }
        guard let inverse = schema.inverse(of: property, in: storage.entity) else { return [] }
        let request = StoreRequest(
            entityName: property.destinationName!, predicate: .equals(inverse.name, storage.objectID.uuid.storedValue))
        let members = try fetchObjects(request, localOnly: storage.isInserted)
        guard let route = schema.orderRoute(of: property, in: storage.entity), members.count > 1 else { return members }
        return inOrder(members, try positions(of: storage, route))
    }
}
