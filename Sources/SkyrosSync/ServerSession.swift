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

    /// A session of `schema` on `connection`; with a `watchdog`, a statement that gets no
    /// answer within `timeout` drops the connection (and fails).
    package init(
        connection: PostgresConnection, schema: ServerSchema, logger: Logger, watchdog: Watchdog? = nil,
        timeout: Duration = .seconds(5)
    ) {
        self.connection = connection
        self.schema = schema
        self.logger = logger
        self.watchdog = watchdog
        self.timeout = timeout
    }

    /// Runs one statement with text parameters and returns its rows, every cell as text.
    @discardableResult
    package func run(_ sql: String, _ parameters: [String?] = []) async throws -> [[String?]] {
        guard let watchdog else { return try await query(sql, parameters) }
        return try await watchdog.bounded(timeout) { [self] in try await query(sql, parameters) }
    }

    private func query(_ sql: String, _ parameters: [String?]) async throws -> [[String?]] {
        var bindings = PostgresBindings(capacity: parameters.count)
        for parameter in parameters {
            if let parameter { bindings.append(parameter) } else { bindings.appendNull() }
        }
        let rows = try await connection.query(PostgresQuery(unsafeSQL: sql, binds: bindings), logger: logger)
        var result: [[String?]] = []
        for try await row in rows {
            var cells: [String?] = []
            for cell in row {
                cells.append(try cell.decode(String?.self))
            }
            result.append(cells)
        }
        return result
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

    /// Uploads change sets in order, in one transaction, each in its own savepoint with its
    /// (machine, number) record: a change set the server refuses (a unique value another
    /// machine took, a `.deny` rule, an object deleted on the server) is rolled back alone and
    /// recorded as rejected; the others are applied. Throws (nothing applied) for anything
    /// that is not the change sets' fault: the connection, the server's disk, a missing table.
    package func upload(_ batch: [(number: Int64, changes: QueuedChangeSet)], machine: UUID) async throws -> [UploadOutcome] {
        var outcomes: [UploadOutcome] = []
        let machineText = machine.uuidString.lowercased()
        try await run("BEGIN")
        do {
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
                } catch let error as PSQLError where Self.isChangeSetsFault(error) {
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
        do {
            return try column.type.serverText(value, typeName: column.typeName)
        } catch let error as SkyrosError {
            throw Refusal(reason: "\(row.entity).\(column.name) of \(row.id.uuidString): \(error.message)")
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
    static func isChangeSetsFault(_ error: PSQLError) -> Bool {
        guard error.code == .server, let state = error.serverInfo?[.sqlState] else { return false }
        return state.hasPrefix("22") || state.hasPrefix("23")
    }

    /// A server error in words: its message, detail and SQLSTATE.
    package static func describe(_ error: any Error) -> String {
        guard let error = error as? PSQLError else { return "\(error)" }
        if let info = error.serverInfo, let message = info[.message] {
            var text = message
            if let detail = info[.detail] { text += " (\(detail))" }
            if let state = info[.sqlState] { text += " [SQLSTATE \(state)]" }
            return text
        }
        return "\(error.code)"
    }
}
