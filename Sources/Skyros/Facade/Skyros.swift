import Foundation

/// A store with Core Data's context stack and Skopelos' API: `read` on the main context,
/// `writeSync` / `writeAsync` on scratch contexts, chaining, and async `read` / `write`.
///
/// ```swift
/// let store = try Skyros(sqliteStack: Schema([User.self]), at: url)
/// store.writeSync { context in
///     User.create(in: context).firstname = "John"
/// }.read { context in
///     print(try User.count(in: context))   // 1
/// }
/// ```
///
/// The stack: a root context owns the store, the main context (the single source of
/// truth, where every `read` runs) saves into it, and writes run on scratch contexts that
/// save into the main context. A write is consistent in the main context when `writeSync`
/// returns, and durable when its completion runs.
///
/// Completions and ``handleError(_:)`` run on ``completionQueue``, a private serial queue
/// by default: in order, once per write, after the write is durable (or has failed).
/// ``writeAndWait(_:)`` does it all on the calling thread and returns once durable.
open class Skyros: @unchecked Sendable {
    /// The schema of the stack.
    public let schema: Schema
    /// The store under the root context.
    public let store: any PersistentStore
    /// When false (the default) one scratch context, reset after each write, serialises
    /// writes; when true each write gets its own scratch context.
    public let allowsConcurrentWritings: Bool
    /// Where completions and ``handleError(_:)`` are called.
    public let completionQueue: DispatchQueue
    /// Whether this stack's in-flight writes are saved by the process-wide handlers of
    /// SIGTERM, SIGINT and normal exit: what the initialiser's `savesOnStop` asked (unless
    /// the deprecated static ``savesOnStop-swift.type.property`` was false), until
    /// ``leaveSaveOnStop()``.
    public var savesOnStop: Bool { SaveOnStop.isRegistered(self) }

    private let lock = NSLock()
    private var contexts: Contexts
    private var _errorHandler: (@Sendable (SkyrosError) -> Void)?
    /// Sync refusals told while no ``errorHandler`` was set, for the next one.
    private var _heldRefusals: [SkyrosError] = []
    private var _mergePolicy = MergePolicy.saverWins
    let inFlight = DispatchGroup()
    let changeObservers = ChangeObservers()

    struct Contexts {
        let root: ObjectContext
        let main: ObjectContext
        let scratch: ObjectContext
    }

    /// A stack on an SQLite file (created with the schema if missing).
    ///
    /// - Parameters:
    ///   - schema: the entities.
    ///   - url: the SQLite file.
    ///   - allowsConcurrentWritings: one scratch context per write when true.
    ///   - durability: `.full` (default) or `.normal`.
    ///   - completionQueue: where write completions run (nil: a serial queue of the stack's own).
    ///   - savesOnStop: whether SIGTERM, SIGINT and a normal exit save the stack's in-flight
    ///     writes through process-wide handlers (default true). Pass false when the
    ///     application handles those signals itself — with swift-service-lifecycle, hand
    ///     the stack to a `SkyrosService` (product `SkyrosServiceLifecycle`) — or calls
    ///     ``flush(timeout:)`` when stopping. See ``savesOnStop-swift.property``.
    ///   - migrations: the stages of migrations to the schema's version (<doc:Migration>). A file of
    ///     an earlier version is migrated when the stack opens: the inferred steps, then these
    ///     stages, in one transaction.
    /// - Throws: ``SkyrosError/Code/migrationFailed`` when a migration is refused or fails,
    ///   ``SkyrosError/Code/schemaTooNew`` when the file has a newer schema version,
    ///   ``SkyrosError/Code/schemaMismatch`` when the file was made with another schema at the
    ///   same version (in each case the file is left untouched), ``SkyrosError/Code/invalidSchema``,
    ///   ``SkyrosError/Code/storeFailure``.
    public convenience init(
        sqliteStack schema: Schema, at url: URL, allowsConcurrentWritings: Bool = false,
        durability: Durability = .full, completionQueue: DispatchQueue? = nil, savesOnStop: Bool = true,
        migrations: MigrationPlan = MigrationPlan()
    ) throws {
        let store = try SQLiteStore(schema: schema, url: url, durability: durability, migrations: migrations)
        self.init(
            store: store, allowsConcurrentWritings: allowsConcurrentWritings, completionQueue: completionQueue,
            savesOnStop: savesOnStop)
    }

