import Foundation
import Synchronization

/// A scratchpad of managed objects over a parent store: Core Data's managed object context.
///
/// A context has a serial queue; its objects and its methods must be used on it, inside
/// ``perform(_:)->()``, ``performAndWait(_:)`` or a `read`/`write` block of ``Skyros``.
/// `performAndWait` is reentrant: nested calls on the same context never deadlock.
///
/// Uniquing: one instance per object per context. A fetch sees the context's pending
/// changes (unsaved inserts that match appear, pending deletions do not, pending updates are
/// matched on their new values). ``save()`` pushes the changes exactly one level toward the
/// store: into the parent context, or into the store for a root context.
public final class ObjectContext: ObjectStore, @unchecked Sendable, CustomStringConvertible {
    /// A name for diagnostics: "root", "main", "scratch".
    public let name: String
    /// The entities this context's objects belong to: its parent's schema.
    public let schema: Schema
    /// What this context saves into.
    public let parent: any ObjectStore
    /// The parent as a context, and as a store that numbers saves: cast once here, not at
    /// each save (a context's cast to `SequencedObjectStore`, which fails, cost some 1,300
    /// instructions of the runtime's conformance lookup at every save).
    let parentContext: ObjectContext?
    let sequencedParent: (any SequencedObjectStore)?
    var parentIsContext: Bool { parentContext != nil }
    let queue: ContextQueue
    /// The weak reference to this context that its objects share.
    let reference = ContextReference()
    private let policyLock = NSLock()
    /// ``mergePolicy`` as a number (read at every save: an atomic load, not a lock).
    private let mergePolicyNumber = Atomic<Int>(0)

    /// What a save into the store does with updated objects that changed in the store since
    /// they were read (it matters for a context whose parent is the store: the root
    /// context). Default: ``MergePolicy/saverWins``. Thread-safe.
    public var mergePolicy: MergePolicy {
        get {
            switch mergePolicyNumber.load(ordering: .relaxed) {
            case 1: .storeWins
            case 2: .error
            default: .saverWins
            }
        }
        set {
            let number =
                switch newValue {
                case .saverWins: 0
                case .storeWins: 1
                case .error: 2
                }
            mergePolicyNumber.store(number, ordering: .relaxed)
        }
    }

    private var _errorHandler: (@Sendable (SkyrosError) -> Void)?

    /// Called with the errors of what cannot throw: touching a fault whose object another
    /// process deleted (``SkyrosError/Code/objectNotFound``) or that cannot be read because
    /// the store is away (``SkyrosError/Code/daemonUnavailable``), reading a relationship
    /// that cannot be loaded. The object does not trap: it becomes inaccessible (Core Data's
    /// inaccessible fault: its attributes give their last known values, or their defaults,
    /// its relationships are empty or nil, ``ManagedObject/isDeleted`` is true, and it
    /// leaves the context, so that fetching it again once the store is back gives a live
    /// object). A context made on another context starts with its parent's handler; a
    /// ``Skyros`` stack sets it on its contexts to call ``Skyros/handleError(_:)``.
    /// Called on the thread that touched the object. Thread-safe.
    public var errorHandler: (@Sendable (SkyrosError) -> Void)? {
        get { policyLock.withLock { _errorHandler } }
        set { policyLock.withLock { _errorHandler = newValue } }
    }

    /// Hands an error of something that cannot throw to ``errorHandler``.
    func report(_ error: any Error) {
        errorHandler?(SkyrosError.wrap(error))
    }

