import Foundation
import GRDBSQLite

extension SQLiteStore {
    /// Reads one row of a table's `SELECT _id, _version, columns…` into an identifier, its
    /// values (made in an arena: a few thousand values to an allocation) and its version,
    /// with no per-row dictionary, `Any` or column lookup by name.
    struct RowReader {
        let entityName: String
        let count: Int
        let columnIndexes: [Int]
        let types: [StorageType?]
        /// No to-many: column i + 2 is property i.
        let dense: Bool
        /// For an entity hierarchy's table: the column of `_entity` (past the end otherwise),
        /// and its entities' names as stored values, so that a row's entity is one of them
        /// (compared byte for byte) rather than a string made for each row.
        let entityColumn: Int
        let entityNames: [(bytes: [UInt8], value: StoredValue)]

        /// For a fetch of one entity of a hierarchy with no subentity: its name, the `_entity`
        /// of every row (not selected).
        let entityConstant: (index: Int, value: StoredValue)?
        /// Where each property's value comes from when the row is not dense: its column's
        /// position in the select list, -1 for NULL (no column read), -2 for `entityConstant`.
        let sources: [Int]

        init(_ table: TableInfo) {
            self.init(table, columns: Array(table.columnIndexes.indices), entityConstant: nil)
        }

        /// Reads the columns at these positions of the table's (the others are NULL), and
        /// gives `_entity` the constant when there is one.
        init(_ table: TableInfo, columns: [Int], entityConstant: (index: Int, value: StoredValue)?) {
            entityName = table.entity.name
            count = table.entity.properties.count
            columnIndexes = columns.map { table.columnIndexes[$0] }
            types = columns.map { table.columnTypes[$0] }
            dense = entityConstant == nil && columnIndexes == Array(0..<table.entity.properties.count)
            self.entityConstant = entityConstant
            var sources = [Int](repeating: -1, count: count)
            for (column, index) in columnIndexes.enumerated() { sources[index] = column }
            if let entityConstant { sources[entityConstant.index] = -2 }
            self.sources = sources
            if let hierarchy = table.entity.hierarchy, let column = columnIndexes.firstIndex(of: hierarchy.entityIndex)
            {
                entityColumn = column
                entityNames = hierarchy.members.map { (Array($0.name.utf8), StoredValue.text($0.name)) }
            } else {
                entityColumn = Int.max
                entityNames = []
            }
        }

        /// What a request reads of a table, and how: for a fetch of a subentity of a hierarchy
        /// (its filter, ``Schema/restricting(_:to:)``), only the columns of its entities (the
        /// other entities' are NULL in its rows) and, for a subentity without subentities, not
        /// `_entity` (it is that subentity's name); every column otherwise.
        static func reading(_ table: TableInfo, for request: StoreRequest) -> (selectList: String, reader: RowReader) {
            guard let hierarchy = table.entity.hierarchy,
                let names = EntityHierarchy.filteredNames(in: request.predicate)
            else {
                return (table.selectList, RowReader(table))
            }
            let members = hierarchy.members.filter { names.contains(.text($0.name)) }
            guard !members.isEmpty else { return (table.selectList, RowReader(table)) }
            var wanted = members.reduce(into: Set<Int>()) { $0.formUnion($1.propertyIndexes) }
            let constant = members.count == 1 ? (hierarchy.entityIndex, StoredValue.text(members[0].name)) : nil
            if constant == nil { wanted.insert(hierarchy.entityIndex) }
            let columns = table.columnIndexes.indices.filter { wanted.contains(table.columnIndexes[$0]) }
            let selectList =
                (["\"_id\"", "\"_version\""]
                + columns.map { SQLBuilder.quote(table.entity.properties[table.columnIndexes[$0]].name) })
                .map { "t0.\($0)" }.joined(separator: ", ")
            return (selectList, RowReader(table, columns: columns, entityConstant: constant))
        }

