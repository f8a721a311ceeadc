import Foundation
import Skyros
import SkyrosWire

/// How a client of an earlier schema version sees a store that was migrated past it: its
/// entities and properties matched to the store's through every recorded version in between
/// (by name, else by `originalName`, as a migration matches them), and what the daemon does
/// to translate that client's requests, replies and events (docs/PROTOCOL.md, "Mixed schema
/// versions").
///
/// A value: no socket, no store. Made once per older version a client says hello with.
struct SchemaProjection: Sendable, Equatable {
    /// One entity of the client's schema and its counterpart in the store's.
    struct EntityMap: Sendable, Equatable {
        var oldName: String
        var currentName: String
        var oldProperties: [SchemaDescription.Property]
        var currentProperties: [SchemaDescription.Property]
        /// For each property of the client's entity: the index of its counterpart in the store's.
        var toCurrent: [Int?]
        /// For each property of the store's entity: the index of its counterpart in the client's.
        var toOld: [Int?]
        /// For each property of the client's entity the store no longer has: what the client is sent.
        var oldFill: [StoredValue]
        /// For each property of the store's entity the client does not have: its value in an
        /// object the client inserts (its default, NULL when optional or a relationship; nil:
        /// none is known, and the client cannot insert such objects).
        var insertValues: [StoredValue?]

        func oldIndex(of name: String) -> Int? { oldProperties.firstIndex { $0.name == name } }
    }

    /// The client's schema version and the store's.
    let version: Int
    let currentVersion: Int
    /// By the client's entity name.
    private(set) var entities: [String: EntityMap] = [:]
    /// The client's entity name of each of the store's entities it has.
    private(set) var oldNames: [String: String] = [:]

    /// Matches `chain` — the client's description first, then every recorded version after it,
    /// the store's current description last — or throws ``SkyrosError/Code/schemaMismatch``
    /// naming what cannot be projected.
    init(chain: [(version: Int, description: SchemaDescription)]) throws {
        guard let first = chain.first, let last = chain.last else {
            throw SkyrosError(.schemaMismatch, "no schema to project")
        }
        version = first.version
        currentVersion = last.version
        // For each entity of the client's: its name in each later version, and for each of its
        // properties, the index in each later version (nil: gone).
        var names: [String: String?] = [:]  // old entity name → current entity name (nil: gone)
        var indexes: [String: [Int?]] = [:]  // old entity name → old property index → current index
        for entity in first.description.entities {
            names[entity.name] = entity.name
            indexes[entity.name] = entity.properties.indices.map { $0 }
        }
        for (older, newer) in zip(chain, chain.dropFirst()) {
            let step = Self.match(older.description, newer.description)
            for (old, name) in names {
                guard let name else { continue }
                guard let matched = step[name] else {
                    names[old] = .some(nil)
                    continue
                }
                names[old] = matched.name
                indexes[old] = indexes[old]!.map { index in index.flatMap { matched.properties[$0] } }
            }
        }
        let current = Dictionary(last.description.entities.map { ($0.name, $0) }, uniquingKeysWith: { a, _ in a })
        for entity in first.description.entities {
            let label = "version \(version)'s \(entity.name)"
            guard let currentName = names[entity.name] ?? nil, let target = current[currentName] else {
                throw SkyrosError(
                    .schemaMismatch,
                    "\(label) is no longer in the store's schema (version \(currentVersion)): a client of version \(version) cannot be served"
                )
            }
            let toCurrent = indexes[entity.name]!
            var toOld = [Int?](repeating: nil, count: target.properties.count)
            var oldFill = [StoredValue](repeating: .null, count: entity.properties.count)
            for (oldIndex, property) in entity.properties.enumerated() {
                guard let index = toCurrent[oldIndex] else {
                    // Removed since: the client is sent its default, or NULL.
                    if property.kind == "attribute" && !property.isOptional {
                        guard let value = property.defaultValue?.value else {
                            throw SkyrosError(
                                .schemaMismatch,
                                "\(entity.name).\(property.name) of version \(version) is no longer in the store's schema (version \(currentVersion)) and has no default to send in its place"
                            )
                        }
                        oldFill[oldIndex] = value
                    }
                    continue
                }
                toOld[index] = oldIndex
                let now = target.properties[index]
                let name = "\(entity.name).\(property.name) of version \(version)"
                if now.kind != property.kind || now.storageType != property.storageType
                    || now.typeName != property.typeName
                {
                    throw SkyrosError(
                        .schemaMismatch,
                        "\(name) is \(Self.describe(property)), but \(currentName).\(now.name) in the store's schema (version \(currentVersion)) is \(Self.describe(now)): its values cannot be translated"
                    )
                }
                if property.kind == "attribute" && !property.isOptional && now.isOptional {
                    throw SkyrosError(
                        .schemaMismatch,
                        "\(name) is not optional, but \(currentName).\(now.name) in the store's schema (version \(currentVersion)) is: the client cannot read a missing value"
                    )
                }
                if property.kind != "attribute", let destination = property.destination,
                    (names[destination] ?? nil) != now.destination
                {
                    throw SkyrosError(
                        .schemaMismatch,
                        "\(name) leads to \(destination), but \(currentName).\(now.name) leads to \(now.destination ?? "?") in the store's schema (version \(currentVersion))"
                    )
                }
            }
            let insertValues = target.properties.enumerated().map { index, property -> StoredValue? in
                if toOld[index] != nil || property.kind != "attribute" || property.isOptional {
                    return property.defaultValue?.value ?? .null
                }
                return property.defaultValue?.value
            }
            entities[entity.name] = EntityMap(
                oldName: entity.name, currentName: currentName, oldProperties: entity.properties,
                currentProperties: target.properties, toCurrent: toCurrent, toOld: toOld, oldFill: oldFill,
                insertValues: insertValues)
            oldNames[currentName] = entity.name
        }
    }

