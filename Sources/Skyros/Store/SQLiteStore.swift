import Foundation
import GRDB
import GRDBSQLite

/// How hard a commit is made durable on disk.
public enum Durability: String, Sendable, Codable {
    /// `synchronous=FULL`: a committed save survives a power loss. The default.
    case full
    /// `synchronous=NORMAL`: in WAL mode a commit survives a crash of the process, but the
    /// last commits may be lost on power loss. Faster.
    case normal
}

/// The store at the bottom of the stack: SQLite through GRDB, in a WAL file, or in memory.
///
/// The schema is created on first open. A file of an earlier schema version is migrated
/// (``init(schema:url:durability:serialAccess:migrations:)``); a file made with another schema
/// at the same version is refused with ``SkyrosError/Code/schemaMismatch`` and left untouched. Saves are one
/// IMMEDIATE transaction each, so a change set is stored entirely or not at all.
public final class SQLiteStore: ObjectStore, @unchecked Sendable {
    public let schema: Schema
    /// The file, or nil for an in-memory store.
    public let url: URL?
    /// The connections: the pool of a file, the queue of an in-memory store (nil only while
    /// the pool opens, see ``init(schema:url:durability:serialAccess:migrations:)``).
    private(set) var writer: (any DatabaseWriter)!
    /// Reads go through the writer connection, one statement each (see ``init(schema:url:durability:serialAccess:migrations:)``).
    let serialAccess: Bool
    /// The durability of the writer connection's commits.
    private let durability: Durability
    private let tables: [String: TableInfo]
    /// The connections of cursors (``openCursor(_:)``), each with its prepared statements.
    let cursorConnections = CursorConnections()

    struct TableInfo {
        let entity: EntityDescription
        /// Property indexes that have a column, in column order after `_id`.
        let columnIndexes: [Int]
        /// The type of each of those columns when it is NOT NULL (STRICT tables hold nothing
        /// else there: no need to ask SQLite a row's type); nil when it may hold NULL.
        let columnTypes: [StorageType?]
        let selectList: String
        let insertSQL: String
    }

    /// While a migration stage runs (on the writer's thread, inside the migration's
    /// transaction): the connection reads and saves go through.
    var migrationDatabase: Database?
    /// While a migration stage runs: the temporary tables holding the previous version's
    /// values of removed or retyped columns (by entity), and of removed entities.
    var previousColumns: [String: (table: String, columns: Set<String>)] = [:]
    var previousEntities: [String: String] = [:]

    /// Opens (or creates) the store at `url`, or an in-memory store when `url` is nil.
    ///
    /// A file of an earlier schema version is migrated (DESIGN §6): the inferred steps, then
    /// the stages of `migrations`, in one transaction. A refused or failed migration throws
    /// ``SkyrosError/Code/migrationFailed`` and leaves the file as it was; a file of a newer
    /// version throws ``SkyrosError/Code/schemaTooNew``; a changed model at the same version
    /// throws ``SkyrosError/Code/schemaMismatch``.
    ///
    /// - Parameter serialAccess: reads run on the writer connection, each a single statement
    ///   in SQLite's own implicit read transaction, instead of borrowing a reader from the
    ///   pool and wrapping the statement in BEGIN/COMMIT: a one-object fetch costs about half
    ///   as many instructions, but a read waits for a write in progress instead of running
    ///   beside it. For a caller that serves one request after another anyway, like the
    ///   daemon of an application group.
    /// - Parameter migrations: the stages of migrations to this schema's version.
    public init(
        schema: Schema, url: URL?, durability: Durability = .full, serialAccess: Bool = false,
        migrations: MigrationPlan = MigrationPlan()
    ) throws {
        try schema.validate()
        self.schema = schema
        self.url = url
        self.serialAccess = serialAccess
        self.durability = durability
        self.tables = Self.makeTables(schema)

        var configuration = Configuration()
        // Foreign keys are turned on below, with the durability, in one call.
        configuration.foreignKeysEnabled = false
        configuration.label = "skyros"
        // Another connection to the file (a stack closing and checkpointing, another process)
        // may hold a lock for a moment: wait for it instead of failing at once.
        configuration.busyMode = .timeout(5)
        let synchronous = durability == .full ? "FULL" : "NORMAL"
        let pragmas = "PRAGMA foreign_keys = ON; PRAGMA synchronous = \(synchronous)"
        configuration.prepareDatabase { db in
            // Run by SQLite directly: the first statements of every connection, the open of an
            // existing store among them (GRDB's execute adds its statement bookkeeping).
            try Self.exec(db, pragmas)
        }
        do {
            if let url {
                // An existing store is checked, and migrated or its records refreshed, on the
                // pool's writer connection as it opens (before GRDB's own set-up of WAL mode),
                // so one connection does it all: a refusal or a failed migration throws out of
                // the pool's opening with nothing committed, and the connection's close removes
                // the -wal and -shm files it made; a migration's commit leaves a WAL that spares
                // the pool the transaction of its own it commits when the WAL is missing or empty.
                let opening = OpeningHook()
                if FileManager.default.fileExists(atPath: url.path) {
                    opening.set { [unowned self] db in try self.openSchema(db, plan: migrations, creating: false) }
                }
                var poolConfiguration = configuration
                poolConfiguration.prepareDatabase { db in
                    if !db.configuration.readonly { try opening.run(db) }
                }
                let pool = try DatabasePool(path: url.path, configuration: poolConfiguration)
                writer = pool
                let opened = opening.opened
                try pool.writeWithoutTransaction { db in
                    // GRDB sets synchronous=NORMAL when it enables WAL, after prepareDatabase:
                    // set the requested durability again on the writer connection.
                    try db.execute(sql: "PRAGMA synchronous = \(synchronous)")
                    if !opened { try self.openSchema(db, plan: migrations) }
                }
            } else {
                writer = try DatabaseQueue(configuration: configuration)
                _ = try writer.writeWithoutTransaction { db in try self.openSchema(db, plan: migrations) }
            }
        } catch let error as SkyrosError {
            throw error
        } catch {
            throw SkyrosError(.storeFailure, "could not open the store at \(url?.path ?? ":memory:")", underlying: error)
        }
    }

