import Foundation
import Synchronization

extension ObjectContext {
    // MARK: - Reset, rollback, refresh

    /// Forgets every object and pending change. Objects fetched before are detached.
    public func reset() {
        // What is empty is left alone: a stack's scratch context is reset after every write,
        // most often with nothing registered and nothing pending.
        if !registry.isEmpty { for entry in registry.values { entry.object.skyrosStorage.context = nil } }
        registry.removeAll()  // also when empty: marks taken before are no longer current
        registryKept = 0
        registryPurgeThreshold = 4096
        inserted.forEach { _, object in object.skyrosStorage.context = nil }
        for object in updated.values { object.skyrosStorage.context = nil }
        for object in deleted.values { object.skyrosStorage.context = nil }
        if !mergedRows.isEmpty { mergedRows.removeAll() }
        clearPendingChanges()
        recorder?.removeAllActions()
        announceReload()
    }

    /// Discards pending changes: inserted objects are forgotten, updated and deleted ones
    /// are turned back into faults of their saved state.
    public func rollback() {
        for object in inserted.values {
            registry[object.objectID] = nil
            object.skyrosStorage.isInserted = false
            object.skyrosStorage.context = nil
        }
        for object in Array(updated.values) + Array(deleted.values) {
            let storage = object.skyrosStorage
            storage.isDeleted = false
            storage.changed = []
            storage.carriesChildChanges = false
            storage.valueErrors = [:]
            storage.isFault = true
        }
        clearPendingChanges()
        recorder?.removeAllActions()
        announceReload()
    }

    /// Empties the pending sets (after a save, a rollback or a reset).
    func clearPendingChanges() {
        // Only what was used is replaced: a small save leaves most of these empty, and making
        // new empty collections is not free.
        inserted.removeAll()
        insertedRows.removeAll()
        if passThrough != nil { passThrough = nil }
        if !updated.isEmpty { updated = [:] }
        if !unverifiedUpdates.isEmpty { unverifiedUpdates = [] }
        hasPendingFaults = false
        if !deleted.isEmpty { deleted = [:] }
        // Its storage kept while small: most saves count one or two entities again.
        if !pendingCountByEntity.isEmpty {
            pendingCountByEntity.removeAll(keepingCapacity: pendingCountByEntity.capacity <= 16)
        }
        pendingLinkIndex = nil
        if !orderTails.isEmpty { orderTails = [:] }
    }

    /// Turns an object back into a fault, discarding its pending changes unless
    /// `mergeChanges` is true (then its changed properties keep their new values over the
    /// parent's current ones).
    public func refresh(_ object: any ManagedObject, mergeChanges: Bool) {
        let storage = object.skyrosStorage
        guard storage.context === self, !storage.isInserted else { return }
        if mergeChanges, !storage.changed.isEmpty {
            let changed = storage.changed.map { ($0, storage.values[$0]) }
            fulfill(storage)
            for (index, value) in changed { storage.values[index] = value }
            return
        }
        if updated.removeValue(forKey: storage.objectID) != nil { adjustPending(storage.entity, -1) }
        if deleted.removeValue(forKey: storage.objectID) != nil { adjustPending(storage.entity, -1) }
        storage.isDeleted = false
        storage.changed = []
        storage.carriesChildChanges = false
        storage.valueErrors = [:]
        storage.isFault = true
    }
}
