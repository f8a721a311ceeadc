import Foundation
import PostgresNIO
import Skyros

/// A consistent prefix of the server's history, as a machine applies it: the objects changed
/// since the machine's previous checkpoint (or every object, for a snapshot), each as the
/// server has it at one PostgreSQL snapshot, or gone.
///
/// Which changes a checkpoint carries is decided by visibility, not by order of insertion:
/// the log rows visible in this snapshot and not in the previous one are exactly the
/// transactions that committed between the two, whatever their transaction ids' order. So a
/// transaction that took its id first but committed last is never skipped (the trap of a
/// change log read by sequence number).
package struct Checkpoint: Sendable {
    /// The PostgreSQL snapshot it was read at (`pg_snapshot` text): the next checkpoint's start.
    package var snapshot: String
    /// The snapshot's `xmin`: a number that grows with the server's history (for status).
    package var number: UInt64
    /// A snapshot of every table: local objects it does not have are deleted.
    package var isSnapshot: Bool
    /// This machine's highest upload number the checkpoint includes (0: none).
    package var uploadedThrough: Int64
    /// The objects changed, with every value as the server has it (one per property, in
    /// declaration order; NULL for to-manys), or nil when the server no longer has them.
    package var objects: [ObjectID: StoredValues?]
    /// Rows the machine cannot read (a value that does not fit its attribute's type, NULL in
    /// a non-optional): skipped, named here.
    package var unreadable: [String]
    /// This machine's change sets the server refused since the previous checkpoint.
    package var rejected: [Rejection]
    /// How long ago, in milliseconds, the newest change it carries was committed on the server.
    package var lagMilliseconds: Int

    /// A change set the server refused.
    package struct Rejection: Sendable, Equatable {
        /// Its number in this machine's upload queue.
        package var number: Int64
        /// Why.
        package var reason: String
        /// The objects it named (`Entity/uuid`).
        package var objects: [ObjectID]
    }
}

