import Foundation
import Skyros
import SkyrosSync
import SkyrosWire

extension DaemonTurn {
    /// The turn's answer to a request of the sync engine: the actions to perform (a
    /// checkpoint's events), whether it committed a change set, and the reply to give the
    /// engine once they are performed.
    struct SyncAnswer {
        var actions: [Action] = []
        var committed = false
        var reply: () -> Void
    }

    /// Answers one request of the sync engine (``SyncChannel/Request``), on the daemon's thread.
    mutating func answer(_ request: SyncChannel.Request) -> SyncAnswer {
        switch request {
        case .apply(let checkpoint, let reply):
            let (result, actions) = applyCheckpoint(checkpoint)
            return SyncAnswer(actions: actions, committed: result == .applied && !actions.isEmpty) { reply(result) }
        case .applyStaged(let checkpoint, let base, let reply):
            let (result, actions) = applyStaged(checkpoint, base: base)
            return SyncAnswer(actions: actions, committed: result == .applied && !actions.isEmpty) { reply(result) }
        case .stage(let page, let reply):
            let result = stageSnapshotPage(page)
            return SyncAnswer { reply(result) }
        case .reidentify(let machine, let dropping, let reason, let reply):
            do {
                try store?.transaction { transaction in
                    try SyncTables.reidentify(as: machine, dropping: dropping, in: transaction)
                }
                settings.log(reason)
                return SyncAnswer { reply(true) }
            } catch {
                settings.log("sync: cannot take a new machine id: \(SkyrosError.wrap(error).message)")
                return SyncAnswer { reply(false) }
            }
        case .uploaded(let number, let reply):
            // Not waited on by the disk: a deletion a power loss takes only leaves change sets
            // the server has recorded, which the uploader skips (it starts after the server's
            // highest number) and the next deletion drops.
            try? store?.transaction(durability: .normal) { transaction in
                try SyncTables.drop(through: number, in: transaction)
            }
            return SyncAnswer { reply(()) }
        }
    }

    /// Whether `checkpoint` includes every change set still queued (the write-checkpoint rule):
    /// its upload number reaches the last one queued, or else the queue holds none past it.
    /// (After a store took a new machine id, its last number can be higher than anything the
    /// new id uploaded, with nothing left to upload: `SyncFaultCampaign`'s restores found a
    /// restored store that never applied a checkpoint again.)
    private func includesQueue(_ checkpoint: Checkpoint, _ store: SQLiteStore) -> Bool {
        if checkpoint.isWriteCheckpoint(for: groupCommit.lastQueued) { return true }
        let queued = try? store.transaction { transaction in
            try SyncTables.queued(after: checkpoint.uploadedThrough, in: transaction)
        }
        return queued == 0
    }

    /// The client id that a checkpoint's change sets carry as author (`sync` is its name).
    static let syncAuthorID = UUID(uuidString: "5C5C5C5C-0000-4000-8000-53594E430000")!