    private static func describe(_ property: SchemaDescription.Property) -> String {
        property.kind == "attribute"
            ? "an attribute of type \(property.typeName)"
            : "a \(property.kind) relationship to \(property.destination ?? "?")"
    }

    /// One step, as a migration infers it: each entity of `older` matched by name in `newer`,
    /// else by a newer entity's `originalName`; within it, each property likewise.
    private static func match(_ older: SchemaDescription, _ newer: SchemaDescription)
        -> [String: (name: String, properties: [Int: Int])]
    {
        let entityMatches = RenameInference.match(
            newer: newer.entities.map(\.name), originalNames: newer.entities.map(\.originalName),
            older: older.entities.map(\.name))
        var result: [String: (name: String, properties: [Int: Int])] = [:]
        for (entity, previous) in zip(newer.entities, entityMatches) {
            guard let previous else { continue }
            let old = older.entities[previous]
            var properties: [Int: Int] = [:]  // older index → newer index
            let propertyMatches = RenameInference.match(
                newer: entity.properties.map(\.name), originalNames: entity.properties.map(\.originalName),
                older: old.properties.map(\.name))
            for (index, previous) in propertyMatches.enumerated() {
                if let previous { properties[previous] = index }
            }
            result[old.name] = (entity.name, properties)
        }
        return result
    }

    // MARK: - From the client to the store

    private func map(_ entity: String) throws -> EntityMap {
        guard let map = entities[entity] else {
            throw SkyrosError(.unknownEntity, "entity \(entity) is not in schema version \(version)")
        }
        return map
    }

    /// An object ID of the client's, in the store's names.
    func current(_ id: ObjectID) throws -> ObjectID {
        ObjectID(entityName: try map(id.entityName).currentName, uuid: id.uuid)
    }

    /// A fetch, count or batch selection of the client's: entity, predicate paths and sort keys
    /// in the store's names.
    func current(_ request: StoreRequest) throws -> StoreRequest {
        let entity = try map(request.entityName)
        var translated = request
        translated.entityName = entity.currentName
        translated.predicate = try request.predicate.map { try current($0, scopes: [0: entity]) }
        translated.sortKeys = try request.sortKeys.map { key in
            SortKey(property: try path([key.property], from: entity).path[0], ascending: key.ascending)
        }
        return translated
    }

    /// A path of property names from `entity`, in the store's names, and the entity it ends in.
    private func path(_ names: [String], from entity: EntityMap) throws -> (path: [String], end: EntityMap) {
        var entity = entity
        var translated: [String] = []
        for name in names {
            if name == PredicateNode.idProperty {
                translated.append(name)
                continue
            }
            guard let index = entity.oldIndex(of: name) else {
                throw SkyrosError(
                    .unsupportedPredicate, "\(entity.oldName).\(name) is not in schema version \(version)")
            }
            guard let currentIndex = entity.toCurrent[index] else {
                throw SkyrosError(
                    .schemaMismatch,
                    "\(entity.oldName).\(name) of version \(version) is no longer in the store's schema (version \(currentVersion)): it cannot be fetched by"
                )
            }
            translated.append(entity.currentProperties[currentIndex].name)
            if let destination = entity.oldProperties[index].destination { entity = try map(destination) }
        }
        return (translated, entity)
    }

