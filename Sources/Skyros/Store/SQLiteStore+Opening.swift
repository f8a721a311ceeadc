import Foundation
import GRDB
import GRDBSQLite
import Synchronization

// Opening a store file: what it records about itself (`skyros_metadata`, `skyros_schema`),
// and the decision to create, open, refresh or migrate it, made on the writer connection.
extension SQLiteStore {
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

    /// Creates the schema of a new store, or opens an existing one: brings its records up
    /// to date, or migrates it (foreign keys off during the transaction, as SQLite's table
    /// rebuild requires; checked before commit).
    ///
    /// - Parameter creating: whether to create the schema of a file that has none.
    /// - Returns: false when the file has no schema and `creating` is false.
    @discardableResult
    func openSchema(_ db: Database, plan: MigrationPlan, creating: Bool = true) throws -> Bool {
        let path = url?.path ?? ":memory:"
        var decided: (state: StoredState, decision: OpenDecision)?
        let existing = try Self.storedStateIfAny(db)
        guard existing != nil || creating else { return false }
        if let state = existing {
            // Decided first without the write lock: an up-to-date store takes none.
            if let format = state.format, format != Self.format {
                throw SkyrosError(
                    .schemaMismatch,
                    "the store at \(path) has file format \(format), this Skyros reads format \(Self.format); the file was left untouched"
                )
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
            let decision =
                try decided.flatMap { $0.state == state ? $0.decision : nil }
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
                    sql:
                        "UPDATE \(SQLBuilder.quote(table)) SET \(name) = skyros_ordered_decimal(\(name)) WHERE \(name) NOT GLOB '[nop]*'"
                )
            }
        }
        try db.execute(
            sql: "INSERT OR REPLACE INTO skyros_metadata (key, value) VALUES ('decimals', ?)",
            arguments: [Self.decimalsForm])
    }
}

/// The work an opening store does on its pool's writer connection as it opens (see
/// ``SQLiteStore/init(schema:url:durability:serialAccess:migrations:)``): run once, on the
/// first connection that is not read-only, then dropped (the pool's configuration keeps the
/// hook, not the store).
final class OpeningHook: Sendable {
    private let state = Mutex<(body: (@Sendable (Database) throws -> Bool)?, done: Bool)>((nil, false))

    /// Whether the body ran and opened the store.
    var opened: Bool { state.withLock { $0.done } }

    func set(_ body: @escaping @Sendable (Database) throws -> Bool) { state.withLock { $0.body = body } }

    func run(_ db: Database) throws {
        let body = state.withLock { state in
            defer { state.body = nil }
            return state.body
        }
        guard let body else { return }
        let opened = try body(db)
        state.withLock { $0.done = opened }
    }
}
