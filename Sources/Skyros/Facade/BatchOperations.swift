import Foundation
import GRDB
import GRDBSQLite

/// One assignment of ``Skyros/batchUpdate(_:where:_:)``: an attribute and its new value.
///
/// ```swift
/// try await store.batchUpdate(User.self, where: #Predicate { $0.age > 65 }, .set(\.isRetired, to: true))
/// ```
public struct BatchAssignment<T: ManagedObject>: Sendable {
    let property: String
    let value: Result<StoredValue, SkyrosError>

    /// Sets an attribute of every selected object to `value`.
    public static func set<V: Sendable>(_ keyPath: KeyPath<T, V>, to value: V) -> BatchAssignment<T> {
        let entity = T.entityDescription
        guard let property = entity.property(for: keyPath), property.kind == .attribute else {
            return BatchAssignment(
                property: "\(keyPath)",
                value: .failure(
                    SkyrosError(
                        .unsupportedPredicate, "a batch update sets stored attributes of \(entity.name), not \(keyPath)"
                    )))
        }
        do {
            return BatchAssignment(property: property.name, value: .success(try property.codec.encodeAny(value)))
        } catch {
            return BatchAssignment(
                property: property.name,
                value: .failure(
                    SkyrosError(.valueNotStorable, "\(entity.name).\(property.name) cannot store \(value): \(error)")))
        }
    }
}

/// A batch update or delete by predicate, as a store runs it: one statement, no objects
/// loaded (``Skyros/batchDelete(_:where:)``, ``Skyros/batchUpdate(_:where:_:)``; through a
/// group's daemon, the `batch` request of docs/PROTOCOL.md).
public enum BatchOperation: Sendable, Hashable {
    /// Deletes the objects the request selects, with the delete rules.
    case delete(StoreRequest)
    /// Sets attributes (by property index) of the objects the request selects.
    case update(StoreRequest, assignments: [Int: StoredValue])

    /// The request that selects the objects (its predicate; a batch has no sort, limit or offset).
    public var request: StoreRequest {
        switch self {
        case .delete(let request), .update(let request, _): request
        }
    }
}

/// Which affected objects a batch operation names in its outcome.
package enum BatchNaming: Sendable {
    /// Every one (for observers): a `RETURNING` row per object.
    case all
    /// Only these (the objects contexts hold): the others need no refresh.
    case held(Set<ObjectID>)
    /// Every one when they are at most this many, none otherwise (``BatchOutcome/isListed``
    /// false): what a daemon publishes, bounded.
    case upTo(Int)
}

/// What a batch operation did, for the contexts that hold affected objects.
package struct BatchOutcome: Sendable {
    /// The objects the predicate selected.
    package var count = 0
    /// Deleted objects (with those a cascade deleted).
    package var deleted: [ObjectID] = []
    /// Updated objects with their changed properties and new values (with those a `.nullify`
    /// rule changed).
    package var updatedValues: [ObjectID: StoreChange.Update] = [:]
    /// False when the outcome does not name the affected objects (more than a
    /// ``BatchNaming/upTo(_:)`` bound): a context refreshes everything it holds.
    package var isListed = true

    package init(
        count: Int = 0, deleted: [ObjectID] = [], updatedValues: [ObjectID: StoreChange.Update] = [:],
        isListed: Bool = true
    ) {
        self.count = count
        self.deleted = deleted
        self.updatedValues = updatedValues
        self.isListed = isListed
    }
}

/// A store that runs batch operations: the SQLite store of this process, or a group's daemon.
package protocol BatchStore: ObjectStore {
    /// Runs a batch operation as one change set (durable and exactly once as a save).
    func batch(_ operation: BatchOperation, naming: BatchNaming) throws -> BatchOutcome
}

extension SQLiteStore: BatchStore {
    package func batch(_ operation: BatchOperation, naming: BatchNaming) throws -> BatchOutcome {
        try transaction { try $0.batch(operation, naming: naming) }
    }
}

