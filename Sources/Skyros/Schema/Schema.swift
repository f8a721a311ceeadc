import Foundation

/// The set of entities a stack stores.
///
/// ```swift
/// let schema = Schema([User.self, Post.self])
/// ```
///
/// Relationships are resolved and checked when the schema is made; a stack refuses to open
/// with an invalid schema (``validate()`` throws ``SkyrosError/Code/invalidSchema``, naming
/// the entity and the relationship). The ``fingerprint`` is a stable hash of the
/// declarations: the same declarations give the same fingerprint in every process and run.
public final class Schema: Sendable {
    /// The entities, in the order given.
    public let entities: [EntityDescription]
    let entitiesByName: [String: EntityDescription]
    /// For each entity and relationship index: the inverse property, if any.
    let inverses: [String: [Int: PropertyDescription]]
    /// The problems found in the declarations; empty for a valid schema.
    public let validationErrors: [String]
    /// A stable hash of the declarations (entity and property names, types, options,
    /// relationships), as 32 hexadecimal digits.
    public let fingerprint: String
    /// Whether any entity has a unique attribute (otherwise saves have nothing to check).
    let hasUniqueAttributes: Bool
    /// Whether any entity's class has validation rules (``ValidatingObject``).
    let hasValidatingEntities: Bool
    /// The version of the model, 1 or more: the application raises it when it changes its
    /// entities. Not part of the ``fingerprint``; a shared stack's hello carries it.
    public let version: Int

    /// Makes a schema of the given managed object classes.
    ///
    /// - Parameters:
    ///   - types: the `@Entity` classes (or hand-written ``ManagedObject`` classes), each once.
    ///   - version: the version of the model (1 or more).
    public convenience init(_ types: [any ManagedObject.Type], version: Int = 1) {
        self.init(entities: types.map { $0.entityDescription }, version: version)
    }

    init(entities: [EntityDescription], version: Int = 1) {
        self.version = max(1, version)
        self.entities = entities
        var byName: [String: EntityDescription] = [:]
        var errors: [String] = []
        for entity in entities {
            if byName[entity.name] != nil { errors.append("entity \(entity.name) is declared twice") }
            byName[entity.name] = entity
        }
        self.entitiesByName = byName
        hasUniqueAttributes = entities.contains { !$0.uniqueProperties.isEmpty }
        hasValidatingEntities = entities.contains(where: \.isValidating)
        var inverses: [String: [Int: PropertyDescription]] = [:]
        for entity in entities {
            for index in entity.indexes {
                for name in index where entity.property(named: name)?.hasColumn != true {
                    errors.append("\(entity.name): the index on \(index) names \(name), which is not an attribute or to-one")
                }
            }
            for property in entity.properties {
                if property.name.hasPrefix("_") {
                    errors.append("\(entity.name).\(property.name): property names may not start with '_'")
                }
                guard property.isRelationship else { continue }
                let label = "\(entity.name).\(property.name)"
                guard let destinationName = property.destinationName, let destination = byName[destinationName] else {
                    errors.append("\(label): destination \(property.destinationName ?? "?") is not in the schema")
                    continue
                }
                switch Schema.resolveInverse(of: property, in: entity, destination: destination) {
                case .success(let inverse):
                    if let inverse { inverses[entity.name, default: [:]][property.index] = inverse }
                case .failure(let message):
                    errors.append("\(label): \(message)")
                }
            }
        }
        self.inverses = inverses
        self.validationErrors = errors
        self.fingerprint = Schema.fingerprint(of: entities, inverses: inverses)
    }

    /// Throws ``SkyrosError/Code/invalidSchema`` listing every problem of the declarations.
    public func validate() throws {
        if !validationErrors.isEmpty {
            throw SkyrosError(.invalidSchema, "invalid schema: " + validationErrors.joined(separator: "; "))
        }
    }

    /// The entity with this name.
    public func entity(named name: String) -> EntityDescription? { entitiesByName[name] }

    func requireEntity(_ name: String) throws -> EntityDescription {
        guard let entity = entitiesByName[name] else {
            throw SkyrosError(.unknownEntity, "entity \(name) is not in the schema")
        }
        return entity
    }

    /// The inverse of a relationship.
    public func inverse(of property: PropertyDescription, in entity: EntityDescription) -> PropertyDescription? {
        inverses[entity.name]?[property.index]
    }

    private enum Resolution { case success(PropertyDescription?), failure(String) }