    /// Applies a checkpoint from the sync server as one change set (docs/SYNC.md): the objects it
    /// carries take the server's values (only the properties that differ are written and
    /// published), the ones the server no longer has are deleted; a snapshot applies the rows
    /// staged for it (``stageSnapshotPage(_:)``, ``applySnapshot(_:to:)``). The checkpoint and the change sets the
    /// server refused are recorded in the same transaction; the event is published like any
    /// other, as kind `syncRejected` when the server refused some of this machine's change
    /// sets, so that their apps are told.
    ///
    /// Applied only when it includes every change set queued so far (a *write checkpoint*):
    /// local changes not yet on the server stay on top, never hidden and brought back.
    mutating func applyCheckpoint(_ checkpoint: Checkpoint) -> (SyncApplyResult, [Action]) {
        guard let store else { return (.failed("the group has no store yet"), []) }
        guard includesQueue(checkpoint, store) else { return (.pendingUploads, []) }
        if checkpoint.isSnapshot { return applySnapshot(checkpoint, base: checkpoint.snapshot, to: store) }
        let changes: ChangeSet
        do {
            changes = DebugDefects.applying(try Self.changeSet(of: checkpoint, against: store))
        } catch {
            return (.failed(SkyrosError.wrap(error).message), [])
        }
        let rejected = checkpoint.rejected
        let record: (SQLiteStore.Transaction) throws -> Void = { transaction in try Self.record(checkpoint, transaction)
        }
        if changes.isEmpty && rejected.isEmpty {
            // Nothing changes here (often this machine's own upload coming back): the checkpoint
            // is recorded without a change set, and without waiting for the disk (a power loss
            // that takes it makes the engine read the same nothing again).
            do {
                try store.transaction(durability: .normal, record)
                return (.applied, [])
            } catch {
                return (.failed(SkyrosError.wrap(error).message), [])
            }
        }
        // Deletions first, in a change set of their own: an object the server replaced (a
        // unique value another machine took) goes before its replacement comes in.
        var saves: [GroupCommit.Save] = []
        func save(_ changes: ChangeSet) -> GroupCommit.Save {
            GroupCommit.Save(
                identity: Data(), requestID: 0, clientID: Self.syncAuthorID,
                saveNumber: sequence + UInt64(saves.count) + 1,
                changes: changes, author: "sync", fromSync: true)
        }
        if !changes.deleted.isEmpty { saves.append(save(ChangeSet(deleted: changes.deleted))) }
        var last = save(ChangeSet(inserted: changes.inserted, updated: changes.updated))
        if saves.isEmpty || !last.changes.isEmpty || !rejected.isEmpty {
            saves.append(last)
        }
        last = saves.removeLast()
        last.alsoRecord = record
        if !rejected.isEmpty, DebugDefects.tellsRefusals {
            last.extensionKind = (
                ChangeEvent.syncRejectedKind,
                ChangeEvent.syncRejectedExtension(Self.told(rejected))
            )
        }
        saves.append(last)
        return commitCheckpoint(saves, to: store)
    }

    /// The change set that brings the store to the checkpoint's values.
    private static func changeSet(of checkpoint: Checkpoint, against store: SQLiteStore) throws -> ChangeSet {
        let schema = store.schema
        let ids = checkpoint.objects.keys.filter { schema.entity(named: $0.entityName) != nil }
        var local: [ObjectID: Snapshot] = [:]
        for chunk in stride(from: 0, to: ids.count, by: 500) {
            for snapshot in try store.snapshots(for: Array(ids[chunk..<min(chunk + 500, ids.count)])) {
                local[snapshot.id] = snapshot
            }
        }
        var changes = ChangeSet()
        for id in SQLiteStore.inKeyOrder(ids) {
            guard let entity = schema.entity(named: id.entityName), let server = checkpoint.objects[id] else {
                continue
            }
            guard let values = server else {
                if local[id] != nil { changes.deleted.append(id) }
                continue
            }
            guard let current = local[id] else {
                changes.inserted.append(Snapshot(id: id, values: values))
                continue
            }
            var differing: [Int: StoredValue] = [:]
            for (index, property) in entity.properties.enumerated()
            where property.kind != .toMany && index < values.count {
                if values[index] != current.values[index] { differing[index] = values[index] }
            }
            if !differing.isEmpty { changes.updated.append(ChangeSet.Update(id: id, changes: differing)) }
        }
        return changes
    }

    // MARK: - Snapshots

    /// Stages a page of a snapshot checkpoint in temporary tables of the store's writer
    /// connection (`temp.skyros_sync_stage_<Entity>`, one row per object: `"_id"` and a column
    /// per stored property), out of the apps' sight: nothing is published, nothing is in the
    /// journal, and a daemon that stops loses the stage with its connection. The first page
    /// drops what was staged before and records which snapshot (and store schema version) the
    /// stage holds; a later page of another snapshot, or after the store was reopened or
    /// migrated, is refused, and the engine reads the snapshot again from its first page.
    ///
    /// - Returns: nil when staged, else why not.
    mutating func stageSnapshotPage(_ page: SnapshotPage) -> String? {
        guard let store else { return "the group has no store yet" }
        let schema = store.schema
        guard let entity = schema.entity(named: page.entity) else { return "the store has no entity \(page.entity)" }
        do {
            try store.transaction { transaction in
                if page.isFirst {
                    try Self.dropStage(schema, transaction)
                    try transaction.execute(
                        "CREATE TEMP TABLE skyros_sync_stage (snapshot TEXT NOT NULL, version INTEGER NOT NULL)")
                    try transaction.execute(
                        "INSERT INTO temp.skyros_sync_stage (snapshot, version) VALUES (?, ?)",
                        [.text(page.snapshot), .integer(Int64(schema.version))])
                    for entity in schema.entities {
                        let columns =
                            ["\"_id\" BLOB PRIMARY KEY NOT NULL"]
                            + Self.storedProperties(entity).map { Self.quote($0.name) }
                        try transaction.execute(
                            "CREATE TEMP TABLE \(Self.quote(Self.stagePrefix + entity.name)) (\(columns.joined(separator: ", "))) WITHOUT ROWID"
                        )
                    }
                } else {
                    try Self.checkStage(holds: page.snapshot, version: schema.version, transaction)
                }
                try Self.stageRows(page.rows, of: entity, transaction)
            }
            return nil
        } catch {
            return SkyrosError.wrap(error).message
        }
    }