    /// A stack on an in-memory store (an in-memory SQLite database: same SQL, nothing on disk).
    ///
    /// `savesOnStop`: see ``init(sqliteStack:at:allowsConcurrentWritings:durability:completionQueue:savesOnStop:migrations:)``.
    public convenience init(
        inMemoryStack schema: Schema, allowsConcurrentWritings: Bool = false, completionQueue: DispatchQueue? = nil,
        savesOnStop: Bool = true
    ) throws {
        let store = try SQLiteStore(schema: schema, url: nil)
        self.init(
            store: store, allowsConcurrentWritings: allowsConcurrentWritings, completionQueue: completionQueue,
            savesOnStop: savesOnStop)
    }

    /// A stack over any persistent store.
    ///
    /// - Parameters:
    ///   - store: the store the root context saves into (an ``SQLiteStore``, or a shared
    ///     stack's connection to its daemon).
    ///   - allowsConcurrentWritings: one scratch context per write when true.
    ///   - completionQueue: where write completions run (nil: a serial queue of the stack's own).
    ///   - savesOnStop: whether the stack's in-flight writes are saved on SIGTERM, SIGINT and a
    ///     normal exit by process-wide handlers (default true; installed with the first such
    ///     stack). False installs nothing: the application stops the stack itself
    ///     (``flush(timeout:)``, or a `SkyrosService` under swift-service-lifecycle).
    public init(
        store: any PersistentStore, allowsConcurrentWritings: Bool = false, completionQueue: DispatchQueue? = nil,
        savesOnStop: Bool = true
    ) {
        self.schema = store.schema
        self.store = store
        self.allowsConcurrentWritings = allowsConcurrentWritings
        self.completionQueue = completionQueue ?? DispatchQueue(label: "skyros.completion")
        self.contexts = Self.makeContexts(store)
        adopt(contexts)
        if savesOnStop { SaveOnStop.register(self) }
    }

    /// Errors of what cannot throw in the stack's contexts (a fault that cannot be read, see
    /// ``ObjectContext/errorHandler``) go to ``handleError(_:)``, on ``completionQueue``.
    private func adopt(_ contexts: Contexts) {
        let report: @Sendable (SkyrosError) -> Void = { [weak self] error in
            guard let self else { return }
            self.completionQueue.async { self.handleError(error) }
        }
        for context in [contexts.root, contexts.main, contexts.scratch] { context.errorHandler = report }
    }

    private static func makeContexts(_ store: any PersistentStore) -> Contexts {
        let root = ObjectContext(name: "root", parent: store)
        let main = ObjectContext(name: "main", parent: root)
        // A write's change set passes through both on its way to the store (see ``PassThrough``):
        // the stack saves them with `performSaveAndWait`/`performSave`.
        root.passesThroughChildSaves = true
        main.passesThroughChildSaves = true
        if let sequenced = store as? SequencedObjectStore {
            // Another process's older change merged after a save must not undo it in main.
            let ledger = OwnWrites()
            main.ownWrites = ledger
            root.childWrites = ledger
            sequenced.ownWrites = ledger
        }
        return Contexts(root: root, main: main, scratch: ObjectContext(name: "scratch", parent: main))
    }

    private var current: Contexts { lock.withLock { contexts } }

    /// What a save does with objects another process (or another stack on the same file)
    /// changed since this stack read them: ``MergePolicy/saverWins`` by default, property by
    /// property; ``MergePolicy/storeWins``; or ``MergePolicy/error``, which refuses the write
    /// with ``SkyrosError/Code/mergeConflict`` and the list of conflicts.
    public var mergePolicy: MergePolicy {
        get { current.root.mergePolicy }
        set {
            lock.withLock { _mergePolicy = newValue }
            current.root.mergePolicy = newValue
        }
    }

    /// The main context: the single source of truth, where `read` runs.
    public var mainContext: ObjectContext { current.main }
    /// The root context, which owns the store.
    public var rootContext: ObjectContext { current.root }

    /// A closure called with every error of a `read` or `write` (before the write's
    /// completion), and of touching an object that cannot be read (another process deleted
    /// it, or the daemon is away: see ``ObjectContext/errorHandler``), unless a subclass
    /// overrides ``handleError(_:)``.
    ///
    /// Refusals of the sync server (``SkyrosError/Code/syncRejected``) that come while no
    /// handler is set are kept (the last 100) and given to the handler once it is set, on
    /// ``completionQueue``: a shared stack tells the refusals still outstanding as soon as it is
    /// made, before the line after `init` can set a handler.
    public var errorHandler: (@Sendable (SkyrosError) -> Void)? {
        get { lock.withLock { _errorHandler } }
        set {
            let held = lock.withLock { () -> [SkyrosError] in
                _errorHandler = newValue
                guard newValue != nil else { return [] }
                defer { _heldRefusals = [] }
                return _heldRefusals
            }
            if let newValue, !held.isEmpty { completionQueue.async { for error in held { newValue(error) } } }
        }
    }

