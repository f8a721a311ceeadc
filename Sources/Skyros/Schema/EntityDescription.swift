import Foundation

/// The description of one entity: its name, class and properties.
///
/// The `@Entity` macro generates it as `static let entityDescription`.
public final class EntityDescription: @unchecked Sendable, CustomStringConvertible {
    /// The entity name: the class name unless `@Entity(name:)` gives another; also the table name.
    public let name: String
    /// The entity's name in an earlier version of the schema (`@Entity(originalName:)`): a
    /// migration renames its table.
    public let originalName: String?
    /// The managed object class.
    public let objectType: any ManagedObject.Type
    /// The persistent properties, in declaration order.
    public let properties: [PropertyDescription]
    /// Multi-column indexes declared on the entity, as lists of property names.
    public let indexes: [[String]]
    /// Whether the class has validation rules of its own (``ValidatingObject``); for the
    /// entity of a hierarchy, whether any of its classes has.
    public let isValidating: Bool
    /// The class of the parent entity, for a subentity (`@Entity final class Car: Vehicle`):
    /// fetching the parent returns the subentity's objects too.
    public let parentType: (any ManagedObject.Type)?
    /// For a subentity: the key paths of its inherited properties rooted at its own class
    /// (`\Car.name` for `Vehicle.name`), in the order of the ancestors' properties (the
    /// root's first). Predicates and sorts written on the subentity name them.
    let inheritedKeyPaths: [AnyKeyPath]
    /// For the entity of a hierarchy's table (the root's name, every class's properties): its
    /// classes, where each one's properties are, and which class a row is.
    let hierarchy: EntityHierarchy?
    /// For the entity of a hierarchy: the subentities' key paths of inherited properties.
    let keyPathAliases: [AnyKeyPath: PropertyDescription]
    /// For the entity of a hierarchy: where each class's own properties begin.
    private let propertyBases: [(type: ObjectIdentifier, base: Int)]
    let propertiesByName: [String: PropertyDescription]
    @usableFromInline let codecs: [AnyAttributeCodec]
    let uniqueProperties: [PropertyDescription]
    let toOneProperties: [PropertyDescription]
    let requiredToOneProperties: [PropertyDescription]
    let relationships: [PropertyDescription]

    /// Describes an entity.
    ///
    /// - Parameters:
    ///   - type: the managed object class.
    ///   - name: the entity name; by default the class's ``ManagedObject/entityName``.
    ///   - originalName: the entity's name in an earlier version of the schema.
    ///   - properties: the persistent properties, in declaration order.
    ///   - indexes: indexes over one or more properties, by property name.
    ///   - parent: for a subentity, its parent entity's class (`@Entity` passes the superclass).
    ///   - inheritedKeyPaths: for a subentity, its inherited properties' key paths rooted at
    ///     `type`, the root's first (`@Entity` writes them).
    public convenience init<T: ManagedObject>(
        _ type: T.Type, name: String? = nil, originalName: String? = nil,
        parent: (any ManagedObject.Type)? = nil, inheritedKeyPaths: [AnyKeyPath] = [],
        properties: [PropertyDescription], indexes: [[String]] = []
    ) {
        self.init(
            objectType: type, name: name ?? type.entityName, originalName: originalName, parent: parent,
            inheritedKeyPaths: inheritedKeyPaths, properties: properties, indexes: indexes)
    }

