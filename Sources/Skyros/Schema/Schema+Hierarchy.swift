import Foundation

/// Entity inheritance: `@Entity class Vehicle` with `@Entity final class Car: Vehicle`.
///
/// A hierarchy is stored as Core Data stores it: one table, the root's, with every class's
/// properties and an `_entity` column naming each row's entity. The schema's entity for the
/// hierarchy (``Schema/entities`` lists it under the root's name) is what the store, the
/// daemon, the wire and sync see: an ordinary entity whose subentities' columns may hold NULL.
/// Object identifiers name it (`Vehicle/<UUID>` for a car), so that a relationship to the
/// parent holds any subentity's object; the class of an object is chosen by its `_entity`.
extension Schema {
    /// The entities the store holds for these declarations: each hierarchy made one entity (its
    /// classes' properties, root first, then each subentity's own, depth first, subentities by
    /// name, then `_entity`), and relationships to a subentity pointed at its hierarchy's entity.
    static func storageEntities(of declared: [EntityDescription]) -> (entities: [EntityDescription], errors: [String]) {
        var errors: [String] = []
        let byType = Dictionary(declared.map { (ObjectIdentifier($0.objectType), $0) }, uniquingKeysWith: { a, _ in a })
        var children: [ObjectIdentifier: [EntityDescription]] = [:]
        var orphans = Set<String>()
        for entity in declared {
            guard let parentType = entity.parentType else { continue }
            guard byType[ObjectIdentifier(parentType)] != nil else {
                errors.append("\(entity.name): its parent entity \(parentType.entityName) is not in the schema")
                orphans.insert(entity.name)
                continue
            }
            children[ObjectIdentifier(parentType), default: []].append(entity)
        }
        guard !children.isEmpty || !errors.isEmpty else { return (declared, []) }
        // Each entity's table: its hierarchy root's.
        var storageName: [String: String] = [:]
        for entity in declared {
            var root = entity
            while let parent = root.parentType, let found = byType[ObjectIdentifier(parent)] { root = found }
            storageName[entity.name] = root.name
        }
        func copy(_ property: PropertyDescription, isSubentityColumn: Bool) -> PropertyDescription {
            property.copy(
                destinationName: property.destinationName.map { storageName[$0] ?? $0 },
                isSubentityColumn: isSubentityColumn)
        }
        var result: [EntityDescription] = []
        for entity in declared where entity.parentType == nil && !orphans.contains(entity.name) {
            if children[ObjectIdentifier(entity.objectType)] != nil {
                result.append(hierarchyEntity(root: entity, children: children, copy: copy, errors: &errors))
            } else if entity.properties.contains(where: { $0.destinationName.map { storageName[$0] != $0 } ?? false }) {
                // A relationship to a subentity: to its hierarchy's entity.
                result.append(
                    EntityDescription(
                        objectType: entity.objectType, name: entity.name, originalName: entity.originalName,
                        properties: entity.properties.map { copy($0, isSubentityColumn: false) },
                        indexes: entity.indexes))
            } else {
                result.append(entity)
            }
        }
        return (result, errors)
    }

    /// The entity of a hierarchy's table.
    private static func hierarchyEntity(
        root: EntityDescription, children: [ObjectIdentifier: [EntityDescription]],
        copy: (PropertyDescription, Bool) -> PropertyDescription, errors: inout [String]
    ) -> EntityDescription {
        var properties: [PropertyDescription] = []
        var members: [EntityHierarchy.Member] = []
        var owners: [String: String] = [:]
        var aliases: [AnyKeyPath: PropertyDescription] = [:]
        var bases: [(type: ObjectIdentifier, base: Int)] = []
        var indexes: [[String]] = []
        var isValidating = false
        func visit(_ entity: EntityDescription, parent: EntityHierarchy.Member?) {
            let base = properties.count
            var own: [String] = []
            for property in entity.properties {
                if let owner = owners[property.name] {
                    errors.append(
                        "\(entity.name).\(property.name): \(owner) already has a property \(property.name) (the entities of a hierarchy share one table; declare it once, on their common parent)"
                    )
                    continue
                }
                owners[property.name] = entity.name
                own.append(property.name)
                properties.append(copy(property, parent != nil))
            }
            let inherited = (parent?.propertyIndexes ?? []).sorted()
            if entity.inheritedKeyPaths.count == inherited.count {
                for (keyPath, index) in zip(entity.inheritedKeyPaths, inherited) {
                    aliases[keyPath] = properties[index]
                }
            } else if parent != nil {
                errors.append(
                    "\(entity.name): \(entity.inheritedKeyPaths.count) inherited key paths for the \(inherited.count) properties of its parents"
                )
            }
            let member = EntityHierarchy.Member(
                name: entity.name, parent: parent?.name, type: entity.objectType, base: base, ownProperties: own,
                propertyIndexes: (parent?.propertyIndexes ?? []).union(base..<properties.count), names: [entity.name],
                originalName: parent == nil ? nil : entity.originalName)
            members.append(member)
            if parent != nil { bases.append((ObjectIdentifier(entity.objectType), base)) }
            indexes += entity.indexes.filter { !indexes.contains($0) }
            isValidating = isValidating || entity.isValidating
            for child in (children[ObjectIdentifier(entity.objectType)] ?? []).sorted(by: { $0.name < $1.name }) {
                visit(child, parent: member)
            }
        }
        visit(root, parent: nil)
        properties.append(entityProperty(root: root.name))
        return EntityDescription(
            objectType: root.objectType, name: root.name, originalName: root.originalName, properties: properties,
            indexes: indexes,
            hierarchy: EntityHierarchy(root: root.name, entityIndex: properties.count - 1, members: withNames(members)),
            keyPathAliases: aliases, propertyBases: bases, isValidating: isValidating)
    }

