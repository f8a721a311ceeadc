import Foundation
import Logging
import PostgresNIO
import Skyros

/// What a machine does on the server, over one connection: create or migrate the group's
/// tables, upload change sets exactly once, read checkpoints, compact the log. Every value
/// crosses as text (``ServerType``); every statement is one extended-protocol query.
package struct ServerSession: Sendable {
    let connection: PostgresConnection
    package let schema: ServerSchema
    let logger: Logger
    /// Bounds each statement (nil: no bound).
    let watchdog: Watchdog?
    let timeout: Duration
    /// The connection's named prepared statements (nil: every statement is parsed and
    /// planned each time it runs).
    package let statements: PreparedStatements?
    /// The checkpoint read's statement (``readChanges(after:rejectedAfter:machine:)``).
    let changesSQL: String
    /// The machine's rows and writes, when a sync gateway works on its behalf (nil: every
    /// row, direct mode).
    package var scope: (any SyncScope)?

    /// A session of `schema` on `connection`; with a `watchdog`, a statement that gets no
    /// answer within `timeout` drops the connection (and fails); with `statements`, the
    /// statements run again and again (the checkpoint read, the upload) are prepared once.
    package init(
        connection: PostgresConnection, schema: ServerSchema, logger: Logger, watchdog: Watchdog? = nil,
        timeout: Duration = .seconds(5), statements: PreparedStatements? = nil
    ) {
        self.connection = connection
        self.schema = schema
        self.logger = logger
        self.watchdog = watchdog
        self.timeout = timeout
        self.statements = statements
        changesSQL = Self.changesSQL(schema)
    }

    /// Runs one statement with text parameters and returns its rows, every cell as text.
    ///
    /// - Parameter prepared: the statement runs often: prepare it once on this connection
    ///   (when the session keeps ``PreparedStatements``) and only bind and execute it after.
    ///   Its parameters are written `($n::text)` for that (a prepared statement's parameter
    ///   types are inferred by the server, and every value here crosses as text).
    @discardableResult
    package func run(_ sql: String, _ parameters: [String?] = [], prepared: Bool = false) async throws -> [[String?]] {
        let work: @Sendable () async throws -> [[String?]] = { [self] in
            if prepared, let statements, let statement = try await statements.statement(for: sql, on: connection) {
                return try await execute(statement, parameters)
            }
            return try await query(sql, parameters)
        }
        guard let watchdog else { return try await work() }
        return try await watchdog.bounded(timeout, work)
    }

    /// Runs `body`'s statements in one transaction, between `BEGIN` and `COMMIT`, and returns
    /// its value once `COMMIT` has answered; on any error, `ROLLBACK` and the error.
    ///
    /// Use it for any write whose answer is taken as done. A statement with parameters
    /// autocommitted in the extended protocol answers before its transaction commits (at the
    /// `Sync` after it), and postgres-nio hands its rows over at that answer: a commit that
    /// fails then (a deferred foreign key, the server stopping) comes after an answer that
    /// looked like success. `COMMIT` reports its own failure before it answers.
    /// Runs one statement with text parameters and returns its rows as the server sent them,
    /// in binary form (postgres-nio asks for binary results): for values read in bulk, decoded
    /// without text (``ServerType/storedValue(_:typeName:)-(PostgresCell,_)``).
    func binaryRows(_ sql: String, _ parameters: [String?] = []) async throws -> [PostgresRow] {
        let work: @Sendable () async throws -> [PostgresRow] = { [self] in
            guard !connection.isClosed else { throw ConnectionClosed() }
            var bindings = PostgresBindings(capacity: parameters.count)
            for parameter in parameters {
                if let parameter { bindings.append(parameter) } else { bindings.appendNull() }
            }
            var result: [PostgresRow] = []
            for try await row in try await connection.query(
                PostgresQuery(unsafeSQL: sql, binds: bindings), logger: logger)
            {
                result.append(row)
            }
            return result
        }
        guard let watchdog else { return try await work() }
        return try await watchdog.bounded(timeout, work)
    }

    package func inTransaction<T>(_ body: () async throws -> T) async throws -> T {
        try await transaction("BEGIN", body)
    }

    /// Runs `body` between `begin` and `COMMIT` (`ROLLBACK` on any error).
    private func transaction<T>(_ begin: String, _ body: () async throws -> T) async throws -> T {
        try await run(begin)
        do {
            let value = try await body()
            try await run("COMMIT")
            return value
        } catch {
            // (After a failed COMMIT the transaction is over already; the ROLLBACK is a no-op.)
            _ = try? await run("ROLLBACK")
            throw error
        }
    }

    /// Runs `body`'s statements in one read-only REPEATABLE READ transaction: every one of them
    /// reads the same snapshot (a gateway's checkpoint, its rows and their buckets, are one
    /// state of the server). Short reads only: no snapshot's pages here.
    package func inSnapshot<T>(_ body: () async throws -> T) async throws -> T {
        try await transaction("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", body)
    }

    private func execute(_ statement: PreparedQuery, _ parameters: [String?]) async throws -> [[String?]] {
        guard !connection.isClosed else { throw ConnectionClosed() }
        let rows = try await statement.execute(parameters.map { $0.map(PostgresData.init(string:)) ?? .null }).get()
        return try rows.map(Self.cells(of:))
    }

    private func query(_ sql: String, _ parameters: [String?]) async throws -> [[String?]] {
        // A statement sent on a connection the server closed may wait for ever (postgres-nio
        // 1.33.2): fail it at once instead, so the engine goes offline now, not at the timeout.
        guard !connection.isClosed else { throw ConnectionClosed() }
        var bindings = PostgresBindings(capacity: parameters.count)
        for parameter in parameters {
            if let parameter { bindings.append(parameter) } else { bindings.appendNull() }
        }
        let rows = try await connection.query(PostgresQuery(unsafeSQL: sql, binds: bindings), logger: logger)
        var result: [[String?]] = []
        for try await row in rows {
            result.append(try Self.cells(of: row))
        }
        return result
    }

    /// A row's cells, each as text (nil for NULL).
    private static func cells(of row: PostgresRow) throws -> [String?] {
        try row.map { try $0.decode(String?.self) }
    }

    /// The connection was closed, by the server (a restart, a cut) or by a timeout.
    struct ConnectionClosed: Error, CustomStringConvertible {
        var description: String { "the connection to the server was closed" }
    }

    // MARK: - Schema

    /// Creates the sync tables and the group's tables, or migrates them additively
    /// (``ServerSchema/migrationSQL(_:)``), in one transaction; nothing (and no lock) when the
    /// server has them all already.
    package func ensureSchema() async throws {
        guard !schema.migrationSQL(try await existing()).isEmpty else { return }
        try await run("BEGIN")
        do {
            // One machine at a time: two daemons starting together would both add a column.
            try await run("SELECT pg_advisory_xact_lock(hashtext(\(ServerSchema.literal(schema.name))))")
            // Looked at again under the lock: the daemon that held it may have made everything.
            // Its DDL again (ALTER TABLE takes an exclusive lock, even for a column that
            // exists) would wait for that daemon's first uploads, and deadlock with them: two
            // machines started together on a new server, one went offline with "deadlock
            // detected" after a second.
            guard !schema.migrationSQL(try await existing()).isEmpty else {
                try await run("COMMIT")
                return
            }
            for statement in schema.syncTablesSQL { try await run(statement) }
            for statement in schema.migrationSQL(try await existing()) {
                try await run(statement)
            }
            try await run("COMMIT")
        } catch {
            _ = try? await run("ROLLBACK")
            throw error
        }
    }

    /// What the server has of the group's schema.
    package func existing() async throws -> ServerSchema.Existing {
        var found = ServerSchema.Existing()
        for row in try await run(schema.columnsQuery) {
            guard let table = row[0], let column = row[1] else { continue }
            found.columns[table, default: []].insert(column)
        }
        found.constraints = Set(try await run(schema.constraintsQuery).compactMap { $0[0] })
        found.indexes = Set(try await run(schema.indexesQuery).compactMap { $0[0] })
        found.triggers = Set(try await run(schema.triggersQuery).compactMap { $0[0] })
        if found.columns["_skyros_meta"] != nil, let text = try await run(schema.schemaVersionQuery).first?.first ?? nil
        {
            found.schemaVersion = UInt64(text) ?? 0
        }
        return found
    }

    /// Whether the group's tables exist with every column this schema has (a daemon whose
    /// role may not create them checks this instead); the missing ones, named.
    /// Records `group` as the schema's group when none is recorded, and throws
    /// ``ServerErrors/OtherGroup`` when another one is. A role that may not insert into
    /// `_skyros_meta` (DML only, the group not recorded by `--sync-setup`) only compares.
    package func claimGroup(_ group: String) async throws {
        let meta = "\(ServerSchema.quote(schema.name))._skyros_meta"
        do {
            try await run("INSERT INTO \(meta) (key, value) VALUES ('group', $1) ON CONFLICT (key) DO NOTHING", [group])
        } catch let error as PSQLError where error.serverInfo?[.sqlState] == "42501" {
            // Insufficient privilege: compared only.
        }
        if let owner = try await run("SELECT value FROM \(meta) WHERE key = 'group'").first?[0] ?? nil, owner != group {
            throw ServerErrors.OtherGroup(schema: schema.name, owner: owner, group: group)
        }
    }

    package func missingTablesAndColumns() async throws -> [String] {
        var existing: [String: Set<String>] = [:]
        for row in try await run(schema.columnsQuery) {
            guard let table = row[0], let column = row[1] else { continue }
            existing[table, default: []].insert(column)
        }
        var missing: [String] = []
        for table in ["_skyros_log", "_skyros_uploads", "_skyros_meta"] where existing[table] == nil {
            missing.append("\(schema.name).\(table)")
        }
        if let uploads = existing["_skyros_uploads"], !uploads.contains("digest") {
            missing.append("\(schema.name)._skyros_uploads.digest")
        }
        for table in schema.tables {
            guard let columns = existing[table.name] else {
                missing.append("\(schema.name).\(table.name)")
                continue
            }
            for column in table.columns where !columns.contains(column.name) {
                missing.append("\(schema.name).\(table.name).\(column.name)")
            }
        }
        return missing
    }

    /// Whether the schema exists and this connection's role has no `USAGE` on it (so its
    /// tables look missing: another group's schema, say).
    package func schemaExistsWithoutUsage() async throws -> Bool {
        let rows = try await run(
            "SELECT (NOT has_schema_privilege(oid, 'USAGE'))::text FROM pg_namespace WHERE nspname = $1", [schema.name])
        return rows.first?.first == "true"
    }

    /// Bounds what this session's statements wait for on the server, below the engine's own
    /// statement bound (whose expiry closes the connection): a lock (the group's upload lock,
    /// a row) is waited for half of it at most, then the statement fails with `55P03` and is
    /// sent again (``isTransientConflict(_:)``); a transaction left open by a client that went
    /// silent is ended after the whole bound, so its locks go; and a statement still running
    /// for a client whose connection closed is stopped within a second (PostgreSQL 14 and
    /// later), instead of taking the upload lock, or committing, for nobody.
    package func limitWaits(statementTimeout: Duration) async throws {
        let milliseconds = { (duration: Duration) in
            String(
                max(1, duration.components.seconds * 1_000 + duration.components.attoseconds / 1_000_000_000_000_000))
        }
        _ = try await run(
            """
            SELECT set_config('lock_timeout', $1, false), set_config('idle_in_transaction_session_timeout', $2, false),
                   CASE WHEN current_setting('server_version_num')::int >= 140000
                        THEN set_config('client_connection_check_interval', '1000', false) END
            """,
            [milliseconds(statementTimeout / 2), milliseconds(statementTimeout)])
    }

    /// The highest number of `machine`'s change sets the server has recorded (0: none).
    /// The digests the server recorded for `numbers` of `machine`'s uploads (a number without
    /// a record, or recorded by a version before digests, is absent).
    package func digests(machine: UUID, numbers: [Int64]) async throws -> [Int64: Int64] {
        guard !numbers.isEmpty else { return [:] }
        var digests: [Int64: Int64] = [:]
        for row in try await run(
            """
            SELECT number::text, digest::text FROM \(ServerSchema.quote(schema.name))._skyros_uploads \
            WHERE machine = $1::uuid AND number = ANY(($2::text)::bigint[]) AND digest IS NOT NULL
            """, [machine.uuidString.lowercased(), Self.arrayLiteral(numbers.map(String.init))])
        {
            if let number = row[0].flatMap({ Int64($0) }), let digest = row[1].flatMap({ Int64($0) }) {
                digests[number] = digest
            }
        }
        return digests
    }

    package func uploadedThrough(machine: UUID) async throws -> Int64 {
        let rows = try await run(
            "SELECT coalesce(max(number), 0)::text FROM \(ServerSchema.quote(schema.name))._skyros_uploads WHERE machine = $1::uuid",
            [machine.uuidString.lowercased()])
        return Int64(rows.first?.first??.description ?? "0") ?? 0
    }
}

