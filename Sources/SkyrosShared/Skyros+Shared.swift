import Foundation
import Skyros
import SkyrosWire

extension Skyros {
    /// A stack whose store is the daemon (`skyrosd`) of an application group: every
    /// process of the group shares it, and each sees the others' changes in its main context.
    ///
    /// - Parameters:
    ///   - schema: the entities; the group's store must have the same fingerprint.
    ///   - applicationGroup: the group identifier; its container is
    ///     ``Skyros/containerURL(forApplicationGroup:)``.
    ///   - timeout: how long a call waits for the daemon before failing with
    ///     ``SkyrosError/Code/daemonUnavailable``.
    ///   - savesOnStop: whether SIGTERM, SIGINT and a normal exit save in-flight writes
    ///     through process-wide handlers (default true); false when the application stops
    ///     the stack itself (`flush(timeout:)`, or a `SkyrosService` under
    ///     swift-service-lifecycle).
    public convenience init(
        sharedStack schema: Schema, applicationGroup: String, allowsConcurrentWritings: Bool = false,
        timeout: TimeInterval = 5, savesOnStop: Bool = true
    ) throws {
        let url = try Skyros.containerURL(forApplicationGroup: applicationGroup)
        try self.init(
            sharedStack: schema, container: url, allowsConcurrentWritings: allowsConcurrentWritings, timeout: timeout,
            savesOnStop: savesOnStop)
    }

    /// A shared stack on an explicit container directory.
    public convenience init(
        sharedStack schema: Schema, container: URL, allowsConcurrentWritings: Bool = false, timeout: TimeInterval = 5,
        savesOnStop: Bool = true
    ) throws {
        let remote = try RemoteStore(schema: schema, container: GroupContainer(url: container), timeout: timeout)
        self.init(sharedStack: remote, allowsConcurrentWritings: allowsConcurrentWritings, savesOnStop: savesOnStop)
    }

    /// A shared stack on a connection made and configured by the caller (timeouts, event
    /// queue): change events of other processes are merged into the main context.
    public convenience init(sharedStack remote: RemoteStore, allowsConcurrentWritings: Bool = false, savesOnStop: Bool = true) {
        self.init(store: remote, allowsConcurrentWritings: allowsConcurrentWritings, savesOnStop: savesOnStop)
        let schema = remote.schema
        remote.onChange = { [weak self] (events: [ChangeEvent]) in
            self?.merge(events.map { Self.storeChange($0, schema) })
        }
        remote.onRestart = { [weak self] in
            // The daemon restarted and may have lost events: what the main context holds is refreshed.
            self?.merge(StoreChange(sequence: 0, author: "", isRefresh: true))
        }
    }

    /// A change event as the main context merges it: updated properties by name, with their
    /// values. A schema change, or a batch operation too large to name its objects, refreshes
    /// everything.
    static func storeChange(_ event: ChangeEvent, _ schema: Schema) -> StoreChange {
        let unlistedBatch = event.kind == .batch && event.inserted.isEmpty && event.updated.isEmpty && event.deleted.isEmpty
        var change = StoreChange(
            sequence: event.sequence, author: event.author, isReset: event.kind == .reset,
            isRefresh: event.kind == .schemaChanged || unlistedBatch, inserted: event.inserted.map(\.id), deleted: event.deleted,
            insertedSnapshots: event.inserted)
        for update in event.updated {
            let properties = schema.entity(named: update.id.entityName)?.properties
            change.updated[update.id] = update.values.keys.sorted().compactMap { index in
                properties.flatMap { index < $0.count ? $0[index].name : nil }
            }
            change.updatedValues[update.id] = StoreChange.UpdatedValues(version: update.version, values: update.values)
        }
        return change
    }
}