    init(
        objectType type: any ManagedObject.Type, name: String, originalName: String?,
        parent: (any ManagedObject.Type)? = nil,
        inheritedKeyPaths: [AnyKeyPath] = [], properties: [PropertyDescription], indexes: [[String]],
        hierarchy: EntityHierarchy? = nil, keyPathAliases: [AnyKeyPath: PropertyDescription] = [:],
        propertyBases: [(type: ObjectIdentifier, base: Int)] = [], isValidating: Bool? = nil
    ) {
        self.name = name
        self.originalName = originalName
        self.objectType = type
        self.parentType = parent
        self.inheritedKeyPaths = inheritedKeyPaths
        self.hierarchy = hierarchy
        self.keyPathAliases = keyPathAliases
        self.propertyBases = propertyBases
        for (index, property) in properties.enumerated() {
            precondition(
                property.index == -1 || property.index == index,
                "Skyros: a PropertyDescription belongs to one entity")
            property.index = index
        }
        self.properties = properties
        self.propertiesByName = Dictionary(properties.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        self.codecs = properties.map(\.codec)
        self.uniqueProperties = properties.filter(\.isUnique)
        self.toOneProperties = properties.filter { $0.kind == .toOne }
        self.requiredToOneProperties = toOneProperties.filter(\.isRequired)
        self.relationships = properties.filter(\.isRelationship)
        self.indexes = indexes
        self.isValidating = isValidating ?? (type is any ValidatingObject.Type)
    }

    /// The property with this name.
    public func property(named name: String) -> PropertyDescription? { propertiesByName[name] }

    /// The property for this key path.
    public func property(for keyPath: AnyKeyPath) -> PropertyDescription? {
        if let own = properties.first(where: { $0.keyPath == keyPath }) { return own }
        if !keyPathAliases.isEmpty { return keyPathAliases[keyPath] }
        // A subentity's class: an inherited property, named by its ancestors.
        guard let parentType, let position = inheritedKeyPaths.firstIndex(of: keyPath) else { return nil }
        let inherited = parentType.entityDescription.declaredProperties
        return position < inherited.count ? inherited[position] : nil
    }

    /// The properties of the class and its ancestors, the root's first.
    var declaredProperties: [PropertyDescription] {
        (parentType?.entityDescription.declaredProperties ?? []) + properties
    }

    /// Where the own properties of `type`, a class of this entity's hierarchy, begin among
    /// ``properties``: 0 for the root and for an entity without subentities. The accessors
    /// `@Entity` writes in a subentity add their property's position among the class's own.
    public func propertyBase(of type: AnyObject.Type) -> Int {
        let id = ObjectIdentifier(type)
        for entry in propertyBases where entry.type == id { return entry.base }
        return 0
    }

    /// The name and the properties, for logs and debugging.
    public var description: String { "Entity \(name) \(properties)" }

    /// The error reported at save for a value of property `index` that cannot be stored.
    func valueError(_ error: any Error, at index: Int) -> SkyrosError {
        SkyrosError(
            .valueNotStorable, "\(name).\(properties[index].name): \(SkyrosError.wrap(error).message)",
            underlying: error)
    }

    /// The values of a new object: each property's default; for an object of a hierarchy's
    /// class (`member`), NULL for the other classes' properties and the class's name as its entity.
    func defaultValues(of member: EntityHierarchy.Member? = nil) -> (StoredValues, [Int: SkyrosError]) {
        var errors: [Int: SkyrosError] = [:]
        let values = StoredValues(unsafeUninitializedCount: properties.count) { values in
            for (index, property) in properties.enumerated() {
                if let member, let hierarchy {
                    if index == hierarchy.entityIndex {
                        (values + index).initialize(to: .text(member.name))
                        continue
                    }
                    if !member.has(index) {
                        (values + index).initialize(to: .null)
                        continue
                    }
                }
                do {
                    (values + index).initialize(to: try property.makeDefault())
                } catch {
                    (values + index).initialize(to: .null)
                    errors[index] = valueError(error, at: index)
                }
            }
        }
        return (values, errors)
    }
}

/// The classes of an entity hierarchy (`@Entity class Vehicle`, `@Entity final class Car:
/// Vehicle`), stored in one table: the root's, holding every class's properties and, in
/// `_entity`, the name of each row's entity (Core Data's single table per hierarchy).
final class EntityHierarchy: @unchecked Sendable {
    /// One entity of the hierarchy.
    struct Member: Sendable {
        /// The entity name.
        let name: String
        /// The parent entity's name; nil for the root.
        let parent: String?
        /// The class (a dynamic object for a schema rebuilt from a description).
        let type: any ManagedObject.Type
        /// The position of the entity's first own property in the hierarchy's entity.
        let base: Int
        /// The names of the class's own properties.
        let ownProperties: [String]
        /// The positions of its properties (inherited and own) in the hierarchy's entity.
        let propertyIndexes: Set<Int>
        /// The entity and its subentities, as the `_entity` values a fetch of it selects.
        var names: [String]
        /// The subentity's name in an earlier version of the schema (`@Entity(originalName:)`):
        /// a migration renames its rows' `_entity`.
        var originalName: String? = nil

        /// Whether the property at `index` of the hierarchy's entity is one of this entity's.
        func has(_ index: Int) -> Bool { propertyIndexes.contains(index) }
    }

    /// The name of the column holding each row's entity.
    static let entityProperty = "_entity"

    /// The entity names a subentity's filter selects (``Schema/restricting(_:to:)``): `node`'s
    /// when it is one, `_entity IN (…)`; nil for any other node.
    static func filteredNames(_ node: PredicateNode) -> [StoredValue]? {
        guard case .isIn(.property(0, let path), let names) = node, path == [entityProperty] else { return nil }
        return names
    }

    /// The entity names a request's predicate selects: its subentity filter, alone or first
    /// beside the fetch's own predicate (as ``Schema/restricting(_:to:)`` writes it).
    static func filteredNames(in predicate: PredicateNode?) -> [StoredValue]? {
        switch predicate {
        case .and(let filter, _)?: filteredNames(filter)
        case let node?: filteredNames(node)
        case nil: nil
        }
    }

    /// The root entity's name (the table's).
    let root: String
    /// The position of `_entity` among the properties.
    let entityIndex: Int
    /// The entities, root first, each before its subentities (the order of their columns).
    let members: [Member]
    /// Each entity's name and class, for choosing the class of an object (no member copied).
    private let classes: [(name: String, type: any ManagedObject.Type)]

    init(root: String, entityIndex: Int, members: [Member]) {
        self.root = root
        self.entityIndex = entityIndex
        self.members = members
        self.classes = members.map { ($0.name, $0.type) }
    }

    /// The entity of a row or object by its values: the one `_entity` names (the root when
    /// it is NULL, as in rows stored before the hierarchy had subentities, or names none).
    func member(of values: StoredValues) -> Member {
        if case .text(let name) = values[entityIndex] {
            for member in members where member.name == name { return member }
        }
        return members[0]
    }

    /// The class of a row or object by its values (see ``member(of:)``). A hierarchy has a few
    /// entities: comparing names (small strings, compared by their bits) beats hashing one
    /// per object made.
    func type(of values: StoredValues) -> any ManagedObject.Type {
        if case .text(let name) = values[entityIndex] {
            // Lengths first: names of other lengths are passed over without comparing text.
            let length = name.utf8.count
            for entry in classes where entry.name.utf8.count == length && entry.name == name { return entry.type }
        }
        return classes[0].type
    }
}
