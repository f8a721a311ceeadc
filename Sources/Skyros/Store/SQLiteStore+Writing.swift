import Foundation
import GRDB
import GRDBSQLite

// The write path: a change set's rows inserted, updated and deleted inside a transaction,
// after its shape and its values' types are checked.
extension SQLiteStore {
    // MARK: - Writing

    /// Saves a change set in one IMMEDIATE transaction, committed with the store's
    /// ``Durability``: all of it is stored, or nothing.
    ///
    /// Inserts, then updates (each one only of the properties it changed, the object's version
    /// raised by one), then deletions, whose delete rules SQLite applies through the foreign keys.
    /// Under ``MergePolicy/error`` an update based on a version the store no longer has is a
    /// conflict; ``MergePolicy/storeWins`` skips it; ``MergePolicy/saverWins`` applies it.
    ///
    /// - Throws: ``SkyrosError/Code/objectNotFound`` (an update or delete of an object that does
    ///   not exist), ``SkyrosError/Code/typeMismatch`` and ``SkyrosError/Code/valueNotStorable``
    ///   (checked before anything is written), ``SkyrosError/Code/uniqueConstraintViolation``
    ///   (naming both objects), ``SkyrosError/Code/deleteDenied``, ``SkyrosError/Code/mergeConflict``,
    ///   ``SkyrosError/Code/storeFailure``.
    public func save(_ changes: ChangeSet) throws {
        guard !changes.isEmpty else { return }
        if let migrationDatabase {
            // A migration stage's save: in the migration's transaction.
            try Transaction(db: migrationDatabase, store: self).savepoint {
                _ = try Transaction(db: migrationDatabase, store: self).apply(changes)
            }
            return
        }
        try transaction { transaction in _ = try transaction.apply(changes) }
    }

