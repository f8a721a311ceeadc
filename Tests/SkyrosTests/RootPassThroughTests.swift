import Foundation
@testable import Skyros
import SkyrosTestModels
import Testing

/// A stack's root context, holding nothing, keeps the main context's change set as it came
/// and its save sends it, instead of making pending rows and objects of it only to make the
/// same change set again (see ``PassThrough``). Anything else that runs on the root in
/// between applies it first. Real SQLite store, an embedded stack.
@Suite("A change set passing through an idle root context", .timeLimit(.minutes(3)))
struct RootPassThroughTests {
    let directory: TemporaryDirectory
    let url: URL
    let stack: Skyros

    init() throws {
        directory = try TemporaryDirectory()
        url = directory.file("store.sqlite")
        stack = try Skyros(sqliteStack: testSchema, at: url)
        try stack.writeAndWait { context in makeUsers([("Ada", "Lovelace"), ("Alan", "Turing")], in: context) }
    }

    /// What the root holds as it came, looked at without applying it.
    func heldAsItCame() -> ChangeSet? {
        stack.rootContext.performSaveAndWait { stack.rootContext.passThrough?.changes }
    }

    /// Pushes a new user from the main context into the root (the first half of a save).
    func pushUser(_ first: String, _ last: String) throws {
        let main = stack.mainContext
        try main.performAndWait {
            makeUsers([(first, last)], in: main)
            try main.save()
        }
    }

    /// The users' first names and ages as another stack on the same file reads them.
    func stored() throws -> [String: Int] {
        let reader = try Skyros(sqliteStack: testSchema, at: url)
        var users: [String: Int] = [:]
        try reader.mainContext.performAndWait {
            for user in try User.all(in: reader.mainContext) { users[user.firstname] = user.age }
        }
        return users
    }

    func handle(_ handle: String, in context: ObjectContext) throws -> User {
        try #require(try User.first(where: #Predicate { $0.handle == handle }, in: context))
    }

    @Test("a write's inserts and updates reach the store through a root that holds nothing after")
    func writeThrough() throws {
        try stack.writeAndWait { context in
            makeUsers([("Grace", "Hopper")], in: context)
            try handle("ada-lovelace", in: context).age = 36
        }
        #expect(try stored() == ["Ada": 36, "Alan": 0, "Grace": 0])
        let root = stack.rootContext
        root.performAndWait {
            #expect(!root.hasChanges)
            #expect(root.registry.isEmpty)
        }
        // The update was made on version 1: the store has version 2.
        let id = try stack.mainContext.performAndWait { try handle("ada-lovelace", in: stack.mainContext).objectID }
        let store = try SQLiteStore(schema: testSchema, url: url)
        #expect(try store.snapshots(for: [id]).first?.version == 2)
    }

