import Foundation
import GRDB
import GRDBSQLite

/// Versions and migrations of a store file (<doc:Migration>).
///
/// Every version a store has had is recorded in `skyros_schema` (version, fingerprint,
/// canonical schema description, date); `skyros_metadata` holds the current one (`fingerprint`,
/// `schema`, `schemaVersion`). Opening a store with a newer version migrates it in one
/// transaction, with foreign keys off (SQLite's 12-step procedure) and checked before commit.
extension SQLiteStore {
    /// What an existing store holds.
    struct StoredState: Equatable {
        var fingerprint: String?
        /// The recorded description, as stored (JSON).
        var json: String?
        var version: Int
        var hasHistory: Bool
        var decimals: String?
        var format: String?
        /// The indexes of each table as sqlite_master has them (index name → SQL); nil when
        /// they were not read with the rest.
        var indexes: [String: [String: String]]?

        /// The state in the rows of ``stateSQL`` (by key), and the indexes it lists.
        init(_ values: [String: String], indexes: [String: [String: String]]? = nil) {
            self.indexes = indexes
            let history = values[" history"]
            fingerprint = values["fingerprint"]
            json = values["schema"]
            version = history.flatMap { Int($0) } ?? values["schemaVersion"].flatMap { Int($0) } ?? 1
            hasHistory = history != nil
            decimals = values["decimals"]
            format = values["format"]
        }
    }

    /// What opening a store with this schema does.
    enum OpenDecision {
        case open
        /// The same model, recorded with runtime type names (or without its history):
        /// the records are brought up to date.
        case refreshRecords
        /// The milestones from the stored version to the schema's, and the inferred step to each.
        case migrate(from: Schema, version: Int, milestones: [MigrationMilestone], steps: [SchemaStep])
    }

    /// The decision for a store in `state`, or the refusal (``SkyrosError/Code/schemaTooNew``,
    /// ``SkyrosError/Code/schemaMismatch``, ``SkyrosError/Code/migrationFailed``). Plans the
    /// migration (which throws its refusals) without touching anything.
    static func decide(_ state: StoredState, schema: Schema, plan: MigrationPlan, path: String) throws -> OpenDecision {
        // An up-to-date store, the common case, is decided without decoding the recorded schema.
        if state.version == schema.version && state.fingerprint == schema.fingerprint {
            return state.hasHistory ? .open : .refreshRecords
        }
        let description = try state.json.map { json in
            do {
                return try SchemaDescription(json: json.utf8).upgradingLegacyTypeNames()
            } catch {
                throw SkyrosError(
                    .storeFailure, "could not read the schema recorded in the store at \(path)", underlying: error)
            }
        }
        let stored = try description.map { try Schema(description: $0, version: state.version) }
        let sameModel = state.fingerprint == schema.fingerprint || stored?.fingerprint == schema.fingerprint
        if state.version > schema.version {
            throw SkyrosError(
                .schemaTooNew,
                "the store at \(path) has schema version \(state.version), newer than this schema's version \(schema.version) (an older version of the application?); it is never downgraded, and the file was left untouched"
            )
        }
        if state.version == schema.version {
            if state.fingerprint == schema.fingerprint { return state.hasHistory ? .open : .refreshRecords }
            if sameModel { return .refreshRecords }
            throw SkyrosError(
                .schemaMismatch,
                "the store at \(path) was made with schema \(state.fingerprint ?? "?") at version \(state.version), not \(schema.fingerprint): a changed model needs a higher version (Schema(…, version: \(schema.version + 1))) to be migrated; the file was left untouched"
            )
        }
        guard let stored else {
            throw SkyrosError(.storeFailure, "the store at \(path) has no recorded schema to migrate from")
        }
        let milestones = MigrationMilestone.list(from: state.version, to: schema, plan: plan)
        let steps = try MigrationMilestone.plan(from: stored, milestones: milestones)
        return .migrate(from: stored, version: state.version, milestones: milestones, steps: steps)
    }

