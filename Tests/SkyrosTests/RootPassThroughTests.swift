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
}
