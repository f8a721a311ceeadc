import Foundation

/// A schema as plain data: what a process that does not have the entity classes (the
/// daemon of an application group) needs to store their objects.
///
/// `Schema(description: schema.schemaDescription)` has the same ``Schema/fingerprint`` as
/// `schema`. The SQLite store records the description when it creates a file.
public struct SchemaDescription: Codable, Sendable, Hashable {
    /// One property of an entity, as ``PropertyDescription`` describes it without key paths or
    /// codecs. Its JSON keys are the property names below (docs/PROTOCOL.md lists them).
    public struct Property: Codable, Sendable, Hashable {
        /// The property's name, also its column's.
        public var name: String
        /// `attribute`, `toOne` or `toMany`.
        public var kind: String
        /// The column's storage class (for a relationship, the blob of the destination's identifier).
        public var storageType: StorageType
        /// Whether the column may hold NULL.
        public var isOptional: Bool
        /// The Swift type of an attribute, as the fingerprint names it.
        public var typeName: String
        /// Whether the attribute has a unique index.
        public var isUnique: Bool
        /// Whether the attribute has an index.
        public var isIndexed: Bool
        /// The property's name in an earlier schema version, for a rename (absent when none).
        public var originalName: String?
        /// A relationship's destination entity (absent for attributes).
        public var destination: String?
        /// A relationship's delete rule (`nullify` for attributes).
        public var deleteRule: DeleteRule
        /// The name of a relationship's inverse on the destination entity.
        public var inverse: String?
        /// Whether a to-one must have a destination at save.
        public var isRequired: Bool
        /// `true` for an ordered to-many (`@Relationship(.ordered)`); absent (nil) otherwise, so
        /// that descriptions without one are the same as before ordered relationships.
        public var isOrdered: Bool?
        /// The attribute's declared default as stored, when it is a constant (absent for
        /// relationships, for a nil default, and for defaults computed anew each time, such
        /// as `Date()`): what a daemon gives the attribute when a migration adds it, or when
        /// a client of an earlier schema version inserts an object without it.
        public var defaultValue: DefaultValue?

        /// A property description; `defaultValue` NULL is the same as none.
        public init(
            name: String, kind: String, storageType: StorageType, isOptional: Bool, typeName: String,
            isUnique: Bool = false, isIndexed: Bool = false, originalName: String? = nil, destination: String? = nil,
            deleteRule: DeleteRule = .nullify, inverse: String? = nil, isRequired: Bool = false,
            defaultValue: StoredValue? = nil, isOrdered: Bool = false
        ) {
            self.defaultValue = defaultValue.flatMap { $0.isNull ? nil : DefaultValue($0) }
            self.name = name
            self.kind = kind
            self.storageType = storageType
            self.isOptional = isOptional
            self.typeName = typeName
            self.isUnique = isUnique
            self.isIndexed = isIndexed
            self.originalName = originalName
            self.destination = destination
            self.deleteRule = deleteRule
            self.inverse = inverse
            self.isRequired = isRequired
            self.isOrdered = isOrdered ? true : nil
        }
    }

    /// One entity: its name, its properties in declaration order, and its declared indexes.
    public struct Entity: Codable, Sendable, Hashable {
        /// The entity's name, also its table's.
        public var name: String
        /// The properties in declaration order (the order of a ``Snapshot``'s values).
        public var properties: [Property]
        /// The entity's declared compound indexes, each a list of property names.
        public var indexes: [[String]]
        /// The entity's name in an earlier version of the schema (absent when none).
        public var originalName: String?
        /// For the root of an entity hierarchy: its subentities, each after its parent (absent
        /// for an entity without subentities). The entity's properties are every entity's of
        /// the hierarchy, and `_entity` names each row's entity.
        public var subentities: [Subentity]?

        /// An entity description.
        public init(
            name: String, properties: [Property], indexes: [[String]] = [], originalName: String? = nil,
            subentities: [Subentity]? = nil
        ) {
            self.name = name
            self.properties = properties
            self.indexes = indexes
            self.originalName = originalName
            self.subentities = subentities
        }
    }

    /// A subentity of an entity hierarchy, stored in its root's table.
    public struct Subentity: Codable, Sendable, Hashable {
        /// The subentity's name: the `_entity` of its rows.
        public var name: String
        /// Its parent entity's name (the root, or another subentity listed before it).
        public var parent: String
        /// The names of its own properties (its parents' are inherited).
        public var properties: [String]
        /// Those of its own attributes declared non-optional: their columns (optional in the
        /// table, for the other entities' rows) hold a value in every row of this entity.
        /// Absent when there is none.
        public var nonOptional: [String]?
        /// The subentity's name in an earlier version of the schema (absent when none): a
        /// migration renames its rows' `_entity`.
        public var originalName: String?

