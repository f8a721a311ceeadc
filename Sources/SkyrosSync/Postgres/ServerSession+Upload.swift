import Foundation
import PostgresNIO
import Skyros

extension ServerSession {
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
    package func upload(_ batch: [QueuedEntry], machine: UUID) async throws -> [UploadOutcome] {
        try await uploadReportingTransactions(batch, machine: machine).outcomes
    }

    /// ``upload(_:machine:)``, with the ids of the server transactions that applied the
    /// batch (nil when a part of it went one by one: not known).
    package func uploadReportingTransactions(
        _ batch: [QueuedEntry], machine: UUID
    ) async throws -> (outcomes: [UploadOutcome], transactions: [UInt64]?) {
        try await upload(batch, machine: machine)
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
            } catch  where Self.isTransientConflict(error) && attempt < Self.conflictRetries {
                attempt += 1
                try await Task.sleep(for: .milliseconds(Int.random(in: 2...20) * attempt))
            }
        }
    }

    /// Uploads `batch` as ``UploadPlan`` splits it: together, and in parts down to the change
    /// set at fault when the server refuses.
    private func upload(_ batch: [QueuedEntry], machine: UUID) async throws -> (
        outcomes: [UploadOutcome], transactions: [UInt64]?
    ) {
        var plan = UploadPlan(resets: batch.map(\.changes.reset))
        while true {
            switch plan.next() {
            case .together(let range):
                do {
                    let transaction = try await retryingConflicts {
                        try await uploadTogether(batch[range], machine: machine)
                    }
                    plan.appliedTogether(range, transaction: transaction)
                } catch  where Self.isBatchFault(error) {
                    // A change set of the part is at fault (or one was applied before): find it.
                    plan.refusedTogether(range, culprit: Self.culprit(of: error, in: batch[range], schema: schema))
                } catch is Refusal {
                    // A value of the part does not fit its column: find its change set.
                    plan.refusedTogether(range, culprit: nil)
                }
            case .oneByOne(let range):
                let outcomes = try await retryingConflicts {
                    try await uploadOneByOne(Array(batch[range]), machine: machine)
                }
                plan.uploadedOneByOne(range, outcomes: outcomes)
            case .done:
                return (plan.outcomes, plan.transactions)
            }
        }
    }

    /// Applies a batch of change sets as one statement (``togetherStatement(_:machine:schema:)``)
    /// in a transaction of its own (``inTransaction(_:)``): the batch counts as applied only once
    /// `COMMIT` has answered. Autocommitted, the statement answered verdict `1` before its
    /// commit; a commit that then failed (a deferred foreign key that dangles: the link's
    /// destination was deleted on the server; the server stopping, or its disk full, at that
    /// moment) left the machine taking the batch for applied and dropping it from its queue,
    /// and the server with none of it (the fault campaign's change sets "never recorded by the
    /// server").
    ///
    /// - Returns: the id of the transaction that applied it.
    @discardableResult
    private func uploadTogether(_ batch: ArraySlice<QueuedEntry>, machine: UUID) async throws -> UInt64? {
        let (sql, parameters) = try Self.togetherStatement(batch, machine: machine, schema: schema)
        return try await inTransaction {
            try await checkScope(Array(batch.map(\.changes)), before: true)
            let transaction = try Self.confirmedTogether(try await run(sql, parameters, prepared: true))
            try await checkScope(Array(batch.map(\.changes)), before: false)
            return transaction
        }
    }

    /// The transaction id in a batch statement's answer, which is one row: the verdict `1`
    /// (its checks held) and the id. Any other answer (no row: a connection that ended
    /// without the statement's answer) is not taken for an applied upload: the error ends the
    /// session, and at the next connection the server's record of this machine decides what
    /// was applied.
    package static func confirmedTogether(_ rows: [[String?]]) throws -> UInt64? {
        guard rows.count == 1, rows[0].count == 2, rows[0][0] == "1" else {
            throw UnconfirmedUpload(
                detail:
                    "the batch statement's answer had \(rows.count) row(s), not its one row of verdict and transaction")
        }
        return rows[0][1].flatMap { UInt64($0) }
    }

    /// The server's answer to an upload did not show it applied or recorded: nothing is taken
    /// for uploaded, and the session ends (the engine connects again).
    package struct UnconfirmedUpload: Error, CustomStringConvertible {
        package var detail: String
        package var description: String { "an upload was not confirmed by the server (\(detail))" }
    }

    /// The group's upload lock, held until the transaction ends: one machine's upload at a
    /// time. Uploads of one group touch the same rows (the objects every machine edits, the
    /// entries of unique indexes) in orders no statement can fix beforehand (data-modifying
    /// `WITH` clauses run in an order PostgreSQL does not promise), and every deadlock cost a
    /// second (the server's `deadlock_timeout`) before it was found: the fault campaign's
    /// machines, draining their queues together after a partition, spent most of their time
    /// deadlocked. Taken in turn they do not wait for each other any longer than the
    /// statement takes. Another group's uploads (another schema) take another lock.
    static func uploadLock(_ schema: ServerSchema) -> String {
        "pg_advisory_xact_lock(hashtext('skyros upload ' || \(ServerSchema.literal(schema.name))))"
    }

    /// Uploads change sets one by one in one transaction, each in its own savepoint with its
    /// (machine, number) record: a change set the server refuses is rolled back alone and
    /// recorded as rejected; one recorded before (a retry after a lost reply) is skipped.
    private func uploadOneByOne(_ batch: [QueuedEntry], machine: UUID) async throws -> [UploadOutcome] {
        var outcomes: [UploadOutcome] = []
        let machineText = machine.uuidString.lowercased()
        try await inTransaction {
            _ = try await run("SELECT '1' FROM (SELECT \(Self.uploadLock(schema))) AS serialized")
            for (number, changes) in batch {
                try await run("SAVEPOINT change_set")
                do {
                    let recorded = try await run(
                        "INSERT INTO \(ServerSchema.quote(schema.name))._skyros_uploads (machine, number, digest) VALUES ($1::uuid, $2::bigint, $3::bigint) ON CONFLICT DO NOTHING RETURNING 1",
                        [machineText, String(number), String(changes.digest)])
                    if recorded.isEmpty {
                        // Recorded before (a retry after a lost reply): its record must be there.
                        let existing = try await run(
                            "SELECT 1 FROM \(ServerSchema.quote(schema.name))._skyros_uploads WHERE machine = $1::uuid AND number = $2::bigint",
                            [machineText, String(number)])
                        guard existing.count == 1 else {
                            throw UnconfirmedUpload(
                                detail: "change set \(number) was neither recorded now nor found recorded before")
                        }
                        outcomes.append(.alreadyApplied)
                        try await run("RELEASE SAVEPOINT change_set")
                        continue
                    }
                    try await checkScope([changes], before: true)
                    try await apply(changes)
                    try await checkScope([changes], before: false)
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
                } catch  where Self.isChangeSetsFault(error) {
                    try await run("ROLLBACK TO SAVEPOINT change_set")
                    let reason = Self.describe(error)
                    try await recordRejection(number, machine: machineText, reason, changes)
                    outcomes.append(.rejected(reason))
                }
            }
        }
        return outcomes
    }

    /// Refuses the change sets (``Refusal``) when the session's ``scope`` does not allow
    /// them, checked under the group's upload lock, so that no other machine's upload moves
    /// rows between the check and the write: `before` their statements, and after, in the
    /// same transaction. Nothing without a scope (direct mode).
    private func checkScope(_ changes: [QueuedChangeSet], before: Bool) async throws {
        guard let scope else { return }
        if before { try await run("SELECT '1' FROM (SELECT \(Self.uploadLock(schema))) AS serialized") }
        // Under the names the statements write (a table or column renamed since the change
        // set was queued has its current name), as they will be applied.
        if let reason = try await scope.refusal(of: changes.map(schema.current), before: before, in: self) {
            throw Refusal(reason: reason)
        }
    }

    /// A change set the server cannot apply, for a reason found by the session itself.
    struct Refusal: Error {
        var reason: String
    }

    /// Applies one change set's statements.
    private func apply(_ changes: QueuedChangeSet) async throws {
        let changes = schema.current(changes)
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
            let sql =
                assignments.isEmpty
                ? "SELECT 1 FROM \(schema.qualified(table.name)) WHERE \"_id\" = $1::uuid"
                : "UPDATE \(schema.qualified(table.name)) SET \(assignments.joined(separator: ", ")) WHERE \"_id\" = $1::uuid RETURNING 1"
            if try await run(sql, parameters).isEmpty {
                throw Refusal(reason: "\(row.entity) \(row.id.uuidString) was deleted on the server")
            }
        }
        for reference in changes.deleted {
            guard let table = schema.table(reference.entity) else { continue }
            try await run(
                "DELETE FROM \(schema.qualified(table.name)) WHERE \"_id\" = $1::uuid",
                [reference.id.uuidString.lowercased()])
        }
    }

    private func text(_ value: StoredValue, _ column: ServerSchema.Column, _ row: QueuedChangeSet.Row) throws -> String?
    {
        try Self.text(value, column, row.entity, row.id)
    }

    /// A value as the server's text for `column`; a ``Refusal`` when it does not fit.
    static func text(_ value: StoredValue, _ column: ServerSchema.Column, _ entity: String, _ id: UUID) throws
        -> String?
    {
        do {
            return try column.type.serverText(value, typeName: column.typeName)
        } catch let error as SkyrosError {
            throw Refusal(reason: "\(entity).\(column.name) of \(id.uuidString): \(error.message)")
        }
    }

    /// Records a refused change set: its (machine, number) with the reason, and its objects in
    /// the log, so that the next checkpoint brings them back as the server has them.
    private func recordRejection(_ number: Int64, machine: String, _ reason: String, _ changes: QueuedChangeSet)
        async throws
    {
        let objects = changes.objects
        let json =
            "["
            + objects.map { "{\"entity\":\(Self.jsonString($0.entity)),\"id\":\"\($0.id.uuidString.lowercased())\"}" }
            .joined(separator: ",") + "]"
        try await run(
            "INSERT INTO \(ServerSchema.quote(schema.name))._skyros_uploads (machine, number, rejected, objects, digest) VALUES ($1::uuid, $2::bigint, $3, $4::jsonb, $5::bigint)",
            [machine, String(number), reason, json, String(changes.digest)])
        for object in objects where schema.table(object.entity) != nil {
            try await run(
                "INSERT INTO \(ServerSchema.quote(schema.name))._skyros_log (entity, id) VALUES ($1, $2::uuid)",
                [object.entity, object.id.uuidString.lowercased()])
        }
        try await run("SELECT pg_notify(\(ServerSchema.literal(schema.channel)), '')")
    }

    private static func jsonString(_ text: String) -> String {
        let data =
            (try? JSONSerialization.data(withJSONObject: text, options: [.fragmentsAllowed])) ?? Data("\"\"".utf8)
        return String(decoding: data, as: UTF8.self)
    }
}