    /// A store of another schema over the same connections, for a migration stage of an
    /// intermediate version.
    init(view schema: Schema, of store: SQLiteStore) throws {
        self.schema = schema
        self.url = store.url
        self.serialAccess = store.serialAccess
        self.durability = store.durability
        self.writer = store.writer
        self.tables = Self.makeTables(schema)
    }

    private static func makeTables(_ schema: Schema) -> [String: TableInfo] {
        var tables: [String: TableInfo] = [:]
        for entity in schema.entities {
            let columns = entity.properties.filter(\.hasColumn)
            let names = ["\"_id\""] + columns.map { SQLBuilder.quote($0.name) }
            tables[entity.name] = TableInfo(
                entity: entity, columnIndexes: columns.map(\.index),
                columnTypes: columns.map { $0.kind == .attribute && !$0.codec.isOptional ? $0.codec.storageType : nil },
                selectList: (["\"_id\"", "\"_version\""] + columns.map { SQLBuilder.quote($0.name) })
                    .map { "t0.\($0)" }.joined(separator: ", "),
                insertSQL:
                    "INSERT INTO \(SQLBuilder.quote(entity.name)) (\(names.joined(separator: ", "))) VALUES (\(names.map { _ in "?" }.joined(separator: ", ")))"
            )
        }
        return tables
    }

    /// The schema recorded in an existing store file, read without writing to it; nil when
    /// the file does not exist or has no Skyros schema yet.
    public static func storedSchemaDescription(at url: URL) throws -> SchemaDescription? {
        guard FileManager.default.fileExists(atPath: url.path),
            let json = try metadata(["schema"], of: url)["schema"]
        else { return nil }
        do {
            return try SchemaDescription(json: json.utf8).upgradingLegacyTypeNames()
        } catch {
            throw SkyrosError(.storeFailure, "could not read the schema of the store at \(url.path)", underlying: error)
        }
    }

    /// The layout of the tables: 2 adds each object's `_version`.
    static let format = "2"

    /// Values of `skyros_metadata` in an existing file, read through a read-only connection
    /// that writes nothing; none when the file has no Skyros metadata.
    static func metadata(_ keys: [String], of url: URL) throws -> [String: String] {
        var values: [String: String] = [:]
        for row in try readOnlyRows("SELECT key, value FROM skyros_metadata", of: url) ?? [] {
            if let key = row[0], let value = row[1], keys.contains(key) { values[key] = value }
        }
        return values
    }

    /// The rows of a query of an existing file (as text), read through a read-only connection
    /// that writes nothing; nil when a table it reads does not exist. Without a `-wal` file
    /// the database file holds everything committed, and it is read as immutable: a plain
    /// read-only connection to a WAL database would create the `-wal` and `-shm` files.
    static func readOnlyRows(_ sql: String, of url: URL) throws -> [[String?]]? {
        let walExists = FileManager.default.fileExists(atPath: url.path + "-wal")
        var components = URLComponents()
        components.scheme = "file"
        components.path = url.path
        if !walExists { components.queryItems = [URLQueryItem(name: "immutable", value: "1")] }
        let failure = { (reason: String) in
            SkyrosError(.storeFailure, "could not read the metadata of the store at \(url.path): \(reason)")
        }
        var db: OpaquePointer?
        defer { sqlite3_close_v2(db) }
        guard let uri = components.string,
            sqlite3_open_v2(uri, &db, SQLITE_OPEN_READONLY | SQLITE_OPEN_URI, nil) == SQLITE_OK, let db
        else { throw failure(db.map { String(cString: sqlite3_errmsg($0)) } ?? "cannot open") }
        var statement: OpaquePointer?
        defer { sqlite3_finalize(statement) }
        guard sqlite3_prepare_v2(db, sql, -1, &statement, nil) == SQLITE_OK, let statement else {
            let message = String(cString: sqlite3_errmsg(db))
            if message.hasPrefix("no such table") { return nil }
            throw failure(message)
        }
        var rows: [[String?]] = []
        let count = sqlite3_column_count(statement)
        while true {
            let code = sqlite3_step(statement)
            guard code == SQLITE_ROW else {
                guard code == SQLITE_DONE else { throw failure(String(cString: sqlite3_errmsg(db))) }
                break
            }
            rows.append((0..<count).map { column in sqlite3_column_text(statement, column).map { String(cString: $0) } })
        }
        return rows
    }