    // Queue-confined state.
    /// Registered objects. Held strongly (no weak side tables on the hot path) and pruned
    /// when the registry doubles: objects nobody else holds and that have no changes are
    /// dropped, so a context never keeps more than about twice what its users hold.
    struct Entry {
        /// The strong reference, typed for `isKnownUniquelyReferenced`.
        var owner: AnyObject
        /// The same object as a managed object; kept alive by `owner`.
        unowned(unsafe) let object: any ManagedObject
        init(_ object: any ManagedObject) {
            self.owner = object
            self.object = object
        }
    }
    @exclusivity(unchecked) var registry = Registry()
    var registryPurgeThreshold = 4096
    /// How many entries the last prune kept: a fetch prunes the registry once it holds twice
    /// as many (``pruneBeforeFetch()``).
    var registryKept = 0
    /// Objects other processes inserted, merged while nobody observed this context: kept as
    /// rows, made objects when asked for (see ``MergedRows``).
    @exclusivity(unchecked) var mergedRows = MergedRows()
    /// Objects inserted in this context, in order.
    @exclusivity(unchecked) var inserted = PendingList<any ManagedObject>()
    /// Rows inserted by a child's save that nobody has asked for in this context yet: kept
    /// as values only, and turned into objects on first use (most never are: they just pass
    /// through toward the store).
    @exclusivity(unchecked) var insertedRows = PendingList<StoredValues>()
    @exclusivity(unchecked) var updated: [ObjectID: any ManagedObject] = [:]
    /// A root context's updated objects made from its child's values, not read from the
    /// store (see ``save(_:childValues:)``): the store may no longer have one of them.
    @exclusivity(unchecked) var unverifiedUpdates: Set<ObjectID> = []
    /// Whether a child's save left faults among the updated objects (see ``apply(_:childValues:)``):
    /// they are read before pending objects are looked at. Cleared with the pending changes.
    @exclusivity(unchecked) var hasPendingFaults = false
    @exclusivity(unchecked) var deleted: [ObjectID: any ManagedObject] = [:]
    /// A stack's main or root context's pending changes while they are only passing through:
    /// its child's change set as it came, held instead of applied when the context had nothing
    /// pending (see ``PassThrough``). Applied (``materializePassThrough()``) before anything
    /// else looks at this context.
    @exclusivity(unchecked) var passThrough: PassThrough?
    /// Whether a child's save may be held as it came (a stack's root and main contexts, which
    /// the stack saves with ``performSaveAndWait(_:)`` and ``performSave(_:)``); set once, at creation.
    @exclusivity(unchecked) var passesThroughChildSaves = false
    /// The entity of the last insert, known to be of this context's schema.
    @exclusivity(unchecked) var lastInsertedEntity: ObjectIdentifier?
    @exclusivity(unchecked) var pendingCountByEntity: [ObjectIdentifier: Int] = [:]
    /// The context's undo manager (``undoManager``), held here: its steps hold objects.
    @exclusivity(unchecked) var recorder: UndoManager?
    /// During an undo or redo step: the objects it brought back to their saved state.
    @exclusivity(unchecked) var undoneToSaved: [ObjectID: any ManagedObject]?
    /// The links of many-to-many relationships pending here, by link entity and by the
    /// identifier of either of their objects (built on first use, see ``linkObjects(of:_:)``).
    @exclusivity(unchecked) var pendingLinkIndex: [String: [UUID: [ObjectID]]]?
    /// The last position of ordered to-manys this context appended to, by owner (see
    /// ``appendPosition(_:owner:)``); forgotten at each save, merge, child's save and undo step.
    @exclusivity(unchecked) var orderTails: [ObjectID: Int64] = [:]
    /// Whether setting a to-one of an ordered to-many's object places it last in its new
    /// owner's list (false while the list itself is being set: it places its objects).
    @exclusivity(unchecked) var appendsToOrder = true
    /// The number of this context's saves: an undo step recorded before the last one is
    /// saved already (see ``UndoManager``).
    @exclusivity(unchecked) var saveGeneration: UInt64 = 0

    // Observation (queue-confined; see ObjectContext+Changes.swift).
    /// The did-change observers, in registration order.
    @exclusivity(unchecked) var changeObservers: [(key: Int, handler: @Sendable (ContextChanges) -> Void)] = []
    @exclusivity(unchecked) var nextObserverKey = 0
    /// Edits made in this context since the last ``processPendingChanges()``, and since the
    /// last save; kept only while the context has observers.
    @exclusivity(unchecked) var unprocessedEdits: [ObjectID: LocalEdit] = [:]
    @exclusivity(unchecked) var unsavedEdits: [ObjectID: LocalEdit] = [:]
    /// Above zero while a child's save is applied: its changes are announced as one, not as edits.
    @exclusivity(unchecked) var applyingChildSave = 0
    /// The entities read since ``startTrackingReads()`` (for `observe`); nil when not tracking.
    @exclusivity(unchecked) var readEntities: Set<String>?
    /// A shared stack's main context: the properties its saves changed that the daemon has not
    /// passed yet, shielded from older changes of other processes merged after them.
    @exclusivity(unchecked) package var ownWrites: OwnWrites?
    /// A shared stack's root context: its child's ledger, to know which of its saves a change
    /// set of the root carries (``coveredGeneration``).
    @exclusivity(unchecked) package var childWrites: OwnWrites?
    /// The generation of the child's last save applied here (queue-confined).
    @exclusivity(unchecked) package internal(set) var coveredGeneration: UInt64 = 0
    /// The sequence the store gave this context's last save, when it says (queue-confined).
    @exclusivity(unchecked) package internal(set) var lastSavedSequence: UInt64?