    private func current(_ node: PredicateNode, scopes: [Int: EntityMap]) throws -> PredicateNode {
        func entity(_ scope: Int) throws -> EntityMap {
            guard let entity = scopes[scope] else {
                throw SkyrosError(.unsupportedPredicate, "scope \(scope) is not bound")
            }
            return entity
        }
        switch node {
        case .constant: return node
        case .property(let scope, let names):
            return .property(scope: scope, path: try path(names, from: entity(scope)).path)
        case .compare(let op, let left, let right):
            return .compare(op, try current(left, scopes: scopes), try current(right, scopes: scopes))
        case .and(let left, let right):
            return .and(try current(left, scopes: scopes), try current(right, scopes: scopes))
        case .or(let left, let right): return .or(try current(left, scopes: scopes), try current(right, scopes: scopes))
        case .not(let inner): return .not(try current(inner, scopes: scopes))
        case .contains(let left, let right, let caseInsensitive):
            return .contains(
                try current(left, scopes: scopes), try current(right, scopes: scopes), caseInsensitive: caseInsensitive)
        case .startsWith(let left, let right):
            return .startsWith(try current(left, scopes: scopes), try current(right, scopes: scopes))
        case .lowercased(let inner): return .lowercased(try current(inner, scopes: scopes))
        case .isIn(let element, let list): return .isIn(try current(element, scopes: scopes), list)
        case .anyMatch(let scope, let names, let variable, let test):
            let (translated, end) = try path(names, from: entity(scope))
            var inner = scopes
            inner[variable] = end
            return .anyMatch(scope: scope, path: translated, variable: variable, try current(test, scopes: inner))
        case .count(let scope, let names):
            return .count(scope: scope, path: try path(names, from: entity(scope)).path)
        }
    }

    /// A change set of the client's, in the store's terms: inserted objects take the values of
    /// the properties the client does not have from their defaults; updates keep only the
    /// properties the store still has (the others are left as they are).
    func current(_ changes: ChangeSet) throws -> ChangeSet {
        var translated = changes
        translated.inserted = try changes.inserted.map { snapshot in
            let entity = try map(snapshot.id.entityName)
            guard snapshot.values.count == entity.oldProperties.count else {
                throw SkyrosError(
                    .valueNotStorable,
                    "an inserted \(entity.oldName) has \(snapshot.values.count) values; version \(version) has \(entity.oldProperties.count) properties"
                )
            }
            var values: [StoredValue] = []
            for (index, old) in entity.toOld.enumerated() {
                if let old {
                    values.append(snapshot.values[old])
                } else if let value = entity.insertValues[index] {
                    values.append(value)
                } else {
                    let property = entity.currentProperties[index]
                    throw SkyrosError(
                        .schemaMismatch,
                        "\(entity.currentName).\(property.name) (schema version \(currentVersion)) has no default the daemon knows: a client of version \(version) cannot insert \(entity.oldName) objects"
                    )
                }
            }
            return Snapshot(
                id: ObjectID(entityName: entity.currentName, uuid: snapshot.id.uuid), values: StoredValues(values),
                version: snapshot.version)
        }
        translated.updated = try changes.updated.map { update in
            let entity = try map(update.id.entityName)
            return ChangeSet.Update(
                id: ObjectID(entityName: entity.currentName, uuid: update.id.uuid),
                changes: try current(update.changes, entity), baseVersion: update.baseVersion)
        }
        translated.deleted = try changes.deleted.map(current)
        return translated
    }

    /// Property values by the client's indexes, by the store's (those the store no longer has left out).
    private func current(_ values: [Int: StoredValue], _ entity: EntityMap) throws -> [Int: StoredValue] {
        var translated: [Int: StoredValue] = [:]
        for (index, value) in values {
            guard entity.toCurrent.indices.contains(index) else {
                throw SkyrosError(
                    .valueNotStorable, "\(entity.oldName) has no property \(index) in schema version \(version)")
            }
            if let now = entity.toCurrent[index] { translated[now] = value }
        }
        return translated
    }