        /// A row's `_entity`: one of the hierarchy's names, or read as any text.
        @inline(never)
        func entity(_ statement: OpaquePointer, _ column: Int32) -> StoredValue {
            let length = Int(sqlite3_column_bytes(statement, column))
            if let text = sqlite3_column_text(statement, column) {
                for name in entityNames where name.bytes.count == length {
                    if name.bytes.withUnsafeBufferPointer({ memcmp($0.baseAddress!, text, length) == 0 }) {
                        return name.value
                    }
                }
            }
            return SQLiteStore.value(statement, column, nil)
        }

        @inline(__always)
        func read(_ statement: OpaquePointer, _ arena: inout StoredValues.Arena) -> (ObjectID, StoredValues, Int64) {
            let uuid = SQLiteStore.uuid(statement, 0)
            let version = sqlite3_column_int64(statement, 1)
            let values = types.withUnsafeBufferPointer { types in
                arena.make(count: count) { buffer in
                    if dense {
                        for index in 0..<count where index != entityColumn {
                            (buffer + index).initialize(
                                to: SQLiteStore.value(statement, Int32(index + 2), types[index]))
                        }
                        if entityColumn < count {
                            (buffer + entityColumn).initialize(to: entity(statement, Int32(entityColumn + 2)))
                        }
                    } else {
                        // Each value made once, in place: no NULL first to overwrite.
                        sources.withUnsafeBufferPointer { sources in
                            for index in 0..<count {
                                let column = sources[index]
                                let value: StoredValue
                                if column >= 0 {
                                    value =
                                        column == entityColumn
                                        ? entity(statement, Int32(column + 2))
                                        : SQLiteStore.value(statement, Int32(column + 2), types[column])
                                } else {
                                    value = column == -2 ? entityConstant!.value : .null
                                }
                                (buffer + index).initialize(to: value)
                            }
                        }
                    }
                }
            }
            return (ObjectID(entityName: entityName, uuid: uuid), values, version)
        }
    }

    /// A query stepped lazily on a connection of its own (see ``openCursor(_:)``): the rows
    /// come `count` at a time, and the statement holds SQLite's implicit read transaction (a
    /// consistent snapshot of the store) until it is exhausted or closed. Use it from one
    /// thread at a time.
    final class Cursor {
        private let pool: CursorConnections
        // Used from one thread at a time: no dynamic exclusivity checks on the row path.
        @exclusivity(unchecked) private var connection: CursorConnection?
        private let statement: OpaquePointer
        private let reader: RowReader
        @exclusivity(unchecked) private var arena = StoredValues.Arena()
        private let sql: String
        /// The first row, stepped when the cursor was opened, not handed out yet.
        @exclusivity(unchecked) private var hasPendingRow = false

        fileprivate init(
            pool: CursorConnections, connection: CursorConnection, statement: OpaquePointer, reader: RowReader,
            sql: String
        ) {
            self.pool = pool
            self.connection = connection
            self.statement = statement
            self.reader = reader
            self.sql = sql
        }

        /// Steps the first row: the read transaction starts, so the cursor sees the store as
        /// it is now, and a failure is thrown by the fetch.
        fileprivate func start() throws {
            guard let connection else { return }
            switch sqlite3_step(statement) {
            case SQLITE_ROW:
                hasPendingRow = true
            case SQLITE_DONE:
                close()
            default:
                let message = String(cString: sqlite3_errmsg(connection.db))
                close()
                throw SkyrosError(.storeFailure, "\(message) (while stepping \(sql))")
            }
        }

        /// Steps up to `count` rows, handing each to `body`; false once the rows are exhausted
        /// (the cursor is then closed). A failure closes the cursor and is thrown.
        func next(_ count: Int, _ body: (consuming ObjectID, consuming StoredValues, Int64) -> Void) throws -> Bool {
            guard let connection else { return false }
            var delivered = 0
            while delivered < count {
                let code = hasPendingRow ? SQLITE_ROW : sqlite3_step(statement)
                hasPendingRow = false
                if code == SQLITE_ROW {
                    let (id, values, version) = reader.read(statement, &arena)
                    body(id, values, version)
                    delivered += 1
                } else if code == SQLITE_DONE {
                    close()
                    return false
                } else {
                    let message = String(cString: sqlite3_errmsg(connection.db))
                    close()
                    throw SkyrosError(.storeFailure, "\(message) (while stepping \(sql))")
                }
            }
            return true
        }

