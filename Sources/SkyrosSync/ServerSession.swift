import Foundation
import Logging
import PostgresNIO
import Skyros

/// What a machine does on the server, over one connection: create or migrate the group's
/// tables, upload change sets exactly once, read checkpoints, compact the log. Every value
/// crosses as text (``ServerType``); every statement is one extended-protocol query.
package struct ServerSession: Sendable {
    let connection: PostgresConnection
    let schema: ServerSchema
    let logger: Logger
    /// Bounds each statement (nil: no bound).
    let watchdog: Watchdog?
    let timeout: Duration
    /// The connection's named prepared statements (nil: every statement is parsed and
    /// planned each time it runs).
    package let statements: PreparedStatements?
    /// The checkpoint read's statement (``readChanges(after:machine:)``).
    let changesSQL: String

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
        if found.columns["_skyros_meta"] != nil, let text = try await run(schema.schemaVersionQuery).first?.first ?? nil {
            found.schemaVersion = UInt64(text) ?? 0
        }
        return found
    }

    /// Whether the group's tables exist with every column this schema has (a daemon whose
    /// role may not create them checks this instead); the missing ones, named.
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

    // MARK: - Upstream

    /// What the server did with an uploaded change set.
    package enum UploadOutcome: Sendable, Equatable {
        /// Applied now.
        case applied
        /// Applied before (a retry after a lost reply): not applied again.
        case alreadyApplied
        /// Refused, with the reason; recorded on the server as rejected, so that its objects
        /// come back with the next checkpoint as the server has them.
        case rejected(String)
    }

    /// Uploads change sets in order, exactly once: a change set the server refuses (a unique
    /// value another machine took, a `.deny` rule, an object deleted on the server) is
    /// recorded as rejected with its reason; the others are applied. Throws (the change sets
    /// not yet applied stay unapplied) for anything that is not the change sets' fault: the
    /// connection, the server's disk, a missing table.
    ///
    /// The batch goes as one statement when it can (``uploadTogether(_:machine:)``: its net
    /// effect, a multi-row statement per table and kind of change, with the records of every
    /// change set, in one transaction of its own). When the server refuses that statement for
    /// something a change set did, the batch is split in halves, each tried the same way, down
    /// to the one change set at fault, which goes alone in a savepoint
    /// (``uploadOneByOne(_:machine:)``): so a refusal costs a few statements, and finds its
    /// change set exactly.
    package func upload(_ batch: [(number: Int64, changes: QueuedChangeSet)], machine: UUID) async throws -> [UploadOutcome] {
        try await uploadReportingTransactions(batch, machine: machine).outcomes
    }

    /// ``upload(_:machine:)``, with the ids of the server transactions that applied the
    /// batch (nil when a part of it went one by one: not known).
    package func uploadReportingTransactions(
        _ batch: [(number: Int64, changes: QueuedChangeSet)], machine: UUID
    ) async throws -> (outcomes: [UploadOutcome], transactions: [UInt64]?) {
        try await upload(batch[...], machine: machine)
    }

    /// Runs one statement (or transaction) of an upload, sending it again when the server
    /// rolled it back for a deadlock or a serialization failure. Another machine's upload
    /// deadlocked with this one (unique values inserted in opposite orders, say): sent again
    /// after a moment, it goes through, without going offline and connecting again. Only the
    /// part that failed is sent again: halves of a split batch already committed are not.
    /// (The sync fault campaign saw machines updating the same objects deadlock over and over,
    /// each time going offline, their queues growing; and, when the whole batch was sent again,
    /// its committed half refused as recorded before and split down to single change sets.)
    private func retryingConflicts<T>(_ body: () async throws -> T) async throws -> T {
        var attempt = 0
        while true {
            do {
                return try await body()
            } catch where Self.isTransientConflict(error) && attempt < Self.conflictRetries {
                attempt += 1
                try await Task.sleep(for: .milliseconds(Int.random(in: 2...20) * attempt))
            }
        }
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
            String(max(1, duration.components.seconds * 1_000 + duration.components.attoseconds / 1_000_000_000_000_000))
        }
        _ = try await run(
            """
            SELECT set_config('lock_timeout', $1, false), set_config('idle_in_transaction_session_timeout', $2, false),
                   CASE WHEN current_setting('server_version_num')::int >= 140000
                        THEN set_config('client_connection_check_interval', '1000', false) END
            """,
            [milliseconds(statementTimeout / 2), milliseconds(statementTimeout)])
    }

    /// How many times an upload that deadlocked or failed to serialize is sent again before
    /// the error goes up (and the engine offline).
    static let conflictRetries = 8

    /// A deadlock (40P01), a serialization failure (40001) or a lock not had in time (55P03,
    /// ``limitWaits(statementTimeout:)``): nothing was applied, and the same statement may
    /// succeed at once.
    static func isTransientConflict(_ error: any Error) -> Bool {
        guard let state = serverReport(error)?.state else { return false }
        return state == "40P01" || state == "40001" || state == "55P03"
    }

    private func upload(
        _ batch: ArraySlice<(number: Int64, changes: QueuedChangeSet)>, machine: UUID
    ) async throws -> (outcomes: [UploadOutcome], transactions: [UInt64]?) {
        guard !batch.isEmpty else { return ([], []) }
        var culprit: Int?
        if batch.allSatisfy({ !$0.changes.reset }) {
            do {
                let transaction = try await retryingConflicts { try await uploadTogether(batch, machine: machine) }
                return (Array(repeating: .applied, count: batch.count), transaction.map { [$0] })
            } catch where Self.isBatchFault(error) {
                // A change set of the batch is at fault (or one was applied before): find it.
                culprit = Self.culprit(of: error, in: batch, schema: schema)
            } catch is Refusal {
                // A value of the batch does not fit its column: find its change set.
            }
        }
        if batch.count == 1 {
            return (try await retryingConflicts { try await uploadOneByOne(Array(batch), machine: machine) }, nil)
        }
        if let culprit {
            // The change set the server named goes straight to its own transaction (it failed
            // together once), between what comes before and after it, where halving down to it
            // took two statements per halving (about twenty in a batch of 1,000). Its
            // transaction's id is not known, so neither is the batch's.
            let before = try await upload(batch[..<culprit], machine: machine)
            let alone = try await retryingConflicts { try await uploadOneByOne([batch[culprit]], machine: machine) }
            let after = try await upload(batch[(culprit + 1)...], machine: machine)
            return (before.outcomes + alone + after.outcomes, nil)
        }
        let middle = batch.startIndex + batch.count / 2
        let first = try await upload(batch[..<middle], machine: machine)
        let second = try await upload(batch[middle...], machine: machine)
        let transactions = first.transactions.flatMap { first in second.transactions.map { first + $0 } }
        return (first.outcomes + second.outcomes, transactions)
    }

    /// Applies a batch of change sets as one autocommitted statement: data-modifying `WITH`
    /// clauses record every change set's (machine, number) (a plain INSERT: one recorded
    /// before fails the statement) and apply the batch's net effect, each object once (an
    /// insert with the values of the later updates, an update with the last value of each
    /// property changed, a delete), a table and kind of change at a time with its rows
    /// unnested from text arrays. The statement fails, and nothing is applied, when an updated
    /// object is missing on the server (its count is checked by a division by zero), when a
    /// constraint refuses a row (foreign keys are checked at its commit), or when a value
    /// does not fit its column.
    ///
    /// - Returns: the id of the transaction that applied it.
    @discardableResult
    private func uploadTogether(_ batch: ArraySlice<(number: Int64, changes: QueuedChangeSet)>, machine: UUID) async throws -> UInt64? {
        var net = NetEffect()
        for (_, changes) in batch {
            guard net.add(changes, schema: schema) else { throw Refusal(reason: "an object is deleted and then inserted again in the batch") }
        }
        var parameters: [String?] = [machine.uuidString.lowercased(), Self.arrayLiteral(batch.map { String($0.number) })]
        func parameter(_ value: String) -> String {
            parameters.append(value)
            return "($\(parameters.count)::text)"
        }
        var clauses = [
            "recorded AS (INSERT INTO \(ServerSchema.quote(schema.name))._skyros_uploads (machine, number) SELECT ($1::text)::uuid, unnest(($2::text)::bigint[]))"
        ]
        var checks: [String] = []
        for group in net.groups(schema: schema) {
            let table = group.table
            let qualified = schema.qualified(table.name)
            var arrays = [parameter(Self.arrayLiteral(group.rows.map { $0.id.uuidString.lowercased() }))]
            for column in group.columns {
                var texts: [String?] = []
                texts.reserveCapacity(group.rows.count)
                for row in group.rows {
                    texts.append(try text(row.values[column.name] ?? .null, column, row.entity, row.id))
                }
                arrays.append(parameter(Self.arrayLiteral(texts)))
            }
            let names = (0...group.columns.count).map { "c\($0)" }
            let source = "unnest(\(arrays.map { "\($0)::text[]" }.joined(separator: ", "))) AS u(\(names.joined(separator: ", ")))"
            let label = "\(group.kind.rawValue)\(clauses.count)"
            switch group.kind {
            case .insert:
                let columns = ["\"_id\""] + group.columns.map { ServerSchema.quote($0.name) }
                let inputs = ["u.c0::uuid"] + group.columns.enumerated().map { $1.type.input("u.c\($0 + 1)") }
                clauses.append("\(label) AS (INSERT INTO \(qualified) (\(columns.joined(separator: ", "))) SELECT \(inputs.joined(separator: ", ")) FROM \(source))")
            case .update:
                if group.columns.isEmpty {
                    // Only to-manys changed: the object must still be there.
                    // Locked (FOR KEY SHARE), so that the rows are read as they are now, not
                    // as the statement's snapshot had them: an object another upload deleted
                    // while this one waited for the upload lock is not counted.
                    checks.append("(SELECT count(*) FROM (SELECT 1 FROM \(qualified) WHERE \"_id\" = ANY(\(arrays[0])::uuid[]) FOR KEY SHARE) AS present) = cardinality(\(arrays[0])::uuid[])")
                    continue
                }
                let assignments = group.columns.enumerated().map { "\(ServerSchema.quote($1.name)) = \($1.type.input("u.c\($0 + 1)"))" }
                // The rows are locked first, in the order of their ids (a one-time filter,
                // evaluated before the update touches a row): two machines updating the same
                // objects take their locks in the same order instead of deadlocking.
                let lockInOrder = """
                    (SELECT count(*) FROM (SELECT 1 FROM \(qualified) WHERE "_id" = ANY(\(arrays[0])::uuid[]) \
                    ORDER BY "_id" FOR UPDATE) AS locked) >= 0
                    """
                clauses.append("""
                    \(label) AS (UPDATE \(qualified) AS t SET \(assignments.joined(separator: ", ")) FROM \(source) \
                    WHERE t."_id" = u.c0::uuid AND \(lockInOrder) RETURNING 1)
                    """)
                checks.append("(SELECT count(*) FROM \(label)) = cardinality(\(arrays[0])::uuid[])")
            case .none:
                continue
            case .delete:
                clauses.append("\(label) AS (DELETE FROM \(qualified) WHERE \"_id\" = ANY(\(arrays[0])::uuid[]))")
            }
        }
        // The protocol counts a statement's parameters in 16 bits: a batch whose change sets
        // write too many kinds of rows is split (as a refused one is) before it gets there.
        guard parameters.count <= Self.maximumParameters else {
            throw Refusal(reason: "the batch needs \(parameters.count) parameters")
        }
        let verdict = checks.isEmpty ? "1" : "1 / (CASE WHEN \(checks.joined(separator: " AND ")) THEN 1 ELSE 0 END)"
        // Row counts are parameters too: batches of one shape share one prepared statement.
        // The group's upload lock comes first (the FROM clause is read before the verdict
        // runs the updates, and the other clauses run after it).
        let rows = try await run(
            "WITH \(clauses.joined(separator: ", ")) SELECT (\(verdict))::text, pg_current_xact_id()::text FROM (SELECT \(uploadLock)) AS serialized",
            parameters, prepared: true)
        return rows.first?[1].flatMap { UInt64($0) }
    }

    /// The group's upload lock, held until the transaction ends: one machine's upload at a
    /// time. Uploads of one group touch the same rows (the objects every machine edits, the
    /// entries of unique indexes) in orders no statement can fix beforehand (data-modifying
    /// `WITH` clauses run in an order PostgreSQL does not promise), and every deadlock cost a
    /// second (the server's `deadlock_timeout`) before it was found: the fault campaign's
    /// machines, draining their queues together after a partition, spent most of their time
    /// deadlocked. Taken in turn they do not wait for each other any longer than the
    /// statement takes. Another group's uploads (another schema) take another lock.
    private var uploadLock: String {
        "pg_advisory_xact_lock(hashtext('skyros upload ' || \(ServerSchema.literal(schema.name))))"
    }

    /// The most parameters one batch statement binds (PostgreSQL's limit is 65,535).
    static let maximumParameters = 30_000

    /// The net effect of consecutive change sets of one machine: each object once, as
    /// inserted, updated or deleted, with the last value of every property the change sets
    /// wrote (the same as applying them one after the other, since no other writer comes
    /// between them in one statement).
    struct NetEffect {
        enum Kind: String {
            case insert = "i", update = "u", delete = "d"
            /// Inserted and deleted in the batch: the server never sees it.
            case none = "n"
        }
        struct Object {
            var entity: String
            var id: UUID
            var kind: Kind
            var values: [String: StoredValue]
        }
        private(set) var objects: [Object] = []
        private var positions: [Reference: Int] = [:]
        private typealias Reference = QueuedChangeSet.Reference

        /// Adds a change set; false for a sequence the net effect cannot express (an object
        /// deleted, then inserted or updated again; inserted twice).
        mutating func add(_ changes: QueuedChangeSet, schema: ServerSchema) -> Bool {
            for row in changes.inserted where schema.table(row.entity) != nil {
                let key = Reference(entity: row.entity, id: row.id)
                guard positions[key] == nil else { return false }
                positions[key] = objects.count
                objects.append(Object(entity: row.entity, id: row.id, kind: .insert, values: row.values))
            }
            for row in changes.updated where schema.table(row.entity) != nil {
                let key = Reference(entity: row.entity, id: row.id)
                if let position = positions[key] {
                    guard objects[position].kind == .insert || objects[position].kind == .update else { return false }
                    objects[position].values.merge(row.values) { $1 }
                } else {
                    positions[key] = objects.count
                    objects.append(Object(entity: row.entity, id: row.id, kind: .update, values: row.values))
                }
            }
            for reference in changes.deleted where schema.table(reference.entity) != nil {
                if let position = positions[reference] {
                    switch objects[position].kind {
                    case .insert, .none: objects[position].kind = .none  // never reaches the server
                    case .update, .delete: objects[position].kind = .delete
                    }
                    objects[position].values = [:]
                } else {
                    positions[reference] = objects.count
                    objects.append(Object(entity: reference.entity, id: reference.id, kind: .delete, values: [:]))
                }
            }
            return true
        }

        /// One statement's worth of rows: a table, a kind of change, the columns written.
        struct Group {
            var table: ServerSchema.Table
            var kind: Kind
            var columns: [ServerSchema.Column]
            var rows: [Object]
        }

        /// The objects grouped by table, kind and the columns they write (in the table's
        /// column order), inserts first, then updates, then deletes.
        func groups(schema: ServerSchema) -> [Group] {
            var groups: [Group] = []
            var index: [String: Int] = [:]
            for kind in [Kind.insert, .update, .delete] {
                for object in objects where object.kind == kind {
                    guard let table = schema.table(object.entity) else { continue }
                    let columns = kind == .delete ? [] : table.columns.filter { object.values[$0.name] != nil }
                    let key = "\(kind.rawValue)\u{1}\(table.name)\u{1}" + columns.map(\.name).joined(separator: "\u{1}")
                    if let position = index[key] {
                        groups[position].rows.append(object)
                    } else {
                        index[key] = groups.count
                        groups.append(Group(table: table, kind: kind, columns: columns, rows: [object]))
                    }
                }
            }
            return groups
        }
    }

    /// A PostgreSQL array literal of text elements (`{"a",NULL,"b\"c"}`), for a `$n::text[]`
    /// parameter: one parameter carries a column of any number of rows.
    package static func arrayLiteral(_ elements: [String?]) -> String {
        var literal: [UInt8] = [UInt8(ascii: "{")]
        literal.reserveCapacity(elements.count * 24)
        for (position, element) in elements.enumerated() {
            if position > 0 { literal.append(UInt8(ascii: ",")) }
            guard var element else {
                literal.append(contentsOf: "NULL".utf8)
                continue
            }
            literal.append(UInt8(ascii: "\""))
            element.withUTF8 { utf8 in
                for byte in utf8 {
                    if byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") { literal.append(UInt8(ascii: "\\")) }
                    literal.append(byte)
                }
            }
            literal.append(UInt8(ascii: "\""))
        }
        literal.append(UInt8(ascii: "}"))
        return String(decoding: literal, as: UTF8.self)
    }

    /// The position in `batch` of the change set a unique violation names: the first that
    /// inserts or updates a row with the value the server's detail quotes
    /// (`Key (handle)=(dup-3) already exists.`) in a unique column of that name. Nil for
    /// anything else (another error, a key of several columns, a value not found): the batch
    /// is halved instead.
    package static func culprit(
        of error: any Error, in batch: ArraySlice<(number: Int64, changes: QueuedChangeSet)>, schema: ServerSchema
    ) -> Int? {
        guard let report = serverReport(error), report.state == "23505", let detail = report.detail,
            detail.hasPrefix("Key ("), let closing = detail.range(of: ")=("),
            let end = detail.range(of: ") already exists", options: .backwards), closing.upperBound <= end.lowerBound
        else { return nil }
        var column = String(detail[detail.index(detail.startIndex, offsetBy: 5)..<closing.lowerBound])
        let value = String(detail[closing.upperBound..<end.lowerBound])
        // A name PostgreSQL quotes (`Key ("firstName")=…`: capitals, a reserved word).
        if column.count >= 2, column.hasPrefix("\""), column.hasSuffix("\"") {
            column = String(column.dropFirst().dropLast()).replacingOccurrences(of: "\"\"", with: "\"")
        } else if column.contains(",") || column.contains("\"") {
            return nil  // several columns
        }
        let unique = schema.tables.compactMap { table in
            table.columns.first { $0.name == column && $0.isUnique }.map { (table.name, $0) }
        }
        guard !unique.isEmpty else { return nil }
        for (position, (_, changes)) in zip(batch.indices, batch) {
            for row in changes.inserted + changes.updated {
                for (table, key) in unique where row.entity == table {
                    guard let written = row.values[column] else { continue }
                    if (try? key.type.serverText(written, typeName: key.typeName)) == value { return position }
                }
            }
        }
        return nil
    }

    /// Whether the server refused a batch statement for something one of its change sets did
    /// (SQLSTATE classes 21, 22, 23 and 27: a cardinality, a data exception, including the
    /// count check's division by zero, a constraint, a change a cascade made twice): the batch
    /// is split to find it. Anything else is the server's or the connection's, and thrown.
    static func isBatchFault(_ error: any Error) -> Bool {
        guard let state = serverReport(error)?.state else { return false }
        return ["21", "22", "23", "27"].contains { state.hasPrefix($0) }
    }

    /// Uploads change sets one by one in one transaction, each in its own savepoint with its
    /// (machine, number) record: a change set the server refuses is rolled back alone and
    /// recorded as rejected; one recorded before (a retry after a lost reply) is skipped.
    private func uploadOneByOne(_ batch: [(number: Int64, changes: QueuedChangeSet)], machine: UUID) async throws -> [UploadOutcome] {
        var outcomes: [UploadOutcome] = []
        let machineText = machine.uuidString.lowercased()
        try await run("BEGIN")
        do {
            _ = try await run("SELECT '1' FROM (SELECT \(uploadLock)) AS serialized")
            for (number, changes) in batch {
                try await run("SAVEPOINT change_set")
                do {
                    let recorded = try await run(
                        "INSERT INTO \(ServerSchema.quote(schema.name))._skyros_uploads (machine, number) VALUES ($1::uuid, $2::bigint) ON CONFLICT DO NOTHING RETURNING 1",
                        [machineText, String(number)])
                    if recorded.isEmpty {
                        outcomes.append(.alreadyApplied)
                        try await run("RELEASE SAVEPOINT change_set")
                        continue
                    }
                    try await apply(changes)
                    // Deferred foreign keys are checked here, so that a dangling link fails
                    // its own change set, not the whole transaction at COMMIT.
                    try await run("SET CONSTRAINTS ALL IMMEDIATE")
                    try await run("SET CONSTRAINTS ALL DEFERRED")
                    try await run("RELEASE SAVEPOINT change_set")
                    outcomes.append(.applied)
                } catch let refusal as Refusal {
                    try await run("ROLLBACK TO SAVEPOINT change_set")
                    try await recordRejection(number, machine: machineText, refusal.reason, changes)
                    outcomes.append(.rejected(refusal.reason))
                } catch where Self.isChangeSetsFault(error) {
                    try await run("ROLLBACK TO SAVEPOINT change_set")
                    let reason = Self.describe(error)
                    try await recordRejection(number, machine: machineText, reason, changes)
                    outcomes.append(.rejected(reason))
                }
            }
            try await run("COMMIT")
        } catch {
            _ = try? await run("ROLLBACK")
            throw error
        }
        return outcomes
    }

    /// A change set the server cannot apply, for a reason found by the session itself.
    struct Refusal: Error {
        var reason: String
    }

    /// Applies one change set's statements.
    private func apply(_ changes: QueuedChangeSet) async throws {
        if changes.reset {
            for table in schema.tables.reversed() {
                try await run("DELETE FROM \(schema.qualified(table.name))")
            }
        }
        for row in changes.inserted {
            guard let table = schema.table(row.entity) else { continue }
            var names = ["\"_id\""]
            var inputs = ["$1::uuid"]
            var parameters: [String?] = [row.id.uuidString.lowercased()]
            for column in table.columns {
                guard let value = row.values[column.name] else { continue }
                names.append(ServerSchema.quote(column.name))
                parameters.append(try text(value, column, row))
                inputs.append(column.type.input("$\(parameters.count)"))
            }
            try await run(
                "INSERT INTO \(schema.qualified(table.name)) (\(names.joined(separator: ", "))) VALUES (\(inputs.joined(separator: ", ")))",
                parameters)
        }
        for row in changes.updated {
            guard let table = schema.table(row.entity) else { continue }
            var assignments: [String] = []
            var parameters: [String?] = [row.id.uuidString.lowercased()]
            for column in table.columns {
                guard let value = row.values[column.name] else { continue }
                parameters.append(try text(value, column, row))
                assignments.append("\(ServerSchema.quote(column.name)) = \(column.type.input("$\(parameters.count)"))")
            }
            let sql = assignments.isEmpty
                ? "SELECT 1 FROM \(schema.qualified(table.name)) WHERE \"_id\" = $1::uuid"
                : "UPDATE \(schema.qualified(table.name)) SET \(assignments.joined(separator: ", ")) WHERE \"_id\" = $1::uuid RETURNING 1"
            if try await run(sql, parameters).isEmpty {
                throw Refusal(reason: "\(row.entity) \(row.id.uuidString) was deleted on the server")
            }
        }
        for reference in changes.deleted {
            guard let table = schema.table(reference.entity) else { continue }
            try await run("DELETE FROM \(schema.qualified(table.name)) WHERE \"_id\" = $1::uuid", [reference.id.uuidString.lowercased()])
        }
    }

    private func text(_ value: StoredValue, _ column: ServerSchema.Column, _ row: QueuedChangeSet.Row) throws -> String? {
        try text(value, column, row.entity, row.id)
    }

    private func text(_ value: StoredValue, _ column: ServerSchema.Column, _ entity: String, _ id: UUID) throws -> String? {
        do {
            return try column.type.serverText(value, typeName: column.typeName)
        } catch let error as SkyrosError {
            throw Refusal(reason: "\(entity).\(column.name) of \(id.uuidString): \(error.message)")
        }
    }

    /// Records a refused change set: its (machine, number) with the reason, and its objects in
    /// the log, so that the next checkpoint brings them back as the server has them.
    private func recordRejection(_ number: Int64, machine: String, _ reason: String, _ changes: QueuedChangeSet) async throws {
        let objects = changes.objects
        let json = "[" + objects.map { "{\"entity\":\(Self.jsonString($0.entity)),\"id\":\"\($0.id.uuidString.lowercased())\"}" }
            .joined(separator: ",") + "]"
        try await run(
            "INSERT INTO \(ServerSchema.quote(schema.name))._skyros_uploads (machine, number, rejected, objects) VALUES ($1::uuid, $2::bigint, $3, $4::jsonb)",
            [machine, String(number), reason, json])
        for object in objects where schema.table(object.entity) != nil {
            try await run(
                "INSERT INTO \(ServerSchema.quote(schema.name))._skyros_log (entity, id) VALUES ($1, $2::uuid)",
                [object.entity, object.id.uuidString.lowercased()])
        }
        try await run("SELECT pg_notify(\(ServerSchema.literal(schema.channel)), '')")
    }

    private static func jsonString(_ text: String) -> String {
        let data = (try? JSONSerialization.data(withJSONObject: text, options: [.fragmentsAllowed])) ?? Data("\"\"".utf8)
        return String(decoding: data, as: UTF8.self)
    }

    /// Whether a server error is the change set's fault (a constraint, a value the column
    /// refuses): SQLSTATE classes 22 (data exception) and 23 (integrity constraint violation).
    static func isChangeSetsFault(_ error: any Error) -> Bool {
        guard let state = serverReport(error)?.state else { return false }
        return state.hasPrefix("22") || state.hasPrefix("23")
    }

    /// A server error in words: its message, detail and SQLSTATE.
    package static func describe(_ error: any Error) -> String {
        if let report = serverReport(error), let message = report.message {
            var text = message
            if let detail = report.detail { text += " (\(detail))" }
            return text + " [SQLSTATE \(report.state)]"
        }
        if let error = error as? PSQLError { return "\(error.code)" }
        return "\(error)"
    }

    /// The server's report of a failed statement (its SQLSTATE, message and detail), whichever
    /// of postgres-nio's interfaces ran it: a prepared statement's failure comes as a
    /// `PostgresError`, an unprepared one's as a `PSQLError`. Nil for anything but the
    /// server's refusal (a lost connection, a timeout).
    package static func serverReport(_ error: any Error) -> (state: String, message: String?, detail: String?)? {
        if let error = error as? PSQLError, error.code == .server, let info = error.serverInfo, let state = info[.sqlState] {
            return (state, info[.message], info[.detail])
        }
        if case .server(let report)? = error as? PostgresError, let state = report.fields[.sqlState] {
            return (state, report.fields[.message], report.fields[.detail])
        }
        return nil
    }
}