    /// Writes rows into an entity's stage table (replacing the rows of the same objects).
    private static func stageRows(
        _ rows: [(id: UUID, values: StoredValues)], of entity: EntityDescription, _ transaction: SQLiteStore.Transaction
    ) throws {
        let properties = storedProperties(entity)
        let sql = """
            INSERT OR REPLACE INTO \(stageTable(entity.name)) (\((["\"_id\""] + properties.map { quote($0.name) }).joined(separator: ", "))) \
            VALUES (\(Array(repeating: "?", count: properties.count + 1).joined(separator: ", ")))
            """
        var arguments: [StoredValue] = []
        arguments.reserveCapacity(properties.count + 1)
        for row in rows {
            arguments.removeAll(keepingCapacity: true)
            arguments.append(row.id.storedValue)
            for property in properties { arguments.append(row.values[property.index]) }
            try transaction.execute(sql, arguments)
        }
    }

    /// Patches the snapshot staged from `base` with `checkpoint`, the changes since `base`
    /// (each changed object's row as the server has it now, or its deletion), and applies the
    /// stage as the store's state at `checkpoint` (``applySnapshot(_:base:to:)``). The snapshot's
    /// pages were read each at its own PostgreSQL snapshot, after `base` was taken: a row that
    /// changed meanwhile is in the log since `base`, so the patched stage is the server at
    /// `checkpoint`, consistent. Under the write-checkpoint rule: with change sets queued that
    /// `checkpoint` lacks, nothing is patched (``SyncApplyResult/pendingUploads``), and the engine
    /// reads the changes since `base` again once it uploaded them — never the whole snapshot.
    mutating func applyStaged(_ checkpoint: Checkpoint, base: String) -> (SyncApplyResult, [Action]) {
        guard let store else { return (.failed("the group has no store yet"), []) }
        guard includesQueue(checkpoint, store) else { return (.pendingUploads, []) }
        let schema = store.schema
        do {
            try store.transaction { transaction in
                try Self.checkStage(holds: base, version: schema.version, transaction)
                var rows: [String: [(id: UUID, values: StoredValues)]] = [:]
                for (id, values) in checkpoint.objects {
                    guard let entity = schema.entity(named: id.entityName) else { continue }
                    if let values {
                        rows[entity.name, default: []].append((id.uuid, values))
                    } else {
                        try transaction.execute(
                            "DELETE FROM \(Self.stageTable(entity.name)) WHERE \"_id\" = ?", [id.uuid.storedValue])
                    }
                }
                for (name, list) in rows {
                    guard let entity = schema.entity(named: name) else { continue }
                    try Self.stageRows(list, of: entity, transaction)
                }
            }
        } catch {
            return (.failed(SkyrosError.wrap(error).message), [])
        }
        return applySnapshot(checkpoint, base: base, to: store)
    }