extension ServerSession {
    /// Reads the checkpoint after `previous` (a `pg_snapshot` text; nil: a first sync) in one
    /// REPEATABLE READ transaction. A machine whose previous checkpoint is older than the
    /// log's compaction horizon gets a snapshot of every table instead.
    package func readCheckpoint(after previous: String?, machine: UUID) async throws -> Checkpoint {
        let quoted = ServerSchema.quote(schema.name)
        try await run("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
        do {
            let head = try await run(
                """
                SELECT pg_current_snapshot()::text, pg_snapshot_xmin(pg_current_snapshot())::text, \
                (SELECT value FROM \(quoted)._skyros_meta WHERE key = 'horizon'), \
                (SELECT coalesce(max(number), 0)::text FROM \(quoted)._skyros_uploads WHERE machine = $1::uuid), \
                ($2::text IS NULL OR pg_snapshot_xmin($2::pg_snapshot) < (SELECT value FROM \(quoted)._skyros_meta WHERE key = 'horizon')::xid8)::text
                """, [machine.uuidString.lowercased(), previous])
            guard let row = head.first, let snapshot = row[0] else {
                throw SkyrosError(.storeFailure, "the server did not give its snapshot")
            }
            var checkpoint = Checkpoint(
                snapshot: snapshot, number: UInt64(row[1] ?? "0") ?? 0, isSnapshot: row[4] == "true",
                uploadedThrough: Int64(row[3] ?? "0") ?? 0, objects: [:], unreadable: [], rejected: [], lagMilliseconds: 0)
            if checkpoint.isSnapshot {
                for table in schema.tables {
                    try await readRows(of: table, where: nil, [], into: &checkpoint)
                }
            } else if let previous {
                let changed = try await run(
                    """
                    SELECT entity, array_agg(DISTINCT id)::text, \
                    (extract(epoch FROM clock_timestamp() - max(at)) * 1000)::bigint::text FROM \(quoted)._skyros_log \
                    WHERE xid >= pg_snapshot_xmin($1::pg_snapshot) AND NOT pg_visible_in_snapshot(xid, $1::pg_snapshot) \
                    GROUP BY entity
                    """, [previous])
                var lag = 0
                for row in changed {
                    guard let entity = row[0], let ids = row[1], let table = schema.table(entity) else { continue }
                    lag = max(lag, Int(row[2] ?? "0") ?? 0)
                    // Every object named is listed: the ones the query does not return are gone.
                    for text in ids.trimmingCharacters(in: CharacterSet(charactersIn: "{}")).split(separator: ",") {
                        if let uuid = UUID(uuidString: String(text)) {
                            checkpoint.objects[ObjectID(entityName: entity, uuid: uuid)] = .some(nil)
                        }
                    }
                    try await readRows(of: table, where: "\"_id\" = ANY($1::uuid[])", [ids], into: &checkpoint)
                }
                checkpoint.lagMilliseconds = lag
            }
            if let previous {
                // Refusals since the previous checkpoint, a snapshot's too (the uploads' records
                // are never compacted).
                for row in try await run(
                    """
                    SELECT number::text, rejected, objects::text FROM \(quoted)._skyros_uploads \
                    WHERE machine = $1::uuid AND rejected IS NOT NULL AND xid >= pg_snapshot_xmin($2::pg_snapshot) \
                    AND NOT pg_visible_in_snapshot(xid, $2::pg_snapshot) ORDER BY number
                    """, [machine.uuidString.lowercased(), previous])
                {
                    checkpoint.rejected.append(Checkpoint.Rejection(
                        number: Int64(row[0] ?? "0") ?? 0, reason: row[1] ?? "", objects: Self.objects(row[2])))
                }
            }
            try await run("COMMIT")
            return checkpoint
        } catch {
            _ = try? await run("ROLLBACK")
            throw error
        }
    }

    /// Reads the rows of `table` (those `condition` selects) into the checkpoint's objects.
    private func readRows(
        of table: ServerSchema.Table, where condition: String?, _ parameters: [String?], into checkpoint: inout Checkpoint
    ) async throws {
        let outputs = ["\"_id\"::text"] + table.columns.map { $0.type.output(ServerSchema.quote($0.name)) }
        var sql = "SELECT \(outputs.joined(separator: ", ")) FROM \(schema.qualified(table.name))"
        if let condition { sql += " WHERE \(condition)" }
        for row in try await run(sql, parameters) {
            guard let text = row[0], let uuid = UUID(uuidString: text) else { continue }
            let id = ObjectID(entityName: table.name, uuid: uuid)
            var values = StoredValues(repeating: .null, count: table.propertyCount)
            var problem: String?
            for (position, column) in table.columns.enumerated() {
                let cell = row[position + 1]
                guard let value = column.type.storedValue(cell, typeName: column.typeName) else {
                    problem = "\(column.name) holds \(cell.map { "'\($0.prefix(32))'" } ?? "NULL"), which a \(column.typeName) cannot hold"
                    break
                }
                if value.isNull && !column.isOptional {
                    problem = "\(column.name) is NULL, and the attribute is not optional"
                    break
                }
                values[column.index] = value
            }
            if let problem {
                checkpoint.unreadable.append("\(table.name) \(text): \(problem); the row is skipped")
                checkpoint.objects[id] = nil
                continue
            }
            checkpoint.objects[id] = .some(values)
        }
    }

    /// The objects of a rejection's JSON list.
    private static func objects(_ json: String?) -> [ObjectID] {
        guard let json, let list = try? JSONSerialization.jsonObject(with: Data(json.utf8)) as? [[String: String]] else { return [] }
        return list.compactMap { entry in
            guard let entity = entry["entity"], let text = entry["id"], let uuid = UUID(uuidString: text) else { return nil }
            return ObjectID(entityName: entity, uuid: uuid)
        }
    }

    /// Drops the log rows older than `retention` seconds (those before the first younger one,
    /// and never one of a transaction still running) and moves the horizon past them:
    /// a machine whose last checkpoint is older re-syncs from a snapshot.
    package func compact(retention: TimeInterval) async throws {
        let quoted = ServerSchema.quote(schema.name)
        try await run("BEGIN")
        do {
            let rows = try await run(
                """
                SELECT least(pg_snapshot_xmin(pg_current_snapshot()), \
                (SELECT min(xid) FROM \(quoted)._skyros_log WHERE at >= clock_timestamp() - make_interval(secs => $1::double precision)))::text
                """, [String(retention)])
            if let horizon = rows.first?[0] ?? nil {
                try await run("DELETE FROM \(quoted)._skyros_log WHERE xid < $1::xid8", [horizon])
                try await run(
                    "UPDATE \(quoted)._skyros_meta SET value = $1 WHERE key = 'horizon' AND value::xid8 < $1::xid8", [horizon])
            }
            try await run("COMMIT")
        } catch {
            _ = try? await run("ROLLBACK")
            throw error
        }
    }
}
