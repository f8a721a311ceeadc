import Foundation
import PostgresNIO
import Skyros

/// A consistent prefix of the server's history, as a machine applies it: the objects changed
/// since the machine's previous checkpoint, each as the server has it at one PostgreSQL
/// snapshot, or gone; or, for a snapshot, every row of every table at that PostgreSQL snapshot,
/// handed over beforehand in pages (``SnapshotPage``) that the machine stages and applies at
/// once when it takes the checkpoint.
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
    /// A snapshot of every table, its rows staged page by page before the checkpoint is
    /// handed over (``objects`` is empty): local objects it does not have are deleted.
    package var isSnapshot: Bool
    /// This machine's highest upload number the checkpoint includes (0: none).
    package var uploadedThrough: Int64
    /// The objects changed, with every value as the server has it (one per property, in
    /// declaration order; NULL for to-manys), or nil when the server no longer has them.
    /// Empty for a snapshot (its rows came in pages).
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

/// One page of a snapshot checkpoint: rows of one table, in the order of their `"_id"`
/// (PostgreSQL orders `uuid` bytewise, as SQLite orders the store's 16-byte `_id` blobs), all
/// read in the snapshot's PostgreSQL snapshot. The machine stages the pages as they come and
/// applies them all together with the checkpoint (``Checkpoint/isSnapshot``), so that no more
/// than a page or two of a large group is ever in memory.
package struct SnapshotPage: Sendable {
    /// The snapshot it belongs to (``Checkpoint/snapshot``).
    package var snapshot: String
    /// The snapshot's first page: what was staged before (another snapshot's pages) is dropped.
    package var isFirst: Bool
    /// The entity (the table).
    package var entity: String
    /// The rows: the object's identifier and every value as the server has it (one per
    /// property, in declaration order; NULL for to-manys).
    package var rows: [(id: UUID, values: StoredValues)]
    /// Rows of the page the machine cannot read, skipped (so a snapshot does not have them).
    package var unreadable: [String]
}

extension Checkpoint {
    /// Whether the transaction `xid` is visible in `snapshot` (a `pg_snapshot`'s text,
    /// `xmin:xmax:xip,…`), as `pg_visible_in_snapshot` says: committed before the snapshot
    /// was taken. Nil for text that is not a snapshot.
    package static func isVisible(_ xid: UInt64, in snapshot: String) -> Bool? {
        let parts = snapshot.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 3, let xmin = UInt64(parts[0]), let xmax = UInt64(parts[1]) else { return nil }
        if xid < xmin { return true }
        if xid >= xmax { return false }
        for running in parts[2].split(separator: ",") {
            guard let running = UInt64(running) else { return nil }
            if running == xid { return false }
        }
        return true
    }

    /// Staging a snapshot's page failed: the store refused it (the reason); the snapshot is
    /// read again later, from its first page.
    package struct StagingFailed: Error, CustomStringConvertible {
        /// Why.
        package var reason: String
        package var description: String { reason }
    }
}