    /// A batch operation of the client's, in the store's terms.
    func current(_ operation: BatchOperation) throws -> BatchOperation {
        switch operation {
        case .delete(let request): return .delete(try current(request))
        case .update(let request, let assignments):
            let entity = try map(request.entityName)
            for index in assignments.keys
            where entity.toCurrent.indices.contains(index) && entity.toCurrent[index] == nil {
                throw SkyrosError(
                    .schemaMismatch,
                    "\(entity.oldName).\(entity.oldProperties[index].name) of version \(version) is no longer in the store's schema (version \(currentVersion)): it cannot be set"
                )
            }
            return .update(try current(request), assignments: try current(assignments, entity))
        }
    }

    // MARK: - From the store to the client

    /// An object ID of the store's in the client's names; nil for an entity the client does not have.
    func old(_ id: ObjectID) -> ObjectID? {
        oldNames[id.entityName].map { ObjectID(entityName: $0, uuid: id.uuid) }
    }

    /// An object as the client knows it: its properties in its order, those the store no
    /// longer has filled in; nil for an entity the client does not have.
    func old(_ snapshot: Snapshot) -> Snapshot? {
        guard let name = oldNames[snapshot.id.entityName], let entity = entities[name] else { return nil }
        let values = entity.toCurrent.enumerated().map { index, current -> StoredValue in
            guard let current, snapshot.values.indices.contains(current) else { return entity.oldFill[index] }
            return snapshot.values[current]
        }
        return Snapshot(
            id: ObjectID(entityName: name, uuid: snapshot.id.uuid), values: StoredValues(values),
            version: snapshot.version)
    }

    /// Property values by the store's indexes, by the client's (those it does not have left out).
    private func old(_ values: [Int: StoredValue], _ entity: EntityMap) -> [Int: StoredValue] {
        var translated: [Int: StoredValue] = [:]
        for (index, value) in values {
            if entity.toOld.indices.contains(index), let old = entity.toOld[index] { translated[old] = value }
        }
        return translated
    }

    /// A change event as the client knows it: objects of entities it does not have left out,
    /// properties it does not have left out of updates.
    func old(_ event: ChangeEvent) -> ChangeEvent {
        var translated = event
        translated.inserted = event.inserted.compactMap(old)
        translated.updated = event.updated.compactMap { update in
            guard let name = oldNames[update.id.entityName], let entity = entities[name] else { return nil }
            return ChangeEvent.Update(
                id: ObjectID(entityName: name, uuid: update.id.uuid), version: update.version,
                values: old(update.values, entity))
        }
        translated.deleted = event.deleted.compactMap(old)
        return translated
    }

    /// A reply to the client, in its terms.
    func old(_ body: WireMessage.Body) -> WireMessage.Body {
        switch body {
        case .snapshotsReply(let snapshots): .snapshotsReply(snapshots.compactMap(old))
        case .identifiersReply(let ids): .identifiersReply(ids.compactMap(old))
        case .changes(let events, let more): .changes(events.map(old), more: more)
        case .event(let event): .event(old(event))
        case .batchDone(let affected, let event): .batchDone(affected: affected, event: old(event))
        case .conflicts(let message, let conflicts):
            .conflicts(
                message: message,
                conflicts.compactMap { conflict in
                    guard let id = old(conflict.objectID), let entity = entities[id.entityName] else { return nil }
                    let names = conflict.properties.compactMap { name -> String? in
                        guard let index = entity.currentProperties.firstIndex(where: { $0.name == name }),
                            let old = entity.toOld[index]
                        else { return nil }
                        return entity.oldProperties[old].name
                    }
                    return MergeConflict(
                        objectID: id, properties: names, baseVersion: conflict.baseVersion,
                        storeVersion: conflict.storeVersion)
                })
        default: body
        }
    }

    /// A request of the client's, in the store's terms.
    func current(_ body: WireMessage.Body) throws -> WireMessage.Body {
        switch body {
        case .fetch(let request): .fetch(try current(request))
        case .fetchIdentifiers(let request): .fetchIdentifiers(try current(request))
        case .count(let request): .count(try current(request))
        case .snapshots(let ids): .snapshots(try ids.map(current))
        case .save(let clientID, let number, let changes):
            .save(clientID: clientID, saveNumber: number, changes: try current(changes))
        case .batch(let clientID, let number, let operation):
            .batch(clientID: clientID, saveNumber: number, operation: try current(operation))
        default: body
        }
    }
}