    /// Creates the schema of a new store, or opens an existing one: brings its records up
    /// to date, or migrates it (foreign keys off during the transaction, as SQLite's table
    /// rebuild requires; checked before commit).
    ///
    /// - Parameter creating: whether to create the schema of a file that has none.
    /// - Returns: false when the file has no schema and `creating` is false.
    @discardableResult
    private func openSchema(_ db: Database, plan: MigrationPlan, creating: Bool = true) throws -> Bool {
        let path = url?.path ?? ":memory:"
        var decided: (state: StoredState, decision: OpenDecision)?
        let existing = try Self.storedStateIfAny(db)
        guard existing != nil || creating else { return false }
        if let state = existing {
            // Decided first without the write lock: an up-to-date store takes none.
            if let format = state.format, format != Self.format {
                throw SkyrosError(
                    .schemaMismatch,
                    "the store at \(path) has file format \(format), this Skyros reads format \(Self.format); the file was left untouched")
            }
            let decision = try Self.decide(state, schema: schema, plan: plan, path: path)
            guard Self.writes(decision, state) else { return true }
            decided = (state, decision)
        }
        // Foreign keys off during a migration that may meet them, as SQLite's table rebuild
        // requires (a no-op inside a transaction: set before it); checked before commit.
        var foreignKeysOff = true
        if case .migrate(let stored, _, let milestones, _) = decided?.decision {
            foreignKeysOff = Self.mayMeetForeignKeys(from: stored, through: milestones)
        }
        if foreignKeysOff { try db.execute(sql: "PRAGMA foreign_keys = OFF") }
        defer { if foreignKeysOff { try? db.execute(sql: "PRAGMA foreign_keys = ON") } }
        // The commit of a migration (or of refreshed records) of an existing store is not
        // synced on its own: WAL keeps it atomic, so a power loss before it reaches the disk
        // leaves the old schema whole, migrated again at the next open; and the next durable
        // commit (whose sync covers the WAL before it) or the checkpoint at close makes it
        // durable before any save made after it is. A new store's creation is synced: an empty
        // file is refused as damage, never taken for a new store.
        let deferredSync = decided != nil && durability == .full
        if deferredSync { try Self.exec(db, "PRAGMA synchronous = NORMAL") }
        defer { if deferredSync { try? Self.exec(db, "PRAGMA synchronous = FULL") } }
        let opened = try Self.immediateTransaction(db) { db -> Bool in
            guard let state = try Self.storedStateIfAny(db) else {
                try db.execute(sql: "CREATE TABLE skyros_metadata (key TEXT PRIMARY KEY NOT NULL, value TEXT NOT NULL)")
                try db.execute(
                    sql: "INSERT INTO skyros_metadata (key, value) VALUES ('format', ?), ('decimals', ?)",
                    arguments: [Self.format, Self.decimalsForm])
                for statement in Self.schemaSQL(schema) { try db.execute(sql: statement) }
                try Self.recordCurrent(schema, db)
                return true
            }
            // Read again inside the transaction: another process may have migrated the store
            // meanwhile (the decision stands when the state is the one it was made on).
            let decision = try decided.flatMap { $0.state == state ? $0.decision : nil }
                ?? Self.decide(state, schema: schema, plan: plan, path: path)
            switch decision {
            case .open:
                break
            case .refreshRecords:
                // The same model (recorded with runtime type names, or before versions were
                // recorded): the records are brought up to date.
                try Self.recordCurrent(schema, db)
            case .migrate(let stored, let version, let milestones, let steps):
                // Another process migrated the store meanwhile to a version whose migration
                // may meet foreign keys, still on: nothing done, decided again from the start.
                if !foreignKeysOff && Self.mayMeetForeignKeys(from: stored, through: milestones) { return false }
                try migrate(from: stored, version: version, milestones: milestones, steps: steps, state: state, db)
            }
            if state.decimals != Self.decimalsForm { try upgradeDecimals(db) }
            return true
        }
        return try opened || openSchema(db, plan: plan, creating: creating)
    }