extension ServerSession {
    /// Reads the checkpoint after `previous` (a `pg_snapshot` text; nil: a first sync): in one
    /// statement when `previous` is within the log's retention (``readChanges(after:rejectedAfter:machine:)``).
    /// A first sync, or a machine whose previous checkpoint is older than the log's compaction
    /// horizon, gets a snapshot of every table: its start is taken (the checkpoint's
    /// ``Checkpoint/snapshot``), then its rows are read `pageSize` at a time, table by table in
    /// `"_id"` order (keyset pagination), each page in a statement of its own — no server
    /// transaction stays open for the whole read, so vacuum and everyone's compaction go on —
    /// and handed to `stage` as they come (the next page is read while `stage` takes the
    /// previous one). The checkpoint returned carries no object: the engine reads the changes
    /// since its start next, which make the staged rows consistent (``CheckpointStateMachine/staged``).
    ///
    /// The refusals are those of this machine's uploads numbered after `rejectedAfter` (the
    /// last checkpoint applied's ``Checkpoint/uploadedThrough``): selected by number, not by the
    /// snapshots' visibility, a refusal is told whichever kind of checkpoint comes next (a
    /// snapshot's come with the changes read after it, which every snapshot is applied with).
    ///
    /// - Parameter stage: takes a snapshot's page; returns nil when it was staged, or why not.
    /// - Throws: ``Checkpoint/StagingFailed`` when `stage` refused a page; the server's errors.
    package func readCheckpoint(
        after previous: String?, rejectedAfter: Int64, machine: UUID, pageSize: Int = 10_000,
        stage: @escaping @Sendable (SnapshotPage) async -> String? = { _ in "snapshots are not staged here" }
    ) async throws -> Checkpoint {
        if let previous, let scope {
            // A gateway's machine: the changes and the statements that restrict them to its
            // buckets read one snapshot (a row's bucket and values of the same moment).
            let restricted = try await inSnapshot { () -> Checkpoint? in
                guard
                    let changes = try await readChanges(after: previous, rejectedAfter: rejectedAfter, machine: machine)
                else { return nil }
                return try await scope.restrict(changes, in: self)
            }
            if let restricted { return restricted }
        } else if let previous,
            let changes = try await readChanges(after: previous, rejectedAfter: rejectedAfter, machine: machine)
        {
            return changes
        }
        let quoted = ServerSchema.quote(schema.name)
        // The snapshot's start: its pages are read after it, each in a statement of its own
        // (no transaction held open for the whole read), and the changes since it, read next
        // by the engine, bring every staged row to one consistent state (``SyncHost/applyStaged(_:base:)``).
        let head = try await run(
            """
            SELECT pg_current_snapshot()::text, pg_snapshot_xmin(pg_current_snapshot())::text, \
            (SELECT coalesce(max(number), 0)::text FROM \(quoted)._skyros_uploads WHERE machine = $1::uuid)
            """, [machine.uuidString.lowercased()])
        guard let row = head.first, let snapshot = row[0] else {
            throw SkyrosError(.storeFailure, "the server did not give its snapshot")
        }
        // Here only for a first sync or past the horizon (``readChanges`` answered the rest,
        // and the horizon never moves back): a snapshot. Its refusals come with the changes
        // read after it.
        let checkpoint = Checkpoint(
            snapshot: snapshot, number: UInt64(row[1] ?? "0") ?? 0, isSnapshot: true,
            uploadedThrough: Int64(row[2] ?? "0") ?? 0, objects: [:], unreadable: [], rejected: [],
            lagMilliseconds: 0)
        try await readSnapshot(snapshot, pageSize: max(1, pageSize), stage: stage)
        return checkpoint
    }

    /// Reads every table of the schema after `snapshot` was taken (each page in a statement of
    /// its own, at its own PostgreSQL snapshot), `pageSize` rows at
    /// a time in `"_id"` order, and hands each page to `stage` while reading the next one.
    /// Every table gives at least one page (an empty table's page is empty), so the first
    /// page always comes.
    private func readSnapshot(
        _ snapshot: String, pageSize: Int, stage: @escaping @Sendable (SnapshotPage) async -> String?
    ) async throws {
        var staging: Task<String?, Never>?
        /// Waits for the page being staged; throws when it was refused.
        func staged() async throws {
            guard let task = staging else { return }
            staging = nil
            if let reason = await task.value { throw Checkpoint.StagingFailed(reason: reason) }
        }
        do {
            // The columns whose server type is not the one the schema makes (an operator's
            // change) are read as text, as the changes are: a cast could round or fail.
            let read: @Sendable () async throws -> [String: [String: CatalogColumn]] = { [self] in
                try await Self.catalog(schema: schema.name, on: connection, logger: logger)
            }
            let catalog = if let watchdog { try await watchdog.bounded(timeout, read) } else { try await read() }
            var first = true
            for table in schema.tables {
                let asText = Set(
                    table.columns.filter { column in
                        catalog[table.name]?[column.name].map { !column.type.matches(formatType: $0.type) } ?? false
                    }.map(\.name))
                var after: UUID?
                while true {
                    // A gateway's machine: only the rows of its buckets (none of a table they
                    // hold nothing of, whose first page is still given, empty).
                    let condition = scope.map { $0.condition(entity: table.name, firstParameter: after == nil ? 1 : 2) }
                    let rows: [PostgresRow]
                    if case .some(.none) = condition {
                        rows = []
                    } else {
                        rows = try await binaryRows(
                            snapshotPageSQL(
                                table, pageSize: pageSize, after: after != nil, asText: asText,
                                condition: condition??.sql),
                            (after.map { [$0.uuidString.lowercased()] } ?? []) + (condition??.parameters ?? []))
                    }
                    var page = SnapshotPage(
                        snapshot: snapshot, isFirst: first, entity: table.name, rows: [], unreadable: [])
                    page.rows.reserveCapacity(rows.count)
                    var last: UUID?
                    for row in rows {
                        guard let uuid = Self.uuid(row) else { continue }
                        last = uuid
                        switch Self.values(ofBinary: row, in: table) {
                        case .success(let values): page.rows.append((uuid, values))
                        case .failure(let problem):
                            page.unreadable.append(
                                "\(table.name) \(uuid.uuidString.lowercased()): \(problem.reason); the row is skipped")
                        }
                    }
                    first = false
                    try await staged()
                    staging = Task(executorPreference: watchdog?.executor) { await stage(page) }
                    guard rows.count == pageSize, let last else { break }
                    after = last
                }
            }
            try await staged()
        } catch {
            _ = await staging?.value  // never two pages staged at once, even after a failure
            throw error
        }
    }

