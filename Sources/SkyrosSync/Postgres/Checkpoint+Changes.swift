import Foundation
import Skyros

extension ServerSession {
    /// Reads the checkpoint after `previous` in **one statement** (one round trip): a single
    /// statement reads at one snapshot, `pg_current_snapshot()` is that snapshot, so its head,
    /// the log rows that became visible since `previous`, the changed objects' rows and the
    /// refusals are one consistent checkpoint, as the REPEATABLE READ transaction of
    /// ``readCheckpoint(after:rejectedAfter:machine:pageSize:stage:)`` gives with five or more.
    /// The refusals are those of this machine's uploads numbered after `rejectedAfter`.
    ///
    /// Every row of the answer is `(part, a, b, c)`: part 0 the head (snapshot, its xmin, the
    /// machine's highest upload, whether `previous` is past the horizon, the lag), 1 an object
    /// named by the log, 2 a row of a changed object (`c`: its cells as a text array),
    /// 3 a refusal.
    ///
    /// - Returns: nil when `previous` is older than the log's horizon (its xmin is below it,
    ///   and it does not see the transaction that set it, ``ServerSchema/horizonTransactionSQL(_:)``):
    ///   the machine needs a snapshot instead.
    package func readChanges(after previous: String, rejectedAfter: Int64, machine: UUID) async throws -> Checkpoint? {
        let rows = try await run(
            changesSQL, [previous, machine.uuidString.lowercased(), String(rejectedAfter)], prepared: true)
        return try checkpoint(of: rows)
    }

    /// The checkpoint in the rows of ``changesSQL(_:transactions:)``; nil past the horizon.
    private func checkpoint(of rows: [[String?]]) throws -> Checkpoint? {
        guard let head = rows.first(where: { $0[0] == "0" }),
            let snapshotPart = head[1]?.split(separator: "|"), snapshotPart.count == 2,
            let uploadPart = head[2]?.split(separator: "|"), uploadPart.count == 2
        else {
            throw SkyrosError(.storeFailure, "the server did not give its snapshot")
        }
        if uploadPart[1] == "true" { return nil }
        var checkpoint = Checkpoint(
            snapshot: String(snapshotPart[0]), number: UInt64(snapshotPart[1]) ?? 0, isSnapshot: false,
            uploadedThrough: Int64(uploadPart[0]) ?? 0, objects: [:], unreadable: [], rejected: [],
            lagMilliseconds: Int(head[3] ?? "0") ?? 0)
        // Every object the log names first: the ones without a row are gone.
        for row in rows where row[0] == "1" {
            guard let entity = row[1], schema.table(entity) != nil, let text = row[2], let uuid = UUID(uuidString: text)
            else { continue }
            checkpoint.objects[ObjectID(entityName: entity, uuid: uuid)] = .some(nil)
        }
        for row in rows {
            switch row[0] {
            case "2":
                guard let entity = row[1], let table = schema.table(entity), let text = row[2],
                    let uuid = UUID(uuidString: text)
                else {
                    continue
                }
                let id = ObjectID(entityName: entity, uuid: uuid)
                guard let cells = Self.arrayElements(row[3] ?? ""), cells.count == max(table.columns.count, 1) else {
                    checkpoint.unreadable.append(
                        "\(entity) \(text): the server's answer could not be read; the row is skipped")
                    checkpoint.objects[id] = nil
                    continue
                }
                // As the transaction's rows are: the id first, then the columns.
                switch Self.values(of: [text] + cells.prefix(table.columns.count), in: table) {
                case .success(let values):
                    checkpoint.objects[id] = .some(values)
                case .failure(let problem):
                    checkpoint.unreadable.append("\(entity) \(text): \(problem.reason); the row is skipped")
                    checkpoint.objects[id] = nil
                }
            case "3":
                checkpoint.rejected.append(
                    Checkpoint.Rejection(
                        number: Int64(row[1] ?? "0") ?? 0, reason: row[2] ?? "", objects: Self.objects(row[3])))
            default:
                continue
            }
        }
        checkpoint.rejected.sort { $0.number < $1.number }
        return checkpoint
    }

    /// The changes after `previous` for every machine at once (a sync gateway's read, DESIGN
    /// §10): ``readChanges(after:rejectedAfter:machine:)``'s checkpoint without any machine's
    /// uploads or refusals, and for each object the server transactions that changed it, so
    /// that the checkpoint of any machine whose previous checkpoint saw everything `previous`
    /// saw is the part of it those transactions are not visible in. Nil past the horizon.
    ///
    /// With `operations` (the log has its `op` column: ``ServerSchema/logOperationSQL(_:)``),
    /// `created` has the objects whose first change after `previous` inserted them: they did
    /// not exist for `previous`. Without, it is empty.
    package func readChangesWithTransactions(after previous: String, operations: Bool = false) async throws -> (
        checkpoint: Checkpoint, transactions: [ObjectID: [UInt64]], created: Set<ObjectID>
    )? {
        let rows = try await run(
            Self.changesSQL(schema, transactions: true, operations: operations), [previous, Self.nobody, "0"],
            prepared: true)
        guard let checkpoint = try checkpoint(of: rows) else { return nil }
        var transactions: [ObjectID: [UInt64]] = [:]
        var created: Set<ObjectID> = []
        for row in rows where row[0] == "1" {
            guard let entity = row[1], let text = row[2], let uuid = UUID(uuidString: text), var cell = row[3]
            else { continue }
            // With operations: the first operation's letter ('-' when not recorded), then the array.
            let first = operations ? cell.removeFirst() : "-"
            guard let xids = Self.arrayElements(cell) else { continue }
            let id = ObjectID(entityName: entity, uuid: uuid)
            transactions[id] = xids.compactMap { $0.flatMap { UInt64($0) } }
            if first == "i" { created.insert(id) }
        }
        return (checkpoint, transactions, created)
    }

