import Foundation
import Synchronization

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
    /// The inserted objects with their values: the main context keeps them (as objects when
    /// it has observers, as rows otherwise), so that `object(with:)` has them without asking
    /// the store (Core Data's merge of inserted objects).
    public var inserted: [Snapshot]
    /// The updated objects: their changed properties, by name, with their new values, which
    /// the objects the main context holds take without asking the store.
    public var updated: [ObjectID: Update]
    /// The deleted objects.
    public var deleted: [ObjectID]
    /// More inserted objects, their values still as the change event carried them (a shared
    /// stack's event thread); ``decoded`` moves them to ``inserted``, as every change handed
    /// out of the stack has them.
    /// (`Optional` spelled out: a `?` property has an implied default, with which the
    /// optimizer builds each change twice and copies it.)
    package var encodedInserted: Optional<EncodedRows>

    /// An updated object's changed properties and their values after the change.
    public struct Update: Sendable, Hashable {
        /// The names of the changed properties.
        public var properties: [String]
        /// The object's version after the change.
        public var version: Int64
        /// The changed properties' new values, by property index.
        public var values: [Int: StoredValue]

        /// An update of the named properties to these values.
        public init(properties: [String], version: Int64, values: [Int: StoredValue]) {
            self.properties = properties
            self.version = version
            self.values = values
        }
    }

    /// A change; `isRefresh` with nothing else makes every registered object read again.
    public init(
        sequence: UInt64, author: String, isReset: Bool = false, isRefresh: Bool = false, inserted: [Snapshot] = [],
        updated: [ObjectID: Update] = [:], deleted: [ObjectID] = []
    ) {
        self.sequence = sequence
        self.author = author
        self.isReset = isReset
        self.isRefresh = isRefresh
        self.inserted = inserted
        self.updated = updated
        self.deleted = deleted
        self.encodedInserted = nil
    }

    /// A change some of whose inserted objects' values are still encoded (`encodedInserted`).
    package init(
        sequence: UInt64, author: String, isReset: Bool, isRefresh: Bool, inserted: [Snapshot],
        encodedInserted: EncodedRows?, deleted: [ObjectID]
    ) {
        // Every field assigned here: delegating, then setting one, would copy the change.
        self.sequence = sequence
        self.author = author
        self.isReset = isReset
        self.isRefresh = isRefresh
        self.inserted = inserted
        self.encodedInserted = encodedInserted
        self.updated = [:]
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

    /// Merges a change committed by another process into the main context, then ``changes``
    /// delivers it. Registered objects that changed take the new values the change carries
    /// (without a fetch; the properties an object has unsaved changes of keep them); deleted
    /// ones are marked deleted and forgotten; inserted objects are registered when the main
    /// context has observers (they are handed the inserted objects), and otherwise kept as rows
    /// that become objects only when asked for (by identifier, through a relationship, from a
    /// scratch context), with no request to the store. Updated objects the context never held
    /// are not made. Called by the shared stack on its event thread.
    ///
    /// The merge runs synchronously, inside the main context (waiting for it when it is
    /// busy): it returns once the main context has the change. Merging on the caller's thread
    /// spares the thread wake-up of an asynchronous hop on every change.
    public func merge(_ change: StoreChange) { merge([change]) }

    /// Merges consecutive changes in one visit to the main context (one wait for its queue
    /// instead of one per change), in order; ``changes`` delivers each.
    public func merge(_ changes: [StoreChange]) {
        merge(changes, publishing: true)
    }

    /// Merges changes into the main context; `publishing` false keeps them out of ``changes``
    /// (a batch operation of this process is not another process's change).
    func merge(_ changes: [StoreChange], publishing: Bool) {
        guard !changes.isEmpty else { return }
        let main = mainContext
        // ``changes`` delivers them once the main context is free again: a consumer that
        // reads the main context as soon as it is told (the usual thing to do) then finds it
        // idle, instead of waking only to wait for the end of this merge.
        defer { if publishing { changeObservers.yield(changes.lazy.map(\.decoded)) } }
        main.merge(changes)
    }
}

/// The continuations of ``Skyros/changes``.
final class ChangeObservers: Sendable {
    private let continuations = Mutex<[UUID: AsyncStream<StoreChange>.Continuation]>([:])

    func add(_ continuation: AsyncStream<StoreChange>.Continuation) {
        let key = UUID()
        continuations.withLock { $0[key] = continuation }
        continuation.onTermination = { [weak self] _ in
            guard let self else { return }
            _ = self.continuations.withLock { $0.removeValue(forKey: key) }
        }
    }

    /// Yields `changes` in order to every stream, looking at the streams once (most stacks
    /// have none: the event thread's merges then pay one lock for all).
    func yield(_ changes: some Collection<StoreChange>) {
        let streams = continuations.withLock { $0.isEmpty ? [] : Array($0.values) }
        guard !streams.isEmpty else { return }
        for change in changes {
            for continuation in streams { continuation.yield(change) }
        }
    }

    deinit {
        for continuation in continuations.withLock({ Array($0.values) }) { continuation.finish() }
    }
}