        /// A subentity description.
        public init(
            name: String, parent: String, properties: [String], nonOptional: [String]? = nil,
            originalName: String? = nil
        ) {
            self.originalName = originalName
            self.name = name
            self.parent = parent
            self.properties = properties
            self.nonOptional = nonOptional.flatMap { $0.isEmpty ? nil : $0 }
        }
    }

    /// A default value in JSON, tagged with its storage class: `{"integer": 0}`,
    /// `{"real": 1.5}`, `{"text": "todo"}` or `{"blob": "<base64>"}`.
    public struct DefaultValue: Codable, Sendable, Hashable {
        /// The value; never NULL.
        public var value: StoredValue

        /// Wraps a stored value (not NULL: a nil default is no default).
        public init(_ value: StoredValue) { self.value = value }

        enum CodingKeys: String, CodingKey { case integer, real, text, blob }

        /// Decodes the tagged form; an object without one of the four keys is `dataCorrupted`.
        public init(from decoder: any Decoder) throws {
            let container = try decoder.container(keyedBy: CodingKeys.self)
            if let number = try container.decodeIfPresent(Int64.self, forKey: .integer) {
                value = .integer(number)
            } else if let number = try container.decodeIfPresent(Double.self, forKey: .real) {
                value = .real(number)
            } else if let text = try container.decodeIfPresent(String.self, forKey: .text) {
                value = .text(text)
            } else if let blob = try container.decodeIfPresent(Data.self, forKey: .blob) {
                value = .blob(blob)
            } else {
                throw DecodingError.dataCorrupted(
                    .init(
                        codingPath: decoder.codingPath,
                        debugDescription: "a default value is one of integer, real, text, blob"))
            }
        }

        /// Encodes the tagged form, as `{"text": "todo"}`.
        public func encode(to encoder: any Encoder) throws {
            var container = encoder.container(keyedBy: CodingKeys.self)
            switch value {
            case .null: break
            case .integer(let number): try container.encode(number, forKey: .integer)
            case .real(let number): try container.encode(number, forKey: .real)
            case .text(let text): try container.encode(text, forKey: .text)
            case .blob(let blob): try container.encode(blob, forKey: .blob)
            }
        }
    }

    /// The entities, in the schema's order.
    public var entities: [Entity]

    /// A description of these entities.
    public init(entities: [Entity]) { self.entities = entities }

    /// The description with the platform-neutral type names of ``AttributeCodec``, for a
    /// description recorded before they existed (with runtime names such as `Swift.String`,
    /// `Foundation.Date` or `Swift.Optional<Swift.Int>`). Enums and Codable values, whose
    /// runtime names say nothing of their raw type, are named after their storage
    /// (`enum:string`, `enum:int`, `enum:double`, `json`).
    public func upgradingLegacyTypeNames() -> SchemaDescription {
        var upgraded = self
        for entity in upgraded.entities.indices {
            for property in upgraded.entities[entity].properties.indices {
                let old = upgraded.entities[entity].properties[property]
                upgraded.entities[entity].properties[property].typeName = Self.neutralName(
                    old.typeName, storageType: old.storageType, isAttribute: old.kind == "attribute")
            }
        }
        return upgraded
    }

    /// The types Skyros stores natively (see ``AttributeValue``).
    private static var nativeTypes: [any AttributeValue.Type] {
        [
            String.self, Int.self, Int64.self, Int32.self, Int16.self, Int8.self, Double.self, Float.self, Bool.self,
            Date.self, Data.self, UUID.self, URL.self, Decimal.self,
        ]
    }

    private static func neutralName(_ name: String, storageType: StorageType, isAttribute: Bool) -> String {
        var name = name
        if name.hasPrefix("Swift.Optional<") && name.hasSuffix(">") {
            name = String(name.dropFirst("Swift.Optional<".count).dropLast())
        }
        guard name.contains(".") else { return name }  // already neutral
        let module = name.prefix { $0 != "." }
        let type = name.dropFirst(module.count + 1)
        if ["Swift", "Foundation", "FoundationEssentials"].contains(module),
            let native = nativeTypes.first(where: { String(describing: $0) == type })
        {
            return native.schemaTypeName
        }
        guard isAttribute else { return "uuid" }
        switch storageType {
        case .blob: return "json"
        case .text: return "enum:string"
        case .integer: return "enum:int"
        case .real: return "enum:double"
        }
    }

    /// The description as sent in a hello and recorded in a store: JSON with sorted keys, no
    /// whitespace, absent optional keys left out (docs/PROTOCOL.md, "Schema description").
    /// The bytes are those of `JSONEncoder` with `[.sortedKeys, .withoutEscapingSlashes]`,
    /// written directly. Throws `EncodingError` for a default value that is not a finite number.
    public func canonicalJSON() throws -> Data {
        Data(try canonicalBytes())
    }
}