    /// Makes a context whose parent is `parent` (a store or another context).
    public init(name: String, parent: any ObjectStore) {
        self.name = name
        self.schema = parent.schema
        self.parent = parent
        self.parentContext = parent as? ObjectContext
        self.sequencedParent = parent as? SequencedObjectStore
        self.queue = ContextQueue(label: "skyros.context.\(name)")
        reference.context = self
        if let parentContext { _errorHandler = parentContext.errorHandler }
        ConcurrencyDebug.enableIfRequested()
    }

    /// `ObjectContext(main)`: the context's name, for logs and diagnostics.
    public var description: String { "ObjectContext(\(name))" }

    // MARK: - Queue

    /// Runs `block` on the context's queue and waits for it. Reentrant.
    public func performAndWait<T>(_ block: () throws -> T) rethrows -> T {
        if isPerformingOnCurrentThread { return try block() }
        return try performAndWaitOnQueue(block, keepingPassThrough: false, rescue: { throw $0 })
    }

    /// ``performAndWait(_:)`` for a stack's save of its main or root context: a child's change
    /// set passing through (``passThrough``) is left as it is, for ``save()`` to push it on as
    /// it came.
    func performSaveAndWait<T>(_ block: () throws -> T) rethrows -> T {
        if isPerformingOnCurrentThread { return try block() }
        return try performAndWaitOnQueue(block, keepingPassThrough: true, rescue: { throw $0 })
    }

    /// ``performAndWait(_:)`` off the queue, through ``ContextQueue/sync(_:)``'s non-generic
    /// form (a generic one would look up the metadata of its result type at run time on every
    /// call, several per save). `rescue` rethrows the block's error (the way a `rethrows`
    /// function may throw what it caught).
    private func performAndWaitOnQueue<T>(
        _ block: () throws -> T, keepingPassThrough: Bool, rescue: (any Error) throws -> T
    ) rethrows -> T {
        var result: T?
        var failure: (any Error)?
        queue.sync {
            runBlock(keepingPassThrough: keepingPassThrough) {
                do { result = try block() } catch { failure = error }
            }
        }
        if let failure { return try rescue(failure) }
        return result!
    }

    /// Schedules `block` on the context's queue.
    public func perform(_ block: @escaping @Sendable () -> Void) {
        perform(keepingPassThrough: false, block)
    }

    /// ``perform(_:)`` for a stack's save of its main or root context (see ``performSaveAndWait(_:)``).
    func performSave(_ block: @escaping @Sendable () -> Void) {
        perform(keepingPassThrough: true, block)
    }

    private func perform(keepingPassThrough: Bool, _ block: @escaping @Sendable () -> Void) {
        queue.async { [self] in runBlock(keepingPassThrough: keepingPassThrough, block) }
    }

    /// A block's run on the context's queue, waited for or scheduled: a held change set is
    /// applied first (unless the stack's save keeps it), and after the block the edits are
    /// processed for observers and the undo group is closed.
    private func runBlock(keepingPassThrough: Bool, _ block: () -> Void) {
        if passThrough != nil && !keepingPassThrough { materializePassThrough() }
        defer {
            if reference.isObserved && !unprocessedEdits.isEmpty { processPendingChanges() }
            if let recorder { recorder.endOfBlock() }
        }
        block()
    }

    /// Runs `block` on the context's queue and returns its result.
    public func perform<T: Sendable>(_ block: @escaping @Sendable () throws -> T) async throws -> T {
        try await withCheckedThrowingContinuation { continuation in
            perform { continuation.resume(with: Result { try block() }) }
        }
    }

    /// Whether the current thread is running a block of this context.
    public var isPerformingOnCurrentThread: Bool { queue.isRunningOnCurrentThread }

    // MARK: - Registry

    /// The object with this ID in the context, registered or pending. Objects applied from
    /// a child's save are held by the pending sets only; once handed out here they are also
    /// registered, so that they stay unique after the save.
    func registered(_ id: ObjectID) -> (any ManagedObject)? {
        if let entry = registry[id] { return entry.object }
        guard let object = pendingObject(id) else { return nil }
        register(object)
        return object
    }

