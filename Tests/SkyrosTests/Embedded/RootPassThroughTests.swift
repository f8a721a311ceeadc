import Foundation
import SkyrosTestSupport
import Testing

@testable import Skyros

/// A stack's main and root contexts, holding nothing, keep their child's change set as it came
/// and their save pushes or sends it, instead of making pending rows and objects of it only to
/// make the same change set again (see ``PassThrough``). Anything else that runs on them in
/// between applies it first. Real SQLite store, an embedded stack.
@Suite("A change set passing through an idle main or root context", .timeLimit(.minutes(3)))
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

    @Test(
        "a save reentering the stack while the root's change set is on its way is stored too, and nothing is sent twice"
    )
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

    // MARK: - The main context

    /// Saves `change` in a child of the main context: the first step of a write.
    func saveInChildOfMain(_ change: (ObjectContext) throws -> Void) throws {
        let child = ObjectContext(name: "child", parent: stack.mainContext)
        try child.performAndWait {
            try change(child)
            try child.save()
        }
    }

    func heldByMain() -> ChangeSet? {
        stack.mainContext.performSaveAndWait { stack.mainContext.passThrough?.changes }
    }

    @Test("a child's save into the main context is held as it came; a read of the main context applies it first")
    func mainHoldsAChildSave() throws {
        try saveInChildOfMain { makeUsers([("Grace", "Hopper")], in: $0) }
        #expect(heldByMain()?.inserted.count == 1)
        let names = try stack.read { context in try User.all(in: context).map(\.firstname).sorted() }
        #expect(names == ["Ada", "Alan", "Grace"])
        #expect(heldByMain() == nil)
        stack.mainContext.performAndWait { #expect(stack.mainContext.hasChanges) }
        try stack.saveMainContext()
        #expect(try stored().keys.sorted() == ["Ada", "Alan", "Grace"])
        stack.mainContext.performAndWait { #expect(!stack.mainContext.hasChanges) }
    }

    @Test("the main context's save pushes what it holds on to the root as it came; the root's save sends it")
    func throughBoth() throws {
        try saveInChildOfMain { try handle("alan-turing", in: $0).age = 41 }
        #expect(heldByMain()?.updated.count == 1)
        let main = stack.mainContext
        try main.performSaveAndWait { try main.save() }
        #expect(heldByMain() == nil)
        #expect(heldAsItCame()?.updated.count == 1)  // now in the root, as it came
        try stack.saveMainContext()
        #expect(try stored() == ["Ada": 0, "Alan": 41])
    }

    @Test("an update of an object the main context holds is applied there: what it holds shows it")
    func heldObjectTakesTheUpdate() throws {
        let main = stack.mainContext
        let ada = try main.performAndWait { try handle("ada-lovelace", in: main) }
        try saveInChildOfMain { try handle("ada-lovelace", in: $0).age = 36 }
        #expect(heldByMain() == nil)
        try stack.saveMainContext()  // no read in between
        main.performAndWait {
            #expect(ada.age == 36 && !ada.hasChanges)
            #expect(ada.skyrosStorage.version == 2)  // as the store has it: its next save is no conflict
        }
        #expect(try stored() == ["Ada": 36, "Alan": 0])
    }

    @Test("an update of an object the main context keeps as another process's row is applied: the row goes")
    func keptRowTakesTheUpdate() throws {
        let main = stack.mainContext
        let store = try SQLiteStore(schema: testSchema, url: url)
        let alanID = try main.performAndWait { try handle("alan-turing", in: main).objectID }
        let row = try #require(try store.snapshots(for: [alanID]).first)
        main.performAndWait {
            main.reset()  // Alan is no longer held, only kept as a row (as a merge keeps other processes' inserts)
            main.mergedRows.insert(alanID, values: row.values, version: row.version)
            #expect(main.mergedRows.contains(alanID))
        }
        try saveInChildOfMain { try handle("alan-turing", in: $0).age = 41 }
        #expect(heldByMain() == nil)
        try stack.saveMainContext()
        main.performAndWait { #expect(!main.mergedRows.contains(alanID)) }
        let age = try stack.read { context in try handle("alan-turing", in: context).age }
        #expect(age == 41)
    }

    @Test("a change of a required to-one is applied: the main context's validation takes the new target, as it did")
    func requiredToOneApplied() throws {
        try stack.writeAndWait { context in
            let team = Team.create(in: context)
            team.name = "Analytical"
            Badge.create(in: context).team = team
        }
        var newTeam: ObjectID?
        try saveInChildOfMain { context in
            let team = Team.create(in: context)
            team.name = "Difference"
            try #require(try Badge.first(in: context)).team = team
            newTeam = team.objectID
        }
        #expect(heldByMain() == nil)
        try stack.saveMainContext()
        let main = stack.mainContext
        let id = try #require(newTeam)
        // Held by the main context after the save, where other processes' changes reach it.
        main.performAndWait { #expect(main.registry[id] != nil) }
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