    /// Writes a change set's rows inside the current transaction (no commit of its own).
    /// An update or delete of an object that does not exist fails with
    /// ``SkyrosError/Code/objectNotFound``; a value of the wrong type with
    /// ``SkyrosError/Code/typeMismatch`` (both before anything is written).
    ///
    /// With `vacatingUniqueValues`, the unique values its objects exchange are moved out of
    /// the way first (``vacateUniqueValues(for:_:)``): a sync checkpoint's change set.
    ///
    /// - Returns: the updates applied, each with the object's new version (under
    ///   ``MergePolicy/storeWins``, conflicting updates are left out).
    @discardableResult
    func apply(_ given: ChangeSet, _ db: Database, vacatingUniqueValues: Bool = false) throws -> (
        changes: ChangeSet, updates: [AppliedUpdate]
    ) {
        let changes = try conformed(given)
        if vacatingUniqueValues { try vacateUniqueValues(for: changes, db) }
        var table: TableInfo?
        var raw: OpaquePointer?
        for snapshot in changes.inserted {
            if table?.entity.name != snapshot.id.entityName {
                let info = try tableInfo(snapshot.id.entityName)
                table = info
                raw = try db.cachedStatement(sql: info.insertSQL).sqliteStatement
            }
            guard let table, let raw else { continue }
            sqlite3_reset(raw)
            Self.bind(raw, 1, snapshot.id.uuid)
            for column in table.columnIndexes.indices {
                Self.bind(raw, Int32(column + 2), snapshot.values[table.columnIndexes[column]])
            }
            do {
                try Self.stepDone(db, raw)
            } catch {
                throw try uniqueViolation(error, table.entity, snapshot.id, { snapshot.values[$0] }, db)
            }
        }
        var conflicts: [MergeConflict] = []
        var applied: [AppliedUpdate] = []
        applied.reserveCapacity(changes.updated.count)
        // The UPDATE of each shape (entity, columns changed), made once per change set: a save
        // of one property of many objects builds one SQL string, not one per object.
        var updateStatements: [UpdateShape: OpaquePointer] = [:]
        var updatedTable: TableInfo?
        for update in Self.inKeyOrder(changes.updated) {
            if updatedTable?.entity.name != update.id.entityName { updatedTable = try tableInfo(update.id.entityName) }
            guard let table = updatedTable else { continue }
            let indexes = update.changes.keys.sorted().filter { table.entity.properties[$0].hasColumn }
            let check = changes.mergePolicy != .saverWins && update.baseVersion > 0
            if indexes.isEmpty || check {
                guard let current = try Self.version(of: update.id, table, db) else {
                    if schema.hasPositions(update.id.entityName) { continue }  // see below
                    throw Self.notFound(update.id)
                }
                if check && current != update.baseVersion {
                    // The object changed in the store since the saver read it.
                    if changes.mergePolicy == .storeWins { continue }
                    conflicts.append(
                        MergeConflict(
                            objectID: update.id, properties: indexes.map { table.entity.properties[$0].name },
                            baseVersion: update.baseVersion, storeVersion: current))
                    continue
                }
                if indexes.isEmpty {
                    applied.append(AppliedUpdate(id: update.id, version: current, changes: [:]))
                    continue
                }
            }
            let shape = UpdateShape(entityName: table.entity.name, indexes: indexes)
            let raw: OpaquePointer
            if let known = updateStatements[shape] {
                raw = known
            } else {
                let assignments =
                    indexes.map { "\(SQLBuilder.quote(table.entity.properties[$0].name)) = ?" } + [
                        "\"_version\" = \"_version\" + 1"
                    ]
                raw = try db.cachedStatement(
                    sql:
                        "UPDATE \(SQLBuilder.quote(table.entity.name)) SET \(assignments.joined(separator: ", ")) WHERE \"_id\" = ? RETURNING \"_version\""
                ).sqliteStatement
                updateStatements[shape] = raw
            }
            sqlite3_reset(raw)
            for (position, index) in indexes.enumerated() {
                Self.bind(raw, Int32(position + 1), update.changes[index] ?? .null)
            }
            Self.bind(raw, Int32(indexes.count + 1), update.id.uuid)
            // The values written: usually every change (properties with a column).
            let values =
                indexes.count == update.changes.count
                ? update.changes : update.changes.filter { table.entity.properties[$0.key].hasColumn }
            let version: Int64?
            do {
                version = try Self.stepReturning(db, raw)
            } catch {
                throw try uniqueViolation(error, table.entity, update.id, { values[$0] }, db)
            }
            guard let version else {
                // A position whose row another saver deleted (its object left the list, or was
                // deleted): the move is moot, the rest of the save stands.
                if schema.hasPositions(update.id.entityName) { continue }
                throw Self.notFound(update.id)
            }
            applied.append(AppliedUpdate(id: update.id, version: version, changes: values))
        }
        if !conflicts.isEmpty {
            throw SkyrosError(
                .mergeConflict,
                "\(conflicts.count) object(s) changed in the store since they were read: "
                    + conflicts.map(\.description).joined(separator: "; "),
                conflicts: conflicts)
        }
        // Every deleted object must exist before any is deleted: a cascade of an earlier
        // delete may remove a later one, which is no error.
        // A link of a many-to-many relationship removed by two savers is no error either.
        for id in changes.deleted where !schema.isLinkEntity(id.entityName) {
            if try Self.version(of: id, try tableInfo(id.entityName), db) == nil { throw Self.notFound(id) }
        }
        for id in changes.deleted {
            let table = try tableInfo(id.entityName)
            let statement = try db.cachedStatement(
                sql: "DELETE FROM \(SQLBuilder.quote(table.entity.name)) WHERE \"_id\" = ?")
            let raw = statement.sqliteStatement
            sqlite3_reset(raw)
            Self.bind(raw, 1, id.uuid.storedValue)
            try Self.stepDone(db, raw)
        }
        return (changes, applied)
    }

    /// What an UPDATE statement depends on: the table and the columns it sets.
    private struct UpdateShape: Hashable {
        var entityName: String
        var indexes: [Int]
    }