extension SQLiteStore.Transaction {
    /// Runs a batch operation inside this transaction (a daemon's group commit runs it in a
    /// savepoint beside the saves of the turn).
    ///
    /// - Throws: ``SkyrosError/Code/unknownEntity``; for an update,
    ///   ``SkyrosError/Code/typeMismatch`` (a value the attribute cannot hold, a property that
    ///   is not an attribute, no assignment) and ``SkyrosError/Code/uniqueConstraintViolation``;
    ///   for a delete, ``SkyrosError/Code/deleteDenied``; ``SkyrosError/Code/unsupportedPredicate``.
    package func batch(_ operation: BatchOperation, naming: BatchNaming) throws -> BatchOutcome {
        let schema = store.schema
        let request = operation.request
        let entity = try schema.requireEntity(request.entityName)
        var assignments: [(PropertyDescription, StoredValue)] = []
        if case .update(_, let values) = operation {
            guard !values.isEmpty else {
                throw SkyrosError(.typeMismatch, "a batch update of \(entity.name) sets at least one attribute")
            }
            for (index, value) in values.sorted(by: { $0.key < $1.key }) {
                guard index >= 0, index < entity.properties.count, entity.properties[index].kind == .attribute else {
                    throw SkyrosError(
                        .typeMismatch,
                        "\(entity.name) has no attribute at index \(index): a batch update sets attributes")
                }
                let property = entity.properties[index]
                guard let stored = SQLiteStore.conformed(value, property) else {
                    throw SkyrosError(
                        .typeMismatch,
                        "\(entity.name).\(property.name) \(SQLiteStore.mismatch(value, property)); a batch update gives it \(value.typeDescription)"
                    )
                }
                assignments.append((property, stored))
            }
        }
        var held: Set<ObjectID>?
        var bounded = false
        switch naming {
        case .all: held = nil
        case .held(let ids): held = ids
        case .upTo(let limit):
            // Named when few: found first (at most limit + 1), then one plain statement.
            var limited = request
            (limited.sortKeys, limited.limit, limited.offset) = ([], limit + 1, 0)
            var builder = SQLBuilder(schema: schema)
            let select = try builder.select("t0.\"_id\"", for: limited, sorted: false, sliced: true)
            var ids = Set<ObjectID>()
            try SQLiteStore.query(db, select, builder.arguments) {
                ids.insert(ObjectID(entityName: entity.name, uuid: SQLiteStore.uuid($0, 0)))
            }
            bounded = ids.count > limit
            held = bounded ? [] : ids
        }
        do {
            var outcome: BatchOutcome
            switch operation {
            case .delete: outcome = try batchDelete(request, entity, held: held)
            case .update: outcome = try batchUpdate(request, entity, assignments, held: held)
            }
            if case .upTo(let limit) = naming, bounded || outcome.deleted.count + outcome.updatedValues.count > limit {
                outcome = BatchOutcome(count: outcome.count, isListed: false)
            }
            return outcome
        } catch {
            throw SQLiteStore.translate(error)
        }
    }

