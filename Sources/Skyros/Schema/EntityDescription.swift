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
    /// Whether the class has validation rules of its own (``ValidatingObject``).
    public let isValidating: Bool
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
    public init<T: ManagedObject>(
        _ type: T.Type, name: String? = nil, originalName: String? = nil, properties: [PropertyDescription],
        indexes: [[String]] = []
    ) {
        self.name = name ?? type.entityName
        self.originalName = originalName
        self.objectType = type
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
        self.isValidating = type is any ValidatingObject.Type
    }

    /// The property with this name.
    public func property(named name: String) -> PropertyDescription? { propertiesByName[name] }

    /// The property for this key path.
    public func property(for keyPath: AnyKeyPath) -> PropertyDescription? {
        properties.first { $0.keyPath == keyPath }
    }

    /// The name and the properties, for logs and debugging.
    public var description: String { "Entity \(name) \(properties)" }

    /// The error reported at save for a value of property `index` that cannot be stored.
    func valueError(_ error: any Error, at index: Int) -> SkyrosError {
        SkyrosError(
            .valueNotStorable, "\(name).\(properties[index].name): \(SkyrosError.wrap(error).message)", underlying: error)
    }

    /// The values of a new object: each property's default.
    func defaultValues() -> (StoredValues, [Int: SkyrosError]) {
        var errors: [Int: SkyrosError] = [:]
        let values = StoredValues(unsafeUninitializedCount: properties.count) { values in
            for (index, property) in properties.enumerated() {
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