    /// Whether opening a store in `state` writes to it.
    private static func writes(_ decision: OpenDecision, _ state: StoredState) -> Bool {
        if case .open = decision { return state.decimals != decimalsForm }
        return true
    }

    /// The form of decimal values, recorded in `skyros_metadata` under `decimals`: `ordered`
    /// (``OrderedDecimal``). A store without the record holds them in POSIX notation.
    static let decimalsForm = "ordered"

    /// Converts the decimal columns of a store written before ``OrderedDecimal`` (no
    /// `decimals` record) to the ordered form: one UPDATE per column, in the opening
    /// transaction, of the values that do not already have the form; then records it.
    private func upgradeDecimals(_ db: Database) throws {
        var columns: [(table: String, column: String)] = []
        for entity in schema.entities {
            for property in entity.properties where Self.isDecimal(property) {
                columns.append((entity.name, property.name))
            }
        }
        if !columns.isEmpty {
            // A value that is not a decimal in plain notation is left as it is.
            let function = DatabaseFunction("skyros_ordered_decimal", argumentCount: 1, pure: true) { values in
                guard let text = String.fromDatabaseValue(values[0]) else { return values[0] }
                return OrderedDecimal.encode(plain: text) ?? text
            }
            db.add(function: function)
            defer { db.remove(function: function) }
            for (table, column) in columns {
                let name = SQLBuilder.quote(column)
                try db.execute(
                    sql: "UPDATE \(SQLBuilder.quote(table)) SET \(name) = skyros_ordered_decimal(\(name)) WHERE \(name) NOT GLOB '[nop]*'")
            }
        }
        try db.execute(
            sql: "INSERT OR REPLACE INTO skyros_metadata (key, value) VALUES ('decimals', ?)", arguments: [Self.decimalsForm])
    }

    /// The DDL of a schema: one STRICT, WITHOUT ROWID table per entity, foreign keys with
    /// the inverse's delete rule (deferred to commit), and indexes.
    static func schemaSQL(_ schema: Schema) -> [String] {
        var statements: [String] = []
        for entity in schema.entities {
            statements.append(tableSQL(entity, in: schema))
            statements += indexDefinitions(entity).map(\.sql)
        }
        return statements
    }

    /// The CREATE TABLE statement of an entity, for a table named `table` (the entity name by default).
    static func tableSQL(_ entity: EntityDescription, in schema: Schema, table: String? = nil) -> String {
        var columns = ["\"_id\" BLOB PRIMARY KEY NOT NULL", "\"_version\" INTEGER NOT NULL DEFAULT 1"]
        for property in entity.properties where property.hasColumn {
            columns.append(columnDefinition(property, of: entity, in: schema))
        }
        return "CREATE TABLE \(SQLBuilder.quote(table ?? entity.name)) (\(columns.joined(separator: ", "))) STRICT, WITHOUT ROWID"
    }

    /// The definition of a property's column: its type and NOT NULL, or for a to-one the
    /// foreign key with the inverse's delete rule.
    static func columnDefinition(_ property: PropertyDescription, of entity: EntityDescription, in schema: Schema) -> String {
        let name = SQLBuilder.quote(property.name)
        if property.kind == .toOne {
            return "\(name) BLOB REFERENCES \(SQLBuilder.quote(property.destinationName!))(\"_id\") ON DELETE \(deleteAction(property, of: entity, in: schema)) DEFERRABLE INITIALLY DEFERRED"
        }
        return "\(name) \(property.codec.storageType.rawValue)\(property.codec.isOptional ? "" : " NOT NULL")"
    }

    /// The ON DELETE action of a to-one's foreign key: its inverse's delete rule.
    static func deleteAction(_ property: PropertyDescription, of entity: EntityDescription, in schema: Schema) -> String {
        switch schema.inverse(of: property, in: entity)?.deleteRule {
        case .cascade: "CASCADE"
        case .deny: "NO ACTION"
        default: "SET NULL"
        }
    }

    /// An index of a table as the schema declares it.
    struct IndexDefinition {
        let name: String
        let sql: String
        /// The property of a single-property index (unique or indexed attribute, to-one).
        let property: PropertyDescription?
    }

    /// The indexes of an entity's table: unique and indexed properties, declared indexes.
    static func indexDefinitions(_ entity: EntityDescription) -> [IndexDefinition] {
        let table = SQLBuilder.quote(entity.name)
        var indexes: [IndexDefinition] = []
        for property in entity.properties where property.hasColumn && (property.isUnique || property.isIndexed) {
            let name = "\(entity.name)_\(property.name)"
            let kind = property.isUnique ? "UNIQUE INDEX" : "INDEX"
            indexes.append(IndexDefinition(
                name: name, sql: "CREATE \(kind) \(SQLBuilder.quote(name)) ON \(table) (\(SQLBuilder.quote(property.name)))",
                property: property))
        }
        for (number, index) in entity.indexes.enumerated() {
            let name = "\(entity.name)_index\(number)"
            indexes.append(IndexDefinition(
                name: name,
                sql: "CREATE INDEX \(SQLBuilder.quote(name)) ON \(table) (\(index.map(SQLBuilder.quote).joined(separator: ", ")))",
                property: nil))
        }
        return indexes
    }