    /// The state of a store, or nil when the file has no Skyros schema yet (no
    /// `skyros_metadata` table); asked directly, without GRDB's schema introspection, which
    /// reads the whole schema through several statements.
    static func storedStateIfAny(_ db: Database) throws -> StoredState? {
        var values: [String: String] = [:]
        var indexes: [String: [String: String]]? = [:]
        // Each row's texts, stepped directly (the rows are a few short texts).
        func read(_ raw: OpaquePointer) {
            guard let key = sqlite3_column_text(raw, 0), let value = sqlite3_column_text(raw, 1) else { return }
            if key.pointee == UInt8(ascii: " "), String(cString: key) == " index",
                let table = sqlite3_column_text(raw, 2), let name = sqlite3_column_text(raw, 3)
            {
                indexes?[String(cString: table), default: [:]][String(cString: name)] = String(cString: value)
            } else {
                values[String(cString: key)] = String(cString: value)
            }
        }
        do {
            // A cached statement: read again inside the opening transaction.
            try query(db, Self.stateSQL, [], row: read)
        } catch let error as DatabaseError where error.message?.hasPrefix("no such table") == true {
            // No history yet (the statement did not compile: nothing was read).
            indexes = nil
            do {
                try query(db, "SELECT key, value FROM skyros_metadata", [], row: read)
            } catch let error as DatabaseError where error.message == "no such table: skyros_metadata" {
                return nil
            }
        }
        return StoredState(values, indexes: indexes)
    }

    /// The metadata; under the key `" history"`, the highest version of the history; and
    /// under `" index"`, each index's SQL, table and name (what a migration drops or keeps,
    /// read here with the rest rather than by another statement).
    static let stateSQL = """
        SELECT key, value, NULL, NULL FROM skyros_metadata \
        UNION ALL SELECT ' history', CAST(MAX(version) AS TEXT), NULL, NULL FROM skyros_schema \
        UNION ALL SELECT ' index', sql, tbl_name, name FROM main.sqlite_master WHERE type = 'index' AND sql IS NOT NULL
        """

    /// The schema version recorded in an existing store file, read without writing to it; nil
    /// when the file does not exist or is not a Skyros store yet.
    public static func storedSchemaVersion(at url: URL) throws -> Int? {
        guard FileManager.default.fileExists(atPath: url.path) else { return nil }
        // The state statement, or the metadata alone for a store without a history.
        var values: [String: String] = [:]
        for row in try readOnlyRows(stateSQL, of: url) ?? readOnlyRows(
            "SELECT key, value FROM skyros_metadata", of: url) ?? []
        {
            if let key = row[0], let value = row[1], key != " index" { values[key] = value }
        }
        let state = StoredState(values)
        return state.fingerprint == nil ? nil : state.version
    }

    /// Records a version in the history; creates the history table first unless `historyExists`.
    static func record(
        _ schema: Schema, version: Int, fingerprint: String? = nil, json: String? = nil, historyExists: Bool = false,
        _ db: Database
    ) throws {
        if !historyExists {
            try db.execute(
                sql: """
                    CREATE TABLE IF NOT EXISTS skyros_schema (
                        version INTEGER PRIMARY KEY NOT NULL, fingerprint TEXT NOT NULL, description TEXT NOT NULL, date TEXT NOT NULL)
                    """)
        }
        let description = try json ?? schema.schemaDescription.canonicalText()
        // Stepped directly, as the statements of a save (GRDB's execute adds its bookkeeping).
        try query(
            db, "INSERT OR REPLACE INTO skyros_schema (version, fingerprint, description, date) VALUES (?, ?, ?, ?)",
            [
                .integer(Int64(version)), .text(fingerprint ?? schema.fingerprint), .text(description),
                .text(Self.timestamp()),
            ]
        ) { _ in }
    }

    /// Now in UTC, as ISO 8601 (`2026-11-24T09:30:00Z`): the date of a version in the history.
    /// Formatted from the broken-down time (a date formatter costs more than the rest of
    /// recording a version).
    static func timestamp(_ date: Date = Date()) -> String {
        var seconds = time_t(date.timeIntervalSince1970.rounded(.down))
        var parts = tm()
        gmtime_r(&seconds, &parts)
        func two(_ value: Int32) -> String { value < 10 ? "0\(value)" : "\(value)" }
        return
            "\(parts.tm_year + 1900)-\(two(parts.tm_mon + 1))-\(two(parts.tm_mday))T\(two(parts.tm_hour)):\(two(parts.tm_min)):\(two(parts.tm_sec))Z"
    }