        /// Resets the statement (ending its read transaction) and gives the connection back.
        func close() {
            guard let connection else { return }
            self.connection = nil
            sqlite3_reset(statement)
            sqlite3_clear_bindings(statement)
            pool.giveBack(connection)
        }

        deinit { close() }
    }

    /// A cursor over the rows of a request on a connection of the store's cursor pool, its
    /// statement prepared once per connection and SQL; nil when the store cannot have a
    /// second connection (in memory, or while a migration runs): the caller then reads
    /// another way.
    func openCursor(_ request: StoreRequest) throws -> Cursor? {
        guard let url, migrationDatabase == nil else { return nil }
        let table = try tableInfo(request.entityName)
        var builder = SQLBuilder(schema: schema)
        let (selectList, reader) = RowReader.reading(table, for: request)
        let sql = try builder.select(selectList, for: request)
        let connection = try cursorConnections.take(path: url.path)
        let statement: OpaquePointer
        do {
            statement = try connection.statement(sql)
        } catch {
            cursorConnections.giveBack(connection)
            throw error
        }
        for (position, value) in builder.arguments.enumerated() { Self.bind(statement, Int32(position + 1), value) }
        let cursor = Cursor(
            pool: cursorConnections, connection: connection, statement: statement, reader: reader, sql: sql)
        try cursor.start()  // closes the cursor (giving the connection back) on failure
        return cursor
    }
}

/// A read-only connection to a store file for cursors, with its prepared statements by SQL.
final class CursorConnection {
    let db: OpaquePointer
    private var statements: [String: OpaquePointer] = [:]

    init(path: String) throws {
        var handle: OpaquePointer?
        let code = sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_NOMUTEX, nil)
        guard code == SQLITE_OK, let handle else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? "cannot open"
            sqlite3_close_v2(handle)
            throw SkyrosError(.storeFailure, "could not open a reading connection to \(path): \(message)")
        }
        db = handle
        // Another connection may hold a lock for a moment (a checkpoint): wait, as the pool does.
        sqlite3_busy_timeout(handle, 5_000)
        sqlite3_exec(handle, "PRAGMA query_only = 1", nil, nil, nil)
    }

    /// The statement of `sql`, prepared on first use and kept (reset by its user after use).
    func statement(_ sql: String) throws -> OpaquePointer {
        if let statement = statements[sql] { return statement }
        var statement: OpaquePointer?
        guard sqlite3_prepare_v3(db, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &statement, nil) == SQLITE_OK,
            let statement
        else {
            throw SkyrosError(.storeFailure, "\(String(cString: sqlite3_errmsg(db))) (preparing \(sql))")
        }
        // A few dozen shapes of query at most in an application; bounded all the same.
        if statements.count >= 64 { finalizeStatements() }
        statements[sql] = statement
        return statement
    }

    private func finalizeStatements() {
        for statement in statements.values { sqlite3_finalize(statement) }
        statements = [:]
    }

    deinit {
        finalizeStatements()
        sqlite3_close_v2(db)
    }
}

/// The idle cursor connections of a store. Cursors take one each and give it back when done;
/// after ``close()`` the connections given back are closed.
final class CursorConnections: @unchecked Sendable {
    private let lock = NSLock()
    private var idle: [CursorConnection] = []
    private var isClosed = false
    /// Idle connections kept; more cursors at once open more, closed when given back.
    private let keep = 4

    /// The connections waiting for a cursor (for tests).
    var idleCount: Int { lock.withLock { idle.count } }

    func take(path: String) throws -> CursorConnection {
        let reused: CursorConnection? = try lock.withLock {
            if isClosed { throw SkyrosError(.storeFailure, "the store at \(path) is closed") }
            return idle.popLast()
        }
        return try reused ?? CursorConnection(path: path)
    }

    func giveBack(_ connection: CursorConnection) {
        lock.withLock {
            if !isClosed && idle.count < keep { idle.append(connection) }
        }
    }

    /// Closes the idle connections; those in use are closed when given back.
    func close() {
        let closing = lock.withLock {
            isClosed = true
            defer { idle = [] }
            return idle
        }
        _ = closing  // deinitialised here, outside the lock
    }
}