    // MARK: - Reading

    public func fetchSnapshots(_ request: StoreRequest) throws -> [Snapshot] {
        var result: [Snapshot] = []
        try forEachSnapshot(request) { id, values, version in
            result.append(Snapshot(id: id, values: values, version: version))
        }
        return result
    }

    public func forEachSnapshot(
        _ request: StoreRequest, _ body: (ObjectID, StoredValues, Int64) throws -> Void
    ) throws {
        let table = try tableInfo(request.entityName)
        var builder = SQLBuilder(schema: schema)
        let sql = try builder.select(table.selectList, for: request)
        let reader = RowReader(table)
        var arena = StoredValues.Arena()  // the rows' values, a few thousand to an allocation
        try read { db in
            try Self.query(db, sql, builder.arguments) { statement in
                let (id, values, version) = reader.read(statement, &arena)
                try body(id, values, version)
            }
        }
    }

    public func fetchIdentifiers(_ request: StoreRequest) throws -> [ObjectID] {
        let table = try tableInfo(request.entityName)
        var builder = SQLBuilder(schema: schema)
        let sql = try builder.select("t0.\"_id\"", for: request)
        return try read { db in
            var result: [ObjectID] = []
            try Self.query(db, sql, builder.arguments) { statement in
                result.append(ObjectID(entityName: table.entity.name, uuid: Self.uuid(statement, 0)))
            }
            return result
        }
    }

    public func count(_ request: StoreRequest) throws -> Int {
        _ = try tableInfo(request.entityName)
        var builder = SQLBuilder(schema: schema)
        var sql: String
        if request.limit != nil || request.offset > 0 {
            sql = "SELECT COUNT(*) FROM (" + (try builder.select("1", for: request, sorted: false)) + ")"
        } else {
            sql = try builder.select("COUNT(*)", for: request, sorted: false, sliced: false)
        }
        return try read { db in
            var count = 0
            try Self.query(db, sql, builder.arguments) { count = Int(sqlite3_column_int64($0, 0)) }
            return count
        }
    }

    public func snapshots(for ids: [ObjectID]) throws -> [Snapshot] {
        var result: [Snapshot] = []
        for (entityName, group) in Dictionary(grouping: ids, by: \.entityName) {
            var start = 0
            while start < group.count {
                let chunk = group[start..<min(start + 500, group.count)]
                start += 500
                let request = StoreRequest(
                    entityName: entityName,
                    predicate: .isIn(.property(scope: 0, path: [PredicateNode.idProperty]), chunk.map { $0.uuid.storedValue }))
                result += try fetchSnapshots(request)
            }
        }
        return result
    }