    /// Applies a snapshot checkpoint whose pages are staged, in one transaction of the group
    /// commit: the local objects the snapshot lacks are deleted, the ones whose stored values
    /// differ updated (their version raised), the missing ones inserted, entity by entity, by
    /// SQL over the stage — deletions of every entity first, so an object the server replaced
    /// is gone before its replacement comes in; foreign keys are checked at the commit. Its
    /// change set (authored `sync`) is published naming no object, as a large batch operation
    /// is: every app refreshes what it holds. Nothing differs: only the checkpoint is
    /// recorded. The checkpoint and the refusals are recorded in the same transaction as the
    /// change set; the refusals are then told in a change set of their own.
    private mutating func applySnapshot(_ checkpoint: Checkpoint, base: String, to store: SQLiteStore) -> (
        SyncApplyResult, [Action]
    ) {
        let schema = store.schema
        let differs: Bool
        do {
            differs = try store.transaction { transaction in
                try Self.checkStage(holds: base, version: schema.version, transaction)
                return try Self.stageDiffers(schema, transaction)
            }
        } catch {
            return (.failed(SkyrosError.wrap(error).message), [])
        }
        let rejected = checkpoint.rejected
        let record: (SQLiteStore.Transaction) throws -> Void = { transaction in
            try Self.dropStage(schema, transaction)
            try Self.record(checkpoint, transaction)
        }
        var saves: [GroupCommit.Save] = []
        func save() -> GroupCommit.Save {
            GroupCommit.Save(
                identity: Data(), requestID: 0, clientID: Self.syncAuthorID,
                saveNumber: sequence + UInt64(saves.count) + 1,
                changes: ChangeSet(), author: "sync", fromSync: true)
        }
        if differs {
            var snapshot = save()
            snapshot.appliesBySQL = { transaction in try Self.applyStage(schema, transaction) }
            saves.append(snapshot)
        }
        if !rejected.isEmpty, DebugDefects.tellsRefusals {
            var told = save()
            told.extensionKind = (
                ChangeEvent.syncRejectedKind,
                ChangeEvent.syncRejectedExtension(Self.told(rejected))
            )
            saves.append(told)
        }
        guard !saves.isEmpty else {
            do {
                try store.transaction(record)
                return (.applied, [])
            } catch {
                return (.failed(SkyrosError.wrap(error).message), [])
            }
        }
        // Recorded with the first change set: the checkpoint is never recorded without the snapshot.
        saves[0].alsoRecord = record
        return commitCheckpoint(saves, to: store)
    }

    /// Refusals as the event tells them.
    private static func told(_ rejected: [Checkpoint.Rejection]) -> [SyncRejection] {
        rejected.map { SyncRejection(number: $0.number, date: Date(), reason: $0.reason, objectIDs: $0.objects) }
    }

    /// Records a checkpoint (the cursor) and the change sets the server refused.
    private static func record(_ checkpoint: Checkpoint, _ transaction: SQLiteStore.Transaction) throws {
        try SyncTables.recordCheckpoint(
            checkpoint.snapshot, rejectedThrough: checkpoint.uploadedThrough, in: transaction)
        try SyncTables.recordRejections(checkpoint.rejected, in: transaction)
    }

    /// Commits a checkpoint's change sets and publishes them.
    private mutating func commitCheckpoint(_ saves: [GroupCommit.Save], to store: SQLiteStore) -> (
        SyncApplyResult, [Action]
    ) {
        let outcome = groupCommit.commit(saves, in: store)
        for line in outcome.log { settings.log(line) }
        let failure = outcome.results.lazy.compactMap {
            if case .failure(let error) = $0 { error.message } else { nil }
        }.first
        guard outcome.committed, failure == nil else {
            return (.failed(failure ?? "the checkpoint's change set was not committed"), [])
        }
        logPruning(outcome.pruned)
        return (.applied, publishing(publisher.committed(outcome.events, requestsWaiting: false, now: .now)))
    }

    /// The prefix of the stage's tables.
    private static let stagePrefix = "skyros_sync_stage_"

    /// The stage table of an entity, qualified.
    private static func stageTable(_ entity: String) -> String { "temp." + quote(stagePrefix + entity) }

    private static func quote(_ name: String) -> String { SQLIdentifier.quote(name) }

    /// The properties with a column (attributes and to-ones), in declaration order.
    private static func storedProperties(_ entity: EntityDescription) -> [PropertyDescription] {
        entity.properties.filter { $0.kind != .toMany }
    }

    /// Drops the stage, if any.
    private static func dropStage(_ schema: Schema, _ transaction: SQLiteStore.Transaction) throws {
        try transaction.execute("DROP TABLE IF EXISTS temp.skyros_sync_stage")
        for entity in schema.entities { try transaction.execute("DROP TABLE IF EXISTS \(stageTable(entity.name))") }
    }

    /// Throws unless the stage holds pages of `snapshot`, staged with the store's schema `version`.
    private static func checkStage(holds snapshot: String, version: Int, _ transaction: SQLiteStore.Transaction) throws
    {
        let exists = try transaction.rows("SELECT 1 FROM temp.sqlite_master WHERE name = 'skyros_sync_stage'")
        let row =
            exists.isEmpty ? nil : try transaction.rows("SELECT snapshot, version FROM temp.skyros_sync_stage").first
        guard let row, row[0] == .text(snapshot), row[1] == .integer(Int64(version)) else {
            throw SkyrosError(
                .storeFailure,
                "the snapshot's first pages are not staged (the daemon restarted, the store was migrated, or another snapshot began): it is read again"
            )
        }
    }

