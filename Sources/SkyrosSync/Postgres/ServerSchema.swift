import Foundation
import Skyros

/// A group's tables on the PostgreSQL server (docs/SYNC.md), derived from the group's schema:
/// one table per entity named as the entity, `"_id"` (uuid) as primary key, one typed column
/// per attribute named as the property, a to-one as a uuid column referencing its
/// destination's `"_id"`, unique constraints and indexes as declared; and the sync tables
/// (`_skyros_log`, `_skyros_uploads`, `_skyros_meta`) with the triggers that record every
/// committed change to the group's tables, whoever made it.
///
/// Pure data: it builds SQL text and converts values, and talks to no server.
package struct ServerSchema: Sendable {
    /// A column of an entity's table.
    package struct Column: Sendable, Equatable {
        /// The property's index among its entity's properties (a snapshot's value position).
        package var index: Int
        /// The property's name, also the column's.
        package var name: String
        /// How values are written and read.
        package var type: ServerType
        /// Whether NULL is refused.
        package var isOptional: Bool
        /// The property's type name (`int16`, `enum:string`…), for range checks.
        package var typeName: String
        /// For a to-one: the destination entity.
        package var destination: String?
        /// The property's name in an earlier schema version (a rename).
        package var originalName: String?
        /// The declared constant default, as stored.
        package var defaultValue: StoredValue?
        /// Unique / indexed.
        package var isUnique: Bool
        package var isIndexed: Bool
        /// For a to-one: the foreign key's ON DELETE action (its inverse's delete rule).
        package var onDelete: String
    }

    /// An entity's table.
    package struct Table: Sendable, Equatable {
        /// The entity's name, also the table's.
        package var name: String
        /// The entity's name in an earlier schema version.
        package var originalName: String?
        /// The number of properties (a snapshot's value count).
        package var propertyCount: Int
        /// The columns (attributes and to-ones; to-manys have none), in declaration order.
        package var columns: [Column]
        /// Declared compound indexes.
        package var indexes: [[String]]

        /// `values`, by property name, under the current names: a value named by a property's
        /// name before a rename (`originalName`) is given its current name.
        package func current(_ values: [String: StoredValue]) -> [String: StoredValue] {
            var values = values
            for column in columns {
                guard let original = column.originalName, values[column.name] == nil,
                    !columns.contains(where: { $0.name == original }),
                    let value = values.removeValue(forKey: original)
                else { continue }
                values[column.name] = value
            }
            return values
        }
    }

    /// The PostgreSQL schema's name.
    package let name: String
    /// The tables, in the schema's entity order.
    package let tables: [Table]
    /// The group's schema version.
    package let version: UInt64
    /// The description it was made from (what a machine sends a sync gateway, which makes the
    /// same server schema of it).
    package let source: SchemaDescription
    private let byName: [String: Int]
    /// Whether a table or a column has an `originalName` (else ``current(_:)`` has nothing to do).
    private let hasRenames: Bool

    /// The server schema of a group's `schema`, in the PostgreSQL schema `name`.
    package init(_ schema: Schema, name: String) {
        self.init(schema.schemaDescription, version: UInt64(schema.version), name: name)
    }

    /// The server schema of a schema description.
    package init(_ description: SchemaDescription, version: UInt64, name: String) {
        self.name = name
        self.version = version
        source = description
        var tables: [Table] = []
        for entity in description.entities {
            var columns: [Column] = []
            // A subentity's own columns: no default on the server (a column added with one
            // would give it to every row of the hierarchy, not only the subentity's).
            let subentityColumns = Set(entity.subentities?.flatMap(\.properties) ?? [])
            for (index, property) in entity.properties.enumerated() where property.kind != "toMany" {
                var onDelete = "SET NULL"
                if property.kind == "toOne", let destination = property.destination, let inverse = property.inverse,
                    let rule = description.entities.first(where: { $0.name == destination })?
                        .properties.first(where: { $0.name == inverse })?.deleteRule
                {
                    onDelete =
                        switch rule {
                        case .cascade: "CASCADE"
                        case .deny: "NO ACTION"
                        case .nullify: "SET NULL"
                        }
                }
                columns.append(
                    Column(
                        index: index, name: property.name,
                        type: property.kind == "toOne"
                            ? .uuid : ServerType(typeName: property.typeName, storage: property.storageType),
                        isOptional: property.isOptional || property.kind == "toOne", typeName: property.typeName,
                        destination: property.kind == "toOne" ? property.destination : nil,
                        originalName: property.originalName,
                        defaultValue: subentityColumns.contains(property.name) ? nil : property.defaultValue?.value,
                        isUnique: property.isUnique, isIndexed: property.isIndexed || property.kind == "toOne",
                        onDelete: onDelete))
            }
            tables.append(
                Table(
                    name: entity.name, originalName: entity.originalName, propertyCount: entity.properties.count,
                    columns: columns, indexes: entity.indexes))
        }
        self.tables = tables
        byName = Dictionary(uniqueKeysWithValues: tables.enumerated().map { ($1.name, $0) })
        hasRenames = tables.contains { table in
            table.originalName != nil || table.columns.contains { $0.originalName != nil }
        }
    }

    /// The table of an entity, when the schema has it.
    package func table(_ entity: String) -> Table? { byName[entity].map { tables[$0] } }

    /// The table of `entity` as it is named now or was named before a rename (`originalName`):
    /// what a change set queued before the migration names.
    package func current(_ entity: String) -> Table? {
        table(entity) ?? tables.first { $0.originalName == entity }
    }

    /// `changes` under the current names: a change set queued before a migration that renamed
    /// an entity or a property (`originalName`) names them as they were, and would otherwise be
    /// uploaded without those rows or values. (Its digest stays the one of the change set as
    /// queued: only what is written to the server is renamed.)
    package func current(_ changes: QueuedChangeSet) -> QueuedChangeSet {
        guard hasRenames else { return changes }  // the upload's hot path: most schemas rename nothing
        func renamed(_ row: QueuedChangeSet.Row) -> QueuedChangeSet.Row {
            guard let table = current(row.entity) else { return row }
            var row = row
            row.entity = table.name
            row.values = table.current(row.values)
            return row
        }
        var changes = changes
        changes.inserted = changes.inserted.map(renamed)
        changes.updated = changes.updated.map(renamed)
        changes.deleted = changes.deleted.map { reference in
            var reference = reference
            reference.entity = current(reference.entity)?.name ?? reference.entity
            return reference
        }
        return changes
    }

    /// The statement that records the transaction running it as the one that set the horizon
    /// (`horizonTransaction` in `_skyros_meta`: `horizon:xid`), run in the transaction that
    /// moved it. `quotedSchema`: the schema's quoted name.
    ///
    /// A checkpoint is past the horizon when its snapshot's xmin is below it: it may lack a log
    /// row dropped since, or precede a truncation or a repair. But a snapshot's xmin is the
    /// oldest transaction running in the whole cluster, whatever database it is in: while one
    /// transaction older than the horizon runs (a `pg_dump`, a session left idle in a
    /// transaction, in any database), every snapshot's xmin stays below it, and every machine
    /// read a snapshot of every table, then another, until that transaction ended. A snapshot
    /// that sees the transaction that moved the horizon was taken after it committed, and so
    /// has every change it could lack: such a checkpoint is not past the horizon
    /// (``ServerSession/changesSQL(_:)``). The pair counts only while `horizon` still holds the
    /// value it names: a daemon of an earlier version moves the horizon without it.
    static func horizonTransactionSQL(_ quotedSchema: String) -> String {
        """
        UPDATE \(quotedSchema)._skyros_meta SET value = (SELECT value FROM \(quotedSchema)._skyros_meta WHERE key = 'horizon') \
        || ':' || pg_current_xact_id()::text WHERE key = 'horizonTransaction'
        """
    }

    /// The LISTEN/NOTIFY channel of the group's changes.
    package var channel: String { Self.channel(ofSchema: name) }

    /// The LISTEN/NOTIFY channel of the group whose server schema is `name`.
    package static func channel(ofSchema name: String) -> String { "skyros_" + name }

    // MARK: - Names

    /// `"name"`, with quotes doubled.
    package static func quote(_ identifier: String) -> String {
        SQLIdentifier.quote(identifier)
    }

    /// `schema."table"`.
    package func qualified(_ table: String) -> String { Self.quote(name) + "." + Self.quote(table) }

    /// A SQL string literal: `'text'`, with quotes doubled.
    package static func literal(_ text: String) -> String { "'" + text.replacingOccurrences(of: "'", with: "''") + "'" }

    // MARK: - DDL

    /// Adds the change log's `op` column (`schema` quoted).
    static func logOperationSQL(_ schema: String) -> String {
        "ALTER TABLE \(schema)._skyros_log ADD COLUMN IF NOT EXISTS op \"char\""
    }

    /// The sync tables and functions, created when missing (each entry one statement).
    package var syncTablesSQL: [String] {
        let schema = Self.quote(name)
        return [
            "CREATE SCHEMA IF NOT EXISTS \(schema)",
            // Every committed change to a group table: the transaction's id (its visibility
            // decides which checkpoint carries it, not its order of insertion), the object.
            """
            CREATE TABLE IF NOT EXISTS \(schema)._skyros_log (xid xid8 NOT NULL DEFAULT pg_current_xact_id(), \
            entity text NOT NULL, id uuid NOT NULL, at timestamptz NOT NULL DEFAULT clock_timestamp())
            """,
            "CREATE INDEX IF NOT EXISTS _skyros_log_xid ON \(schema)._skyros_log (xid)",
            // What the change was ('i' insert, 'u' update, 'd' delete; NULL when logged
            // otherwise), added after the table: a sync gateway tells a new row only to the
            // machines whose buckets hold it (a row that did not exist left nobody's).
            Self.logOperationSQL(schema),
            // One row per change set a machine uploaded: exactly once, and the write checkpoint.
            """
            CREATE TABLE IF NOT EXISTS \(schema)._skyros_uploads (machine uuid NOT NULL, number bigint NOT NULL, \
            xid xid8 NOT NULL DEFAULT pg_current_xact_id(), at timestamptz NOT NULL DEFAULT clock_timestamp(), \
            rejected text, objects jsonb, digest bigint, PRIMARY KEY (machine, number))
            """,
            // The digest of each change set (QueuedChangeSet.digest), added after the table:
            // a store restored or copied is told apart by it.
            "ALTER TABLE \(schema)._skyros_uploads ADD COLUMN IF NOT EXISTS digest bigint",
            "CREATE TABLE IF NOT EXISTS \(schema)._skyros_meta (key text PRIMARY KEY, value text NOT NULL)",
            // The horizon starts at the schema's creation: a machine whose last checkpoint is
            // older (it synced with a schema since dropped and made again) reads a snapshot.
            // `horizonTransaction` (``ServerSchema/horizonTransactionSQL(_:)``) names the
            // transaction that set it: a checkpoint that sees it is not older, whatever
            // transaction of the cluster was still running.
            """
            INSERT INTO \(schema)._skyros_meta (key, value) \
            VALUES ('horizon', pg_snapshot_xmax(pg_current_snapshot())::text), \
            ('horizonTransaction', pg_snapshot_xmax(pg_current_snapshot())::text || ':' || pg_current_xact_id()::text) \
            ON CONFLICT DO NOTHING
            """,
            // One statement-level trigger per kind of change, with its transition table: a
            // multi-row INSERT of 1,000 rows logs them in one set-based INSERT (a row-level
            // trigger would run 1,000 times), and notifies once.
            """
            CREATE OR REPLACE FUNCTION \(schema)._skyros_changes() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF TG_OP = 'INSERT' THEN
                INSERT INTO \(schema)._skyros_log (entity, id, op) SELECT TG_TABLE_NAME, "_id", 'i' FROM skyros_new;
              ELSIF TG_OP = 'UPDATE' THEN
                INSERT INTO \(schema)._skyros_log (entity, id, op)
                  SELECT TG_TABLE_NAME, "_id", 'u' FROM skyros_old UNION SELECT TG_TABLE_NAME, "_id", 'u' FROM skyros_new;
              ELSE
                INSERT INTO \(schema)._skyros_log (entity, id, op) SELECT TG_TABLE_NAME, "_id", 'd' FROM skyros_old;
              END IF;
              IF FOUND THEN
                PERFORM pg_notify(\(Self.literal(channel)), pg_current_xact_id()::text);
              END IF;
              RETURN NULL;
            END $$
            """,
            // TRUNCATE fires no row trigger and has no transition table: before a group table
            // is truncated, every row it has is logged (as a DELETE would), so that machines
            // delete them too; truncating the log itself loses what machines have not read
            // yet, so it moves the horizon past the truncation: every machine re-reads a
            // snapshot.
            """
            CREATE OR REPLACE FUNCTION \(schema)._skyros_truncated() RETURNS trigger LANGUAGE plpgsql AS $$
            DECLARE
              logged bigint;
            BEGIN
              IF TG_TABLE_NAME = '_skyros_log' THEN
                UPDATE \(schema)._skyros_meta SET value = pg_snapshot_xmax(pg_current_snapshot())::text
                  WHERE key = 'horizon' AND value::xid8 < pg_snapshot_xmax(pg_current_snapshot());
                \(Self.horizonTransactionSQL(schema));
                logged := 1;
              ELSE
                EXECUTE format('INSERT INTO \(schema.replacingOccurrences(of: "'", with: "''"))._skyros_log (entity, id) SELECT $1, "_id" FROM %I.%I',
                  TG_TABLE_SCHEMA, TG_TABLE_NAME) USING TG_TABLE_NAME;
                GET DIAGNOSTICS logged = ROW_COUNT;
              END IF;
              IF logged > 0 THEN
                PERFORM pg_notify(\(Self.literal(channel)), pg_current_xact_id()::text);
              END IF;
              RETURN NULL;
            END $$
            """,
        ]
    }

    /// The statements that bring the server to this schema, given what it has (``Existing``;
    /// empty for a new server): tables created, columns added or renamed (`originalName`),
    /// never dropped; constraints, indexes and triggers created when missing; the horizon moved
    /// when a table or column is made again on a server already at this version (a repair:
    /// every machine re-reads a snapshot). None when the
    /// server has everything: a daemon that starts takes no lock on the group's tables. Throws ``SkyrosError/Code/migrationFailed`` for a change it cannot make
    /// additively (a non-optional column without a default added to a table that has rows is
    /// left to the server, which refuses it in the same words).
    package func migrationSQL(_ found: Existing) -> [String] {
        let existing = found.columns
        let constraints = found.constraints
        var statements: [String] = []
        // Whether a table or column is created (not renamed).
        var repaired = false
        for table in tables {
            let qualified = qualified(table.name)
            var have = existing[table.name] ?? []
            if have.isEmpty, let original = table.originalName, let old = existing[original], !old.isEmpty {
                statements.append("ALTER TABLE \(self.qualified(original)) RENAME TO \(Self.quote(table.name))")
                have = old
            }
            if have.isEmpty {
                repaired = true
                let columns = ["\"_id\" uuid PRIMARY KEY DEFAULT gen_random_uuid()"] + table.columns.map(columnSQL)
                statements.append("CREATE TABLE IF NOT EXISTS \(qualified) (\(columns.joined(separator: ", ")))")
            } else {
                for column in table.columns where !have.contains(column.name) {
                    if let original = column.originalName, have.contains(original) {
                        statements += expandRename(of: original, to: column, in: table)
                    } else {
                        repaired = true
                        statements.append("ALTER TABLE \(qualified) ADD COLUMN IF NOT EXISTS \(columnSQL(column))")
                    }
                }
            }
        }
        // Then what refers to other tables, once they all exist.
        for table in tables {
            let qualified = qualified(table.name)
            for column in table.columns {
                if let destination = column.destination, tables.contains(where: { $0.name == destination }) {
                    let constraint = "\(table.name)_\(column.name)_fkey"
                    if !constraints.contains(constraint) {
                        statements.append(
                            """
                            ALTER TABLE \(qualified) ADD CONSTRAINT \(Self.quote(constraint)) FOREIGN KEY (\(Self.quote(column.name))) \
                            REFERENCES \(self.qualified(destination)) ("_id") ON DELETE \(column.onDelete) DEFERRABLE INITIALLY DEFERRED
                            """)
                    }
                }
                if (column.isUnique || column.isIndexed) && !found.indexes.contains("\(table.name)_\(column.name)") {
                    statements.append(
                        """
                        CREATE \(column.isUnique ? "UNIQUE " : "")INDEX IF NOT EXISTS \(Self.quote("\(table.name)_\(column.name)")) \
                        ON \(qualified) (\(Self.quote(column.name)))
                        """)
                }
            }
            for index in table.indexes
            where !index.isEmpty && !found.indexes.contains(([table.name] + index).joined(separator: "_")) {
                statements.append(
                    """
                    CREATE INDEX IF NOT EXISTS \(Self.quote(([table.name] + index).joined(separator: "_"))) \
                    ON \(qualified) (\(index.map(Self.quote).joined(separator: ", ")))
                    """)
            }
            // Servers set up by the first sync build logged with a row-level trigger and
            // notified from a second one: both give way to the statement-level triggers.
            for old in ["_skyros_record", "_skyros_notify"] where found.triggers.contains("\(table.name).\(old)") {
                statements.append("DROP TRIGGER IF EXISTS \(old) ON \(qualified)")
            }
            for (trigger, event, transition) in Self.changeTriggers
            where !found.triggers.contains("\(table.name).\(trigger)") {
                statements.append(
                    """
                    CREATE OR REPLACE TRIGGER \(trigger) AFTER \(event) ON \(qualified) \
                    REFERENCING \(transition) FOR EACH STATEMENT EXECUTE FUNCTION \(Self.quote(name))._skyros_changes()
                    """)
            }
        }
        for table in tables.map(\.name) + ["_skyros_log"] where !found.triggers.contains("\(table)._skyros_truncated") {
            statements.append(
                """
                CREATE OR REPLACE TRIGGER _skyros_truncated BEFORE TRUNCATE ON \(qualified(table)) \
                FOR EACH STATEMENT EXECUTE FUNCTION \(Self.quote(name))._skyros_truncated()
                """)
        }
        if let uploads = existing["_skyros_uploads"], !uploads.contains("digest") {
            statements.append("ALTER TABLE \(Self.quote(name))._skyros_uploads ADD COLUMN IF NOT EXISTS digest bigint")
        }
        // The log's operations (with the function that records them, made again with the
        // sync tables' statements whenever there is anything to do).
        if let log = existing["_skyros_log"], !log.contains("op") {
            statements.append(Self.logOperationSQL(Self.quote(name)))
        }
        guard !statements.isEmpty || found.schemaVersion < version else { return [] }
        // A table or column of this schema version missing on a server already set up for it
        // was dropped there: what the server had in it is gone, and no log row says so. The
        // horizon moves past this repair, so that every machine re-reads a snapshot and
        // converges to the server's (default) values.
        if found.schemaVersion >= version, repaired {
            statements.append(
                """
                UPDATE \(Self.quote(name))._skyros_meta SET value = pg_snapshot_xmax(pg_current_snapshot())::text \
                WHERE key = 'horizon' AND value::xid8 < pg_snapshot_xmax(pg_current_snapshot())
                """)
            statements.append(Self.horizonTransactionSQL(Self.quote(name)))
        }
        statements.append(
            """
            INSERT INTO \(Self.quote(name))._skyros_meta (key, value) VALUES ('schemaVersion', \(Self.literal(String(version)))) \
            ON CONFLICT (key) DO UPDATE SET value = greatest(EXCLUDED.value::bigint, \(Self.quote(name))._skyros_meta.value::bigint)::text
            """)
        return statements
    }

    /// The triggers that log every change to a group table: name, event, transition tables
    /// (PostgreSQL allows transition tables only on a trigger of one event).
    static let changeTriggers = [
        ("_skyros_inserted", "INSERT", "NEW TABLE AS skyros_new"),
        ("_skyros_updated", "UPDATE", "OLD TABLE AS skyros_old NEW TABLE AS skyros_new"),
        ("_skyros_deleted", "DELETE", "OLD TABLE AS skyros_old"),
    ]

    /// A column's definition: name, type, default, NOT NULL.
    /// A renamed column (`originalName`), expanded instead of renamed, so that daemons of both
    /// versions keep seeing every value during a rolling upgrade: the new column is added and
    /// filled from the old one, and a row trigger keeps the two equal — a write to either
    /// (an older daemon writes the old name, a newer one the new name) is copied to the other.
    /// The old column stays until an operator drops it (with the trigger) once no machine of
    /// the older version remains (docs/SYNC.md, "Renames").
    private func expandRename(of original: String, to column: Column, in table: Table) -> [String] {
        let qualified = qualified(table.name)
        let new = Self.quote(column.name)
        let old = Self.quote(original)
        let function = "\(Self.quote(name)).\(Self.quote("_skyros_mirror_\(table.name)_\(column.name)"))"
        var defaultValue = "NULL"
        if let value = column.defaultValue, let text = try? column.type.serverText(value, typeName: column.typeName) {
            defaultValue = column.type.input(Self.literal(text))
        }
        return [
            "ALTER TABLE \(qualified) ADD COLUMN IF NOT EXISTS \(columnSQL(column))",
            "UPDATE \(qualified) SET \(new) = \(old) WHERE \(new) IS DISTINCT FROM \(old)",
            """
            CREATE OR REPLACE FUNCTION \(function)() RETURNS trigger LANGUAGE plpgsql AS $$
            BEGIN
              IF TG_OP = 'INSERT' THEN
                IF NEW.\(new) IS NOT DISTINCT FROM \(defaultValue) THEN NEW.\(new) := NEW.\(old);
                ELSE NEW.\(old) := NEW.\(new);
                END IF;
              ELSIF NEW.\(new) IS DISTINCT FROM OLD.\(new) THEN NEW.\(old) := NEW.\(new);
              ELSIF NEW.\(old) IS DISTINCT FROM OLD.\(old) THEN NEW.\(new) := NEW.\(old);
              END IF;
              RETURN NEW;
            END $$
            """,
            """
            CREATE OR REPLACE TRIGGER \(Self.quote("_skyros_mirror_\(column.name)")) BEFORE INSERT OR UPDATE ON \(qualified) \
            FOR EACH ROW EXECUTE FUNCTION \(function)()
            """,
        ]
    }

    private func columnSQL(_ column: Column) -> String {
        var sql = "\(Self.quote(column.name)) \(column.type.sqlType)"
        if let value = column.defaultValue, let text = try? column.type.serverText(value, typeName: column.typeName) {
            sql += " DEFAULT \(column.type.input(Self.literal(text)))"
        }
        if !column.isOptional { sql += " NOT NULL" }
        return sql
    }

    /// What the server has of the schema: tables and their columns, constraints, indexes,
    /// triggers (`table.trigger`), and the highest schema version a daemon set it up for.
    package struct Existing: Sendable, Equatable {
        package var columns: [String: Set<String>] = [:]
        package var constraints: Set<String> = []
        package var indexes: Set<String> = []
        package var triggers: Set<String> = []
        package var schemaVersion: UInt64 = 0

        /// Nothing: a new server.
        package init() {}
    }

    /// The query that lists the schema's indexes.
    package var indexesQuery: String {
        "SELECT indexname::text FROM pg_indexes WHERE schemaname = \(Self.literal(name))"
    }

    /// The query that lists the triggers of the schema's tables, as `table.trigger`.
    package var triggersQuery: String {
        """
        SELECT c.relname::text || '.' || t.tgname::text FROM pg_trigger t JOIN pg_class c ON c.oid = t.tgrelid \
        JOIN pg_namespace n ON n.oid = c.relnamespace WHERE n.nspname = \(Self.literal(name)) AND NOT t.tgisinternal
        """
    }

    /// The query that reads the schema version recorded in `_skyros_meta` (no row: none).
    package var schemaVersionQuery: String {
        "SELECT value FROM \(Self.quote(name))._skyros_meta WHERE key = 'schemaVersion'"
    }

    /// The query that lists the columns of the schema's tables: rows of (table, column).
    package var columnsQuery: String {
        "SELECT table_name::text, column_name::text FROM information_schema.columns WHERE table_schema = \(Self.literal(name))"
    }

    /// The query that lists the schema's constraint names.
    package var constraintsQuery: String {
        """
        SELECT c.conname::text FROM pg_constraint c JOIN pg_namespace n ON n.oid = c.connamespace \
        WHERE n.nspname = \(Self.literal(name))
        """
    }
}