extension Schema {
    /// This schema as plain data.
    public var schemaDescription: SchemaDescription {
        SchemaDescription(
            entities: entities.map { entity in
                SchemaDescription.Entity(
                    name: entity.name,
                    properties: entity.properties.map { property in
                        SchemaDescription.Property(
                            name: property.name, kind: "\(property.kind)", storageType: property.codec.storageType,
                            isOptional: property.isStoredOptional, typeName: property.codec.typeName,
                            isUnique: property.isUnique, isIndexed: property.isIndexed,
                            originalName: property.originalName, destination: property.destinationName,
                            deleteRule: property.deleteRule, inverse: inverse(of: property, in: entity)?.name,
                            isRequired: property.isRequired, defaultValue: Self.constantDefault(of: property),
                            isOrdered: property.isOrdered)
                    },
                    indexes: entity.indexes, originalName: entity.originalName,
                    subentities: entity.hierarchy.map { hierarchy in
                        hierarchy.members.dropFirst().map { member in
                            SchemaDescription.Subentity(
                                name: member.name, parent: member.parent ?? hierarchy.root,
                                properties: member.ownProperties,
                                nonOptional: member.ownProperties.filter { name in
                                    entity.property(named: name).map { $0.kind == .attribute && !$0.codec.isOptional }
                                        ?? false
                                },
                                originalName: member.originalName)
                        }
                    })
            })
    }

    /// An attribute's default when it is the same value each time it is made (`Date()` is not).
    private static func constantDefault(of property: PropertyDescription) -> StoredValue? {
        guard property.kind == .attribute, let first = try? property.makeDefault(), !first.isNull else { return nil }
        // A default made from the clock can come out equal twice in a row: a `Date` holds
        // seconds since 2001 in a Double, whose resolution today is about 0.12 µs, so two
        // `Date()` made within it are equal, and the description (and the fingerprint every
        // hello carries) would change from one process to the next. The second value is made
        // at least 2 µs after the first.
        let start = DispatchTime.now().uptimeNanoseconds
        while DispatchTime.now().uptimeNanoseconds &- start < 2_000 {}
        guard let second = try? property.makeDefault(), first == second else { return nil }
        return first
    }

    /// A schema rebuilt from its description, without the entity classes. Its objects can be
    /// stored, fetched and saved (as values); typed access needs the real classes.
    public convenience init(description: SchemaDescription, version: Int = 1) throws {
        var entities: [EntityDescription] = []
        for entity in description.entities {
            var properties: [PropertyDescription] = []
            // A subentity's own columns hold NULL in the other entities' rows; whether the
            // property is optional is what the subentity declares.
            let subentityColumns = Set(entity.subentities?.flatMap(\.properties) ?? [])
            let nonOptional = Set(entity.subentities?.flatMap { $0.nonOptional ?? [] } ?? [])
            for property in entity.properties {
                let kind: PropertyDescription.Kind
                switch property.kind {
                case "attribute": kind = .attribute
                case "toOne": kind = .toOne
                case "toMany": kind = .toMany
                default:
                    throw SkyrosError(
                        .invalidSchema, "\(entity.name).\(property.name) has an unknown kind \(property.kind)")
                }
                let codec = AttributeCodec<StoredValue>(
                    storageType: property.storageType,
                    isOptional: property.isOptional && !nonOptional.contains(property.name),
                    typeName: property.typeName, decode: { $0 }, encode: { $0 })
                properties.append(
                    PropertyDescription(
                        name: property.name, kind: kind, keyPath: \DynamicObject.skyrosStorage, codec: codec,
                        makeDefault: { [value = property.defaultValue?.value] in value ?? .null },
                        isUnique: property.isUnique, isIndexed: property.isIndexed,
                        originalName: property.originalName, destinationName: property.destination,
                        deleteRule: property.deleteRule, inverseName: property.inverse, isRequired: property.isRequired,
                        isOrdered: property.isOrdered == true,
                        isSubentityColumn: subentityColumns.contains(property.name)))
            }
            entities.append(
                EntityDescription(
                    objectType: DynamicObject.self, name: entity.name, originalName: entity.originalName,
                    properties: properties, indexes: entity.indexes,
                    hierarchy: try Schema.hierarchy(of: entity, properties: properties)))
        }
        self.init(entities: entities, version: version)
        try validate()
    }
}

/// The object class of entities rebuilt from a ``SchemaDescription``.
final class DynamicObject: ManagedObject {
    static var entityDescription: EntityDescription {
        preconditionFailure("Skyros: entities rebuilt from a description have no static description")
    }
    let skyrosStorage: ObjectStorage
    init(skyrosStorage: ObjectStorage) { self.skyrosStorage = skyrosStorage }
}
