import Foundation
import Skyros
import SkyrosWire

extension StoreChange {
    /// A change event as the contexts take it: updated properties by name (the wire numbers
    /// them), with their values. A schema change, or a batch operation too large to name its
    /// objects, refreshes everything. The one place the client reads a change event's objects.
    init(_ event: ChangeEvent, schema: Schema) {
        let unlistedBatch = event.kind == .batch && event.inserted.isEmpty && event.updated.isEmpty && event.deleted.isEmpty
        self.init(
            sequence: event.sequence, author: event.author, isReset: event.kind == .reset,
            isRefresh: event.kind == .schemaChanged || unlistedBatch, inserted: event.inserted, deleted: event.deleted)
        for update in event.updated {
            let properties = schema.entity(named: update.id.entityName)?.properties ?? []
            let names = update.values.keys.sorted().compactMap { $0 < properties.count ? properties[$0].name : nil }
            updated[update.id] = Update(properties: names, version: update.version, values: update.values)
        }
    }
}

extension BatchOutcome {
    /// What a batch's change event says, as the contexts take it (`affected`: how many objects
    /// its predicate selected).
    init(_ event: ChangeEvent, affected: Int, schema: Schema) {
        let change = StoreChange(event, schema: schema)
        self.init(count: affected, deleted: change.deleted, updatedValues: change.updated, isListed: !change.isRefresh)
    }
}