    /// Makes `schema` at its version the store's current schema in `skyros_metadata` and the history.
    static func recordCurrent(_ schema: Schema, historyExists: Bool = false, _ db: Database) throws {
        let description = try schema.schemaDescription.canonicalText()
        // An upsert, not INSERT OR REPLACE: a key already there keeps its row, so its index
        // (the key's) is not rewritten, one page less for the commit and the checkpoint.
        try query(
            db,
            """
            INSERT INTO skyros_metadata (key, value) VALUES ('fingerprint', ?), ('schema', ?), ('schemaVersion', ?) \
            ON CONFLICT (key) DO UPDATE SET value = excluded.value
            """,
            [.text(schema.fingerprint), .text(description), .text(String(schema.version))]
        ) { _ in }
        try record(schema, version: schema.version, json: description, historyExists: historyExists, db)
    }

    /// Whether a migration from `stored` through `milestones` may meet foreign keys (the
    /// columns of to-one relationships): only then are they turned off during it and checked
    /// before commit.
    static func mayMeetForeignKeys(from stored: Schema, through milestones: [MigrationMilestone]) -> Bool {
        ([stored] + milestones.map(\.schema)).contains { schema in
            schema.entities.contains { !$0.toOneProperties.isEmpty }
        }
    }

    // MARK: - Running a migration

    /// Migrates the store, inside the open transaction (foreign keys off), from `stored` at
    /// `storedVersion` to the store's schema, through the milestones and steps ``decide(_:schema:plan:path:)`` planned.
    func migrate(
        from stored: Schema, version storedVersion: Int, milestones: [MigrationMilestone], steps: [SchemaStep],
        state: StoredState, _ db: Database
    ) throws {
        if !state.hasHistory {
            // The version the store had before it kept a history.
            try Self.record(stored, version: storedVersion, fingerprint: state.fingerprint, json: state.json, db)
        }
        for (number, (milestone, step)) in zip(milestones, steps).enumerated() {
            let store = milestone.schema === schema ? self : try SQLiteStore(view: milestone.schema, of: self)
            // The indexes read with the state hold for the first step only.
            try store.run(step, stages: milestone.stages, indexes: number == 0 ? state.indexes : nil, db)
            if milestone.schema !== schema {
                try Self.record(milestone.schema, version: milestone.version, historyExists: true, db)
            }
        }
        let violations =
            Self.mayMeetForeignKeys(from: stored, through: milestones)
            ? try Row.fetchAll(db, sql: "PRAGMA foreign_key_check") : []
        if let first = violations.first {
            let table: String = first[0] ?? "?"
            let parent: String = first[2] ?? "?"
            throw SkyrosError(
                .migrationFailed,
                "cannot migrate the store to schema version \(schema.version): \(violations.count) object(s) of \(table) refer to \(parent) objects that do not exist; the store was left as it was"
            )
        }
        try Self.recordCurrent(schema, historyExists: true, db)
    }

    /// The indexes of a table as sqlite_master has them (index name → SQL), without the
    /// automatic ones of its constraints.
    private static func indexes(of table: String, _ db: Database) throws -> [String: String] {
        var indexes: [String: String] = [:]
        try query(
            db, "SELECT name, sql FROM main.sqlite_master WHERE type = 'index' AND tbl_name = ? AND sql IS NOT NULL",
            [.text(table)]
        ) { raw in
            if let name = sqlite3_column_text(raw, 0), let sql = sqlite3_column_text(raw, 1) {
                indexes[String(cString: name)] = String(cString: sql)
            }
        }
        return indexes
    }