    /// Whether the stage differs from the store: a local object it lacks, or a staged row
    /// that no local object equals.
    private static func stageDiffers(_ schema: Schema, _ transaction: SQLiteStore.Transaction) throws -> Bool {
        for entity in schema.entities {
            let table = quote(entity.name)
            let stage = stageTable(entity.name)
            let same = (["\"_id\""] + storedProperties(entity).map { quote($0.name) }).map { "l.\($0) IS s.\($0)" }
            let rows = try transaction.rows(
                """
                SELECT EXISTS (SELECT 1 FROM \(table) AS l WHERE NOT EXISTS (SELECT 1 FROM \(stage) AS s WHERE s."_id" = l."_id")) \
                OR EXISTS (SELECT 1 FROM \(stage) AS s WHERE NOT EXISTS (SELECT 1 FROM \(table) AS l WHERE \(same.joined(separator: " AND "))))
                """)
            if rows.first?.first == .integer(1) { return true }
        }
        return false
    }

    /// Moves out of the way the unique values of an entity's objects that the stage changes
    /// (``SQLiteStore/Transaction/vacateUniqueValues(of:of:in:)``): the server may have
    /// permuted them among the objects, or given one to an object the stage inserts, and
    /// SQLite checks a unique index at every row an UPDATE writes. The stage's values are
    /// written over the placeholders in the same transaction; a duplicate they leave still
    /// fails.
    private static func vacateChangedUniqueValues(_ entity: EntityDescription, _ transaction: SQLiteStore.Transaction)
        throws
    {
        let table = quote(entity.name)
        for property in storedProperties(entity) where property.isUnique {
            let column = quote(property.name)
            let ids = try transaction.rows(
                """
                SELECT l."_id" FROM \(table) AS l JOIN \(stageTable(entity.name)) AS s ON s."_id" = l."_id" \
                WHERE l.\(column) IS NOT NULL AND l.\(column) IS NOT s.\(column)
                """
            ).compactMap { UUID(storedValue: $0[0]) }
            try transaction.vacateUniqueValues(of: property.name, of: entity.name, in: ids)
        }
    }

    /// Brings the store to the stage and returns how many objects changed
    /// (deleted, updated, inserted; not counting the cascades of deletions).
    private static func applyStage(_ schema: Schema, _ transaction: SQLiteStore.Transaction) throws -> Int {
        var affected = 0
        func changed() throws -> Int {
            if case .integer(let count)? = try transaction.rows("SELECT changes()").first?.first { return Int(count) }
            return 0
        }
        for entity in schema.entities {
            let table = quote(entity.name)
            try transaction.execute(
                "DELETE FROM \(table) WHERE NOT EXISTS (SELECT 1 FROM \(stageTable(entity.name)) AS s WHERE s.\"_id\" = \(table).\"_id\")"
            )
            affected += try changed()
        }
        for entity in schema.entities { try vacateChangedUniqueValues(entity, transaction) }
        for entity in schema.entities {
            let table = quote(entity.name)
            let columns = storedProperties(entity).map { quote($0.name) }
            guard !columns.isEmpty else { continue }
            try transaction.execute(
                """
                UPDATE \(table) SET \(columns.map { "\($0) = s.\($0)" }.joined(separator: ", ")), "_version" = \(table)."_version" + 1 \
                FROM \(stageTable(entity.name)) AS s WHERE s."_id" = \(table)."_id" \
                AND (\(columns.map { "\(table).\($0) IS NOT s.\($0)" }.joined(separator: " OR ")))
                """)
            affected += try changed()
        }
        for entity in schema.entities {
            let table = quote(entity.name)
            let columns = (["\"_id\""] + storedProperties(entity).map { quote($0.name) }).joined(separator: ", ")
            try transaction.execute(
                """
                INSERT INTO \(table) (\(columns)) SELECT \(columns) FROM \(stageTable(entity.name)) AS s \
                WHERE NOT EXISTS (SELECT 1 FROM \(table) AS l WHERE l."_id" = s."_id")
                """)
            affected += try changed()
        }
        if transaction.hasUnresolvedReferences {
            throw SkyrosError(
                .deleteDenied,
                "relationship integrity: the snapshot leaves a link to an object it does not have (a row skipped as unreadable?)"
            )
        }
        return affected
    }
}