    // MARK: - Writing

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
    /// - Returns: the updates applied, each with the object's new version (under
    ///   ``MergePolicy/storeWins``, conflicting updates are left out).
    @discardableResult
    func apply(_ changes: ChangeSet, _ db: Database) throws -> [AppliedUpdate] {
        try validateShape(of: changes)
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
        for update in changes.updated {
            let table = try tableInfo(update.id.entityName)
            let indexes = update.changes.keys.sorted().filter { table.entity.properties[$0].hasColumn }
            let check = changes.mergePolicy != .saverWins && update.baseVersion > 0
            if indexes.isEmpty || check {
                guard let current = try Self.version(of: update.id, table, db) else { throw Self.notFound(update.id) }
                if check && current != update.baseVersion {
                    // The object changed in the store since the saver read it.
                    if changes.mergePolicy == .storeWins { continue }
                    conflicts.append(MergeConflict(
                        objectID: update.id, properties: indexes.map { table.entity.properties[$0].name },
                        baseVersion: update.baseVersion, storeVersion: current))
                    continue
                }
                if indexes.isEmpty {
                    applied.append(AppliedUpdate(id: update.id, version: current, changes: [:]))
                    continue
                }
            }
            let assignments = indexes.map { "\(SQLBuilder.quote(table.entity.properties[$0].name)) = ?" } + ["\"_version\" = \"_version\" + 1"]
            let statement = try db.cachedStatement(
                sql: "UPDATE \(SQLBuilder.quote(table.entity.name)) SET \(assignments.joined(separator: ", ")) WHERE \"_id\" = ? RETURNING \"_version\"")
            let raw = statement.sqliteStatement
            sqlite3_reset(raw)
            var values: [Int: StoredValue] = [:]
            for (position, index) in indexes.enumerated() {
                let value = update.changes[index] ?? .null
                values[index] = value
                Self.bind(raw, Int32(position + 1), value)
            }
            Self.bind(raw, Int32(indexes.count + 1), update.id.uuid.storedValue)
            let version: Int64?
            do {
                version = try Self.stepReturning(db, raw)
            } catch {
                throw try uniqueViolation(error, table.entity, update.id, { values[$0] }, db)
            }
            guard let version else { throw Self.notFound(update.id) }
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
        for id in changes.deleted where try Self.version(of: id, try tableInfo(id.entityName), db) == nil {
            throw Self.notFound(id)
        }
        for id in changes.deleted {
            let table = try tableInfo(id.entityName)
            let statement = try db.cachedStatement(sql: "DELETE FROM \(SQLBuilder.quote(table.entity.name)) WHERE \"_id\" = ?")
            let raw = statement.sqliteStatement
            sqlite3_reset(raw)
            Self.bind(raw, 1, id.uuid.storedValue)
            try Self.stepDone(db, raw)
        }
        return applied
    }

    /// An update as applied: the object, its version after the update, and the values of
    /// the properties it changed (stored properties only), by property index.
    public struct AppliedUpdate: Sendable, Hashable {
        public var id: ObjectID
        public var version: Int64
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
            db, "SELECT \"_id\" FROM \(SQLBuilder.quote(entity.name)) WHERE \(SQLBuilder.quote(property.name)) = ? LIMIT 1", [held]
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
        let raw = try db.cachedStatement(sql: "SELECT \"_version\" FROM \(SQLBuilder.quote(table.entity.name)) WHERE \"_id\" = ?")
            .sqliteStatement
        sqlite3_reset(raw)
        bind(raw, 1, id.uuid.storedValue)
        defer { sqlite3_reset(raw) }
        return sqlite3_step(raw) == SQLITE_ROW ? sqlite3_column_int64(raw, 0) : nil
    }

    /// Checks what a change set from another process could get wrong before touching the
    /// database: known entities, one value per property, property indexes in range, and every
    /// value of the storage class its property declares (STRICT tables would convert text
    /// that looks like a number, and a number into text: ``SkyrosError/Code/typeMismatch``).
    func validateShape(of changes: ChangeSet) throws {
        for snapshot in changes.inserted {
            let table = try tableInfo(snapshot.id.entityName)
            guard snapshot.values.count == table.entity.properties.count else {
                throw SkyrosError(
                    .valueNotStorable,
                    "\(snapshot.id) has \(snapshot.values.count) values; \(table.entity.name) has \(table.entity.properties.count) properties")
            }
            for index in table.columnIndexes {
                try Self.checkType(snapshot.values[index], table.entity, index, snapshot.id)
            }
            // A to-many has no value of its own (its objects point here): anything but NULL
            // would be published to other clients and never stored.
            for property in table.entity.properties where property.kind == .toMany && !snapshot.values[property.index].isNull {
                throw SkyrosError(
                    .typeMismatch,
                    "\(table.entity.name).\(property.name) is a to-many relationship, whose value is always null; \(snapshot.id) gives it \(snapshot.values[property.index].typeDescription)")
            }
        }
        for update in changes.updated {
            let table = try tableInfo(update.id.entityName)
            if let index = update.changes.keys.first(where: { $0 < 0 || $0 >= table.entity.properties.count }) {
                throw SkyrosError(.valueNotStorable, "\(table.entity.name) has no property number \(index)")
            }
            for (index, value) in update.changes where table.entity.properties[index].hasColumn {
                try Self.checkType(value, table.entity, index, update.id)
            }
        }
        for id in changes.deleted { _ = try tableInfo(id.entityName) }
    }

    /// Throws ``SkyrosError/Code/typeMismatch`` when a value does not fit its property.
    private static func checkType(_ value: StoredValue, _ entity: EntityDescription, _ index: Int, _ id: ObjectID) throws {
        let property = entity.properties[index]
        guard !fits(value, property) else { return }
        let declared =
            property.kind == .toOne
            ? "a reference to \(property.destinationName ?? "?") (a 16-byte blob or null)"
            : "\(property.codec.isOptional ? "an optional " : "")\(property.codec.typeName) (\(property.codec.storageType.rawValue))"
        throw SkyrosError(
            .typeMismatch, "\(entity.name).\(property.name) is \(declared); \(id) gives it \(value.typeDescription)")
    }

    /// Whether a value has the storage class of a property's column.
    static func fits(_ value: StoredValue, _ property: PropertyDescription) -> Bool {
        if property.kind == .toOne {
            switch value {
            case .null: return true
            case .blob(let data): return data.count == 16
            default: return false
            }
        }
        switch (value, property.codec.storageType) {
        case (.null, _): return property.codec.isOptional
        case (.text(let text), .text) where isDecimal(property):
            // A decimal in any other form would compare and sort out of numeric order.
            return OrderedDecimal.isWellFormed(text)
        case (.integer, .integer), (.integer, .real), (.real, .real), (.text, .text), (.blob, .blob): return true
        case (.real(let number), .integer): return number.rounded() == number && abs(number) < 9.2e18
        default: return false
        }
    }

    /// Whether an attribute holds decimals (``OrderedDecimal``): `decimal` or `enum:decimal`.
    static func isDecimal(_ property: PropertyDescription) -> Bool {
        let type = property.codec.typeName
        return property.kind == .attribute
            && (type == Decimal.schemaTypeName || type == "enum:" + Decimal.schemaTypeName)
    }

    /// Deletes every object, keeping the schema.
    public func deleteAll() throws {
        try transaction { transaction in try transaction.deleteAll() }
    }

    /// Closes the database connections. The store cannot be used afterwards.
    public func close() throws {
        cursorConnections.close()
        if let pool = writer as? DatabasePool {
            pool.writeWithoutTransaction { db in _ = try? db.checkpoint(.truncate) }
            try pool.close()
        } else if let queue = writer as? DatabaseQueue {
            try queue.close()
        }
    }

    /// The durability the writer connection actually runs with (`PRAGMA synchronous`).
    public func effectiveDurability() throws -> Durability {
        let mode = try writer.writeWithoutTransaction { db in try Int.fetchOne(db, sql: "PRAGMA synchronous") }
        return mode == 1 ? .normal : .full
    }

    /// The SQL a request runs, with its arguments (for tests and diagnostics).
    public func sql(for request: StoreRequest) throws -> (sql: String, arguments: [StoredValue]) {
        let table = try tableInfo(request.entityName)
        var builder = SQLBuilder(schema: schema)
        let sql = try builder.select(table.selectList, for: request)
        return (sql, builder.arguments)
    }

    // MARK: - SQLite plumbing

    func tableInfo(_ entityName: String) throws -> TableInfo {
        guard let table = tables[entityName] else {
            throw SkyrosError(.unknownEntity, "entity \(entityName) is not in the schema")
        }
        return table
    }

    /// Runs `body` as a read: on the writer connection with serial access, else on a reader
    /// of the pool (or the queue of an in-memory store); errors become ``SkyrosError``s.
    func read<T>(_ body: (Database) throws -> T) throws -> T {
        do {
            if let migrationDatabase { return try body(migrationDatabase) }
            if serialAccess { return try writer.writeWithoutTransaction(body) }
            if let pool = writer as? DatabasePool { return try pool.read(body) }
            return try writer.read(body)
        } catch {
            throw Self.translate(error)
        }
    }

    static func query(
        _ db: Database, _ sql: String, _ arguments: [StoredValue], row: (OpaquePointer) throws -> Void
    ) throws {
        let statement = try db.cachedStatement(sql: sql)
        let raw = statement.sqliteStatement
        sqlite3_reset(raw)
        sqlite3_clear_bindings(raw)
        for (position, value) in arguments.enumerated() { bind(raw, Int32(position + 1), value) }
        defer { sqlite3_reset(raw) }
        while true {
            let code = sqlite3_step(raw)
            if code == SQLITE_ROW {
                try row(raw)
            } else if code == SQLITE_DONE {
                return
            } else {
                throw lastError(db, sql: sql)
            }
        }
    }

    /// Runs SQL without arguments directly (`sqlite3_exec`).
    static func exec(_ db: Database, _ sql: String) throws {
        var message: UnsafeMutablePointer<CChar>?
        guard sqlite3_exec(db.sqliteConnection, sql, nil, nil, &message) == SQLITE_OK else {
            defer { sqlite3_free(message) }
            throw DatabaseError(message: message.map { String(cString: $0) } ?? "could not run \(sql)", sql: sql)
        }
    }

    static func stepDone(_ db: Database, _ raw: OpaquePointer) throws {
        let code = sqlite3_step(raw)
        sqlite3_reset(raw)
        if code != SQLITE_DONE { throw lastError(db) }
    }

    /// The error of the connection's last failed call.
    static func lastError(_ db: Database, sql: String? = nil) -> DatabaseError {
        DatabaseError(
            resultCode: ResultCode(rawValue: sqlite3_extended_errcode(db.sqliteConnection)),
            message: String(cString: sqlite3_errmsg(db.sqliteConnection)), sql: sql)
    }

    /// Steps a statement that returns at most one integer (`… RETURNING column`): the integer,
    /// or nil when no row was touched.
    static func stepReturning(_ db: Database, _ raw: OpaquePointer) throws -> Int64? {
        defer { sqlite3_reset(raw) }
        var result: Int64?
        var code = sqlite3_step(raw)
        if code == SQLITE_ROW {
            result = sqlite3_column_int64(raw, 0)
            code = sqlite3_step(raw)
        }
        guard code == SQLITE_DONE else { throw lastError(db) }
        return result
    }

    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)

