import Foundation
import SkyrosTestSupport
import Testing

@testable import Skyros

/// `fetch(_:batchSize:)`: a cursor over the store when nothing is pending, else batches of
/// identifiers; the same objects as `fetch(_:)` either way, and only a batch held at a time.
@Suite("Streaming fetch", .timeLimit(.minutes(3)))
struct StreamingFetchTests {
    /// 1,200 users, ages 0–59, lastnames of 7 letters.
    func fill(_ store: Skyros, count: Int = 1_200) throws {
        try store.writeAndWait { context in
            for index in 0..<count {
                let user = User.create(in: context)
                user.handle = String(format: "h%05d", index)
                user.age = index % 60
                user.lastname = String(UnicodeScalar(UInt8(65 + index % 7)))
                user.firstname = "f\(index % 13)"
                user.email = index % 5 == 0 ? nil : "u\(index)@example.com"
            }
        }
    }

    /// Runs `body` on the main context, its errors thrown (the chaining `read` would hand
    /// them to the stack's handler).
    func onMain(_ store: Skyros, _ body: (ObjectContext) throws -> Void) throws {
        let main = store.mainContext
        try main.performAndWait { try body(main) }
    }

    /// Descriptors with and without predicate, sort, limit and offset.
    func descriptors() -> [FetchDescriptor<User>] {
        var limited = FetchDescriptor<User>(
            predicate: #Predicate { $0.age >= 30 }, sortBy: [SortDescriptor(\.handle, order: .reverse)])
        limited.fetchLimit = 250
        limited.fetchOffset = 17
        return [
            FetchDescriptor<User>(),
            FetchDescriptor<User>(sortBy: [SortDescriptor(\.handle)]),
            FetchDescriptor<User>(
                predicate: #Predicate { $0.age < 20 && $0.email != nil },
                sortBy: [SortDescriptor(\.lastname), SortDescriptor(\.age, order: .reverse)]),
            limited,
            FetchDescriptor<User>(predicate: #Predicate { $0.age == 1_000 }),
        ]
    }

    /// What a user reads as, for comparing two fetches.
    func describe(_ user: User) -> String {
        "\(user.objectID.uuid) \(user.handle) \(user.age) \(user.lastname) \(user.firstname) \(user.email ?? "nil")"
    }

    /// Batch sizes: 5,000 and `.max` hold the whole result in one batch, grown past its first 1,024 objects.
    func expectSameAsFetch(_ context: ObjectContext, batchSizes: [Int] = [1, 7, 100, 5_000, .max]) throws {
        for descriptor in descriptors() {
            let expected = try context.fetch(descriptor).map(describe)
            for batchSize in batchSizes {
                let streamed = try context.fetch(descriptor, batchSize: batchSize).map(describe)
                #expect(streamed == expected, "batchSize \(batchSize)")
            }
        }
    }

    @Test("order and values equal fetch(_:), with and without pending changes", arguments: StoreKind.allCases)
    func sameAsFetch(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        try fill(stack.store)
        try onMain(stack.store) { context in
            try expectSameAsFetch(context)
            // Pending changes: an insert, an update (moving in and out of predicates and
            // sort positions), a delete.
            let inserted = User.create(in: context)
            inserted.handle = "h00003b"
            inserted.age = 5
            inserted.lastname = "C"
            inserted.email = "new@example.com"
            let all = try context.fetch(FetchDescriptor<User>(sortBy: [SortDescriptor(\.handle)]))
            all[10].age = 45
            all[10].handle = "z"
            context.delete(all[20])
            try expectSameAsFetch(context, batchSizes: [1, 100])
            context.rollback()
            try expectSameAsFetch(context, batchSizes: [100])
        }
    }

    @Test("a cursor when nothing is pending down to a store file; identifiers otherwise")
    func sources() throws {
        let stack = try TestStack(.sqlite)
        try fill(stack.store, count: 10)
        let main = stack.store.mainContext
        let scratch = ObjectContext(name: "scratch", parent: main)
        let request = StoreRequest(entityName: "User")
        func isCursor(_ context: ObjectContext) throws -> Bool {
            try context.performAndWait {
                if case .cursor = try context.batchSource(request) { return true }
                return false
            }
        }
        #expect(try isCursor(main))
        #expect(try isCursor(scratch))
        // A pending change of the entity in a parent: the child merges it, by identifier.
        main.performAndWait { User.create(in: main).handle = "pending" }
        #expect(try !isCursor(scratch))
        try scratch.performAndWait {
            let handles = try scratch.fetch(FetchDescriptor<User>(), batchSize: 3).map(\.handle)
            #expect(handles.count == 11 && handles.contains("pending"))
        }
        main.performAndWait { main.rollback() }
        #expect(try isCursor(scratch))
        // A pending change of another entity does not matter.
        main.performAndWait { Post.create(in: main).title = "p" }
        #expect(try isCursor(scratch))
        let memory = try TestStack(.inMemory)
        #expect(try !isCursor(memory.store.mainContext))
    }

    @Test("rows a child saved into a root that has not saved yet are merged")
    func pendingInRoot() throws {
        let directory = try TemporaryDirectory()
        let store = try SQLiteStore(schema: testSchema, url: directory.file("store.sqlite"))
        defer { try? store.close() }
        let root = ObjectContext(name: "root", parent: store)
        let main = ObjectContext(name: "main", parent: root)
        try main.performAndWait {
            for index in 0..<30 { User.create(in: main).handle = String(format: "h%03d", index) }
            try main.save()
        }
        try root.performAndWait { try root.save() }
        try main.performAndWait {
            for index in 30..<45 { User.create(in: main).handle = String(format: "h%03d", index) }
            try main.save()  // into root only
            let descriptor = FetchDescriptor<User>(sortBy: [SortDescriptor(\.handle, order: .reverse)])
            if case .cursor = try main.batchSource(try descriptor.storeRequest(schema: testSchema)) {
                Issue.record("a cursor despite the root's pending rows")
            }
            let streamed = try main.fetch(descriptor, batchSize: 4).map(\.handle)
            #expect(streamed == (0..<45).reversed().map { String(format: "h%03d", $0) })
        }
        try root.performAndWait { try root.save() }
        try main.performAndWait {
            let request = StoreRequest(entityName: "User")
            guard case .cursor = try main.batchSource(request) else {
                Issue.record("no cursor once everything is saved")
                return
            }
            #expect(try main.fetch(FetchDescriptor<User>(), batchSize: 7).map(\.handle).count == 45)
        }
    }

    @Test("leaving the loop early ends the statement; later writes and fetches work")
    func earlyBreak() throws {
        let stack = try TestStack(.sqlite)
        try fill(stack.store, count: 300)
        let sqlite = try #require(stack.store.store as? SQLiteStore)
        try onMain(stack.store) { context in
            var seen = 0
            for _ in try context.fetch(FetchDescriptor<User>(), batchSize: 10) {
                #expect(sqlite.cursorConnections.idleCount == 0)
                seen += 1
                if seen == 15 { break }
            }
            #expect(seen == 15)
            // The statement was reset and its connection given back.
            #expect(sqlite.cursorConnections.idleCount == 1)
            // A fetch that is never iterated gives its connection back too.
            _ = try context.fetch(FetchDescriptor<User>(), batchSize: 10)
            #expect(sqlite.cursorConnections.idleCount == 1)
        }
        try stack.store.writeAndWait { context in User.create(in: context).handle = "after" }
        try onMain(stack.store) { context in
            let count = try context.fetch(FetchDescriptor<User>(), batchSize: 1_000).reduce(0) { n, _ in n + 1 }
            #expect(count == 301)
        }
        // The cursor reads the store as it was when the fetch was made.
        try onMain(stack.store) { context in
            let results = try context.fetch(FetchDescriptor<User>(), batchSize: 50)
            try stack.store.writeAndWait { context in User.create(in: context).handle = "later" }
            #expect(results.reduce(0) { n, _ in n + 1 } == 301)
        }
        try sqlite.close()
        #expect(sqlite.cursorConnections.idleCount == 0)
    }

    @Test("objects of earlier batches leave the context unless held or changed; uniquing holds")
    func earlierBatchesReleased() throws {
        let stack = try TestStack(.sqlite)
        try fill(stack.store, count: 1_000)
        try onMain(stack.store) { context in
            context.reset()
            let descriptor = FetchDescriptor<User>(sortBy: [SortDescriptor(\.handle)])
            // Held before the fetch: the fetch gives the same instance.
            let early = try #require(
                try context.fetch(FetchDescriptor<User>(predicate: #Predicate { $0.handle == "h00500" })).first)
            weak var dropped: User?
            var kept: User?
            var changedID: ObjectID?
            var index = 0
            var maxRegistered = 0
            for user in try context.fetch(descriptor, batchSize: 50) {
                switch index {
                case 3: dropped = user
                case 7: kept = user
                case 11:
                    user.age = 1_234
                    changedID = user.objectID
                case 500: #expect(user === early)
                default: break
                }
                if index == 200 { #expect(dropped == nil) }
                maxRegistered = max(maxRegistered, context.registeredObjects.count)
                index += 1
            }
            #expect(index == 1_000)
            #expect(dropped == nil)
            #expect(maxRegistered <= 60)
            let keptUser = try #require(kept)
            #expect(context.object(with: keptUser.objectID) === keptUser)
            let id = try #require(changedID)
            let changed = try #require(context.object(with: id, as: User.self))
            #expect(changed.age == 1_234 && changed.hasChanges)
            context.rollback()
        }
    }

    @Test("a context holding nothing holds one batch at a time, and nothing after the loop")
    func nothingHeld() throws {
        let stack = try TestStack(.sqlite)
        try fill(stack.store, count: 500)
        try onMain(stack.store) { context in
            context.reset()
            for round in 0..<2 {
                var maxRegistered = 0
                var seen = 0
                for _ in try context.fetch(FetchDescriptor<User>(), batchSize: 50) {
                    maxRegistered = max(maxRegistered, context.registeredObjects.count)
                    seen += 1
                }
                #expect(seen == 500)
                #expect(maxRegistered == 50, "round \(round)")
                #expect(context.registeredObjects.isEmpty, "round \(round)")
            }
        }
    }

    @Test("the identifier form also releases earlier batches and keeps changed objects")
    func identifierFormReleases() throws {
        let stack = try TestStack(.inMemory)
        try fill(stack.store, count: 600)
        try onMain(stack.store) { context in
            context.reset()
            weak var dropped: User?
            var index = 0
            for user in try context.fetch(FetchDescriptor<User>(sortBy: [SortDescriptor(\.handle)]), batchSize: 40) {
                if index == 2 { dropped = user }
                if index == 5 { user.firstname = "changed" }
                if index == 100 { #expect(dropped == nil) }
                index += 1
            }
            #expect(index == 600)
            #expect(context.updatedObjects.count == 1)
            #expect(context.registeredObjects.count <= 41)
        }
    }
}
