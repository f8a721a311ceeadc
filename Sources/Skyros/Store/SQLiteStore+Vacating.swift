import Foundation
import GRDB
import GRDBSQLite

// Unique values moved out of the way inside a transaction, so that a change set (or a sync
// snapshot) that permutes unique values among its objects can be written one row at a time:
// SQLite checks a UNIQUE index at every row an UPDATE writes, not at the commit.
extension SQLiteStore {
    /// A unique column of a table: the table's entity and the property's index there.
    private struct UniqueColumn: Hashable {
        var entityName: String
        var index: Int
    }

    /// Before a change set's rows are written: every object that holds a unique value the
    /// change set gives another object (an insert, or an update of that property), and whose
    /// own update changes that property too, is given a placeholder there (see
    /// ``vacate(_:of:in:_:)``). The objects then exchange their values, or hand one to an
    /// insert, in any order; their updates write the final values over the placeholders in the
    /// same transaction, so no reader ever sees one.
    ///
    /// An object that keeps the value (no update of that property) is left as it is: the write
    /// of the other object then fails with ``SkyrosError/Code/uniqueConstraintViolation``
    /// naming both, as it does without this — a change set that ends with a duplicate is
    /// refused.
    func vacateUniqueValues(for changes: ChangeSet, _ db: Database) throws {
        // The objects whose update writes a unique property, by column; the values wanted.
        var moving: [UniqueColumn: Set<UUID>] = [:]
        var wanted: [(column: UniqueColumn, value: StoredValue, id: UUID)] = []
        for update in changes.updated {
            let entity = try tableInfo(update.id.entityName).entity
            for (index, value) in update.changes
            where entity.properties.indices.contains(index) && entity.properties[index].hasColumn
                && entity.properties[index].isUnique
            {
                let column = UniqueColumn(entityName: entity.name, index: index)
                moving[column, default: []].insert(update.id.uuid)
                if !value.isNull { wanted.append((column, value, update.id.uuid)) }
            }
        }
        guard !moving.isEmpty else { return }
        for snapshot in changes.inserted {
            let entity = try tableInfo(snapshot.id.entityName).entity
            for property in entity.properties where property.hasColumn && property.isUnique {
                let column = UniqueColumn(entityName: entity.name, index: property.index)
                guard moving[column] != nil, property.index < snapshot.values.count else { continue }
                let value = snapshot.values[property.index]
                if !value.isNull { wanted.append((column, value, snapshot.id.uuid)) }
            }
        }
        for (column, value, id) in wanted {
            let entity = try tableInfo(column.entityName).entity
            let property = entity.properties[column.index]
            let holder = try Self.rows(
                db,
                "SELECT \"_id\" FROM \(SQLBuilder.quote(entity.name)) WHERE \(SQLBuilder.quote(property.name)) = ? LIMIT 1",
                [value]
            ).first.flatMap { UUID(storedValue: $0[0]) }
            guard let holder, holder != id, moving[column]?.contains(holder) == true else { continue }
            try vacate(property, of: entity, in: [holder], db)
        }
    }

    /// Gives a unique property of some objects a placeholder that no other object holds:
    /// NULL when the property is optional (a to-one always is), else a value of its column's
    /// type that no row holds (a random one, looked up first): a text or 16 bytes of a new
    /// UUID, a random integer or real. The objects' versions are not raised; what follows in
    /// the transaction is to write their final values.
    ///
    /// - Throws: ``SkyrosError/Code/storeFailure`` when no free placeholder is found (it never
    ///   happens in practice), or the statement's failure.
    func vacate(_ property: PropertyDescription, of entity: EntityDescription, in ids: [UUID], _ db: Database)
        throws
    {
        let table = SQLBuilder.quote(entity.name)
        let column = SQLBuilder.quote(property.name)
        let update = try db.cachedStatement(sql: "UPDATE \(table) SET \(column) = ? WHERE \"_id\" = ?").sqliteStatement
        for id in ids {
            var placeholder = StoredValue.null
            if property.kind != .toOne && !property.isStoredOptional {
                placeholder = try Self.freePlaceholder(property.codec.storageType) { candidate in
                    try Self.rows(db, "SELECT 1 FROM \(table) WHERE \(column) = ? LIMIT 1", [candidate]).isEmpty
                }
            }
            sqlite3_reset(update)
            Self.bind(update, 1, placeholder)
            Self.bind(update, 2, id)
            try Self.stepDone(db, update)
        }
    }

    /// A random value of a column's storage type for which `isFree` holds.
    private static func freePlaceholder(_ type: StorageType, _ isFree: (StoredValue) throws -> Bool) throws
        -> StoredValue
    {
        for _ in 0..<16 {
            let candidate: StoredValue =
                switch type {
                case .text: .text("skyros-placeholder-" + UUID().uuidString)
                case .blob: UUID().storedValue
                case .integer: .integer(Int64.random(in: Int64.min...Int64.max))
                case .real: .real(Double.random(in: -1e300...1e300))
                }
            if try isFree(candidate) { return candidate }
        }
        throw SkyrosError(.storeFailure, "no free placeholder for a unique \(type.rawValue) column")
    }
}

extension SQLiteStore.Transaction {
    /// Gives a unique property of some objects of an entity a placeholder that no other object
    /// holds (NULL when the property is optional): a snapshot applied by SQL moves the values
    /// it changes out of the way first, so that its objects may exchange them (see
    /// ``SQLiteStore/vacateUniqueValues(for:_:)`` for change sets). Their final values must be
    /// written in the same transaction.
    ///
    /// - Throws: ``SkyrosError/Code/unknownEntity``, or the write's failure as a ``SkyrosError``.
    package func vacateUniqueValues(of property: String, of entityName: String, in ids: [UUID]) throws {
        guard !ids.isEmpty else { return }
        let entity = try store.tableInfo(entityName).entity
        guard let described = entity.property(named: property), described.hasColumn else {
            throw SkyrosError(.storeFailure, "\(entity.name) has no stored property \(property)")
        }
        do {
            try store.vacate(described, of: entity, in: ids, db)
        } catch {
            throw SQLiteStore.translate(error)
        }
    }
}