    /// A large change set's updates in the order of the tables' primary key (the bytes of the
    /// identifier, as SQLite compares BLOBs): each leaf page of the table is then visited in
    /// one run instead of at random, so it is read, changed and spilled once. A change set's
    /// updates have no order of their own (a context keeps them in a dictionary); small ones
    /// are left as they are.
    static func inKeyOrder(_ updates: [ChangeSet.Update]) -> [ChangeSet.Update] {
        guard updates.count > 64 else { return updates }
        return updates.sorted { a, b in keyOrder(a.id, b.id) }
    }

    /// Identifiers by entity, then in key order (see the updates' ``inKeyOrder(_:)``).
    package static func inKeyOrder(_ ids: [ObjectID]) -> [ObjectID] {
        ids.count < 2 ? ids : ids.sorted(by: keyOrder)
    }

    /// Whether `a` comes before `b`: by entity name, then by the identifier's bytes (the order
    /// of `uuidString` too, compared without making the strings).
    @inline(__always)
    package static func keyOrder(_ a: ObjectID, _ b: ObjectID) -> Bool {
        if a.entityName != b.entityName { return a.entityName < b.entityName }
        let (a0, a1) = keyHalves(a.uuid)
        let (b0, b1) = keyHalves(b.uuid)
        return a0 != b0 ? a0 < b0 : a1 < b1
    }