    /// Called with every error of a `read` or `write`; override it in a subclass, or set
    /// ``errorHandler``. The default calls ``errorHandler`` (or keeps a sync refusal for it
    /// while none is set).
    open func handleError(_ error: SkyrosError) {
        let handler = lock.withLock { () -> (@Sendable (SkyrosError) -> Void)? in
            if let handler = _errorHandler { return handler }
            if error.code == .syncRejected {
                if _heldRefusals.count == 100 { _heldRefusals.removeFirst() }
                _heldRefusals.append(error)
            }
            return nil
        }
        handler?(error)
    }

    // MARK: - Reading

    /// Runs `statements` on the main context and waits. Errors go to ``handleError(_:)``.
    @discardableResult
    public func read(_ statements: (ObjectContext) throws -> Void) -> Self {
        let main = current.main
        var failure: SkyrosError?
        main.performAndWait {
            do { try statements(main) } catch { failure = SkyrosError.wrap(error) }
        }
        if let failure { handleError(failure) }
        return self
    }

    /// Runs `block` on the main context, waits, and returns its value; the synchronous
    /// counterpart of ``read(_:)-2v82g`` (GRDB's `dbQueue.read`).
    /// Errors are thrown, not sent to ``handleError(_:)``.
    ///
    /// ```swift
    /// let count = try store.read { context in try User.count(in: context) }
    /// ```
    ///
    /// It is also what makes `let names = try await store.read { … }` give the names in
    /// top-level code (`main.swift`): Swift ranks overloads there as in synchronous code, where
    /// the async form always loses to a synchronous one, so without this form the chaining
    /// ``read(_:)->Self`` would win and `names` would be the stack. There the
    /// compiler notes that the `await` is not needed; in async functions and closures the async
    /// form runs.
    /// A chaining `read` whose block throws, written as the only statement of a closure that
    /// returns `Void` (`queue.async { store.read { … try … } }`), now resolves to this form: mark
    /// it `try`, or give the closure a second statement.
    /// - Throws: the block's error, as a ``SkyrosError``.
    public func read<T>(_ block: (ObjectContext) throws -> T) rethrows -> T {
        let main = current.main
        do {
            return try main.performAndWait { try block(main) }
        } catch {
            throw SkyrosError.wrap(error)
        }
    }

    /// Runs `block` on the main context and returns its value.
    public func read<T: Sendable>(_ block: @escaping @Sendable (ObjectContext) throws -> T) async throws -> T {
        let main = current.main
        do {
            return try await main.perform { try block(main) }
        } catch {
            throw SkyrosError.wrap(error)
        }
    }

    // MARK: - Writing

    /// Runs `changes` on a scratch context, saves it into the main context, and returns;
    /// then saves to the store in the background and calls `completion` once, with nil
    /// when the changes are durable, or with the error. An error thrown by `changes`
    /// discards the whole write.
    @discardableResult
    public func writeSync(
        _ changes: (ObjectContext) throws -> Void, completion: (@Sendable (SkyrosError?) -> Void)? = nil
    ) -> Self {
        let stack = current
        let scratch = scratchContext(stack)
        inFlight.enter()
        var failure: SkyrosError?
        scratch.performAndWait { failure = runWrite(changes, in: scratch) }
        if let failure {
            finishInTurn(stack, failure, completion)
        } else {
            persist(stack, completion)
        }
        return self
    }

    /// Like ``writeSync(_:completion:)`` but returns at once; `changes` runs on the scratch
    /// context's queue.
    @discardableResult
    public func writeAsync(
        _ changes: @escaping @Sendable (ObjectContext) throws -> Void,
        completion: (@Sendable (SkyrosError?) -> Void)? = nil
    ) -> Self {
        let stack = current
        let scratch = scratchContext(stack)
        inFlight.enter()
        scratch.perform { [self] in
            if let failure = runWrite(changes, in: scratch) {
                finishInTurn(stack, failure, completion)
            } else {
                persist(stack, completion)
            }
        }
        return self
    }

