import Foundation
import Skyros
import SkyrosSync
import SkyrosWire

extension DaemonTurn {
    /// The client id that a checkpoint's change sets carry as author (`sync` is its name).
    static let syncAuthorID = UUID(uuidString: "5C5C5C5C-0000-4000-8000-53594E430000")!

    /// Applies a checkpoint from the sync server as one change set (DESIGN §9): the objects it
    /// carries take the server's values (only the properties that differ are written and
    /// published), the ones the server no longer has are deleted, and for a snapshot the
    /// objects it does not have are deleted too. The checkpoint and the change sets the
    /// server refused are recorded in the same transaction; the event is published like any
    /// other, as kind `syncRejected` when the server refused some of this machine's change
    /// sets, so that their apps are told.
    ///
    /// Applied only when it includes every change set queued so far (a *write checkpoint*):
    /// local changes not yet on the server stay on top, never hidden and brought back.
    mutating func applyCheckpoint(_ checkpoint: Checkpoint) -> (SyncApplyResult, [Action]) {
        guard let store else { return (.failed("the group has no store yet"), []) }
        guard groupCommit.lastQueued <= checkpoint.uploadedThrough else { return (.pendingUploads, []) }
        let changes: ChangeSet
        do {
            changes = try Self.changeSet(of: checkpoint, against: store)
        } catch {
            return (.failed(SkyrosError.wrap(error).message), [])
        }
        let rejected = checkpoint.rejected
        let record: (SQLiteStore.Transaction) throws -> Void = { transaction in
            try transaction.execute(
                "INSERT OR REPLACE INTO skyros_metadata (key, value) VALUES ('syncCheckpoint', ?)", [.text(checkpoint.snapshot)])
            for rejection in rejected {
                try transaction.execute(
                    "INSERT OR REPLACE INTO skyros_sync_rejected (number, timestamp, reason, objects, changes) VALUES (?, ?, ?, ?, NULL)",
                    [.integer(rejection.number), .real(Date().timeIntervalSince1970), .text(rejection.reason),
                     .text(rejection.objects.map(\.description).joined(separator: " "))])
            }
        }
        if changes.isEmpty && rejected.isEmpty {
            // Nothing changes here: the checkpoint is recorded without a change set.
            do {
                try store.transaction(record)
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
                identity: Data(), requestID: 0, clientID: Self.syncAuthorID, saveNumber: sequence + UInt64(saves.count) + 1,
                changes: changes, author: "sync", fromSync: true)
        }
        if !changes.deleted.isEmpty { saves.append(save(ChangeSet(deleted: changes.deleted))) }
        var last = save(ChangeSet(inserted: changes.inserted, updated: changes.updated))
        if saves.isEmpty || !last.changes.isEmpty || !rejected.isEmpty {
            saves.append(last)
        }
        last = saves.removeLast()
        last.alsoRecord = record
        if !rejected.isEmpty {
            last.extensionKind = (
                ChangeEvent.syncRejectedKind, ChangeEvent.syncRejectedExtension(rejected.map { ($0.reason, $0.objects) })
            )
        }
        saves.append(last)
        let outcome = groupCommit.commit(saves, in: store)
        for line in outcome.log { settings.log(line) }
        let failure = outcome.results.lazy.compactMap { if case .failure(let error) = $0 { error.message } else { nil } }.first
        guard outcome.committed, failure == nil else {
            return (.failed(failure ?? "the checkpoint's change set was not committed"), [])
        }
        logPruning(outcome.pruned)
        return (.applied, publishing(publisher.committed(outcome.events, requestsWaiting: false, now: .now)))
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
        for id in ids.sorted(by: { ($0.entityName, $0.uuid.uuidString) < ($1.entityName, $1.uuid.uuidString) }) {
            guard let entity = schema.entity(named: id.entityName), let server = checkpoint.objects[id] else { continue }
            guard let values = server else {
                if local[id] != nil { changes.deleted.append(id) }
                continue
            }
            guard let current = local[id] else {
                changes.inserted.append(Snapshot(id: id, values: values))
                continue
            }
            var differing: [Int: StoredValue] = [:]
            for (index, property) in entity.properties.enumerated() where property.kind != .toMany && index < values.count {
                if values[index] != current.values[index] { differing[index] = values[index] }
            }
            if !differing.isEmpty { changes.updated.append(ChangeSet.Update(id: id, changes: differing)) }
        }
        if checkpoint.isSnapshot {
            for entity in schema.entities {
                let table = "\"" + entity.name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
                for row in try store.rows("SELECT \"_id\" FROM \(table)") {
                    guard case .blob(let data)? = row.first, data.count == 16 else { continue }
                    let id = ObjectID(entityName: entity.name, uuid: UUID(uuid: data.withUnsafeBytes { $0.loadUnaligned(as: uuid_t.self) }))
                    if checkpoint.objects[id] == nil { changes.deleted.append(id) }
                }
            }
        }
        return changes
    }
}