    /// A UUID's 16 bytes as two big-endian integers: compared like `memcmp`.
    @inline(__always)
    private static func keyHalves(_ uuid: UUID) -> (UInt64, UInt64) {
        withUnsafeBytes(of: uuid.uuid) { bytes in
            (
                UInt64(bigEndian: bytes.loadUnaligned(as: UInt64.self)),
                UInt64(bigEndian: bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
            )
        }
    }

    /// An update as applied: the object, its version after the update, and the values of
    /// the properties it changed (stored properties only), by property index.
    public struct AppliedUpdate: Sendable, Hashable {
        /// The object updated.
        public var id: ObjectID
        /// Its version in the store after the update.
        public var version: Int64
        /// The values written, by property index (properties with a column only).
        public var changes: [Int: StoredValue]
    }

    /// A unique index's failure as the contexts report it, naming entity, property, value and
    /// the object that holds it already (SQLite names only the column); any other error as is.
    private func uniqueViolation(
        _ error: any Error, _ entity: EntityDescription, _ id: ObjectID, _ value: (Int) -> StoredValue?, _ db: Database
    ) throws -> any Error {
        guard let error = error as? DatabaseError, error.extendedResultCode == .SQLITE_CONSTRAINT_UNIQUE,
            let column = error.message?.split(separator: ".").last.map(String.init),
            let property = entity.property(named: column), let held = value(property.index)
        else { return error }
        let other = try Self.rows(
            db,
            "SELECT \"_id\" FROM \(SQLBuilder.quote(entity.name)) WHERE \(SQLBuilder.quote(property.name)) = ? LIMIT 1",
            [held]
        ).first.flatMap { UUID(storedValue: $0[0]) }.map { ObjectID(entityName: entity.name, uuid: $0) }
        return SkyrosError(
            .uniqueConstraintViolation,
            "\(entity.name).\(property.name) must be unique: \(id)\(other.map { " and \($0)" } ?? "") both hold \(held)",
            underlying: error)
    }

    private static func notFound(_ id: ObjectID) -> SkyrosError {
        SkyrosError(.objectNotFound, "\(id) does not exist in the store (another process may have deleted it)")
    }

    /// Runs `body` in a `BEGIN IMMEDIATE` transaction (the write lock is taken at once, so
    /// another process can never make the commit fail with SQLITE_BUSY halfway), with
    /// prepared BEGIN/COMMIT statements: the cheapest durable commit SQLite offers.
    static func immediateTransaction<T>(_ db: Database, _ body: (Database) throws -> T) throws -> T {
        // Stepped directly, like every statement of a save: GRDB's execute() adds its
        // statement bookkeeping to what is, on the daemon, most of a one-object commit.
        try stepDone(db, db.cachedStatement(sql: "BEGIN IMMEDIATE").sqliteStatement)
        do {
            let result = try body(db)
            try stepDone(db, db.cachedStatement(sql: "COMMIT").sqliteStatement)
            return result
        } catch {
            if db.isInsideTransaction { try? db.execute(sql: "ROLLBACK") }
            throw error
        }
    }

    /// The stored version of an object; nil when it does not exist (any more).
    private static func version(of id: ObjectID, _ table: TableInfo, _ db: Database) throws -> Int64? {
        let raw = try db.cachedStatement(
            sql: "SELECT \"_version\" FROM \(SQLBuilder.quote(table.entity.name)) WHERE \"_id\" = ?"
        )
        .sqliteStatement
        sqlite3_reset(raw)
        bind(raw, 1, id.uuid.storedValue)
        defer { sqlite3_reset(raw) }
        return sqlite3_step(raw) == SQLITE_ROW ? sqlite3_column_int64(raw, 0) : nil
    }

    /// Checks what a change set from another process could get wrong before touching the
    /// database — known entities, one value per property, property indexes in range, every
    /// value of its property's declared type — and returns it as it will be stored (and must
    /// be published): an integer for a REAL property as that real, an integral real for an
    /// INTEGER property as that integer. Anything else that does not fit is
    /// ``SkyrosError/Code/typeMismatch`` naming the property (STRICT tables would convert text
    /// that looks like a number, SQLite would store NaN as NULL).
    func conformed(_ changes: ChangeSet) throws -> ChangeSet {
        var result = changes
        for (position, snapshot) in changes.inserted.enumerated() {
            let table = try tableInfo(snapshot.id.entityName)
            guard snapshot.values.count == table.entity.properties.count else {
                throw SkyrosError(
                    .valueNotStorable,
                    "\(snapshot.id) has \(snapshot.values.count) values; \(table.entity.name) has \(table.entity.properties.count) properties"
                )
            }
            for property in table.entity.properties {
                let value = snapshot.values[property.index]
                // A to-many has no value of its own (its objects point here): anything but NULL
                // would be published to other clients and never stored.
                guard property.hasColumn else {
                    if property.kind == .toMany && !value.isNull {
                        throw SkyrosError(
                            .typeMismatch,
                            "\(table.entity.name).\(property.name) is a to-many relationship, whose value is always null; \(snapshot.id) gives it \(value.typeDescription)"
                        )
                    }
                    continue
                }
                let stored = try Self.conformed(value, table.entity, property.index, snapshot.id)
                if stored != value { result.inserted[position].values[property.index] = stored }
            }
        }
        for (position, update) in changes.updated.enumerated() {
            let table = try tableInfo(update.id.entityName)
            if let index = update.changes.keys.first(where: { $0 < 0 || $0 >= table.entity.properties.count }) {
                throw SkyrosError(.valueNotStorable, "\(table.entity.name) has no property number \(index)")
            }
            for (index, value) in update.changes where table.entity.properties[index].hasColumn {
                let stored = try Self.conformed(value, table.entity, index, update.id)
                if stored != value { result.updated[position].changes[index] = stored }
            }
        }
        for id in changes.deleted { _ = try tableInfo(id.entityName) }
        return result
    }

    /// A value as its property stores it, or ``SkyrosError/Code/typeMismatch`` naming the
    /// property when it does not fit.
    private static func conformed(_ value: StoredValue, _ entity: EntityDescription, _ index: Int, _ id: ObjectID)
        throws -> StoredValue
    {
        let property = entity.properties[index]
        if let stored = conformed(value, property) { return stored }
        throw SkyrosError(
            .typeMismatch,
            "\(entity.name).\(property.name) \(mismatch(value, property)); \(id) gives it \(value.typeDescription)")
    }

    /// What a property holds, for a ``SkyrosError/Code/typeMismatch`` message: "is a date
    /// (REAL)", "is a bool (INTEGER) …, not optional".
    package static func mismatch(_ value: StoredValue, _ property: PropertyDescription) -> String {
        if property.kind == .toOne {
            return "is a reference to \(property.destinationName ?? "?") (a 16-byte blob or null)"
        }
        let codec = property.codec
        var declared =
            "is \(property.isStoredOptional ? "an optional" : "a") \(codec.typeName) (\(codec.storageType.rawValue))"
        if value.isNull && !property.isStoredOptional { declared += ", which is not optional" }
        let type = String(rawTypeName(property))
        if let range = integerRanges[type] { declared += " from \(range.lowerBound) to \(range.upperBound)" }
        switch type {
        case "bool": declared += ": 0 or 1"
        case "uuid": declared += " of 16 bytes"
        case "double", "float", "date": declared += ", not NaN"
        default: break
        }
        return declared
    }

    /// The ranges of the fixed-size integer type names (`int` and `int64` are SQLite's).
    private static let integerRanges: [String: ClosedRange<Int64>] = [
        "int32": Int64(Int32.min)...Int64(Int32.max), "int16": Int64(Int16.min)...Int64(Int16.max),
        "int8": Int64(Int8.min)...Int64(Int8.max), "bool": 0...1,
    ]

    /// A value as a property's column stores it (see ``conformed(_:)``); nil when it does not
    /// fit: another storage class, NULL in a non-optional attribute, an integer outside its
    /// type name's range (`bool` is 0 or 1), a `uuid` that is not 16 bytes, a NaN real, a
    /// decimal not in its ordered text.
    static func conformed(_ value: StoredValue, _ property: PropertyDescription) -> StoredValue? {
        if property.kind == .toOne {
            switch value {
            case .null: return value
            case .blob(let data): return data.count == 16 ? value : nil
            default: return nil
            }
        }
        let codec = property.codec
        // The type name is read only where a value's storage class leaves a check to make: a
        // save's texts and reals pass without any string work.
        switch (value, codec.storageType) {
        case (.null, _):
            return property.isStoredOptional ? value : nil
        case (.text(let text), .text):
            // A decimal in any other form would compare and sort out of numeric order.
            return !isDecimal(property) || OrderedDecimal.isWellFormed(text) ? value : nil
        case (.blob(let data), .blob):
            return data.count == 16 || rawTypeName(property) != UUID.schemaTypeName ? value : nil
        case (.integer(let number), .integer):
            return integerRanges[String(rawTypeName(property))].map { $0.contains(number) } ?? true ? value : nil
        case (.real(let number), .integer):
            // An integral real is that integer (as SQLite stores it in an INTEGER column).
            guard number.rounded() == number, abs(number) < 9.2e18 else { return nil }
            return conformed(.integer(Int64(number)), property)
        case (.real(let number), .real):
            return number.isNaN ? nil : value
        case (.integer(let number), .real):
            // Stored as a real (SQLite would convert it): only when the real is that integer.
            let real = Double(number)
            return Int64(exactly: real) == number ? .real(real) : nil
        default:
            return nil
        }
    }

    /// Whether a value has (or converts to) the type of a property's column.
    static func fits(_ value: StoredValue, _ property: PropertyDescription) -> Bool {
        conformed(value, property) != nil
    }

    /// A type name without its `enum:` prefix: the type of the raw values it stores.
    private static func rawTypeName(_ property: PropertyDescription) -> Substring {
        let name = property.codec.typeName[...]
        return name.hasPrefix("enum:") ? name.dropFirst(5) : name
    }

    /// Whether an attribute holds decimals (``OrderedDecimal``): `decimal` or `enum:decimal`.
    static func isDecimal(_ property: PropertyDescription) -> Bool {
        property.kind == .attribute && rawTypeName(property) == Decimal.schemaTypeName
    }
}