    /// One inferred step and the stages after it.
    private func run(
        _ step: SchemaStep, stages: [MigrationPlan.Stage], indexes known: [String: [String: String]]?, _ db: Database
    ) throws {
        func quote(_ name: String) -> String { SQLBuilder.quote(name) }
        var temporary: [String] = []
        defer { for table in temporary { try? db.execute(sql: "DROP TABLE IF EXISTS temp.\(quote(table))") } }
        // What the stages may read of the previous version.
        previousColumns = [:]
        previousEntities = [:]
        if !stages.isEmpty {
            for table in step.tables where !table.previous.isEmpty {
                guard let source = table.sourceName else { continue }
                let name = "skyros_previous_\(table.entity.name)"
                try db.execute(
                    sql:
                        "CREATE TEMP TABLE \(quote(name)) AS SELECT \"_id\", \(table.previous.map(quote).joined(separator: ", ")) FROM main.\(quote(source))"
                )
                temporary.append(name)
                previousColumns[table.entity.name] = (name, Set(table.previous))
            }
            for entity in step.removedEntities {
                let name = "skyros_previous_entity_\(entity)"
                try db.execute(sql: "CREATE TEMP TABLE \(quote(name)) AS SELECT * FROM main.\(quote(entity))")
                temporary.append(name)
                previousEntities[entity] = name
            }
        }
        defer {
            previousColumns = [:]
            previousEntities = [:]
        }
        for entity in step.removedEntities { try db.execute(sql: "DROP TABLE main.\(quote(entity))") }
        // Renamed tables, through temporary names (two entities may swap names). RENAME TO
        // also updates the foreign keys of other tables that refer to them.
        let renamed = step.tables.filter { $0.sourceName != nil && $0.sourceName != $0.entity.name }
        for (number, table) in renamed.enumerated() {
            try db.execute(
                sql: "ALTER TABLE main.\(quote(table.sourceName!)) RENAME TO \(quote("skyros_renaming_\(number)"))")
        }
        for (number, table) in renamed.enumerated() {
            try db.execute(
                sql: "ALTER TABLE main.\(quote("skyros_renaming_\(number)")) RENAME TO \(quote(table.entity.name))")
        }
        // The index definitions each table has after the DDL below, when they are known
        // without asking sqlite_master again (see the index creation at the end).
        var indexesAfter: [String: Set<String>] = [:]
        for table in step.tables {
            let name = quote(table.entity.name)
            guard table.sourceName != nil else {
                try db.execute(sql: Self.tableSQL(table.entity, in: step.target))
                indexesAfter[table.entity.name] = []
                continue
            }
            // Indexes the new schema does not declare, before their columns change.
            let wanted = Set(Self.indexDefinitions(table.entity).map(\.sql))
            var kept: Set<String> = []
            // Those read with the state, unless the table was renamed in this step (RENAME TO
            // rewrites its indexes).
            let current: [String: String]
            if let known, table.sourceName == table.entity.name {
                current = known[table.entity.name] ?? [:]
            } else {
                current = try Self.indexes(of: table.entity.name, db)
            }
            for (index, sql) in current.sorted(by: { $0.key < $1.key }) {
                if wanted.contains(sql) {
                    kept.insert(sql)
                } else {
                    try db.execute(sql: "DROP INDEX main.\(quote(index))")
                }
            }
            // Dropping the table drops its indexes. A renamed column rewrites the indexes that
            // name it (SQLite's RENAME COLUMN), so those are read again; a kept index names its
            // columns quoted, as the new schema declares them.
            if table.rebuild {
                indexesAfter[table.entity.name] = []
            } else if !table.renamed.contains(where: { old, _ in kept.contains { $0.contains(quote(old)) } }) {
                indexesAfter[table.entity.name] = kept
            }
            if table.rebuild {
                let temporaryName = "skyros_rebuilding_\(table.entity.name)"
                try db.execute(sql: Self.tableSQL(table.entity, in: step.target, table: temporaryName))
                let columns = ["\"_id\"", "\"_version\""] + table.columns.map { quote($0.property.name) }
                let values =
                    ["\"_id\"", "\"_version\""]
                    + table.columns.map { column -> String in
                        switch column.source {
                        case .column(let old): quote(old)
                        case .coalesce(let old, let value): "COALESCE(\(quote(old)), \(Self.literal(value)))"
                        case .constant(let value): Self.literal(value)
                        }
                    }
                try db.execute(
                    sql: """
                        INSERT INTO main.\(quote(temporaryName)) (\(columns.joined(separator: ", "))) \
                        SELECT \(values.joined(separator: ", ")) FROM main.\(name)
                        """)
                try db.execute(sql: "DROP TABLE main.\(name)")
                try db.execute(sql: "ALTER TABLE main.\(quote(temporaryName)) RENAME TO \(name)")
            } else {
                for (old, new) in table.renamed {
                    try db.execute(sql: "ALTER TABLE main.\(name) RENAME COLUMN \(quote(old)) TO \(quote(new))")
                }
                for column in table.dropped {
                    try db.execute(sql: "ALTER TABLE main.\(name) DROP COLUMN \(quote(column))")
                }
                for (property, value) in table.added {
                    var definition = Self.columnDefinition(property, of: table.entity, in: step.target)
                    if !value.isNull { definition += " DEFAULT \(Self.literal(value))" }
                    try db.execute(sql: "ALTER TABLE main.\(name) ADD COLUMN \(definition)")
                }
            }
        }
        for table in step.tables where table.entity.hierarchy != nil { try Self.migrateHierarchyRows(table, step, db) }
        if !stages.isEmpty { try runStages(stages, db) }
        for table in step.tables {
            // Read again when the DDL may have changed them in a way not followed above, or
            // when stages ran in between.
            let followed = stages.isEmpty ? indexesAfter[table.entity.name] : nil
            let existing = try followed ?? Set(Self.indexes(of: table.entity.name, db).values)
            for index in Self.indexDefinitions(table.entity) where !existing.contains(index.sql) {
                do {
                    try db.execute(sql: index.sql)
                } catch let error as DatabaseError where error.extendedResultCode == .SQLITE_CONSTRAINT_UNIQUE {
                    let column = index.property.map { quote($0.name) } ?? "?"
                    let duplicate = try? String.fetchOne(
                        db,
                        sql:
                            "SELECT quote(\(column)) FROM main.\(quote(table.entity.name)) GROUP BY \(column) HAVING COUNT(*) > 1 LIMIT 1"
                    )
                    throw step.refusal(
                        "\(table.entity.name).\(index.property?.name ?? "?") becomes unique, but existing objects share a value\(duplicate.map { " (\($0))" } ?? ""); a migration stage for version \(step.version) can make them unique"
                    )
                }
            }
            for property in table.required {
                // A subentity's: in its rows only.
                var rows = ""
                if let owner = table.entity.hierarchy?.members.first(where: {
                    $0.parent != nil && $0.ownProperties.contains(property.name)
                }) {
                    rows = " AND " + Self.rowsCondition(of: owner)
                }
                let missing =
                    try Int.fetchOne(
                        db,
                        sql:
                            "SELECT COUNT(*) FROM main.\(quote(table.entity.name)) WHERE \(quote(property.name)) IS NULL\(rows)"
                    ) ?? 0
                if missing > 0 {
                    throw step.refusal(
                        "\(table.entity.name).\(property.name) is a new required relationship and \(missing) existing object(s) have none; a migration stage for version \(step.version) can set it"
                    )
                }
            }
        }
    }