    /// Deletes the rows a request selects, with the delete rules: `.cascade` and `.nullify` are
    /// SQLite's foreign-key actions (their rows are collected first, to tell the contexts), a
    /// cascading to-one is deleted explicitly, and a `.deny` that still has objects refuses the
    /// whole batch with ``SkyrosError/Code/deleteDenied``.
    ///
    /// `held`: the objects of the entity that contexts hold, when only those need to be
    /// named in the outcome (nil: every deleted object is named, for observers).
    private func batchDelete(_ request: StoreRequest, _ entity: EntityDescription, held: Set<ObjectID>?) throws
        -> BatchOutcome
    {
        let schema = store.schema
        let pointedAt = schema.entities.contains { other in
            other.properties.contains { $0.kind == .toOne && $0.destinationName == entity.name }
        }
        let cascadesToOne = entity.properties.contains { $0.kind == .toOne && $0.deleteRule == .cascade }
        if !pointedAt && !cascadesToOne {
            // Nothing refers to these objects: one statement, which says what it deleted.
            var builder = SQLBuilder(schema: schema)
            let condition = try builder.condition(for: request)
            let delete = "DELETE FROM \(SQLBuilder.quote(entity.name)) AS t0" + (condition.map { " WHERE \($0)" } ?? "")
            var outcome = BatchOutcome()
            if let held {
                // Only the held objects need naming: found first, then one plain statement.
                outcome.deleted = try SQLiteStore.selected(held, entity, request, db, schema)
                try SQLiteStore.query(db, delete, builder.arguments) { _ in }
                outcome.count = db.changesCount
            } else {
                try SQLiteStore.query(db, delete + " RETURNING \"_id\"", builder.arguments) { statement in
                    outcome.deleted.append(ObjectID(entityName: entity.name, uuid: SQLiteStore.uuid(statement, 0)))
                }
                outcome.count = outcome.deleted.count
            }
            return outcome
        }
        var builder = SQLBuilder(schema: schema)
        let select = try builder.select("t0.\"_id\"", for: request, sorted: false, sliced: false)
        let selected = try SQLiteStore.rows(db, select, builder.arguments).compactMap { row in
            UUID(storedValue: row[0]).map { ObjectID(entityName: entity.name, uuid: $0) }
        }
        var outcome = BatchOutcome()
        outcome.count = selected.count
        var doomed = Set(selected)
        var nullified: [ObjectID: [String]] = [:]  // objects a `.nullify` rule changes, and how
        var explicit = selected  // what is deleted by statement (the rest follows by cascade)
        var frontier = selected
        while !frontier.isEmpty {
            var next: [ObjectID] = []
            for (entityName, ids) in Dictionary(grouping: frontier, by: \.entityName) {
                let source = try schema.requireEntity(entityName)
                for chunk in stride(from: 0, to: ids.count, by: 500).map({ Array(ids[$0..<min($0 + 500, ids.count)]) })
                {
                    let list = chunk.map(\.uuid.storedValue)
                    let marks = Array(repeating: "?", count: list.count).joined(separator: ", ")
                    // Objects of other entities pointing here: their foreign key's action.
                    for other in schema.entities {
                        for property in other.properties
                        where property.kind == .toOne && property.destinationName == entityName {
                            let rows = try SQLiteStore.rows(
                                db,
                                "SELECT \"_id\" FROM \(SQLBuilder.quote(other.name)) WHERE \(SQLBuilder.quote(property.name)) IN (\(marks))",
                                list)
                            let pointing = rows.compactMap {
                                UUID(storedValue: $0[0]).map { ObjectID(entityName: other.name, uuid: $0) }
                            }
                            .filter { !doomed.contains($0) }
                            guard !pointing.isEmpty else { continue }
                            if schema.isOrderEntity(other.name) {
                                // Positions in an ordered to-many: they go with either object (the
                                // relationship's rule applies through the member's to-one).
                                for id in pointing where doomed.insert(id).inserted { next.append(id) }
                                continue
                            }
                            if schema.isLinkEntity(other.name) {
                                // Links of a many-to-many: they go, and the relationship's own rule applies.
                                let own = property.index
                                let end = schema.linkEnds[other.name]?.first {
                                    $0.entity == entityName && $0.own == own
                                }
                                let relationship = end.flatMap { source.property(named: $0.property) }
                                if relationship?.deleteRule == .deny {
                                    throw SkyrosError(
                                        .deleteDenied,
                                        "the batch delete of \(entity.name) is refused: \(entityName).\(relationship!.name) still has objects (delete rule .deny); nothing was deleted"
                                    )
                                }
                                for id in pointing where doomed.insert(id).inserted { next.append(id) }
                                if relationship?.deleteRule == .cascade, let destination = relationship?.destinationName
                                {
                                    let target = SQLBuilder.quote(other.properties[1 - own].name)
                                    let ends = try SQLiteStore.rows(
                                        db,
                                        "SELECT \(target) FROM \(SQLBuilder.quote(other.name)) WHERE \(SQLBuilder.quote(property.name)) IN (\(marks))",
                                        list)
                                    for row in ends {
                                        guard let uuid = UUID(storedValue: row[0]) else { continue }
                                        let id = ObjectID(entityName: destination, uuid: uuid)
                                        if doomed.insert(id).inserted {
                                            next.append(id)
                                            explicit.append(id)
                                        }
                                    }
                                }
                                continue
                            }
                            switch SQLiteStore.deleteAction(property, of: other, in: schema) {
                            case "CASCADE":
                                for id in pointing where doomed.insert(id).inserted { next.append(id) }
                            case "SET NULL":
                                for id in pointing { nullified[id, default: []].append(property.name) }
                            default:
                                let rule =
                                    schema.inverse(of: property, in: other).map { "\(entityName).\($0.name)" }
                                    ?? entityName
                                throw SkyrosError(
                                    .deleteDenied,
                                    "the batch delete of \(entity.name) is refused: \(rule) still has \(pointing[0]) (delete rule .deny); nothing was deleted"
                                )
                            }
                        }
                    }
                    // A cascading to-one of the deleted objects: its destination goes too.
                    for property in source.properties where property.kind == .toOne && property.deleteRule == .cascade {
                        let rows = try SQLiteStore.rows(
                            db,
                            "SELECT \(SQLBuilder.quote(property.name)) FROM \(SQLBuilder.quote(entityName)) WHERE \"_id\" IN (\(marks))",
                            list)
                        for row in rows {
                            guard let uuid = UUID(storedValue: row[0]) else { continue }
                            let id = ObjectID(entityName: property.destinationName!, uuid: uuid)
                            if doomed.insert(id).inserted {
                                next.append(id)
                                explicit.append(id)
                            }
                        }
                    }
                }
            }
            frontier = next
        }
        for (entityName, ids) in Dictionary(grouping: explicit, by: \.entityName) {
            for start in stride(from: 0, to: ids.count, by: 500) {
                let chunk = ids[start..<min(start + 500, ids.count)].map(\.uuid.storedValue)
                let marks = Array(repeating: "?", count: chunk.count).joined(separator: ", ")
                _ = try SQLiteStore.rows(
                    db, "DELETE FROM \(SQLBuilder.quote(entityName)) WHERE \"_id\" IN (\(marks))", chunk)
            }
        }
        outcome.deleted = Array(doomed)
        for id in doomed { nullified[id] = nil }
        // Objects a `.nullify` rule changed: a new version, as for a save, and their values
        // (the cleared references), so that contexts and other processes take them.
        for (entityName, ids) in Dictionary(grouping: Array(nullified.keys), by: \.entityName) {
            let other = try schema.requireEntity(entityName)
            for start in stride(from: 0, to: ids.count, by: 500) {
                let chunk = ids[start..<min(start + 500, ids.count)].map(\.uuid.storedValue)
                let marks = Array(repeating: "?", count: chunk.count).joined(separator: ", ")
                _ = try SQLiteStore.rows(
                    db,
                    "UPDATE \(SQLBuilder.quote(entityName)) SET \"_version\" = \"_version\" + 1 WHERE \"_id\" IN (\(marks))",
                    chunk)
            }
            for (id, version) in try SQLiteStore.versions(of: ids, other, db) {
                let names = nullified[id] ?? []
                var values: [Int: StoredValue] = [:]
                for name in names {
                    if let property = other.property(named: name) { values[property.index] = .null }
                }
                outcome.updatedValues[id] = StoreChange.Update(properties: names, version: version, values: values)
            }
        }
        return outcome
    }

