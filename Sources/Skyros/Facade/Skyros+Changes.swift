import Foundation

/// What another process committed, as merged into a shared stack's main context.
public struct StoreChange: Sendable, Hashable {
    /// The daemon's sequence number of the change set.
    public var sequence: UInt64
    /// Who saved it (client ID and process name).
    public var author: String
    /// The store was emptied.
    public var isReset: Bool
    /// Everything may have changed (the daemon restarted): every registered object was refreshed.
    public var isRefresh: Bool
    public var inserted: [ObjectID]
    /// Updated objects with the names of their changed properties.
    public var updated: [ObjectID: [String]]
    public var deleted: [ObjectID]

    public init(
        sequence: UInt64, author: String, isReset: Bool = false, isRefresh: Bool = false, inserted: [ObjectID] = [],
        updated: [ObjectID: [String]] = [:], deleted: [ObjectID] = []
    ) {
        self.sequence = sequence
        self.author = author
        self.isReset = isReset
        self.isRefresh = isRefresh
        self.inserted = inserted
        self.updated = updated
        self.deleted = deleted
    }
}

extension Skyros {
    /// The changes other processes make to a shared stack, each delivered after it has been
    /// merged into the main context (Core Data's remote-change notification, with the merge
    /// done). Each call makes a new sequence; it ends when the stack is deallocated.
    public var changes: AsyncStream<StoreChange> {
        let (stream, continuation) = AsyncStream<StoreChange>.makeStream(bufferingPolicy: .bufferingNewest(1_024))
        changeObservers.add(continuation)
        return stream
    }

    /// Merges a change committed by another process into the main context: registered
    /// objects that changed become faults (their next access reads the new values), deleted
    /// ones are marked deleted and forgotten, and fetches see inserts (they ask the store).
    /// Then ``changes`` delivers it. Called by the shared stack on its event thread; objects
    /// with unsaved changes in the main context keep them.
    ///
    /// The merge runs synchronously, inside the main context (waiting for it when it is
    /// busy): it returns once the main context has the change. Merging on the caller's thread
    /// spares the thread wake-up of an asynchronous hop on every change.
    public func merge(_ change: StoreChange) {
        let main = mainContext
        main.performAndWait { [self] in
            if change.isReset {
                main.forgetAllClean()
            } else if change.isRefresh {
                for id in main.registry.keys { main.refreshIfClean(id) }
            } else {
                for id in change.updated.keys { main.refreshIfClean(id) }
                for id in change.deleted { main.forgetDeleted(id) }
            }
            changeObservers.yield(change)
        }
    }
}

/// The continuations of ``Skyros/changes``.
final class ChangeObservers: @unchecked Sendable {
    private let lock = NSLock()
    private var continuations: [UUID: AsyncStream<StoreChange>.Continuation] = [:]

    func add(_ continuation: AsyncStream<StoreChange>.Continuation) {
        let key = UUID()
        lock.withLock { continuations[key] = continuation }
        continuation.onTermination = { [weak self] _ in
            guard let self else { return }
            self.lock.withLock { _ = self.continuations.removeValue(forKey: key) }
        }
    }

    func yield(_ change: StoreChange) {
        for continuation in lock.withLock({ Array(continuations.values) }) { continuation.yield(change) }
    }

    deinit {
        for continuation in continuations.values { continuation.finish() }
    }
}

extension ObjectContext {
    /// Turns a registered, unchanged object back into a fault.
    func refreshIfClean(_ id: ObjectID) {
        guard let object = registry[id]?.object, !object.skyrosStorage.hasChanges else { return }
        object.skyrosStorage.isFault = true
    }

    /// Marks a registered object deleted by another process, and forgets it.
    func forgetDeleted(_ id: ObjectID) {
        guard let object = registry[id]?.object, !object.skyrosStorage.hasChanges else { return }
        registry[id] = nil
        object.skyrosStorage.isDeleted = true
        object.skyrosStorage.context = nil
    }

    /// Forgets every registered object without changes (the store was emptied).
    func forgetAllClean() {
        for id in registry.keys { forgetDeleted(id) }
    }
}