    /// Whether the server's change log records each change's operation (its `op` column,
    /// added by a `--sync-setup` of a version that has it).
    package func logRecordsOperations() async throws -> Bool {
        try await !run(
            "SELECT 1 FROM information_schema.columns WHERE table_schema = $1 AND table_name = '_skyros_log' AND column_name = 'op'",
            [schema.name]
        ).isEmpty
    }

    /// A machine id no machine has (the feed's read is nobody's).
    static let nobody = "00000000-0000-0000-0000-000000000000"

    /// The statement of ``readChanges(after:rejectedAfter:machine:)`` for `schema` (made once per session:
    /// it is the same for every read).
    static func changesSQL(_ schema: ServerSchema, transactions: Bool = false, operations: Bool = false) -> String {
        let quoted = ServerSchema.quote(schema.name)
        var parts = [
            """
            SELECT '0'::text, pg_current_snapshot()::text || '|' || pg_snapshot_xmin(pg_current_snapshot())::text, \
            (SELECT coalesce(max(number), 0)::text FROM \(quoted)._skyros_uploads WHERE machine = ($2::text)::uuid) || '|' || \
            (SELECT (pg_snapshot_xmin(($1::text)::pg_snapshot) < h.value::xid8 AND NOT coalesce(split_part(t.value, ':', 1) = h.value \
            AND pg_visible_in_snapshot(split_part(t.value, ':', 2)::xid8, ($1::text)::pg_snapshot), false))::text \
            FROM \(quoted)._skyros_meta AS h LEFT JOIN \(quoted)._skyros_meta AS t ON t.key = 'horizonTransaction' \
            WHERE h.key = 'horizon'), \
            (SELECT (extract(epoch FROM clock_timestamp() - max(at)) * 1000)::bigint::text FROM changed)
            """,
            "SELECT '1', entity, id::text, \(transactions ? (operations ? "coalesce(first, '-') || xids" : "xids") : "NULL") FROM changed",
        ]
        for table in schema.tables {
            let cells = table.columns.map { $0.type.output("t." + ServerSchema.quote($0.name)) + "::text" }
            parts.append(
                """
                SELECT '2', \(ServerSchema.literal(table.name)), t."_id"::text, ARRAY[\(cells.isEmpty ? "NULL" : cells.joined(separator: ", "))]::text[]::text \
                FROM \(schema.qualified(table.name)) AS t WHERE t."_id" IN (SELECT id FROM changed WHERE entity = \(ServerSchema.literal(table.name)))
                """)
        }
        parts.append(
            """
            SELECT '3', number::text, rejected, objects::text FROM \(quoted)._skyros_uploads \
            WHERE machine = ($2::text)::uuid AND rejected IS NOT NULL AND number > ($3::text)::bigint
            """)
        return """
            WITH changed AS (SELECT entity, id, max(at) AS at\(transactions ? ", array_agg(DISTINCT xid)::text AS xids" : "")\
            \(operations ? ", (array_agg(op ORDER BY at, xid))[1]::text AS first" : "") FROM \(quoted)._skyros_log \
            WHERE xid >= pg_snapshot_xmin(($1::text)::pg_snapshot) AND xid < pg_snapshot_xmax(pg_current_snapshot()) \
            AND NOT pg_visible_in_snapshot(xid, ($1::text)::pg_snapshot) \
            GROUP BY entity, id) \
            \(parts.joined(separator: " UNION ALL "))
            """
    }

    /// The elements of a one-dimensional PostgreSQL array's text (`{a,"b c",NULL,"q\"x"}`):
    /// an unquoted `NULL` is nil; quoted elements keep backslash-escaped characters. Nil for
    /// text that is not such an array. The inverse of ``arrayLiteral(_:)``.
    package static func arrayElements(_ text: String) -> [String?]? {
        let bytes = Array(text.utf8)
        guard bytes.first == UInt8(ascii: "{"), bytes.last == UInt8(ascii: "}") else { return nil }
        var elements: [String?] = []
        var index = 1
        let end = bytes.count - 1
        if index == end { return [] }
        while index <= end {
            var element: [UInt8] = []
            if bytes[index] == UInt8(ascii: "\"") {
                index += 1
                while true {
                    guard index < end else { return nil }
                    let byte = bytes[index]
                    if byte == UInt8(ascii: "\\") {
                        guard index + 1 < end else { return nil }
                        element.append(bytes[index + 1])
                        index += 2
                    } else if byte == UInt8(ascii: "\"") {
                        index += 1
                        break
                    } else {
                        element.append(byte)
                        index += 1
                    }
                }
                elements.append(String(decoding: element, as: UTF8.self))
            } else {
                while index < end, bytes[index] != UInt8(ascii: ",") {
                    element.append(bytes[index])
                    index += 1
                }
                let raw = String(decoding: element, as: UTF8.self)
                elements.append(raw == "NULL" ? nil : raw)
            }
            guard index == end || bytes[index] == UInt8(ascii: ",") else { return nil }
            index += 1
        }
        return elements
    }
}