    @Test("pushed into the root, the change set is held as it came; a fetch on the root applies it first")
    func fetchInBetween() throws {
        try pushUser("Grace", "Hopper")
        let held = try #require(heldAsItCame())
        #expect(held.inserted.count == 1 && held.updated.isEmpty)
        let root = stack.rootContext
        // A fetch on the root sees the pending insert, as it did when the root applied it at once.
        let names = try root.performAndWait { try User.all(in: root).map(\.firstname).sorted() }
        #expect(names == ["Ada", "Alan", "Grace"])
        #expect(heldAsItCame() == nil)
        root.performAndWait { #expect(root.hasChanges) }
        try stack.saveMainContext()  // the main context has nothing: the root saves
        #expect(try stored().keys.sorted() == ["Ada", "Alan", "Grace"])
        root.performAndWait { #expect(!root.hasChanges) }
    }

    @Test("a second push applies the first: one save of the root stores both")
    func twoPushes() throws {
        try pushUser("Grace", "Hopper")
        #expect(heldAsItCame() != nil)
        try pushUser("Edsger", "Dijkstra")
        #expect(heldAsItCame() == nil)  // the root held something: the second is applied too
        stack.rootContext.performAndWait {
            #expect(stack.rootContext.insertedObjects.map(\.objectID.entityName) == ["User", "User"])
        }
        try stack.saveMainContext()
        #expect(try stored().keys.sorted() == ["Ada", "Alan", "Edsger", "Grace"])
    }

    @Test("a deletion is applied in the root, not held")
    func deletionApplied() throws {
        let main = stack.mainContext
        try main.performAndWait {
            try handle("alan-turing", in: main).delete(in: main)
            try main.save()
        }
        #expect(heldAsItCame() == nil)
        stack.rootContext.performSaveAndWait { #expect(stack.rootContext.deleted.count == 1) }
        try stack.saveMainContext()
        #expect(try stored() == ["Ada": 0])
    }

    @Test("an object updated in the write and deleted in the store meanwhile: its update is dropped, the rest is saved")
    func updatedObjectDeletedMeanwhile() throws {
        let other = try Skyros(sqliteStack: testSchema, at: url)
        try stack.writeAndWait { context in
            try handle("ada-lovelace", in: context).age = 36
            try handle("alan-turing", in: context).age = 41
            // Another stack deletes Ada before this write's save reaches the store.
            try other.writeAndWait { context in try handle("ada-lovelace", in: context).delete(in: context) }
        }
        #expect(try stored() == ["Alan": 41])
        stack.rootContext.performAndWait { #expect(!stack.rootContext.hasChanges) }
    }

    @Test("a change set the store refuses: the error is the write's, the root is left empty, the next write saves")
    func refusedByTheStore() throws {
        // The store's unique index refuses it (the contexts hold no other user with the handle).
        #expect {
            try stack.writeAndWait { context in makeUsers([("Ada", "Lovelace")], in: context) }
        } throws: { ($0 as? SkyrosError)?.code == .uniqueConstraintViolation }
        let root = stack.rootContext
        root.performSaveAndWait {
            #expect(root.passThrough == nil)
            #expect(!root.hasChanges)
        }
        try stack.writeAndWait { context in makeUsers([("Grace", "Hopper")], in: context) }
        #expect(try stored().keys.sorted() == ["Ada", "Alan", "Grace"])
    }

    @Test("a root that is observed or records undo applies the change set at once")
    func observedOrUndoApplies() throws {
        let root = stack.rootContext
        var observation: ContextChangeObservation? = root.addChangeObserver { _ in }
        try pushUser("Grace", "Hopper")
        #expect(heldAsItCame() == nil)
        try stack.saveMainContext()
        observation?.cancel()
        observation = nil

        root.undoManager = UndoManager()
        try pushUser("Edsger", "Dijkstra")
        #expect(heldAsItCame() == nil)
        try stack.saveMainContext()
        #expect(try stored().keys.sorted() == ["Ada", "Alan", "Edsger", "Grace"])
    }

    @Test("a save reentering the stack while the root's change set is on its way is stored too, and nothing is sent twice")
    func reentrantSave() throws {
        // What `RemoteStore.onSaveResolved` may do: save through the same stack, on the saving thread.
        let store = CallingBackStore(try SQLiteStore(schema: testSchema, url: directory.file("hook.sqlite")))
        let stack = Skyros(store: store, savesOnStop: false)
        try stack.writeAndWait { context in makeUsers([("Ada", "Lovelace")], in: context) }
        var innerError: (any Error)?
        store.once {
            do {
                try stack.writeAndWait { context in makeUsers([("Grace", "Hopper")], in: context) }
            } catch {
                innerError = error
            }
        }
        store.sent = []
        try stack.writeAndWait { context in try handle("ada-lovelace", in: context).age = 36 }
        #expect(innerError == nil)
        #expect(store.sent.map { [$0.inserted.count, $0.updated.count] } == [[0, 1], [1, 0]])
        let users = try stack.read { context in try User.all(in: context).map { "\($0.firstname) \($0.age)" }.sorted() }
        #expect(users == ["Ada 36", "Grace 0"])
        let reader = try SQLiteStore(schema: testSchema, url: directory.file("hook.sqlite"))
        #expect(try reader.count(StoreRequest(entityName: "User")) == 2)
    }

    @Test("an updated object the store no longer has costs one refused send, as without passing through")
    func missingObjectSends() throws {
        let store = CallingBackStore(try SQLiteStore(schema: testSchema, url: directory.file("hook.sqlite")))
        let stack = Skyros(store: store, savesOnStop: false)
        try stack.writeAndWait { context in makeUsers([("Ada", "Lovelace"), ("Alan", "Turing")], in: context) }
        store.sent = []
        try stack.writeAndWait { context in
            let ada = try handle("ada-lovelace", in: context)
            ada.age = 36
            try handle("alan-turing", in: context).age = 41
            var deletion = ChangeSet()
            deletion.deleted = [ada.objectID]
            try store.inner.save(deletion)  // behind the stack's back
        }
        // The refused change set, then the rest after one read of which objects exist.
        #expect(store.sent.map(\.updated.count) == [2, 1])
        let users = try stack.read { context in try User.all(in: context).map { "\($0.firstname) \($0.age)" } }
        #expect(users == ["Alan 41"])
    }
}

/// A SQLite store that records the change sets it is asked to save and, once, calls a
/// handler inside a save after writing it (as `RemoteStore` calls `onSaveResolved`).
private final class CallingBackStore: PersistentStore, @unchecked Sendable {
    let inner: SQLiteStore
    var sent: [ChangeSet] = []
    private var handler: (() -> Void)?

    init(_ inner: SQLiteStore) { self.inner = inner }

    func once(_ handler: @escaping () -> Void) { self.handler = handler }

    var schema: Schema { inner.schema }
    func fetchSnapshots(_ request: StoreRequest) throws -> [Snapshot] { try inner.fetchSnapshots(request) }
    func fetchIdentifiers(_ request: StoreRequest) throws -> [ObjectID] { try inner.fetchIdentifiers(request) }
    func count(_ request: StoreRequest) throws -> Int { try inner.count(request) }
    func snapshots(for ids: [ObjectID]) throws -> [Snapshot] { try inner.snapshots(for: ids) }
    func deleteAll() throws { try inner.deleteAll() }
    func save(_ changes: ChangeSet) throws {
        sent.append(changes)
        try inner.save(changes)
        if let handler {
            self.handler = nil
            handler()
        }
    }
}
