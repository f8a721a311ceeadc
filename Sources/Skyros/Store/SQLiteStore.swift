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
    /// The schema the store was opened with (its tables are this schema's, migrated if need be).
    public let schema: Schema
    /// The file, or nil for an in-memory store.
    public let url: URL?
    /// The connections: the pool of a file, the queue of an in-memory store (nil only while
    /// the pool opens, see ``init(schema:url:durability:serialAccess:migrations:)``).
    private(set) var writer: (any DatabaseWriter)!
    /// Reads go through the writer connection, one statement each (see ``init(schema:url:durability:serialAccess:migrations:)``).
    let serialAccess: Bool
    /// The durability of the writer connection's commits.
    let durability: Durability
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
    /// A file of an earlier schema version is migrated (<doc:Migration>): the inferred steps, then
    /// the stages of `migrations`, in one transaction. A refused or failed migration throws
    /// ``SkyrosError/Code/migrationFailed`` and leaves the file as it was; a file of a newer
    /// version throws ``SkyrosError/Code/schemaTooNew``; a changed model at the same version
    /// throws ``SkyrosError/Code/schemaMismatch``.
    ///
    /// ```swift
    /// let store = try SQLiteStore(schema: Schema([User.self]), url: fileURL)
    /// let stack = Skyros(store: store)
    /// ```
    ///
    /// - Parameters:
    ///   - schema: the entities; validated first (``SkyrosError/Code/invalidSchema``).
    ///   - url: the SQLite file, created with the schema when missing (WAL mode); nil for an
    ///     in-memory database.
    ///   - durability: how hard each commit is synced (``Durability/full`` by default).
    ///   - serialAccess: reads run on the writer connection, each a single statement
    ///     in SQLite's own implicit read transaction, instead of borrowing a reader from the
    ///     pool and wrapping the statement in BEGIN/COMMIT: a one-object fetch costs about half
    ///     as many instructions, but a read waits for a write in progress instead of running
    ///     beside it. For a caller that serves one request after another anyway, like the
    ///     daemon of an application group.
    ///   - migrations: the stages of migrations to this schema's version.
    /// - Throws: the codes above, ``SkyrosError/Code/invalidSchema``, or
    ///   ``SkyrosError/Code/storeFailure`` when the file cannot be opened.
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
            throw SkyrosError(
                .storeFailure, "could not open the store at \(url?.path ?? ":memory:")", underlying: error)
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
                columnTypes: columns.map { $0.kind == .attribute && !$0.isStoredOptional ? $0.codec.storageType : nil },
                selectList: (["\"_id\"", "\"_version\""] + columns.map { SQLBuilder.quote($0.name) })
                    .map { "t0.\($0)" }.joined(separator: ", "),
                // A link of a many-to-many relationship added by two savers is one link; a
                // position of an ordered to-many placed by two savers is the last one's.
                insertSQL: schema.hasPositions(entity.name)
                    ? "INSERT INTO \(SQLBuilder.quote(entity.name)) (\(names.joined(separator: ", "))) VALUES (\(names.map { _ in "?" }.joined(separator: ", "))) ON CONFLICT(\"_id\") DO UPDATE SET \"position\" = excluded.\"position\""
                    : "INSERT \(schema.isLinkEntity(entity.name) ? "OR IGNORE " : "")INTO \(SQLBuilder.quote(entity.name)) (\(names.joined(separator: ", "))) VALUES (\(names.map { _ in "?" }.joined(separator: ", ")))"
            )
        }
        return tables
    }

    // MARK: - Reading

    /// The rows matching a request, with all their values and versions, sorted and sliced as it
    /// says: one SELECT on a reader connection (the writer's with `serialAccess`).
    ///
    /// - Throws: ``SkyrosError/Code/unknownEntity``, ``SkyrosError/Code/unsupportedPredicate``,
    ///   ``SkyrosError/Code/storeFailure``.
    public func fetchSnapshots(_ request: StoreRequest) throws -> [Snapshot] {
        var result: [Snapshot] = []
        try forEachSnapshot(request) { id, values, version in
            result.append(Snapshot(id: id, values: values, version: version))
        }
        return result
    }

    /// Calls `body` with each row matching a request as SQLite steps it, without collecting the
    /// rows first; the values of many rows share an allocation. `body` runs inside the read: keep
    /// it short, and do not call the store from it.
    ///
    /// - Throws: what ``fetchSnapshots(_:)`` throws, and what `body` throws.
    public func forEachSnapshot(
        _ request: StoreRequest, _ body: (ObjectID, StoredValues, Int64) throws -> Void
    ) throws {
        let table = try tableInfo(request.entityName)
        var builder = SQLBuilder(schema: schema)
        let (selectList, reader) = RowReader.reading(table, for: request)
        let sql = try builder.select(selectList, for: request)
        var arena = StoredValues.Arena()  // the rows' values, a few thousand to an allocation
        try read { db in
            try Self.query(db, sql, builder.arguments) { statement in
                let (id, values, version) = reader.read(statement, &arena)
                try body(id, values, version)
            }
        }
    }

    /// The identifiers of the rows matching a request, sorted and sliced as it says (only the
    /// `_id` column is read).
    ///
    /// - Throws: what ``fetchSnapshots(_:)`` throws.
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

    /// The number of rows matching a request, after its limit and offset: one `SELECT COUNT(*)`.
    ///
    /// - Throws: what ``fetchSnapshots(_:)`` throws.
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

    /// The rows with these identifiers, by entity, 500 to a query; identifiers of objects that do
    /// not exist are left out (in no particular order).
    ///
    /// - Throws: ``SkyrosError/Code/unknownEntity`` for an identifier of an entity not in the
    ///   schema, ``SkyrosError/Code/storeFailure``.
    public func snapshots(for ids: [ObjectID]) throws -> [Snapshot] {
        guard !ids.isEmpty else { return [] }
        // The identifiers in key order, each looked up by one prepared statement, all in one
        // read: a run of neighbouring seeks, with no SQL to build nor IN list to sort.
        let sorted = Self.inKeyOrder(ids)
        var result: [Snapshot] = []
        result.reserveCapacity(ids.count)
        var arena = StoredValues.Arena()
        try read { db in
            var start = 0
            while start < sorted.count {
                let table = try tableInfo(sorted[start].entityName)
                var end = start + 1
                while end < sorted.count && sorted[end].entityName == table.entity.name { end += 1 }
                let reader = RowReader(table)
                let raw = try db.cachedStatement(
                    sql:
                        "SELECT \(table.selectList) FROM \(SQLBuilder.quote(table.entity.name)) AS t0 WHERE t0.\"_id\" = ?"
                ).sqliteStatement
                defer { sqlite3_reset(raw) }
                for id in sorted[start..<end] {
                    sqlite3_reset(raw)
                    Self.bind(raw, 1, id.uuid)
                    switch sqlite3_step(raw) {
                    case SQLITE_ROW:
                        let (_, values, version) = reader.read(raw, &arena)
                        result.append(Snapshot(id: id, values: values, version: version))
                    case SQLITE_DONE: continue
                    default: throw Self.lastError(db, sql: "SELECT … WHERE _id = ? (\(table.entity.name))")
                    }
                }
                start = end
            }
        }
        return result
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

    /// The SQL a request runs, with its arguments (package API, for tests and diagnostics).
    ///
    /// - Throws: ``SkyrosError/Code/unknownEntity`` for an entity not in the schema,
    ///   ``SkyrosError/Code/unsupportedPredicate`` for a predicate SQL cannot express.
    package func sql(for request: StoreRequest) throws -> (sql: String, arguments: [StoredValue]) {
        let table = try tableInfo(request.entityName)
        var builder = SQLBuilder(schema: schema)
        let sql = try builder.select(RowReader.reading(table, for: request).selectList, for: request)
        return (sql, builder.arguments)
    }

    // MARK: - Tables and connections

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
}