    /// A pending object, without registering it (for internal bookkeeping).
    func pendingObject(_ id: ObjectID) -> (any ManagedObject)? {
        guard hasChanges else { return nil }
        if let object = inserted[id] ?? updated[id] ?? deleted[id] { return object }
        return promoteRow(id)
    }

    /// Turns a pending inserted row into an inserted object.
    func promoteRow(_ id: ObjectID) -> (any ManagedObject)? {
        guard let values = insertedRows.removeValue(forKey: id), let entity = schema.entity(named: id.entityName) else {
            return nil
        }
        let object = makeObject(id, of: entity, values: values)
        object.skyrosStorage.isInserted = true
        object.skyrosStorage.changesValidated = true  // a child's insert, validated there
        inserted.appendNew(id, object)  // a row is never also an inserted object
        return object
    }

    /// Turns every pending inserted row of an entity (all entities when nil) into objects.
    func promoteRows(of entityName: String?) {
        guard !insertedRows.isEmpty else { return }
        for id in insertedRows.keys where entityName == nil || id.entityName == entityName {
            _ = promoteRow(id)
        }
    }

    /// The registered or pending object, without registering it.
    func lookup(_ id: ObjectID) -> (any ManagedObject)? {
        registry[id]?.object ?? pendingObject(id)
    }

    func register(_ object: any ManagedObject) {
        object.skyrosStorage.isExposed = true
        if registry.count >= registryPurgeThreshold { pruneRegistry() }
        registry[object.objectID] = Entry(object)
        // A row merged for it becomes its values: a fault (a relationship's) is filled
        // with no request, and values read from the parent before a newer merge give way.
        if !mergedRows.isEmpty, let row = mergedRows.take(object.objectID) {
            let storage = object.skyrosStorage
            if storage.isFault || (row.version > storage.version && !storage.hasChanges) {
                storage.fill(row.values, version: row.version)
            }
        }
    }

    /// Drops the registered objects that only the registry holds and that have no changes.
    /// Amortised O(1) per registration: it runs when the registry has doubled.
    func pruneRegistry() {
        for entry in registry.removeUnused() { entry.object.skyrosStorage.context = nil }
        registryPurgeThreshold = max(4096, registry.count * 2)
        registryKept = registry.count
    }

    /// Prunes before a fetch makes its objects, once the registry has doubled since the last
    /// prune (rather than once it reaches ``registryPurgeThreshold``, at least 4,096). A
    /// context whose app lets go of each fetch's objects (many small fetches on the main
    /// context, the common read) then meets a registry holding only what the app holds at
    /// every fetch — empty, mostly — and makes the objects without looking each one up: the
    /// lookups, and the indexing of the earlier fetches' objects for them, were a third of the
    /// time of a fetch of 1,000 objects. Amortised O(1) per object made: a prune scans at most
    /// twice as many entries as were added since the one before.
    func pruneBeforeFetch() {
        if registry.count > 0, registry.count >= 2 * registryKept { pruneRegistry() }
    }

    /// The registered object, or a new one made from `values` (a fault when nil).
    func materialize(
        _ id: ObjectID, values: StoredValues?, version: Int64 = 0,
        entity knownEntity: EntityDescription? = nil
    ) throws -> any ManagedObject {
        if let object = registered(id) {
            let storage = object.skyrosStorage
            if storage.isFault, let values { storage.fill(values, version: version) }
            return object
        }
        let entity = try knownEntity ?? schema.requireEntity(id.entityName)
        let object = makeObject(id, of: entity, values: values, version: version)
        // An object of a hierarchy whose row could not be read has no class known for sure:
        // it is not registered (an object of the wrong class would stay for every later fetch).
        if entity.hierarchy != nil, object.skyrosStorage.isFault {
            makeInaccessible(
                object.skyrosStorage,
                SkyrosError(
                    .objectNotFound, "\(id) could not be read (deleted, or the store is away) in context '\(name)'"))
            return object
        }
        register(object)
        return object
    }

    /// A new instance of the entity's class for this context, not registered anywhere: a
    /// fault when `values` is nil.
    @inline(__always)
    func makeObject(
        _ id: ObjectID, of entity: EntityDescription, values: StoredValues?, version: Int64 = 0, exposed: Bool = false
    ) -> any ManagedObject {
        var type = entity.objectType
        if let hierarchy = entity.hierarchy {
            // An object of an entity hierarchy: an instance of the class its `_entity` names.
            guard let values else { return makeFault(id, of: entity, exposed: exposed) }
            type = hierarchy.type(of: values)
        }
        let storage = ObjectStorage(objectID: id, entity: entity, values: values, reference: reference)
        storage.version = version
        storage.isExposed = exposed
        return type.init(skyrosStorage: storage)
    }