    /// Sets attributes of the rows a request selects in one statement (each object's version
    /// goes up by one, as for a save). `held`: as for a delete.
    private func batchUpdate(
        _ request: StoreRequest, _ entity: EntityDescription, _ assignments: [(PropertyDescription, StoredValue)],
        held: Set<ObjectID>?
    ) throws -> BatchOutcome {
        let schema = store.schema
        var builder = SQLBuilder(schema: schema)
        let condition = try builder.condition(for: request)
        let sets = assignments.map { "\(SQLBuilder.quote($0.0.name)) = ?" } + ["\"_version\" = \"_version\" + 1"]
        let update =
            "UPDATE \(SQLBuilder.quote(entity.name)) AS t0 SET \(sets.joined(separator: ", "))"
            + (condition.map { " WHERE \($0)" } ?? "")
        var outcome = BatchOutcome()
        let names = assignments.map(\.0.name)
        var values: [Int: StoredValue] = [:]
        for (property, value) in assignments { values[property.index] = value }
        let arguments = assignments.map(\.1) + builder.arguments
        if let held {
            // Only the held objects need their new versions: found first, then one plain statement.
            let affected = try SQLiteStore.selected(held, entity, request, db, schema)
            try SQLiteStore.query(db, update, arguments) { _ in }
            outcome.count = db.changesCount
            for (id, version) in try SQLiteStore.versions(of: affected, entity, db) {
                outcome.updatedValues[id] = StoreChange.Update(properties: names, version: version, values: values)
            }
            return outcome
        }
        try SQLiteStore.query(db, update + " RETURNING \"_id\", \"_version\"", arguments) { statement in
            let id = ObjectID(entityName: entity.name, uuid: SQLiteStore.uuid(statement, 0))
            outcome.updatedValues[id] = StoreChange.Update(
                properties: names, version: sqlite3_column_int64(statement, 1), values: values)
        }
        outcome.count = outcome.updatedValues.count
        return outcome
    }
}

