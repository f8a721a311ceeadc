import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// Batch update and delete (issue 18, DESIGN §7): one statement, no object loaded, delete
/// rules held, the main context and its observers told once.
@Suite("Batch update and delete", .timeLimit(.minutes(3)))
struct BatchOperationTests {
    static let kinds: [StoreKind] = [.inMemory, .sqlite, .shared]

    func users(_ store: Skyros) throws {
        try store.writeAndWait { context in
            for index in 0..<10 {
                let user = User.create(in: context)
                user.firstname = "u\(index)"
                user.age = index * 10
                user.handle = "h\(index)"
                for post in 0..<2 {
                    let item = Post.create(in: context)
                    item.title = "p\(index)-\(post)"
                    item.author = user
                }
            }
        }
    }

    @Test(
        "batchUpdate sets attributes of the selected objects; held objects take the values; one observer change",
        arguments: kinds)
    func update(kind: StoreKind) async throws {
        let stack = try TestStack(kind)
        let store = stack.store
        try users(store)
        let main = store.mainContext
        let held = try main.performAndWait { try User.first(where: #Predicate { $0.age == 70 }, in: main)! }
        let monitor = EntityMonitor<User>(context: main, frequency: .onSave)
        final class Calls: @unchecked Sendable { var changes: [EntityMonitorChange<User>] = [] }
        let calls = Calls()
        monitor.onChange = { calls.changes.append($0) }
        let changed = try await store.batchUpdate(
            User.self, where: #Predicate { $0.age > 50 }, .set(\.lastname, to: "Senior"),
            .set(\.email, to: "old@example.com"))
        #expect(changed == 4)
        try main.performAndWait { () throws in
            let context = main
            #expect(try User.count(where: #Predicate { $0.lastname == "Senior" }, in: context) == 4)
            #expect(try User.count(where: #Predicate { $0.email == "old@example.com" }, in: context) == 4)
            #expect(held.lastname == "Senior")  // the held object took the new value
            #expect(calls.changes.count == 1 && calls.changes[0].updated.count == 4)
        }
        // Nothing selected: nothing changed, no call.
        #expect(
            try await store.batchUpdate(User.self, where: #Predicate { $0.age > 1_000 }, .set(\.lastname, to: "x")) == 0
        )
        main.performAndWait { #expect(calls.changes.count == 1) }
        // A unique attribute set twice: refused, nothing updated.
        await #expect(throws: SkyrosError.self) {
            try await store.batchUpdate(User.self, where: #Predicate { $0.age < 30 }, .set(\.handle, to: "same"))
        }
        try main.performAndWait { () throws in
            let context = main
            #expect(try User.count(where: #Predicate { $0.handle == "same" }, in: context) == 0)
        }
    }

    @Test(
        "batchDelete deletes the selected objects, cascades, nullifies, and refuses a deny; held objects read as deleted",
        arguments: kinds)
    func delete(kind: StoreKind) async throws {
        let stack = try TestStack(kind)
        let store = stack.store
        try users(store)
        let main = store.mainContext
        let held = try main.performAndWait { try User.first(where: #Predicate { $0.age == 0 }, in: main)! }
        let controller = FetchedResultsController<User>(
            fetch: FetchDescriptor(sortBy: [SortDescriptor(\.age)]), context: store.mainContext)
        final class Calls: @unchecked Sendable { var count = 0 }
        let calls = Calls()
        controller.onChange = { _ in calls.count += 1 }
        try controller.performFetch()
        let removed = try await store.batchDelete(User.self, where: #Predicate { $0.age < 30 })
        #expect(removed == 3)
        try main.performAndWait { () throws in
            let context = main
            #expect(try User.count(in: context) == 7)
            #expect(try Post.count(in: context) == 14)  // cascade: their 6 posts went with them
            #expect(held.isDeleted)
            #expect(calls.count == 1 && controller.fetchedObjects.count == 7)
        }
        // Nullify: players keep existing, without their team. Deny: a team with badges stays.
        try store.writeAndWait { context in
            let open = Team.create(in: context)
            open.name = "open"
            for name in ["a", "b"] {
                let player = Player.create(in: context)
                player.name = name
                player.team = open
            }
            let guarded = Team.create(in: context)
            guarded.name = "guarded"
            let badge = Badge.create(in: context)
            badge.label = "gold"
            badge.team = guarded
        }
        #expect(try await store.batchDelete(Team.self, where: #Predicate { $0.name == "open" }) == 1)
        try main.performAndWait { () throws in
            let context = main
            #expect(try Player.count(in: context) == 2)
            #expect(try Player.all(in: context).allSatisfy { $0.team == nil })
        }
        let denied = await #expect(throws: SkyrosError.self) {
            try await store.batchDelete(Team.self)
        }
        #expect(
            denied?.code == .deleteDenied && denied?.message.contains("Team.badges") == true,
            "\(String(describing: denied))")
        try main.performAndWait { () throws in #expect(try Team.count(in: main) == 1) }
    }

    @Test("an entity nothing refers to is deleted by one statement; held objects read as deleted", arguments: kinds)
    func unreferenced(kind: StoreKind) async throws {
        let stack = try TestStack(kind)
        let store = stack.store
        try store.writeAndWait { context in
            for index in 0..<20 { Tag.create(in: context).label = "t\(index)" }
        }
        let main = store.mainContext
        let held = try main.performAndWait { try Tag.first(where: #Predicate { $0.label == "t3" }, in: main)! }
        #expect(try await store.batchDelete(Tag.self, where: #Predicate { $0.label < "t2" }) == 12)  // t0, t1, t10…t19
        try main.performAndWait { () throws in
            #expect(try Tag.count(in: main) == 8)
            #expect(!held.isDeleted)
        }
        #expect(try await store.batchDelete(Tag.self) == 8)
        main.performAndWait { #expect(held.isDeleted) }
    }

    @Test(
        "without observers only the held objects are named: they take the new values, the count is right",
        arguments: kinds)
    func updateWithoutObservers(kind: StoreKind) async throws {
        let stack = try TestStack(kind)
        let store = stack.store
        try users(store)
        let main = store.mainContext
        let held = try main.performAndWait { try User.first(where: #Predicate { $0.age == 90 }, in: main)! }
        let untouched = try main.performAndWait { try User.first(where: #Predicate { $0.age == 10 }, in: main)! }
        #expect(
            try await store.batchUpdate(User.self, where: #Predicate { $0.age >= 50 }, .set(\.lastname, to: "Held"))
                == 5)
        try main.performAndWait { () throws in
            #expect(held.lastname == "Held" && untouched.lastname == "")
            #expect(try User.count(where: #Predicate { $0.lastname == "Held" }, in: main) == 5)
        }
        // A held object updated again keeps counting versions: a later save of it is not a conflict.
        try store.writeAndWait { context in (context.object(with: held.objectID) as! User).firstname = "again" }
        try main.performAndWait { () throws in
            #expect(try User.first(where: #Predicate { $0.firstname == "again" }, in: main)?.lastname == "Held")
        }
    }

    @Test(
        "deleteAll(in:) deletes by identifier without reading values, pending inserts included; with relationships the rules hold",
        arguments: kinds)
    func deleteAllInContext(kind: StoreKind) async throws {
        let stack = try TestStack(kind)
        let store = stack.store
        try store.writeAndWait { context in
            for index in 0..<50 { Tag.create(in: context).label = "t\(index)" }
        }
        try users(store)
        let held = try store.mainContext.performAndWait { try Tag.first(in: store.mainContext)! }
        let pending = try await store.write { context in
            Tag.create(in: context).label = "new"
            try Tag.deleteAll(in: context)
            // Nothing of the stored tags was read: they are deleted as faults.
            let deleted = context.deletedObjects
            #expect(deleted.count == 50 && deleted.allSatisfy { $0.isFault && $0.isDeleted })
            #expect(try Tag.count(in: context) == 0 && context.insertedObjects.isEmpty)
            try User.deleteAll(in: context)  // relationships: cascade to the posts
            return context.deletedObjects.count
        }
        #expect(pending == 50 + 10 + 20)
        let counts = try await store.read { context in
            [try Tag.count(in: context), try User.count(in: context), try Post.count(in: context)]
        }
        #expect(counts == [0, 0, 0])
        store.mainContext.performAndWait { #expect(held.isDeleted) }
    }
}