    /// An object of an entity hierarchy known by its identifier alone: its row is read first, to
    /// know its class (an object of a hierarchy is not made a fault). A row that cannot be read
    /// (gone, or the parent away) makes a fault of the root's class: reading it reports why, as
    /// for any fault.
    func makeFault(_ id: ObjectID, of entity: EntityDescription, exposed: Bool) -> any ManagedObject {
        noteRead(entity.name)
        if !mergedRows.isEmpty, let row = mergedRows.take(id) {
            return makeObject(id, of: entity, values: row.values, version: row.version, exposed: exposed)
        }
        if let snapshot = try? parent.snapshots(for: [id]).first {
            return makeObject(id, of: entity, values: snapshot.values, version: snapshot.version, exposed: exposed)
        }
        let storage = ObjectStorage(objectID: id, entity: entity, values: nil, reference: reference)
        storage.isExposed = exposed
        return entity.objectType.init(skyrosStorage: storage)
    }

    /// The object for a to-one reference: registered, or a fault filled on first access.
    func registeredOrFault(_ id: ObjectID) -> (any ManagedObject)? {
        try? materialize(id, values: nil)
    }

    /// Fills a fault from the parent. When the object is gone (another process deleted it)
    /// or the parent cannot answer (the daemon is away), the object becomes inaccessible
    /// instead (see ``errorHandler``) and the error is reported.
    func fulfill(_ storage: ObjectStorage) {
        noteRead(storage.entity.name)
        do {
            guard let snapshot = try parent.snapshots(for: [storage.objectID]).first else {
                // A child's update of it passing through here goes with it.
                if storage.carriesChildChanges { dropUpdate(of: storage) }
                makeInaccessible(
                    storage,
                    SkyrosError(
                        .objectNotFound,
                        "\(storage.objectID) was deleted (by another context or process) before this fault in context '\(name)' was read"
                    ))
                return
            }
            storage.fill(snapshot.values, version: snapshot.version)
        } catch {
            makeInaccessible(storage, SkyrosError.wrap(error))
        }
    }

    /// Reads the rows of faults carrying a child's changes (see ``apply(_:childValues:)``) in
    /// one request and fills them: their changes stay over the rows, and their version is the
    /// one the changes were made on. The update of one whose row the parent no longer has is
    /// dropped, as a child's update of an object deleted meanwhile always was.
    func fillFaults(_ storages: [ObjectStorage]) throws {
        guard !storages.isEmpty else { return }
        var noted: Set<String> = []
        for storage in storages where noted.insert(storage.entity.name).inserted { noteRead(storage.entity.name) }
        var rows: [ObjectID: Snapshot] = [:]
        for row in try parent.snapshots(for: storages.map(\.objectID)) { rows[row.id] = row }
        for storage in storages where storage.isFault {
            if let row = rows[storage.objectID] {
                storage.fill(row.values, version: row.version)
            } else {
                dropUpdate(of: storage)
            }
        }
    }

    /// Forgets the pending update of an object that no longer exists (a fault carrying a
    /// child's changes, whose row is gone): it leaves the context, deleted.
    private func dropUpdate(of storage: ObjectStorage) {
        unverifiedUpdates.remove(storage.objectID)
        storage.makeInaccessible()  // while it still carries the changes: its defaults, not placeholders
        storage.carriesChildChanges = false
        forgetUpdate(of: storage)
    }

    /// Takes an object's pending update out of this context (its object no longer exists in
    /// the store) and detaches the object.
    func forgetUpdate(of storage: ObjectStorage) {
        let id = storage.objectID
        if let object = updated.removeValue(forKey: id) {
            adjustPending(storage.entity, -1)
            if registry[id]?.object === object { registry[id] = nil }
        }
        storage.changed = []
        storage.context = nil
    }

    /// Fills the faults among the updated objects of an entity (objects a child's save updated
    /// that this context did not hold), in one request, before their values are looked at.
    private func fillPendingFaults(of entityName: String) throws {
        guard hasPendingFaults else { return }
        var faults: [ObjectStorage] = []
        for (id, object) in updated where id.entityName == entityName && object.skyrosStorage.isFault {
            faults.append(object.skyrosStorage)
        }
        try fillFaults(faults)
    }

