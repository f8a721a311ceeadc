import Foundation
import GRDB
import GRDBSQLite

extension SQLiteStore {
    /// One write transaction of a store, for a process that commits several change sets
    /// together and keeps its own records next to them in the same commit — the daemon of an
    /// application group does both (group commit, history, exactly-once records).
    ///
    /// Use it only inside ``SQLiteStore/transaction(_:)``; it is not valid afterwards.
    package final class Transaction {
        let db: Database
        let store: SQLiteStore

        init(db: Database, store: SQLiteStore) {
            self.db = db
            self.store = store
        }

        /// The schema of the store the transaction writes.
        package var schema: Schema { store.schema }

        /// Writes a change set. Every reference it leaves must resolve: a change set that
        /// links to an object that no longer exists (another process deleted it) or deletes
        /// an object still referenced under a `.deny` rule fails with
        /// ``SkyrosError/Code/deleteDenied`` — call it inside ``savepoint(_:)`` to undo what
        /// it wrote in that case. An update or delete of an object that does not exist fails
        /// with ``SkyrosError/Code/objectNotFound``, a value of the wrong type with
        /// ``SkyrosError/Code/typeMismatch``.
        ///
        /// - Returns: the updates applied, with the objects' new versions.
        @discardableResult
        package func apply(_ changes: ChangeSet) throws -> [AppliedUpdate] {
            try applyConformed(changes).updates
        }

        /// Writes a change set as ``apply(_:)`` does, and returns it as stored — each value
        /// as its property's type holds it (an integer given for a real is that real) — with
        /// the updates applied: what a daemon publishes must be what a fetch returns.
        ///
        /// With `vacatingUniqueValues` (a sync checkpoint's change set, whose objects may
        /// exchange unique values among themselves, or hand one to an inserted object), the
        /// values they exchange are first moved out of the way in the transaction; a change
        /// set that ends with two objects holding one value is refused all the same.
        package func applyConformed(_ changes: ChangeSet, vacatingUniqueValues: Bool = false) throws -> (
            changes: ChangeSet, updates: [AppliedUpdate]
        ) {
            let applied: (changes: ChangeSet, updates: [AppliedUpdate])
            do {
                applied = try store.apply(changes, db, vacatingUniqueValues: vacatingUniqueValues)
            } catch {
                throw SQLiteStore.translate(error)
            }
            if hasUnresolvedReferences {
                throw SkyrosError(
                    .deleteDenied,
                    "relationship integrity: the change set refers to an object that does not exist, or deletes one that is still referenced under a deny rule"
                )
            }
            return applied
        }

        /// Deletes every object, keeping the schema.
        package func deleteAll() throws {
            do {
                try db.execute(sql: "PRAGMA defer_foreign_keys = ON")
                for entity in store.schema.entities {
                    try db.execute(sql: "DELETE FROM \(SQLBuilder.quote(entity.name))")
                }
            } catch {
                throw SQLiteStore.translate(error)
            }
        }

        /// Runs `body` in a savepoint: when it throws, everything it wrote is undone and the
        /// rest of the transaction goes on.
        package func savepoint<T>(_ body: () throws -> T) throws -> T {
            try execute("SAVEPOINT skyros_item")
            do {
                let result = try body()
                try execute("RELEASE skyros_item")
                return result
            } catch {
                try? execute("ROLLBACK TO skyros_item")
                try? execute("RELEASE skyros_item")
                throw error
            }
        }

        /// True when a foreign key written in this transaction points nowhere (SQLite's
        /// deferred constraint counter): the commit would fail.
        package var hasUnresolvedReferences: Bool {
            var current: Int32 = 0
            var highest: Int32 = 0
            sqlite3_db_status(db.sqliteConnection, SQLITE_DBSTATUS_DEFERRED_FKS, &current, &highest, 0)
            return current != 0
        }

        /// Runs one SQL statement with arguments, bound to its `?` placeholders in order.
        ///
        /// Raw SQL is package API: the daemon's journal and the `skyros` tool keep their own
        /// tables next to the objects with it; applications go through change sets.
        ///
        /// - Throws: the statement's failure as a ``SkyrosError`` (``SkyrosError/Code/storeFailure``,
        ///   or the code of the constraint it breaks).
        package func execute(_ sql: String, _ arguments: [StoredValue] = []) throws {
            do {
                try SQLiteStore.query(db, sql, arguments) { _ in }
            } catch {
                throw SQLiteStore.translate(error)
            }
        }

        /// Runs a query inside the transaction; each row is its columns' values, in order.
        /// Package API, as ``execute(_:_:)`` is.
        ///
        /// - Throws: the query's failure as a ``SkyrosError``.
        package func rows(_ sql: String, _ arguments: [StoredValue] = []) throws -> [[StoredValue]] {
            do {
                return try SQLiteStore.rows(db, sql, arguments)
            } catch {
                throw SQLiteStore.translate(error)
            }
        }
    }

    /// Runs `body` in one `BEGIN IMMEDIATE` transaction and commits when it returns (with the
    /// store's durability); when it throws, or the commit fails, nothing is stored.
    package func transaction<T>(_ body: (Transaction) throws -> T) throws -> T {
        do {
            return try writer.writeWithoutTransaction { db in
                try Self.immediateTransaction(db) { db in try body(Transaction(db: db, store: self)) }
            }
        } catch {
            throw Self.translate(error)
        }
    }

    /// Runs `body` in one `BEGIN IMMEDIATE` transaction, as ``transaction(_:)`` does, committed
    /// with `durability` when it is weaker than the store's (`.normal`: the commit does not
    /// wait for the disk; a power loss may take it, and every later commit with it, but never
    /// leaves a part of it).
    ///
    /// Package API: the daemon applies sync checkpoints this way, since a checkpoint the
    /// store loses is read again from the server (the cursor is lost with it).
    package func transaction<T>(durability: Durability, _ body: (Transaction) throws -> T) throws -> T {
        guard durability == .normal, self.durability == .full else { return try transaction(body) }
        do {
            return try writer.writeWithoutTransaction { db in
                try db.execute(sql: "PRAGMA synchronous = NORMAL")
                defer { try? db.execute(sql: "PRAGMA synchronous = FULL") }
                return try Self.immediateTransaction(db) { db in try body(Transaction(db: db, store: self)) }
            }
        } catch {
            throw Self.translate(error)
        }
    }

    /// Runs a read-only query as a read (on a reader connection, or the writer one with serial
    /// access); each row is its columns' values.
    ///
    /// Package API: for the daemon's journal, the `skyros` tool and tests, which read tables
    /// the object graph does not describe (`skyros_history`, `skyros_schema`, `sqlite_master`).
    ///
    /// - Throws: the query's failure as a ``SkyrosError``.
    package func rows(_ sql: String, _ arguments: [StoredValue] = []) throws -> [[StoredValue]] {
        try read { db in try Self.rows(db, sql, arguments) }
    }

    static func rows(_ db: Database, _ sql: String, _ arguments: [StoredValue]) throws -> [[StoredValue]] {
        var result: [[StoredValue]] = []
        try query(db, sql, arguments) { raw in
            let count = sqlite3_column_count(raw)
            result.append((0..<count).map { value(raw, $0) })
        }
        return result
    }
}