extension SQLiteStore {
    /// Which of `held` the request selects (before a statement changes them).
    static func selected(
        _ held: Set<ObjectID>, _ entity: EntityDescription, _ request: StoreRequest, _ db: Database, _ schema: Schema
    ) throws -> [ObjectID] {
        guard !held.isEmpty else { return [] }
        var result: [ObjectID] = []
        let ids = Array(held)
        for start in stride(from: 0, to: ids.count, by: 500) {
            let chunk = ids[start..<Swift.min(start + 500, ids.count)]
            var restricted = request
            let inChunk = PredicateNode.isIn(
                .property(scope: 0, path: [PredicateNode.idProperty]), chunk.map(\.uuid.storedValue))
            restricted.predicate = request.predicate.map { .and($0, inChunk) } ?? inChunk
            var builder = SQLBuilder(schema: schema)
            let sql = try builder.select("t0.\"_id\"", for: restricted, sorted: false, sliced: false)
            try query(db, sql, builder.arguments) {
                result.append(ObjectID(entityName: entity.name, uuid: uuid($0, 0)))
            }
        }
        return result
    }

    /// The stored versions of objects of one entity.
    static func versions(of ids: [ObjectID], _ entity: EntityDescription, _ db: Database) throws -> [(ObjectID, Int64)]
    {
        var result: [(ObjectID, Int64)] = []
        for start in stride(from: 0, to: ids.count, by: 500) {
            let chunk = ids[start..<Swift.min(start + 500, ids.count)].map(\.uuid.storedValue)
            let marks = Array(repeating: "?", count: chunk.count).joined(separator: ", ")
            try query(
                db, "SELECT \"_id\", \"_version\" FROM \(SQLBuilder.quote(entity.name)) WHERE \"_id\" IN (\(marks))",
                chunk
            ) {
                result.append((ObjectID(entityName: entity.name, uuid: uuid($0, 0)), sqlite3_column_int64($0, 1)))
            }
        }
        return result
    }
}

extension Skyros {
    /// Deletes every object of `type` the predicate selects (all of them without one), with one
    /// SQL statement and no object loaded; returns how many the predicate selected.
    ///
    /// ```swift
    /// let removed = try await store.batchDelete(User.self, where: #Predicate { $0.age < 18 })
    /// ```
    ///
    /// Delete rules hold: `.cascade` deletes the related objects (recursively), `.nullify`
    /// clears their references, and `.deny` refuses the whole batch
    /// (``SkyrosError/Code/deleteDenied``, naming the relationship; nothing is deleted). Writes
    /// started before it are saved first. The main context forgets the deleted objects it
    /// holds (they read as deleted) and its observers get one change.
    ///
    /// On a shared stack the batch is one change set through the group's daemon: exactly once
    /// and as durable as a save, one sequence number, published to the other processes (which
    /// refresh what they hold).
    /// - Throws: ``SkyrosError/Code/unsupportedPredicate`` for a predicate that cannot be
    ///   translated; ``SkyrosError/Code/deleteDenied``.
    @discardableResult
    public func batchDelete<T: ManagedObject>(_ type: T.Type, where predicate: Predicate<T>? = nil) async throws -> Int
    {
        let request = try FetchDescriptor<T>(predicate: predicate).storeRequest(schema: schema)
        return try await runBatch(.delete(request))
    }