    /// The rows of a hierarchy's table after this step's DDL: those of renamed subentities
    /// (`@Entity(originalName:)`) take the new name; those of removed subentities become their
    /// nearest remaining ancestor's (the root's at worst: their columns are gone, what they
    /// inherited stays); a subentity's non-optional attribute that is new, or was optional,
    /// gets its default in the subentity's rows (its column is NULL in the other entities').
    private static func migrateHierarchyRows(_ table: SchemaStep.Table, _ step: SchemaStep, _ db: Database) throws {
        guard let hierarchy = table.entity.hierarchy else { return }
        let name = SQLBuilder.quote(table.entity.name)
        let entityColumn = SQLBuilder.quote(EntityHierarchy.entityProperty)
        let source = table.sourceName.flatMap { step.source.entity(named: $0) }
        func setEntity(_ new: String, where old: String) throws {
            try db.execute(
                sql: "UPDATE main.\(name) SET \(entityColumn) = ? WHERE \(entityColumn) = ?", arguments: [new, old])
        }
        if let previous = source?.hierarchy {
            let remaining = Set(hierarchy.members.map(\.name))
            for member in hierarchy.members {
                guard let original = member.originalName, !remaining.contains(original),
                    previous.members.contains(where: { $0.name == original })
                else { continue }
                try setEntity(member.name, where: original)
            }
            let parents = Dictionary(previous.members.map { ($0.name, $0.parent) }, uniquingKeysWith: { a, _ in a })
            for member in previous.members where !remaining.contains(member.name) {
                var heir = member.parent
                while let parent = heir, !remaining.contains(parent) { heir = parents[parent] ?? nil }
                try setEntity(heir ?? hierarchy.root, where: member.name)
            }
        }
        for member in hierarchy.members.dropFirst() {
            for propertyName in member.ownProperties {
                guard let property = table.entity.property(named: propertyName), property.kind == .attribute,
                    !property.codec.isOptional, let value = SchemaStep.defaultValue(of: property)
                else { continue }
                // Its rows have a value already when it was a non-optional attribute of the same
                // subentity, or of every row, in the previous version.
                if let before = source?.property(named: property.originalName ?? property.name)
                    ?? source?.property(named: property.name),
                    before.kind == .attribute, !before.codec.isOptional
                {
                    let owner = source?.hierarchy?.members.first {
                        $0.parent != nil && $0.ownProperties.contains(before.name)
                    }
                    if owner == nil || owner?.name == member.name || owner?.name == member.originalName { continue }
                }
                let column = SQLBuilder.quote(property.name)
                try db.execute(
                    sql:
                        "UPDATE main.\(name) SET \(column) = \(literal(value)) WHERE \(column) IS NULL AND \(rowsCondition(of: member))"
                )
            }
        }
    }

