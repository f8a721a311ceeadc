import Foundation
import Skyros
import SkyrosWire

extension StoreChange {
    /// A change event as the contexts take it: updated properties by name (the wire numbers
    /// them), with their values. A schema change, or a batch operation too large to name its
    /// objects, refreshes everything. The one place the client reads a change event's objects.
    init(_ event: ChangeEvent, schema: Schema) {
        self.init([event], at: 0, schema: schema)
    }

    /// The change of the event at `index` of `events`, read where it lies: each of the event
    /// thread's change sets goes through here, and an event handed to a function is copied
    /// first (each of its lists retained, then released).
    init(_ events: [ChangeEvent], at index: Int, schema: Schema) {
        var isReset = false
        var isRefresh = false
        switch events[index].kind {  // matched: an enum of another module is compared through a witness
        case .reset: isReset = true
        case .schemaChanged: isRefresh = true
        case .batch:
            isRefresh =
                events[index].inserted.isEmpty && (events[index].encodedInserted?.isEmpty ?? true)
                && events[index].updated.isEmpty && events[index].deleted.isEmpty
        case .changes, .heartbeat: break
        }
        self.init(
            sequence: events[index].sequence, author: events[index].author, isReset: isReset, isRefresh: isRefresh,
            inserted: events[index].inserted, encodedInserted: events[index].encodedInserted,
            deleted: events[index].deleted)
        guard !events[index].updated.isEmpty else { return }
        for update in events[index].updated {
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