    static func bind(_ statement: OpaquePointer, _ position: Int32, _ value: StoredValue) {
        switch value {
        case .null: sqlite3_bind_null(statement, position)
        case .integer(let value): sqlite3_bind_int64(statement, position, value)
        case .real(let value): sqlite3_bind_double(statement, position, value)
        case .text(var value):
            value.withUTF8 { buffer in
                _ = sqlite3_bind_text(
                    statement, position, UnsafeRawPointer(buffer.baseAddress!).assumingMemoryBound(to: CChar.self),
                    Int32(buffer.count), transient)
            }
        case .blob(let data):
            data.withUnsafeBytes { buffer in
                _ = sqlite3_bind_blob(statement, position, buffer.baseAddress ?? UnsafeRawPointer(bitPattern: 1), Int32(buffer.count), transient)
            }
        }
    }

    /// Binds an object identifier as its 16 bytes, without an intermediate `Data`.
    static func bind(_ statement: OpaquePointer, _ position: Int32, _ uuid: UUID) {
        withUnsafeBytes(of: uuid.uuid) { buffer in
            _ = sqlite3_bind_blob(statement, position, buffer.baseAddress, 16, transient)
        }
    }

    /// A column of the current row whose type is known (NOT NULL in a STRICT table), or asked.
    @inline(__always)
    static func value(_ statement: OpaquePointer, _ column: Int32, _ type: StorageType?) -> StoredValue {
        switch type {
        case .integer?: .integer(sqlite3_column_int64(statement, column))
        case .real?: .real(sqlite3_column_double(statement, column))
        case .text?: text(statement, column)
        case .blob?, nil: value(statement, column)
        }
    }