    /// Sets attributes of every object of `type` the predicate selects, with one SQL statement
    /// and no object loaded; returns how many were updated.
    ///
    /// ```swift
    /// let changed = try await store.batchUpdate(User.self, where: #Predicate { $0.age > 65 },
    ///                                           .set(\.isRetired, to: true), .set(\.plan, to: "gold"))
    /// ```
    ///
    /// Unique attributes are checked by the store (``SkyrosError/Code/uniqueConstraintViolation``,
    /// nothing updated). Writes started before it are saved first. Objects the main context
    /// holds take the new values (properties they have unsaved changes of keep them), and its
    /// observers get one change.
    @discardableResult
    public func batchUpdate<T: ManagedObject>(
        _ type: T.Type, where predicate: Predicate<T>? = nil, _ assignments: BatchAssignment<T>...
    ) async throws -> Int {
        let request = try FetchDescriptor<T>(predicate: predicate).storeRequest(schema: schema)
        let entity = try schema.requireEntity(request.entityName)
        var values: [Int: StoredValue] = [:]
        for assignment in assignments {
            guard let property = entity.property(named: assignment.property) else {
                throw SkyrosError(.unsupportedPredicate, "\(entity.name) has no attribute \(assignment.property)")
            }
            values[property.index] = try assignment.value.get()
        }
        guard !values.isEmpty else { return 0 }
        return try await runBatch(.update(request, assignments: values))
    }

    /// Runs a batch operation on the root context's queue (after the writes queued there),
    /// then tells the contexts.
    ///
    /// When no observer follows the main context, the store names only the affected objects
    /// that the main and root contexts hold (the others need no refresh): no row per object
    /// of the batch comes back.
    private func runBatch(_ operation: BatchOperation) async throws -> Int {
        guard let batchStore = store as? any BatchStore else {
            throw SkyrosError(.storeFailure, "this stack's store does not run batch operations")
        }
        let entityName = operation.request.entityName
        let root = rootContext
        let main = mainContext
        // What the main context holds, asked before the root's queue is taken (the main context
        // waits for the root's queue when it saves: asking from there could deadlock).
        let heldInMain: Set<ObjectID>? = main.performAndWait {
            guard !main.reference.isObserved else { return nil }
            var ids = Set(main.registry.keys.filter { $0.entityName == entityName })
            for id in main.updated.keys where id.entityName == entityName { ids.insert(id) }
            for id in main.deleted.keys where id.entityName == entityName { ids.insert(id) }
            return ids
        }
        do {
            let outcome = try await root.perform { () -> BatchOutcome in
                let held = heldInMain.map { $0.union(root.registry.keys.filter { $0.entityName == entityName }) }
                let outcome = try batchStore.batch(operation, naming: held.map { .held($0) } ?? .all)
                if outcome.isListed {
                    for id in outcome.deleted { root.forgetDeleted(id) }
                    for id in outcome.updatedValues.keys { root.refreshIfClean(id) }
                } else {
                    for id in Array(root.registry.keys) { root.refreshIfClean(id) }
                }
                return outcome
            }
            if let heldInMain {
                // Objects the main context took in since it was asked are read again when touched.
                main.performAndWait {
                    for id in main.registry.keys where id.entityName == entityName && !heldInMain.contains(id) {
                        main.refreshIfClean(id)
                    }
                }
            }
            if !outcome.isListed {
                // Too many to name (through a daemon): everything held is read again.
                merge([StoreChange(sequence: 0, author: "batch", isRefresh: true)], publishing: false)
            } else if !outcome.deleted.isEmpty || !outcome.updatedValues.isEmpty {
                merge(
                    [
                        StoreChange(
                            sequence: 0, author: "batch", updated: outcome.updatedValues, deleted: outcome.deleted)
                    ],
                    publishing: false)
            }
            return outcome.count
        } catch {
            throw SkyrosError.wrap(error)
        }
    }
}