    /// Core Data's inaccessible fault: the object keeps its last known values (its defaults
    /// when it never had any), reads as deleted, and leaves the context; the error is reported.
    func makeInaccessible(_ storage: ObjectStorage, _ error: SkyrosError) {
        storage.makeInaccessible()
        if let entry = registry[storage.objectID], entry.object.skyrosStorage === storage {
            registry[storage.objectID] = nil
        }
        storage.context = nil
        report(error)
    }

    // MARK: - Pending state

    func adjustPending(_ entity: EntityDescription, _ delta: Int) {
        pendingCountByEntity[ObjectIdentifier(entity), default: 0] += delta
    }

    @usableFromInline
    func hasPendingChanges(of entityName: String) -> Bool {
        guard hasChanges, let entity = schema.entity(named: entityName) else { return false }
        if (pendingCountByEntity[ObjectIdentifier(entity)] ?? 0) > 0 { return true }
        return !schema.links.isEmpty && hasPendingLinks(of: entityName)
    }

    func didUpdate(_ storage: ObjectStorage) {
        guard updated[storage.objectID] == nil, let object = lookup(storage.objectID) else { return }
        updated[storage.objectID] = object
        adjustPending(storage.entity, 1)
    }

    func markInserted(_ object: any ManagedObject) {
        let storage = object.skyrosStorage
        if let recorder, recorder.isRecording { recordMembership(object, from: .gone, to: .inserted) }
        storage.isInserted = true
        inserted.appendNew(storage.objectID, object)  // a new object: its identifier is new
        adjustPending(storage.entity, 1)
        if pendingLinkIndex != nil && schema.isLinkEntity(storage.objectID.entityName) {
            indexPendingLink(storage.objectID, storage.values)
        }
        if reference.isObserved { noteEdit(storage.objectID, object: object, inserted: true) }
    }

    func markDeleted(_ object: any ManagedObject) {
        let storage = object.skyrosStorage
        let id = storage.objectID
        if let recorder, recorder.isRecording {
            // Undoing the deletion once it is saved inserts the object again: it needs its values.
            if storage.isFault { fulfill(storage) }
            let state = membership(of: storage)
            recordMembership(object, from: state, to: storage.isInserted ? .gone : .deleted)
        }
        if reference.isObserved { noteEdit(id, object: object, deleted: true) }
        if updated.removeValue(forKey: id) != nil { adjustPending(storage.entity, -1) }
        if storage.isInserted {
            inserted.removeValue(forKey: id)
            storage.isInserted = false
            adjustPending(storage.entity, -1)
        } else {
            deleted[id] = object
            adjustPending(storage.entity, 1)
            if pendingLinkIndex != nil && schema.isLinkEntity(id.entityName) {
                if storage.isFault { fulfill(storage) }
                indexPendingLink(id, storage.values)
            }
        }
        storage.isDeleted = true
        storage.changed = []
    }

    /// Objects of an entity with pending changes (inserted, updated, deleted).
    /// - Throws: the parent's error when faults carrying a child's changes cannot be read.
    func pendingStorages(of entityName: String) throws -> [ObjectStorage] {
        guard hasPendingChanges(of: entityName) else { return [] }
        promoteRows(of: entityName)
        try fillPendingFaults(of: entityName)
        var result: [ObjectStorage] = []
        inserted.forEach { id, object in if id.entityName == entityName { result.append(object.skyrosStorage) } }
        for dictionary in [updated, deleted] {
            for (id, object) in dictionary where id.entityName == entityName { result.append(object.skyrosStorage) }
        }
        if !schema.links.isEmpty { result += linkEndpoints(of: entityName, besides: result) }
        return result
    }

    // MARK: - Public state

    /// Whether the context has unsaved changes.
    public var hasChanges: Bool {
        !inserted.isEmpty || !insertedRows.isEmpty || !updated.isEmpty || !deleted.isEmpty || passThrough != nil
    }
    /// Objects inserted and not yet saved.
    public var insertedObjects: [any ManagedObject] {
        promoteRows(of: nil)
        return inserted.values
    }
    /// Objects changed and not yet saved.
    public var updatedObjects: [any ManagedObject] { Array(updated.values) }
    /// Objects deleted and not yet saved.
    public var deletedObjects: [any ManagedObject] { Array(deleted.values) }
    /// Objects currently registered in the context.
    public var registeredObjects: [any ManagedObject] { registry.values.map(\.object) }

}