    /// Runs `block` on a scratch context, saves, and returns its value once the changes
    /// are durable in the store. Throws the block's error (nothing of it is saved) or the
    /// save's.
    public func write<T: Sendable>(_ block: @escaping @Sendable (ObjectContext) throws -> T) async throws -> T {
        let box = ResultBox<T>()
        try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
            writeAsync(
                { context in box.value = try block(context) },
                completion: { error in
                    if let error { continuation.resume(throwing: error) } else { continuation.resume() }
                })
        }
        return box.value!
    }

    /// Runs `changes` on a scratch context and saves them all the way to the store before it
    /// returns: when it returns without throwing, the write is durable (for a shared stack,
    /// acknowledged by the daemon). Everything runs on the calling thread, which waits for
    /// the disk or the daemon: for command-line tools, services and background threads, not
    /// for a thread that must stay responsive.
    ///
    /// ```swift
    /// try store.writeAndWait { context in User.create(in: context).firstname = "Jane" }
    /// // durable here: no completion, no semaphore
    /// ```
    ///
    /// Writes started before it with ``writeSync(_:completion:)`` or
    /// ``writeAsync(_:completion:)`` are saved first (their completions follow, in order, on
    /// ``completionQueue``): its changes reach the root context behind their saves, on the
    /// root's queue. Errors also go to ``handleError(_:)``, on ``completionQueue``.
    /// - Throws: the block's error (nothing of it is saved), or the save's
    ///   (``SkyrosError/Code/uniqueConstraintViolation``, ``SkyrosError/Code/validationFailed``,
    ///   ``SkyrosError/Code/daemonUnavailable``, …), after which nothing of the write is stored.
    public func writeAndWait(_ changes: (ObjectContext) throws -> Void) throws {
        let stack = current
        let scratch = scratchContext(stack)
        inFlight.enter()
        defer { inFlight.leave() }
        var failure: SkyrosError?
        scratch.performAndWait { failure = runWrite(changes, in: scratch) }
        try saveToStore(stack, unless: failure)
    }

    /// Saves the changes made in the main context itself — edits made there directly, an
    /// ``UndoManager/undo()`` or ``UndoManager/redo()`` — all the way to the store, and
    /// returns once they are durable: ``writeAndWait(_:)`` without a scratch context.
    ///
    /// ```swift
    /// store.mainContext.undoManager?.undo()
    /// try store.saveMainContext()
    /// ```
    ///
    /// Does nothing when the main context has no changes (writes save their own). On failure
    /// the main context's changes are discarded (and its undo steps with them, as a rollback
    /// does) and nothing of them is stored.
    /// - Throws: the save's error (``SkyrosError/Code/validationFailed``,
    ///   ``SkyrosError/Code/uniqueConstraintViolation``, ``SkyrosError/Code/daemonUnavailable``, …).
    public func saveMainContext() throws {
        let stack = current
        inFlight.enter()
        defer { inFlight.leave() }
        try saveToStore(stack, unless: nil)
    }

    /// Main → root → store on this thread, unless an earlier step failed; the error (that
    /// one, or the saves') goes to ``handleError(_:)`` on ``completionQueue`` and is thrown.
    private func saveToStore(_ stack: Contexts, unless earlier: SkyrosError?) throws {
        var failure = earlier
        if failure == nil { failure = saveMain(stack) }
        // On this thread: the root's queue runs the block here when it is idle.
        if failure == nil { failure = stack.root.performSaveAndWait { saveRoot(stack) } }
        if let failure {
            completionQueue.async { [self] in handleError(failure) }
            throw failure
        }
    }

    private final class ResultBox<T>: @unchecked Sendable {
        var value: T?
    }

    private func scratchContext(_ stack: Contexts) -> ObjectContext {
        allowsConcurrentWritings ? ObjectContext(name: "scratch", parent: stack.main) : stack.scratch
    }

    private func runWrite(_ changes: (ObjectContext) throws -> Void, in scratch: ObjectContext) -> SkyrosError? {
        var failure: SkyrosError?
        do {
            try changes(scratch)
            try scratch.save(keepingObjects: allowsConcurrentWritings)
        } catch {
            failure = SkyrosError.wrap(error)
            scratch.rollback()
        }
        if !allowsConcurrentWritings { scratch.reset() }
        return failure
    }

    /// Main → root at once (in memory: the rows just move one level), then root → store
    /// on the root's queue, then the completion. The disk write is the only asynchronous
    /// step, so a small write reaches the disk with as few thread hops as possible. The
    /// root's queue keeps each write's save before the next write's changes reach the root
    /// (a push waits there behind the saves queued before it), so a save carries its own
    /// write's changes and its error is its own.
    private func persist(_ stack: Contexts, _ completion: (@Sendable (SkyrosError?) -> Void)?) {
        let mainFailure = saveMain(stack)
        // (A save of the root's: the change set the main context pushed is sent as it came.)
        stack.root.performSave { [self] in
            finish(mainFailure ?? saveRoot(stack), completion)
        }
    }

    /// The completion of a write that failed before reaching the root: through the root's
    /// queue, so that it comes after the completions of the writes before it.
    private func finishInTurn(
        _ stack: Contexts, _ failure: SkyrosError, _ completion: (@Sendable (SkyrosError?) -> Void)?
    ) {
        stack.root.perform { [self] in finish(failure, completion) }
    }

    /// Saves the main context into the root (in memory); on failure discards its changes.
    private func saveMain(_ stack: Contexts) -> SkyrosError? {
        // (A save of the main context's: the change set a write pushed is sent as it came.)
        stack.main.performSaveAndWait {
            do {
                try stack.main.save()
                return nil
            } catch {
                stack.main.rollback()
                return SkyrosError.wrap(error)
            }
        }
    }

    /// Saves the root context to the store; on failure discards its changes and turns the
    /// main context forget its copies of the objects (they are ahead of the store).
    private func saveRoot(_ stack: Contexts) -> SkyrosError? {
        let root = stack.root
        guard root.hasChanges else { return nil }
        // Under storeWins the store may keep its values for some updated objects: the main
        // context's copies are refreshed after the save.
        let refreshed =
            root.mergePolicy == .storeWins
            ? Array(root.updated.keys) + (root.passThrough?.changes.updated.map(\.id) ?? []) : []
        // The main context's saves this one carries (on the root's queue, like this function).
        let covered = root.coveredGeneration
        stack.main.ownWrites?.sending(through: covered)
        do {
            try root.save()
            stack.main.ownWrites?.settle(through: covered, sequence: root.lastSavedSequence)
            if !refreshed.isEmpty {
                stack.main.perform { for id in refreshed { stack.main.refreshIfClean(id) } }
            }
            return nil
        } catch {
            // A failed save keeps the pending changes: they say which objects it touched.
            let touched = root.makeChangeSet().allIDs
            root.rollback()
            stack.main.ownWrites?.settle(through: covered, sequence: nil)
            stack.main.perform { stack.main.forgetRefusedSave(touching: touched) }
            return SkyrosError.wrap(error)
        }
    }

    private func finish(_ error: SkyrosError?, _ completion: (@Sendable (SkyrosError?) -> Void)?) {
        completionQueue.async { [self] in
            if let error { handleError(error) }
            completion?(error)
            inFlight.leave()
        }
    }

    // MARK: - Maintenance

    /// Empties the store. Pending writes finish first; every context is then reset (objects
    /// fetched before are detached, so no stale object survives) and the stack stays usable.
    /// Observers of the main context get a ``ContextChanges/Kind/reloaded`` change.
    public func nuke() throws {
        let stack = current
        stack.scratch.performAndWait {}
        stack.main.performAndWait {}
        try stack.root.performAndWait {
            try store.deleteAll()
            stack.root.reset()
        }
        // The same contexts, emptied: observers of the main context (controllers, monitors)
        // keep working, and are told to start over.
        for context in [stack.scratch, stack.main] { context.performAndWait { context.reset() } }
    }

    /// Waits until every write started so far has completed, and saves changes left in the
    /// main context (objects modified in a `read`). Used at process stop.
    /// - Returns: false when `timeout` expired first.
    @discardableResult
    public func flush(timeout: TimeInterval = 10) -> Bool {
        let finished = inFlight.wait(timeout: .now() + timeout) == .success
        let stack = current
        stack.main.performAndWait {
            if stack.main.hasChanges { try? stack.main.save() }
        }
        stack.root.performAndWait {
            if stack.root.hasChanges { _ = saveRoot(stack) }
        }
        return finished
    }
}

/// A store that can be emptied and closed: what a ``Skyros`` stack sits on.
public protocol PersistentStore: ObjectStore {
    /// Deletes every object, keeping the schema.
    func deleteAll() throws
}

extension SQLiteStore: PersistentStore {}