    static func text(_ statement: OpaquePointer, _ column: Int32) -> StoredValue {
        let count = Int(sqlite3_column_bytes(statement, column))
        guard let pointer = sqlite3_column_text(statement, column) else { return .text("") }
        return .text(String(decoding: UnsafeBufferPointer(start: pointer, count: count), as: UTF8.self))
    }

    static func value(_ statement: OpaquePointer, _ column: Int32) -> StoredValue {
        switch sqlite3_column_type(statement, column) {
        case SQLITE_INTEGER: return .integer(sqlite3_column_int64(statement, column))
        case SQLITE_FLOAT: return .real(sqlite3_column_double(statement, column))
        case SQLITE_TEXT: return text(statement, column)
        case SQLITE_BLOB:
            let count = Int(sqlite3_column_bytes(statement, column))
            guard let pointer = sqlite3_column_blob(statement, column) else { return .blob(Data()) }
            return .blob(Data(bytes: pointer, count: count))
        default: return .null
        }
    }

    static func uuid(_ statement: OpaquePointer, _ column: Int32) -> UUID {
        guard let pointer = sqlite3_column_blob(statement, column), sqlite3_column_bytes(statement, column) == 16 else {
            return UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0))
        }
        // A UUID is its 16 bytes: loaded as one, without a call to its initializer per row.
        assert(MemoryLayout<UUID>.size == MemoryLayout<uuid_t>.size)
        return pointer.loadUnaligned(as: UUID.self)
    }

    /// Maps SQLite errors to typed Skyros errors.
    static func translate(_ error: any Error) -> SkyrosError {
        if let error = error as? SkyrosError { return error }
        guard let error = error as? DatabaseError else {
            return SkyrosError(.storeFailure, "\(error)", underlying: error)
        }
        let message = error.message ?? "\(error)"
        switch error.extendedResultCode {
        case .SQLITE_CONSTRAINT_UNIQUE, .SQLITE_CONSTRAINT_PRIMARYKEY:
            return SkyrosError(.uniqueConstraintViolation, message, underlying: error)
        case .SQLITE_CONSTRAINT_FOREIGNKEY:
            return SkyrosError(.deleteDenied, "relationship integrity: \(message)", underlying: error)
        case .SQLITE_CONSTRAINT_NOTNULL, .SQLITE_CONSTRAINT_DATATYPE:
            return SkyrosError(.valueNotStorable, message, underlying: error)
        default:
            return SkyrosError(.storeFailure, message, underlying: error)
        }
    }
}

/// The work an opening store does on its pool's writer connection as it opens (see
/// ``SQLiteStore/init(schema:url:durability:serialAccess:migrations:)``): run once, on the
/// first connection that is not read-only, then dropped (the pool's configuration keeps the
/// hook, not the store).
final class OpeningHook: @unchecked Sendable {
    private let lock = NSLock()
    private var body: ((Database) throws -> Bool)?
    private var done = false

    /// Whether the body ran and opened the store.
    var opened: Bool { lock.withLock { done } }

    func set(_ body: @escaping (Database) throws -> Bool) { lock.withLock { self.body = body } }

    func run(_ db: Database) throws {
        let body = lock.withLock {
            defer { self.body = nil }
            return self.body
        }
        guard let body else { return }
        let opened = try body(db)
        lock.withLock { done = opened }
    }
}

