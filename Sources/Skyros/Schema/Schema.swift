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
    /// The entities, in the order given, followed by the link entity of each many-to-many
    /// relationship (see ``linkEntityName(ownerEntity:property:)``).
    public let entities: [EntityDescription]
    /// The entities by name; a subentity's name gives its hierarchy's entity.
    let entitiesByName: [String: EntityDescription]
    /// The same pairs in a list, for a schema of at most ``maximumScannedNames`` names: looked
    /// through by equality, cheaper than hashing the name (a short name compares as two words).
    private let namedEntities: [(name: String, entity: EntityDescription)]?
    /// The entity storing each class's objects, and for a class of a hierarchy its place there.
    let entitiesByType: [ObjectIdentifier: (entity: EntityDescription, member: EntityHierarchy.Member?)]
    /// For each entity and relationship index: the inverse property, if any.
    let inverses: [String: [Int: PropertyDescription]]
    /// For each entity and many-to-many relationship index: where its links are.
    let links: [String: [Int: LinkRoute]]
    /// For each entity and ordered to-many index: where its objects' positions are (`own` is
    /// the order entity's to-one to the owner, `other` the one to the object placed).
    let orders: [String: [Int: LinkRoute]]
    /// For each entity and to-one index whose inverse is an ordered to-many: that to-many's
    /// owner entity, property and order route.
    let orderedInverses: [String: [Int: (owner: EntityDescription, property: PropertyDescription, route: LinkRoute)]]
    /// The names of the order entities of ordered to-manys.
    let orderEntityNames: Set<String>
    /// For each entity holding positions (an order entity, or the link entity of an ordered
    /// many-to-many): which of its to-ones points to the object whose list is ordered.
    let positionSides: [String: Int]
    /// The names of the entities whose rows are keyed by a pair of objects: the link entities
    /// of many-to-manys and the order entities of ordered to-manys. The store inserts links
    /// `OR IGNORE` and positions as upserts (the last saver's position), skips updates and
    /// deletes of rows that are gone, and their to-ones cascade.
    let linkEntityNames: Set<String>
    /// For each link entity: the relationships whose links it holds (entity, property name,
    /// and which of the link's to-ones points to that entity's object).
    let linkEnds: [String: [(entity: String, property: String, own: Int)]]
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
        let (entities, errors) = Schema.storageEntities(of: types.map { $0.entityDescription })
        self.init(entities: entities, version: version, errors: errors)
    }

    init(entities: [EntityDescription], version: Int = 1, errors declarationErrors: [String] = []) {
        self.version = max(1, version)
        var byName: [String: EntityDescription] = [:]
        var errors: [String] = declarationErrors
        for entity in entities {
            if byName[entity.name] != nil { errors.append("entity \(entity.name) is declared twice") }
            byName[entity.name] = entity
        }
        hasUniqueAttributes = entities.contains { !$0.uniqueProperties.isEmpty }
        hasValidatingEntities = entities.contains(where: \.isValidating)
        var inverses: [String: [Int: PropertyDescription]] = [:]
        for entity in entities {
            for index in entity.indexes {
                for name in index where entity.property(named: name)?.hasColumn != true {
                    errors.append(
                        "\(entity.name): the index on \(index) names \(name), which is not an attribute or to-one")
                }
            }
            for property in entity.properties {
                if property.name.hasPrefix("_"), entity.hierarchy?.entityIndex != property.index {
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
        // Many-to-many relationships: each pair's links are the rows of a link entity, made
        // here (or found, in a schema rebuilt from a description, which lists it).
        var allEntities = entities
        var links: [String: [Int: LinkRoute]] = [:]
        var linkEntityNames = Set<String>()
        var positionSides: [String: Int] = [:]
        for entity in entities {
            for property in entity.relationships where property.kind == .toMany {
                guard let inverse = inverses[entity.name]?[property.index], inverse.kind == .toMany,
                    let destination = byName[property.destinationName!]
                else { continue }
                let label = "\(entity.name).\(property.name)"
                let otherLabel = "\(destination.name).\(inverse.name)"
                if property.isOrdered && inverse.isOrdered {
                    if label <= otherLabel {
                        errors.append(
                            "\(label): a many-to-many relationship ordered on both sides is not supported yet (order one side)"
                        )
                    }
                    continue
                }
                if inverse === property {
                    errors.append("\(label): a many-to-many relationship that is its own inverse is not supported yet")
                    continue
                }
                let isOwner = label < otherLabel
                let (ownerEntity, ownerProperty, otherEntity) =
                    isOwner
                    ? (entity, property, destination) : (destination, inverse, entity)
                let name = Schema.linkEntityName(ownerEntity: ownerEntity.name, property: ownerProperty.name)
                // An ordered many-to-many: its links hold the ordered side's positions.
                let positioned = property.isOrdered || inverse.isOrdered
                guard
                    let link = Schema.pairEntity(
                        name, of: ownerEntity, ownerProperty, declared: byName, all: &allEntities,
                        hasShape: {
                            positioned
                                ? Schema.hasOrderShape($0, source: ownerEntity.name, target: otherEntity.name)
                                : Schema.hasLinkShape($0, source: ownerEntity.name, target: otherEntity.name)
                        },
                        make: {
                            positioned
                                ? Schema.makeOrderEntity(
                                    name, source: ownerEntity.name, target: otherEntity.name, originalName: $0)
                                : Schema.makeLinkEntity(
                                    name, source: ownerEntity.name, target: otherEntity.name, originalName: $0)
                        })
                else {
                    errors.append(
                        "\(label): the entity \(name) is not the link entity of this many-to-many relationship")
                    continue
                }
                linkEntityNames.insert(name)
                if property.isOrdered { positionSides[name] = isOwner ? 0 : 1 }
                links[entity.name, default: [:]][property.index] = LinkRoute(
                    entity: link, own: isOwner ? 0 : 1, other: isOwner ? 1 : 0, isOrdered: property.isOrdered)
            }
        }

        // Ordered to-manys: the positions of their objects are the rows of an order entity, made
        // here (or found, in a schema rebuilt from a description).
        var orders: [String: [Int: LinkRoute]] = [:]
        var orderedInverses:
            [String: [Int: (owner: EntityDescription, property: PropertyDescription, route: LinkRoute)]] = [:]
        var orderEntityNames = Set<String>()
        for entity in entities {
            for property in entity.properties where property.isOrdered {
                let label = "\(entity.name).\(property.name)"
                guard property.kind == .toMany else {
                    errors.append("\(label): only a to-many relationship can be ordered")
                    continue
                }
                guard let inverse = inverses[entity.name]?[property.index], inverse.kind == .toOne,
                    let destination = byName[property.destinationName!]
                else { continue }  // a many-to-many (its links hold the positions) or an error already listed
                let name = Schema.linkEntityName(ownerEntity: entity.name, property: property.name)
                guard
                    let order = Schema.pairEntity(
                        name, of: entity, property, declared: byName, all: &allEntities,
                        hasShape: { Schema.hasOrderShape($0, source: entity.name, target: destination.name) },
                        make: {
                            Schema.makeOrderEntity(
                                name, source: entity.name, target: destination.name, originalName: $0)
                        })
                else {
                    errors.append("\(label): the entity \(name) is not the order entity of this ordered relationship")
                    continue
                }
                orderEntityNames.insert(name)
                linkEntityNames.insert(name)
                positionSides[name] = 0
                let route = LinkRoute(entity: order, own: 0, other: 1)
                orders[entity.name, default: [:]][property.index] = route
                orderedInverses[destination.name, default: [:]][inverse.index] = (entity, property, route)
            }
        }

        self.entities = allEntities
        self.orders = orders
        self.orderedInverses = orderedInverses
        self.orderEntityNames = orderEntityNames
        self.positionSides = positionSides
        var entitiesByName = Dictionary(allEntities.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        var entitiesByType: [ObjectIdentifier: (entity: EntityDescription, member: EntityHierarchy.Member?)] = [:]
        for entity in allEntities {
            guard let hierarchy = entity.hierarchy else {
                if entity.objectType != DynamicObject.self {
                    entitiesByType[ObjectIdentifier(entity.objectType)] = (entity, nil)
                }
                continue
            }
            for member in hierarchy.members {
                if member.parent != nil {
                    if entitiesByName[member.name] != nil {
                        errors.append("entity \(member.name) is declared twice")
                    }
                    entitiesByName[member.name] = entity
                }
                if member.type != DynamicObject.self {
                    entitiesByType[ObjectIdentifier(member.type)] = (entity, member)
                }
            }
        }
        self.entitiesByName = entitiesByName
        if entitiesByName.count <= Self.maximumScannedNames {
            // The entities in their order (the first ones declared are looked up first), then subentities.
            var named: [(name: String, entity: EntityDescription)] = []
            for entity in allEntities
            where entitiesByName[entity.name] === entity && !named.contains(where: { $0.name == entity.name }) {
                named.append((entity.name, entity))
            }
            for (name, entity) in entitiesByName where !named.contains(where: { $0.name == name }) {
                named.append((name, entity))
            }
            namedEntities = named
        } else {
            namedEntities = nil
        }
        self.entitiesByType = entitiesByType
        self.links = links
        self.linkEntityNames = linkEntityNames
        var linkEnds: [String: [(entity: String, property: String, own: Int)]] = [:]
        for (entityName, routes) in links {
            guard let entity = byName[entityName] else { continue }
            for (index, route) in routes {
                linkEnds[route.entity.name, default: []].append((entityName, entity.properties[index].name, route.own))
            }
        }
        for (entityName, routes) in orders {
            guard let entity = byName[entityName] else { continue }
            for (index, route) in routes {
                let property = entity.properties[index]
                linkEnds[route.entity.name, default: []].append((entityName, property.name, 0))
                if let inverse = inverses[entityName]?[index] {
                    linkEnds[route.entity.name, default: []].append((property.destinationName!, inverse.name, 1))
                }
            }
        }
        self.linkEnds = linkEnds
        self.inverses = inverses
        self.validationErrors = errors
        self.fingerprint = Schema.fingerprint(of: allEntities, inverses: inverses)
    }

    // MARK: - Many-to-many

    /// Where a many-to-many relationship's links are: its link entity, and which of the link
    /// entity's two to-ones points to this side's object (`own`) and to the other side's (`other`).
    struct LinkRoute: Sendable {
        let entity: EntityDescription
        let own: Int
        let other: Int
        /// Whether this side's list is ordered (the rows' `position`).
        var isOrdered = false

        /// The route from the other side.
        var reversed: LinkRoute { LinkRoute(entity: entity, own: other, other: own) }
    }

    /// The link or order entity `name` of a relationship: found (a schema rebuilt from a
    /// description lists it) when it has the shape expected (nil when it does not), or made and
    /// appended to `all`. When the owner's entity or property was renamed, a made one is renamed
    /// from the name it had (its table, and the links or positions in it, are kept).
    private static func pairEntity(
        _ name: String, of owner: EntityDescription, _ property: PropertyDescription,
        declared: [String: EntityDescription], all: inout [EntityDescription],
        hasShape: (EntityDescription) -> Bool, make: (String?) -> EntityDescription
    ) -> EntityDescription? {
        if let found = declared[name] ?? all.first(where: { $0.name == name }) { return hasShape(found) ? found : nil }
        let originalName =
            owner.originalName != nil || property.originalName != nil
            ? linkEntityName(
                ownerEntity: owner.originalName ?? owner.name, property: property.originalName ?? property.name)
            : nil
        let made = make(originalName)
        all.append(made)
        return made
    }

    /// The name of the link entity of a many-to-many relationship: `_<Entity>_<property>`, named
    /// after the side whose `Entity.property` comes first in code-point order (the owner).
    public static func linkEntityName(ownerEntity: String, property: String) -> String {
        "_\(ownerEntity)_\(property)"
    }

    /// A link entity: two to-ones, `source` to the owner's entity and `target` to the other side's.
    static func makeLinkEntity(_ name: String, source: String, target: String, originalName: String? = nil)
        -> EntityDescription
    {
        EntityDescription(
            DynamicObject.self, name: name, originalName: originalName,
            properties: [linkSide("source", source), linkSide("target", target)])
    }

    /// One of a link's or an order's two to-ones, indexed.
    private static func linkSide(_ name: String, _ destination: String) -> PropertyDescription {
        PropertyDescription(
            name: name, kind: .toOne, keyPath: \DynamicObject.skyrosStorage,
            codec: AttributeCodecs.codec(for: UUID?.self)!,
            makeDefault: { .null }, isIndexed: true, destinationName: destination)
    }

    /// An order entity: `source` (to the ordered to-many's entity), `target` (to the object
    /// placed) and `position`, a 64-bit integer; one row per object in the relationship.
    static func makeOrderEntity(_ name: String, source: String, target: String, originalName: String? = nil)
        -> EntityDescription
    {
        let position = PropertyDescription(
            name: "position", kind: .attribute, keyPath: \DynamicObject.skyrosStorage,
            codec: AttributeCodecs.codec(for: Int64.self)!, makeDefault: { .integer(0) })
        return EntityDescription(
            DynamicObject.self, name: name, originalName: originalName,
            properties: [linkSide("source", source), linkSide("target", target), position])
    }

    /// Whether an entity (of a schema rebuilt from a description) has an order entity's shape.
    static func hasOrderShape(_ entity: EntityDescription, source: String, target: String) -> Bool {
        let properties = entity.properties
        return properties.count == 3 && properties[2].name == "position" && properties[2].kind == .attribute
            && properties[2].codec.storageType == .integer && hasLinkSides(properties, source: source, target: target)
    }

    /// Where the positions of an ordered to-many's objects are; nil for any other property.
    func orderRoute(of property: PropertyDescription, in entity: EntityDescription) -> LinkRoute? {
        orders.isEmpty ? nil : orders[entity.name]?[property.index]
    }

    /// Whether the entity holds the positions of an ordered to-many.
    func isOrderEntity(_ name: String) -> Bool { !orderEntityNames.isEmpty && orderEntityNames.contains(name) }

    /// Whether the entity's rows hold positions: an order entity, or the link entity of an
    /// ordered many-to-many.
    func hasPositions(_ name: String) -> Bool { !positionSides.isEmpty && positionSides[name] != nil }

    /// Whether an entity (of a schema rebuilt from a description) has a link entity's shape.
    static func hasLinkShape(_ entity: EntityDescription, source: String, target: String) -> Bool {
        entity.properties.count == 2 && hasLinkSides(entity.properties, source: source, target: target)
    }

    /// Whether the first two properties are a link's to-ones, `source` and `target`.
    private static func hasLinkSides(_ properties: [PropertyDescription], source: String, target: String) -> Bool {
        properties.count >= 2 && properties[0...1].allSatisfy { $0.kind == .toOne }
            && properties[0].name == "source" && properties[0].destinationName == source
            && properties[1].name == "target" && properties[1].destinationName == target
    }

    /// Where the links of a many-to-many relationship are; nil for any other property.
    func linkRoute(of property: PropertyDescription, in entity: EntityDescription) -> LinkRoute? {
        links.isEmpty ? nil : links[entity.name]?[property.index]
    }

    /// Whether the entity holds the links of a many-to-many relationship.
    func isLinkEntity(_ name: String) -> Bool { !linkEntityNames.isEmpty && linkEntityNames.contains(name) }

    /// The identifier of the link between two objects: derived from the pair (a hash of both
    /// identifiers), so that the pair is the key, every process makes the same identifier for
    /// it, and adding it twice is one link. The link entity's name is not part of it: a rename
    /// keeps the links' identifiers.
    static func linkID(_ link: EntityDescription, source: UUID, target: UUID) -> ObjectID {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(32)
        withUnsafeBytes(of: source.uuid) { bytes += $0 }
        withUnsafeBytes(of: target.uuid) { bytes += $0 }
        var digest = StableHash.bytes128(bytes)
        digest[6] = (digest[6] & 0x0F) | 0x80  // version 8: custom
        digest[8] = (digest[8] & 0x3F) | 0x80  // RFC 4122 variant
        let uuid = UUID(
            uuid: (
                digest[0], digest[1], digest[2], digest[3], digest[4], digest[5], digest[6], digest[7],
                digest[8], digest[9], digest[10], digest[11], digest[12], digest[13], digest[14], digest[15]
            ))
        return ObjectID(entityName: link.name, uuid: uuid)
    }

    /// Throws ``SkyrosError/Code/invalidSchema`` listing every problem of the declarations.
    public func validate() throws {
        if !validationErrors.isEmpty {
            throw SkyrosError(.invalidSchema, "invalid schema: " + validationErrors.joined(separator: "; "))
        }
    }

    /// The entity with this name; for a subentity, the entity of its hierarchy's table (the
    /// root's name, every class's properties).
    public func entity(named name: String) -> EntityDescription? {
        // Several lookups per save and per merged change: hashing a name costs more than
        // comparing it with a few.
        guard let namedEntities else { return entitiesByName[name] }
        for pair in namedEntities where pair.name == name { return pair.entity }
        return nil
    }

    /// The most names ``entity(named:)`` compares one by one instead of hashing.
    private static var maximumScannedNames: Int { 8 }

    func requireEntity(_ name: String) throws -> EntityDescription {
        guard let entity = entity(named: name) else {
            throw SkyrosError(.unknownEntity, "entity \(name) is not in the schema")
        }
        return entity
    }

    /// The inverse of a relationship.
    public func inverse(of property: PropertyDescription, in entity: EntityDescription) -> PropertyDescription? {
        inverses[entity.name]?[property.index]
    }

    private enum Resolution {
        case success(PropertyDescription?)
        case failure(String)
    }

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
                        : "several to-one relationships of \(destination.name) could be its inverse; name one with inverse:"
                )
            }
            inverse = candidates[0]
        } else {
            // A to-one without a declared inverse: the inverse is a to-many of the destination that names it, if any.
            let toMany = pointingBack.filter { $0.kind == .toMany && $0.inverseKeyPath == nil }
            if toMany.count == 1, pointingBack.filter({ $0.kind == .toOne }).isEmpty { inverse = toMany[0] }
        }
        if let inverse {
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

    private static func fingerprintText(
        of entities: [EntityDescription], inverses: [String: [Int: PropertyDescription]]
    )
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
                    if property.isOrdered { text += " ordered" }
                }
                text += "\n"
            }
            for index in entity.indexes { text += "  index \(index.joined(separator: ","))\n" }
            for member in entity.hierarchy?.members.dropFirst() ?? [] {
                text +=
                    "  subentity \(member.name) < \(member.parent ?? "?"): \(member.ownProperties.joined(separator: ","))\n"
            }
        }
        return text
    }
}

/// A process-independent 128-bit hash (two FNV-1a 64-bit lanes with different offsets).
enum StableHash {
    /// The two lanes' 16 bytes, big-endian.
    static func bytes128(_ bytes: [UInt8]) -> [UInt8] {
        let (a, b) = lanes(bytes)
        return withUnsafeBytes(of: a.bigEndian) { Array($0) } + withUnsafeBytes(of: b.bigEndian) { Array($0) }
    }

    static func lanes(_ bytes: [UInt8]) -> (UInt64, UInt64) {
        var a: UInt64 = 0xcbf2_9ce4_8422_2325
        var b: UInt64 = 0x6c62_272e_07bb_0142
        for byte in bytes {
            a = (a ^ UInt64(byte)) &* 0x0000_0100_0000_01B3
            b = (b ^ UInt64(byte ^ 0x5A)) &* 0x0000_0100_0000_01B3
        }
        return (a, b)
    }

    static func hex128(_ bytes: [UInt8]) -> String {
        let (a, b) = lanes(bytes)
        func hex16(_ lane: UInt64) -> String {
            let digits = String(lane, radix: 16)
            return String(repeating: "0", count: 16 - digits.count) + digits
        }
        return hex16(a) + hex16(b)
    }
}