    /// Each member's `names`: itself and its subentities, at any depth.
    static func withNames(_ members: [EntityHierarchy.Member]) -> [EntityHierarchy.Member] {
        let parents = Dictionary(members.map { ($0.name, $0.parent) }, uniquingKeysWith: { a, _ in a })
        return members.map { member in
            var member = member
            member.names = members.map(\.name).filter { name in
                var current: String? = name
                while let found = current {
                    if found == member.name { return true }
                    current = parents[found] ?? nil
                }
                return false
            }
            return member
        }
    }

    /// The `_entity` attribute of a hierarchy's entity: a string, indexed, the root's name by
    /// default (rows stored before the entity had subentities are the root's).
    static func entityProperty(root: String) -> PropertyDescription {
        PropertyDescription(
            name: EntityHierarchy.entityProperty, kind: .attribute, keyPath: \DynamicObject.skyrosStorage,
            codec: AttributeCodecs.codec(for: String.self)!, makeDefault: { .text(root) }, isIndexed: true)
    }

    /// The hierarchy of an entity rebuilt from a description: its members as the description
    /// lists them (the root first, each entity before its subentities).
    static func hierarchy(
        of entity: SchemaDescription.Entity, properties: [PropertyDescription]
    ) throws -> EntityHierarchy? {
        guard let subentities = entity.subentities, !subentities.isEmpty else { return nil }
        guard let entityIndex = properties.firstIndex(where: { $0.name == EntityHierarchy.entityProperty }) else {
            throw SkyrosError(
                .invalidSchema, "\(entity.name) has subentities but no \(EntityHierarchy.entityProperty) property")
        }
        let indexOf = Dictionary(properties.enumerated().map { ($1.name, $0) }, uniquingKeysWith: { a, _ in a })
        var members: [EntityHierarchy.Member] = []
        let rootOwn = properties.indices.filter { index in
            index != entityIndex && !subentities.contains { $0.properties.contains(properties[index].name) }
        }
        members.append(
            EntityHierarchy.Member(
                name: entity.name, parent: nil, type: DynamicObject.self, base: 0,
                ownProperties: rootOwn.map { properties[$0].name }, propertyIndexes: Set(rootOwn), names: [entity.name])
        )
        for subentity in subentities {
            guard let parent = members.first(where: { $0.name == subentity.parent }) else {
                throw SkyrosError(
                    .invalidSchema,
                    "\(entity.name): the subentity \(subentity.name)'s parent \(subentity.parent) is not listed before it"
                )
            }
            var own: [Int] = []
            for name in subentity.properties {
                guard let index = indexOf[name] else {
                    throw SkyrosError(
                        .invalidSchema,
                        "\(entity.name): the subentity \(subentity.name)'s property \(name) is not one of its properties"
                    )
                }
                own.append(index)
            }
            members.append(
                EntityHierarchy.Member(
                    name: subentity.name, parent: parent.name, type: DynamicObject.self,
                    base: own.min() ?? properties.count,
                    ownProperties: subentity.properties, propertyIndexes: parent.propertyIndexes.union(own),
                    names: [subentity.name],
                    originalName: subentity.originalName))
        }
        return EntityHierarchy(root: entity.name, entityIndex: entityIndex, members: withNames(members))
    }

    /// The schema's entity storing the objects of `type`: its own, or for a class of a
    /// hierarchy, the hierarchy's (the root's name, every class's properties).
    public func entity(for type: any ManagedObject.Type) -> EntityDescription? {
        (try? storage(of: type))?.entity
    }

    /// The entity storing `type`'s objects and, for a class of a hierarchy, its place there. A
    /// class the schema was not made of is found by its entity name (another version's class
    /// of the same entity, as a fetch by name always allowed).
    func storage(of type: any ManagedObject.Type) throws -> (entity: EntityDescription, member: EntityHierarchy.Member?)
    {
        if let found = entitiesByType[ObjectIdentifier(type)] { return found }
        let name = type.entityName
        guard let entity = entitiesByName[name] else {
            throw SkyrosError(.unknownEntity, "entity \(name) (\(type)) is not in the schema")
        }
        return (entity, entity.hierarchy?.members.first { $0.name == name && $0.parent != nil })
    }

    /// `predicate` restricted to the objects of a hierarchy's `member` (its place as
    /// ``storage(of:)`` gives it): `_entity` is the entity or one of its subentities, first
    /// (``EntityHierarchy/filteredNames(in:)`` finds it there). A root, or an entity without
    /// subentities (no member), takes every row: `predicate` as it is.
    static func restricting(_ predicate: PredicateNode?, to member: EntityHierarchy.Member?) -> PredicateNode? {
        guard let member, member.parent != nil else { return predicate }
        let filter = PredicateNode.isIn(
            .property(scope: 0, path: [EntityHierarchy.entityProperty]), member.names.map { .text($0) })
        return predicate.map { .and(filter, $0) } ?? filter
    }
}