    /// The statement of a snapshot's page of `table`: `"_id"` and every column, read in
    /// binary form (``ServerType/binaryOutput(_:)``; the columns of `asText` as text, their
    /// server type not the one expected), the first `pageSize` rows in `"_id"` order, or those
    /// after `$1` (keyset pagination).
    ///
    /// The ordering and the bound name the table's column (`t."_id"`): were the select list's
    /// id an expression named `_id` (its text, as it once was), `ORDER BY "_id"` would sort by
    /// that output column, which no index holds: every page a scan and a sort of the whole
    /// table (100 pages of a million rows took 24 s of the server's time instead of 0.4).
    package func snapshotPageSQL(
        _ table: ServerSchema.Table, pageSize: Int, after: Bool, asText: Set<String> = [], condition: String? = nil
    ) -> String {
        let columns =
            ["t.\"_id\""]
            + table.columns.map { column in
                let quoted = "t." + ServerSchema.quote(column.name)
                return asText.contains(column.name) ? column.type.output(quoted) : column.type.binaryOutput(quoted)
            }
        let conditions = (after ? ["t.\"_id\" > $1::uuid"] : []) + (condition.map { ["(\($0))"] } ?? [])
        return "SELECT \(columns.joined(separator: ", ")) FROM \(schema.qualified(table.name)) AS t"
            + (conditions.isEmpty ? "" : " WHERE " + conditions.joined(separator: " AND "))
            + " ORDER BY t.\"_id\" LIMIT \(pageSize)"
    }

    /// The rows of `table` among `ids` that `condition` selects (its parameters from `$2`),
    /// every value as the server has it now: for a gateway, the objects whose buckets changed
    /// with an object they reach. Rows it cannot read are skipped, named in `unreadable`.
    package func rows(
        of table: ServerSchema.Table, ids: [UUID], condition: (sql: String, parameters: [String])?
    ) async throws -> (rows: [(id: UUID, values: StoredValues)], unreadable: [String]) {
        guard !ids.isEmpty else { return ([], []) }
        let columns = ["t.\"_id\""] + table.columns.map { $0.type.output("t." + ServerSchema.quote($0.name)) }
        let sql =
            "SELECT \(columns.joined(separator: ", ")) FROM \(schema.qualified(table.name)) AS t WHERE t.\"_id\" = ANY($1::text::uuid[])"
            + (condition.map { " AND (\($0.sql))" } ?? "")
        let list = "{" + ids.map { $0.uuidString.lowercased() }.joined(separator: ",") + "}"
        var found: [(id: UUID, values: StoredValues)] = []
        var unreadable: [String] = []
        for row in try await run(sql, [list] + (condition?.parameters ?? [])) {
            guard let text = row.first ?? nil, let uuid = UUID(uuidString: text) else { continue }
            switch Self.values(of: row, in: table) {
            case .success(let values): found.append((uuid, values))
            case .failure(let problem):
                unreadable.append("\(table.name) \(text): \(problem.reason); the row is skipped")
            }
        }
        return (found, unreadable)
    }

    /// Why a row cannot be read.
    struct Unreadable: Error {
        var reason: String
    }

    /// A row's values (one per property of `table`, NULL for to-manys), from its cells (the
    /// `"_id"` first, then one per column); why not, when a cell does not fit its attribute.
    static func values(of row: [String?], in table: ServerSchema.Table) -> Result<StoredValues, Unreadable> {
        var values = StoredValues(repeating: .null, count: table.propertyCount)
        for (position, column) in table.columns.enumerated() {
            let cell = row[position + 1]
            guard let value = column.type.storedValue(cell, typeName: column.typeName) else {
                return .failure(
                    Unreadable(
                        reason:
                            "\(column.name) holds \(cell.map { "'\($0.prefix(32))'" } ?? "NULL"), which a \(column.typeName) cannot hold"
                    ))
            }
            if value.isNull && !column.isOptional {
                return .failure(Unreadable(reason: "\(column.name) is NULL, and the attribute is not optional"))
            }
            values[column.index] = value
        }
        return .success(values)
    }