    /// The rows of a hierarchy's entity `member` and its subentities, as SQL.
    private static func rowsCondition(of member: EntityHierarchy.Member) -> String {
        "\(SQLBuilder.quote(EntityHierarchy.entityProperty)) IN (\(member.names.map { literal(.text($0)) }.joined(separator: ", ")))"
    }

    /// Runs stages on a context of this store, on the current thread (the writer's), inside
    /// the migration's transaction; saves what they changed.
    private func runStages(_ stages: [MigrationPlan.Stage], _ db: Database) throws {
        migrationDatabase = db
        defer { migrationDatabase = nil }
        for stage in stages {
            let context = ObjectContext(name: "migration-\(stage.version)", parent: self)
            do {
                // On this thread: an idle context's waited-for block runs on the caller's.
                try context.performAndWait {
                    try stage.body(context)
                    try context.save()
                }
            } catch {
                let wrapped = SkyrosError.wrap(error)
                throw SkyrosError(
                    .migrationFailed,
                    "the migration stage for version \(stage.version) failed: \(wrapped.code): \(wrapped.message); the store was left as it was",
                    underlying: error)
            }
        }
    }

    /// A value as an SQL literal.
    static func literal(_ value: StoredValue) -> String {
        switch value {
        case .null: return "NULL"
        case .integer(let number): return String(number)
        case .real(let number):
            let text = "\(number)"
            return text.contains(where: { $0 == "." || $0 == "e" }) ? text : text + ".0"
        case .text(let text): return "'" + text.replacingOccurrences(of: "'", with: "''") + "'"
        case .blob(let data): return "X'" + data.map { String(format: "%02X", $0) }.joined() + "'"
        }
    }

    // MARK: - The previous version, for stages

    func previousValue(_ property: String, of id: ObjectID) throws -> StoredValue? {
        guard let db = migrationDatabase, let (table, columns) = previousColumns[id.entityName],
            columns.contains(property)
        else { return nil }
        return try Self.rows(
            db, "SELECT \(SQLBuilder.quote(property)) FROM temp.\(SQLBuilder.quote(table)) WHERE \"_id\" = ?",
            [id.uuid.storedValue]
        ).first?.first
    }

    func previousObjects(ofEntity entity: String) throws -> [(id: UUID, values: [String: StoredValue])] {
        guard let db = migrationDatabase, let table = previousEntities[entity] else { return [] }
        var result: [(id: UUID, values: [String: StoredValue])] = []
        let statement = try db.makeStatement(sql: "SELECT * FROM temp.\(SQLBuilder.quote(table))")
        let names = statement.columnNames
        try Self.query(db, "SELECT * FROM temp.\(SQLBuilder.quote(table))", []) { raw in
            var values: [String: StoredValue] = [:]
            for (column, name) in names.enumerated() where name != "_id" && name != "_version" {
                values[name] = Self.value(raw, Int32(column))
            }
            result.append((Self.uuid(raw, 0), values))
        }
        return result
    }
}
