import Foundation
import Synchronization

extension ObjectContext {
    // MARK: - Inserting and deleting

    /// Inserts a new object with its default values.
    public func insert<T: ManagedObject>(_ type: T.Type) -> T {
        var entity = T.entityDescription
        var member: EntityHierarchy.Member?
        if lastInsertedEntity != ObjectIdentifier(entity) {  // checked once per run of inserts of an entity
            guard let found = schema.entitiesByType[ObjectIdentifier(T.self)] else {
                preconditionFailure("Skyros: \(T.self) is not an entity of this context's schema")
            }
            if found.entity === entity {
                lastInsertedEntity = ObjectIdentifier(entity)
            } else {
                // A class of a hierarchy, or an entity whose relationship to a subentity the
                // schema pointed at its hierarchy: the schema's entity stores it.
                (entity, member) = found
            }
        }
        let (values, errors) = entity.defaultValues(of: member)
        let storage = ObjectStorage(
            objectID: .make(entityName: entity.name), entity: entity, values: values, reference: reference)
        storage.valueErrors = errors  // by property: reported at save, like a value set that cannot be stored
        let object = T(skyrosStorage: storage)
        storage.isExposed = true
        markInserted(object)
        return object
    }

    /// Deletes an object, applying its relationships' delete rules at once (cascade deletes,
    /// nullify clears references). `.deny` is checked at save. A fault is read first only when
    /// its values are needed: for its relationships' delete rules, or for the context's
    /// observers (who are told what the deleted object was).
    public func delete(_ object: any ManagedObject) {
        let storage = object.skyrosStorage
        precondition(
            storage.context === self, "Skyros: deleting \(storage.objectID) in a context it does not belong to")
        guard !storage.isDeleted else { return }
        storage.changesValidated = false
        if storage.isFault && (!storage.entity.relationships.isEmpty || reference.isObserved) { fulfill(storage) }
        var toCascade: [any ManagedObject] = []
        for property in storage.entity.relationships {
            if let route = schema.linkRoute(of: property, in: storage.entity) {
                toCascade += deleteLinks(of: storage, property, route)
                continue
            }
            let inverse = schema.inverse(of: property, in: storage.entity)
            switch property.kind {
            case .toMany:
                if let route = schema.orderRoute(of: property, in: storage.entity) {
                    // Its positions go with it (in the store by the foreign key; here, those
                    // pending must not be saved pointing to an object that is gone).
                    for row in (try? linkObjects(of: storage, route)) ?? [] { delete(row) }
                }
                guard let inverse, let related = try? relatedObjects(of: storage, index: property.index) else {
                    continue
                }
                switch property.deleteRule {
                case .cascade: toCascade += related
                case .nullify:
                    for object in related { object.skyrosStorage.setStored(.null, at: inverse.index) }
                case .deny: break
                }
            case .toOne:
                if !schema.orderedInverses.isEmpty,
                    let ordered = schema.orderedInverses[storage.entity.name]?[property.index],
                    let owner = UUID(storedValue: storage.values[property.index]),
                    let row = lookup(Schema.linkID(ordered.route.entity, source: owner, target: storage.objectID.uuid))
                {
                    delete(row)  // its position, when this context holds it (the store's foreign key deletes the others)
                }
                guard let target = storage.relatedObject(at: property.index) else { continue }
                if property.deleteRule == .cascade {
                    toCascade.append(target)
                } else if let inverse, inverse.kind == .toOne, property.deleteRule == .nullify {
                    target.skyrosStorage.setStored(.null, at: inverse.index)
                }
            case .attribute: break
            }
        }
        markDeleted(object)
        for related in toCascade { delete(related) }
    }
}
