import Foundation

/// What happens to related objects when an object is deleted.
public enum DeleteRule: String, Sendable, Codable {
    /// The related objects stay; their reference to the deleted object is removed. The default.
    case nullify
    /// The related objects are deleted too.
    case cascade
    /// The delete is refused at save (``SkyrosError/Code/deleteDenied``) while related objects exist.
    case deny
}

/// Options of an attribute, as in `@Attribute(.unique)`.
public struct AttributeOption: Hashable, Sendable {
    let name: String
    /// The attribute holds a different value in every object; saving a duplicate fails with
    /// ``SkyrosError/Code/uniqueConstraintViolation``.
    public static let unique = AttributeOption(name: "unique")
    /// The attribute has an index in the store, for fast predicates and sorts.
    public static let indexed = AttributeOption(name: "indexed")
}

/// Options of a relationship, as in `@Relationship(.required)`.
public struct RelationshipOption: Hashable, Sendable {
    let name: String
    /// A to-one relationship that must have a destination when the object is saved
    /// (``SkyrosError/Code/missingRequiredRelationship`` otherwise).
    public static let required = RelationshipOption(name: "required")
    /// A to-many relationship whose objects keep the order they are given in
    /// (`@Relationship(.ordered) var steps: [Step]`), in the store and in every process; its
    /// inverse is a to-one, or an unordered to-many (an ordered many-to-many). Core Data's
    /// ordered relationships, as an array.
    public static let ordered = RelationshipOption(name: "ordered")
}

/// One persistent property of an entity: an attribute, a to-one or a to-many relationship.
///
/// Made by the `@Entity` macro (or by hand, see ``ManagedObject``) with ``attribute(_:_:default:options:originalName:)``,
/// ``toOne(_:_:deleteRule:inverse:options:originalName:)`` and ``toMany(_:_:deleteRule:inverse:options:originalName:)``.
public final class PropertyDescription: @unchecked Sendable, CustomStringConvertible {
    /// What a property is: a value of its own, or a reference to one or many other objects.
    public enum Kind: Sendable, Equatable, CustomStringConvertible {
        /// A value of the object's own, in a column of its table.
        case attribute
        /// A reference to one object (or none), in a column holding the destination's identifier.
        case toOne
        /// The objects whose inverse to-one points here, or (a many-to-many) those linked to
        /// this one; no column of its own.
        case toMany

        /// `attribute`, `toOne` or `toMany`: the kind's name in a schema description and its
        /// fingerprint (written out, not found by reflection at each use).
        public var description: String {
            switch self {
            case .attribute: "attribute"
            case .toOne: "toOne"
            case .toMany: "toMany"
            }
        }
    }

    /// The property name, also its column name.
    public let name: String
    /// Attribute, to-one or to-many.
    public let kind: Kind
    /// The key path of the property on its class: predicates and sorts are mapped through it.
    public let keyPath: AnyKeyPath
    /// The position of the property in its entity (set by ``EntityDescription``).
    public internal(set) var index: Int = -1

    // Attributes
    /// The codec of an attribute; for relationships, the codec of the stored reference.
    public let codec: AnyAttributeCodec
    let makeDefault: @Sendable () throws -> StoredValue
    /// Whether the attribute was declared `@Attribute(.unique)`: a unique index in the store, and
    /// ``SkyrosError/Code/uniqueConstraintViolation`` at save for a duplicate.
    public let isUnique: Bool
    /// Whether the attribute was declared `@Attribute(.indexed)`: an index in the store.
    public let isIndexed: Bool
    /// The name the property had in an earlier version of the schema: a migration renames
    /// its column and keeps its values.
    public let originalName: String?

    // Relationships
    /// The entity name of the destination of a relationship.
    public let destinationName: String?
    /// What deleting the object does to the destination of the relationship (``DeleteRule/nullify``
    /// for attributes).
    public let deleteRule: DeleteRule
    let inverseKeyPath: AnyKeyPath?
    /// The inverse's name, for schemas rebuilt from a ``SchemaDescription`` (no key paths).
    let inverseName: String?
    /// Whether a to-one was declared `@Relationship(.required)`: a save with no destination fails
    /// with ``SkyrosError/Code/missingRequiredRelationship``.
    public let isRequired: Bool
    /// Whether a to-many was declared `@Relationship(.ordered)`: its objects keep the order they
    /// are set in, held in the positions of an order entity the schema adds
    /// (``Schema/linkEntityName(ownerEntity:property:)``).
    public let isOrdered: Bool
    /// Whether the property is a subentity's own, in its hierarchy's table: its column holds
    /// NULL in the rows of the other entities of the hierarchy, whatever the property's type.
    public let isSubentityColumn: Bool

    /// Whether the property's column may hold NULL: an optional type, or a subentity's column.
    var isStoredOptional: Bool { codec.isOptional || isSubentityColumn }