    /// The object's identifier in a binary row's first cell (a `uuid`).
    static func uuid(_ row: PostgresRow) -> UUID? {
        guard let cell = row.first, cell.dataType == .uuid, cell.format == .binary, var bytes = cell.bytes,
            bytes.readableBytes == 16
        else { return nil }
        return bytes.readUUIDBytes()
    }

    /// A binary row's values (``snapshotPageSQL(_:pageSize:after:)``: the `"_id"` first,
    /// then one cell per column), as ``values(of:in:)`` makes them from text.
    static func values(ofBinary row: PostgresRow, in table: ServerSchema.Table) -> Result<StoredValues, Unreadable> {
        var values = StoredValues(repeating: .null, count: table.propertyCount)
        var cells = row.makeIterator()
        _ = cells.next()
        for column in table.columns {
            guard let cell = cells.next() else {
                return .failure(Unreadable(reason: "the server's answer lacks \(column.name)"))
            }
            guard let value = column.type.storedValue(cell, typeName: column.typeName) else {
                return .failure(
                    Unreadable(
                        reason:
                            "\(column.name) holds \(ServerType.describe(cell)), which a \(column.typeName) cannot hold"
                    ))
            }
            if value.isNull && !column.isOptional {
                return .failure(Unreadable(reason: "\(column.name) is NULL, and the attribute is not optional"))
            }
            values[column.index] = value
        }
        return .success(values)
    }

    /// The objects of a rejection's JSON list.
    static func objects(_ json: String?) -> [ObjectID] {
        guard let json, let list = try? JSONSerialization.jsonObject(with: Data(json.utf8)) as? [[String: String]]
        else { return [] }
        return list.compactMap { entry in
            guard let entity = entry["entity"], let text = entry["id"], let uuid = UUID(uuidString: text) else {
                return nil
            }
            return ObjectID(entityName: entity, uuid: uuid)
        }
    }

    /// Drops the log rows older than `retention` seconds (those before the first younger one,
    /// and never one of a transaction still running) and moves the horizon just past the last
    /// of them: a machine whose last checkpoint may lack one of them re-syncs from a snapshot.
    /// When none is dropped the horizon stays: a machine that checkpointed before a compaction
    /// that removed nothing has missed nothing (the horizon used to move to the oldest row
    /// kept, or to the current snapshot's xmin when the log was empty, and every such machine
    /// read the whole server again).
    package func compact(retention: TimeInterval) async throws {
        let quoted = ServerSchema.quote(schema.name)
        try await inTransaction {
            let rows = try await run(
                """
                SELECT least(pg_snapshot_xmin(pg_current_snapshot()), \
                (SELECT min(xid) FROM \(quoted)._skyros_log WHERE at >= clock_timestamp() - make_interval(secs => $1::double precision)))::text
                """, [String(retention)])
            if let bound = rows.first?[0] ?? nil {
                // A checkpoint is past the horizon when its snapshot's xmin is below it
                // (``readChanges(after:rejectedAfter:machine:)``): just past the last row dropped, a machine
                // whose snapshot had that transaction already is not sent back to a snapshot.
                // Nothing dropped: no update. Never lowered (a truncation or a repair may have
                // raised it further). Moved, it names this transaction as the one that moved it
                // (``ServerSchema/horizonTransactionSQL(_:)``): a snapshot taken after it
                // committed has every row it dropped (each of a transaction finished before it).
                try await run(
                    """
                    WITH gone AS (DELETE FROM \(quoted)._skyros_log WHERE xid < $1::xid8 RETURNING xid), \
                    past AS (SELECT ((max(xid)::text::numeric + 1)::text)::xid8 AS xid FROM gone), \
                    moved AS (UPDATE \(quoted)._skyros_meta AS meta SET value = past.xid::text FROM past \
                    WHERE meta.key = 'horizon' AND past.xid IS NOT NULL AND meta.value::xid8 < past.xid RETURNING meta.value) \
                    UPDATE \(quoted)._skyros_meta AS meta SET value = moved.value || ':' || pg_current_xact_id()::text \
                    FROM moved WHERE meta.key = 'horizonTransaction'
                    """, [bound])
            }
        }
    }
}