    private static func resolveInverse(
        of property: PropertyDescription, in entity: EntityDescription, destination: EntityDescription
    ) -> Resolution {
        let pointingBack = destination.properties.filter {
            $0.isRelationship && $0.destinationName == entity.name && $0 !== property
        }
        var inverse: PropertyDescription?
        if let name = property.inverseName {
            guard let found = destination.property(named: name), found.isRelationship,
                found.destinationName == entity.name
            else {
                return .failure("its inverse \(destination.name).\(name) is not a relationship to \(entity.name)")
            }
            inverse = found
        } else if let keyPath = property.inverseKeyPath {
            guard let found = destination.property(for: keyPath) else {
                return .failure("its inverse is not a persistent property of \(destination.name)")
            }
            guard found.isRelationship, found.destinationName == entity.name else {
                return .failure("its inverse \(destination.name).\(found.name) is not a relationship to \(entity.name)")
            }
            inverse = found
        } else if let declared = pointingBack.first(where: { $0.inverseKeyPath == property.keyPath }) {
            inverse = declared
        } else if property.kind == .toMany {
            let candidates = pointingBack.filter { $0.kind == .toOne && $0.inverseKeyPath == nil }
            guard candidates.count == 1 else {
                return .failure(
                    candidates.isEmpty
                        ? "a to-many relationship needs a to-one inverse in \(destination.name)"
                        : "several to-one relationships of \(destination.name) could be its inverse; name one with inverse:")
            }
            inverse = candidates[0]
        } else {
            // A to-one without a declared inverse: the inverse is a to-many of the destination that names it, if any.
            let toMany = pointingBack.filter { $0.kind == .toMany && $0.inverseKeyPath == nil }
            if toMany.count == 1, pointingBack.filter({ $0.kind == .toOne }).isEmpty { inverse = toMany[0] }
        }
        if let inverse {
            if property.kind == .toMany && inverse.kind == .toMany {
                return .failure("many-to-many relationships are not supported yet")
            }
            if inverse.inverseName == nil, let back = inverse.inverseKeyPath, back != property.keyPath {
                return .failure("its inverse \(destination.name).\(inverse.name) names another inverse")
            }
        } else if property.kind == .toMany {
            return .failure("a to-many relationship needs a to-one inverse in \(destination.name)")
        }
        return .success(inverse)
    }

    /// The canonical text the ``fingerprint`` hashes (docs/PROTOCOL.md, "Schema fingerprint").
    public var fingerprintText: String { Schema.fingerprintText(of: entities, inverses: inverses) }

    private static func fingerprint(of entities: [EntityDescription], inverses: [String: [Int: PropertyDescription]])
        -> String
    {
        StableHash.hex128(Array(fingerprintText(of: entities, inverses: inverses).utf8))
    }

    private static func fingerprintText(of entities: [EntityDescription], inverses: [String: [Int: PropertyDescription]])
        -> String
    {
        var text = "skyros-schema-2\n"
        for entity in entities.sorted(by: { $0.name < $1.name }) {
            text += "entity \(entity.name)\n"
            for property in entity.properties {
                text += "  \(property.index) \(property.name) \(property.kind) \(property.codec.storageType.rawValue)"
                text += property.codec.isOptional ? "?" : "!"
                if property.kind == .attribute { text += " \(property.codec.typeName)" }
                if property.isUnique { text += " unique" }
                if property.isIndexed { text += " indexed" }
                if let destination = property.destinationName {
                    text += " -> \(destination) \(property.deleteRule.rawValue)"
                    if let inverse = inverses[entity.name]?[property.index] { text += " inverse \(inverse.name)" }
                    if property.isRequired { text += " required" }
                }
                text += "\n"
            }
            for index in entity.indexes { text += "  index \(index.joined(separator: ","))\n" }
        }
        return text
    }
}

/// A process-independent 128-bit hash (two FNV-1a 64-bit lanes with different offsets).
enum StableHash {
    static func hex128(_ bytes: [UInt8]) -> String {
        var a: UInt64 = 0xcbf2_9ce4_8422_2325
        var b: UInt64 = 0x6c62_272e_07bb_0142
        for byte in bytes {
            a = (a ^ UInt64(byte)) &* 0x0000_0100_0000_01B3
            b = (b ^ UInt64(byte ^ 0x5A)) &* 0x0000_0100_0000_01B3
        }
        func hex16(_ lane: UInt64) -> String {
            let digits = String(lane, radix: 16)
            return String(repeating: "0", count: 16 - digits.count) + digits
        }
        return hex16(a) + hex16(b)
    }
}