    init(
        name: String, kind: Kind, keyPath: AnyKeyPath, codec: AnyAttributeCodec,
        makeDefault: @escaping @Sendable () throws -> StoredValue,
        isUnique: Bool = false, isIndexed: Bool = false, originalName: String? = nil,
        destinationName: String? = nil, deleteRule: DeleteRule = .nullify,
        inverseKeyPath: AnyKeyPath? = nil, inverseName: String? = nil, isRequired: Bool = false,
        isOrdered: Bool = false,
        isSubentityColumn: Bool = false
    ) {
        self.name = name
        self.kind = kind
        self.keyPath = keyPath
        self.codec = codec
        self.makeDefault = makeDefault
        self.isUnique = isUnique
        self.isIndexed = isIndexed
        self.originalName = originalName
        self.destinationName = destinationName
        self.deleteRule = deleteRule
        self.inverseKeyPath = inverseKeyPath
        self.inverseName = inverseName
        self.isRequired = isRequired
        self.isOrdered = isOrdered
        self.isSubentityColumn = isSubentityColumn
    }

    /// The same property for the entity of a hierarchy's table (not yet indexed there), its
    /// destination named by the hierarchy that stores it.
    func copy(destinationName: String?, isSubentityColumn: Bool) -> PropertyDescription {
        PropertyDescription(
            name: name, kind: kind, keyPath: keyPath, codec: codec, makeDefault: makeDefault, isUnique: isUnique,
            isIndexed: isIndexed, originalName: originalName, destinationName: destinationName, deleteRule: deleteRule,
            inverseKeyPath: inverseKeyPath, inverseName: inverseName, isRequired: isRequired, isOrdered: isOrdered,
            isSubentityColumn: isSubentityColumn)
    }

    /// Whether the property is a to-one or a to-many relationship.
    public var isRelationship: Bool { kind != .attribute }

    /// Whether the property has a column in its entity's table.
    var hasColumn: Bool { kind != .toMany }

    /// The name and the kind, as `author (toOne)`.
    public var description: String { "\(name) (\(kind))" }

    /// Describes an attribute.
    ///
    /// - Parameters:
    ///   - name: the property name.
    ///   - keyPath: the property's key path, `\User.firstname`.
    ///   - makeDefault: the initial value of new objects (the `default:` argument), evaluated
    ///     for each new object.
    ///   - options: `.unique`, `.indexed`.
    ///   - originalName: the name in an earlier schema version.
    public static func attribute<Root: ManagedObject, Value>(
        _ name: String, _ keyPath: KeyPath<Root, Value>,
        default makeDefault: @escaping @Sendable () -> Value,
        options: [AttributeOption] = [], originalName: String? = nil
    ) -> PropertyDescription {
        guard let codec = AttributeCodecs.codec(for: Value.self) else {
            preconditionFailure("Skyros: \(Root.self).\(name) has type \(Value.self), which cannot be stored")
        }
        return PropertyDescription(
            name: name, kind: .attribute, keyPath: keyPath, codec: codec,
            makeDefault: { try codec.encode(makeDefault()) },
            isUnique: options.contains(.unique), isIndexed: options.contains(.indexed),
            originalName: originalName)
    }

    /// Describes a to-one relationship, `var author: User?`.
    public static func toOne<Root: ManagedObject, Destination: ManagedObject>(
        _ name: String, _ keyPath: KeyPath<Root, Destination?>,
        deleteRule: DeleteRule = .nullify, inverse: PartialKeyPath<Destination>? = nil,
        options: [RelationshipOption] = [], originalName: String? = nil
    ) -> PropertyDescription {
        PropertyDescription(
            name: name, kind: .toOne, keyPath: keyPath, codec: AttributeCodecs.codec(for: UUID?.self)!,
            makeDefault: { .null }, isIndexed: true, originalName: originalName,
            destinationName: Destination.entityName, deleteRule: deleteRule,
            inverseKeyPath: inverse, isRequired: options.contains(.required))
    }

    /// Describes a to-many relationship, `var posts: [Post]`. Its inverse is a to-one of the
    /// destination (when `inverse` is nil it is found by type), or a to-many of the destination:
    /// a many-to-many, whose links are the rows of a link entity the schema adds
    /// (``Schema/linkEntityName(ownerEntity:property:)``). Name the inverse on one side of a
    /// many-to-many (`@Relationship(inverse: \Tag.posts) var tags: [Tag]`); the other side finds it.
    /// With `options: [.ordered]` (a to-one inverse), the objects keep the order they are set in.
    public static func toMany<Root: ManagedObject, Destination: ManagedObject>(
        _ name: String, _ keyPath: KeyPath<Root, [Destination]>,
        deleteRule: DeleteRule = .nullify, inverse: PartialKeyPath<Destination>? = nil,
        options: [RelationshipOption] = [], originalName: String? = nil
    ) -> PropertyDescription {
        PropertyDescription(
            name: name, kind: .toMany, keyPath: keyPath, codec: AttributeCodecs.codec(for: UUID?.self)!,
            makeDefault: { .null }, originalName: originalName,
            destinationName: Destination.entityName, deleteRule: deleteRule,
            inverseKeyPath: inverse, isOrdered: options.contains(.ordered))
    }
}