extension ServerSession {
    /// A column of the group's tables as the server has it: its SQL type (`format_type`) and,
    /// for a to-one relationship's column, the table its foreign key references.
    package struct CatalogColumn: Sendable, Equatable {
        package var type: String
        package var references: String?
    }

    /// The group's tables (not Skyros' own `_skyros_…` tables nor the link tables, whose names
    /// begin with `_`) and their columns, as the server has them, for checking what names them
    /// (a gateway's sync rules).
    package static func catalog(schema name: String, on connection: PostgresConnection, logger: Logger) async throws
        -> [String: [String: CatalogColumn]]
    {
        let rows = try await connection.query(
            """
            SELECT cl.relname::text, a.attname::text, format_type(a.atttypid, a.atttypmod), \
            (SELECT f.relname::text FROM pg_constraint co JOIN pg_class f ON f.oid = co.confrelid \
            WHERE co.conrelid = cl.oid AND co.contype = 'f' AND co.conkey = ARRAY[a.attnum] LIMIT 1) \
            FROM pg_class cl JOIN pg_namespace n ON n.oid = cl.relnamespace JOIN pg_attribute a ON a.attrelid = cl.oid \
            WHERE n.nspname = \(name) AND cl.relkind IN ('r', 'p') AND a.attnum > 0 AND NOT a.attisdropped \
            AND left(cl.relname, 1) <> '_' AND a.attname <> '_id'
            """, logger: logger)
        var catalog: [String: [String: CatalogColumn]] = [:]
        for try await (table, column, type, references) in rows.decode((String, String, String, String?).self) {
            catalog[table, default: [:]][column] = CatalogColumn(type: type, references: references)
        }
        return catalog
    }
}
