import Foundation
import SkyrosTestSupport
import SkyrosWire
import Testing

@testable import Skyros
@testable import SkyrosShared

/// Another process's inserts merged into a main context nobody observes are kept as rows:
/// no object is made for them until someone asks, and asking costs no request to the daemon
/// (by identifier, through a relationship, from a scratch context); later merges keep the
/// rows current. A daemon in this process, two clients with their own connections.
@Suite("Merged rows of an unobserved main context", .timeLimit(.minutes(3)))
struct MergedRowsTests {
    /// A daemon in this process, client A, and client B built on a `RemoteStore` whose
    /// requests can be counted.
    func clients(_ running: RunningDaemon? = nil) throws -> (
        daemon: RunningDaemon, a: Skyros, b: Skyros, remote: RemoteStore
    ) {
        let daemon = try running ?? RunningDaemon()
        let a = try Skyros(sharedStack: testSchema, container: daemon.container.url)
        let remote = try RemoteStore(schema: testSchema, container: GroupContainer(url: daemon.container.url))
        return (daemon, a, Skyros(sharedStack: remote), remote)
    }

    @Test(
        "inserts merged as rows are read by ID, through a relationship and from a scratch context with no request; updates and deletes keep them current"
    )
    func rows() async throws {
        let (daemon, a, b, remote) = try clients()
        defer { withExtendedLifetime(daemon) {} }
        let changes = b.changes
        let main = b.mainContext
        /// The fetches and faults B has asked the daemon for.
        func reads() -> Int {
            let sent = remote.requestsSentForTesting
            return (sent[.snapshots] ?? 0) + (sent[.fetch] ?? 0) + (sent[.fetchIdentifiers] ?? 0)
        }

        let (userID, postID) = try await a.write { context in
            let user = User.create(in: context)
            user.firstname = "John"
            user.handle = "john"
            let post = Post.create(in: context)
            post.title = "hello"
            post.author = user
            return (user.objectID, post.objectID)
        }
        #expect(try #require(await nextChange(changes)).inserted.count == 2)
        let before = reads()
        main.performAndWait {
            #expect(main.mergedRows.count == 2)
            #expect(main.registry[userID] == nil && main.registry[postID] == nil)  // no object made
            // The post by ID, then its author through the relationship: both from the rows.
            let post = main.object(with: postID, as: Post.self)
            #expect(post?.title == "hello")
            #expect(post?.author?.firstname == "John")
            #expect(main.mergedRows.isEmpty)
        }
        #expect(reads() == before)

        // A row updated by a later merge, read from a scratch context (through the main context).
        let other = try await a.write { context in
            let user = User.create(in: context)
            user.firstname = "Ann"
            user.handle = "ann"
            return user.objectID
        }
        _ = try #require(await nextChange(changes))
        try await a.write { context in context.object(with: other, as: User.self)?.firstname = "Annie" }
        #expect(try #require(await nextChange(changes)).updated[other]?.properties == ["firstname"])
        main.performAndWait { #expect(main.mergedRows.peek(other) != nil) }
        var name: String?
        try b.writeAndWait { context in name = context.object(with: other, as: User.self)?.firstname }
        #expect(name == "Annie")
        #expect(reads() == before)

        // A deleted object's row goes: the main context no longer finds it.
        try await a.write { context in try context.delete(#require(context.object(with: other))) }
        #expect(try #require(await nextChange(changes)).deleted == [other])
        main.performAndWait {
            #expect(main.mergedRows.peek(other) == nil)
            #expect(main.object(with: other) == nil)
        }
    }

    /// A daemon, client A, and client B whose unobserved main context keeps A's new user as a row.
    func keptRow() async throws -> (RunningDaemon, Skyros, Skyros, RemoteStore, ObjectID) {
        let (daemon, a, b, remote) = try clients()
        let changes = b.changes
        let id = try await a.write { context in
            let user = User.create(in: context)
            user.handle = "counter"
            return user.objectID
        }
        _ = try #require(await nextChange(changes))
        b.mainContext.performAndWait { #expect(b.mainContext.mergedRows.peek(id) != nil) }
        return (daemon, a, b, remote, id)
    }

    /// The age of a user as the store has it, read by a third client.
    func storeAge(_ daemon: RunningDaemon, _ id: ObjectID) throws -> Int? {
        let c = try Skyros(sharedStack: testSchema, container: daemon.container.url)
        return c.mainContext.performAndWait { c.mainContext.object(with: id, as: User.self)?.age }
    }

    @Test(
        "two increments through scratch contexts of the process that keeps the row: none is lost, in the store or in the main context"
    )
    func noLostUpdate() async throws {
        let (daemon, a, b, remote, id) = try await keptRow()
        defer { withExtendedLifetime(a) {} }
        let before = remote.requestsSentForTesting[.snapshots] ?? 0
        try b.writeAndWait { context in context.object(with: id, as: User.self)!.age += 1 }
        // The main context takes the row as the object's state, and the root context, which
        // holds no copy, takes the main context's: nobody asks the daemon for it.
        #expect((remote.requestsSentForTesting[.snapshots] ?? 0) - before == 0)
        try b.writeAndWait { context in context.object(with: id, as: User.self)!.age += 1 }
        #expect(try storeAge(daemon, id) == 2)
        b.mainContext.performAndWait {
            #expect(b.mainContext.mergedRows.peek(id) == nil)
            #expect(b.mainContext.object(with: id, as: User.self)?.age == 2)
        }
    }

    @Test("an object kept as a row and deleted through a scratch context is gone from the main context")
    func deletedLocally() async throws {
        let (daemon, a, b, _, id) = try await keptRow()
        defer { withExtendedLifetime((daemon, a)) {} }
        try b.writeAndWait { context in context.delete(try #require(context.object(with: id))) }
        b.mainContext.performAndWait {
            #expect(b.mainContext.mergedRows.peek(id) == nil)
            #expect(b.mainContext.object(with: id) == nil)
        }
    }

    @Test(
        "fetched in the main context, updated, then dropped from its registry: read again, it has the update, not the old row"
    )
    func fetchedThenPruned() async throws {
        let (daemon, a, b, _, id) = try await keptRow()
        defer { withExtendedLifetime((daemon, a)) {} }
        let main = b.mainContext
        try main.performAndWait {
            _ = try User.all(in: main)
            #expect(main.mergedRows.peek(id) == nil)  // the fetched object took over
        }
        try b.writeAndWait { context in context.object(with: id, as: User.self)!.age = 5 }
        let age = main.performAndWait { () -> Int? in
            main.pruneRegistry()
            return main.object(with: id, as: User.self)?.age
        }
        #expect(age == 5)
    }

    @Test("batch update and delete by the process that keeps the row update it, then drop it")
    func batchOfThisProcess() async throws {
        let (daemon, a, b, _, id) = try await keptRow()
        defer { withExtendedLifetime((daemon, a)) {} }
        _ = try await b.batchUpdate(User.self, .set(\.age, to: 9))
        #expect(b.mainContext.performAndWait { b.mainContext.object(with: id, as: User.self)?.age } == 9)
        _ = try await b.batchDelete(User.self)
        #expect(b.mainContext.performAndWait { b.mainContext.object(with: id) } == nil)
    }

    @Test(
        "a handler set on RemoteStore.onChange is handed other processes' inserts with their values, and the main context keeps them encoded"
    )
    func publicHandlerGetsValues() async throws {
        let daemon = try RunningDaemon()
        defer { withExtendedLifetime(daemon) {} }
        let a = try Skyros(sharedStack: testSchema, container: daemon.container.url)
        let remote = try RemoteStore(schema: testSchema, container: GroupContainer(url: daemon.container.url))
        let (stream, continuation) = AsyncStream<StoreChange>.makeStream()
        remote.onChange = { changes in for change in changes { continuation.yield(change) } }
        let id = try await insertUser(handle: "zoe", into: a)
        let change = try #require(await nextChange(stream) { !$0.inserted.isEmpty })
        #expect(change.encodedInserted == nil)
        #expect(change.inserted.map(\.id) == [id])
        let handle = try #require(testSchema.entity(named: "User")?.properties.firstIndex { $0.name == "handle" })
        #expect(change.inserted.first?.values[handle] == .text("zoe"))

        // Through a stack: the row is kept as the event carried it, and reads back whole.
        let (_, _, b, _) = try clients(daemon)
        let changes = b.changes
        let other = try await insertUser(handle: "ann", into: a)
        #expect(
            try #require(await nextChange(changes) { $0.inserted.map(\.id) == [other] }).inserted.first?.values[handle]
                == .text("ann"))
        let main = b.mainContext
        main.performAndWait {
            #expect(main.mergedRows.isKeptEncoded(other))
            #expect(main.mergedRows.peek(other)?.values[handle] == .text("ann"))
            #expect(main.object(with: other, as: User.self)?.handle == "ann")
        }

        // An event message over 8 KiB is decoded whole: a row kept encoded would keep it alive.
        let long = String(repeating: "x", count: EncodedRows.maximumMessageBytes + 1)
        let large = try await a.write { context in
            let user = User.create(in: context)
            user.handle = "big"
            user.firstname = long
            return user.objectID
        }
        #expect(await nextChange(changes) { $0.inserted.map(\.id) == [large] } != nil)
        let firstname = try #require(testSchema.entity(named: "User")?.properties.firstIndex { $0.name == "firstname" })
        main.performAndWait {
            #expect(!main.mergedRows.isKeptEncoded(large))
            #expect(main.mergedRows.peek(large)?.values[firstname] == .text(long))
        }
    }

    @Test("an observed main context still makes the inserted objects (its observers are handed them)")
    func observed() async throws {
        let (daemon, a, b, _) = try clients()
        defer { withExtendedLifetime(daemon) {} }
        let changes = b.changes
        let main = b.mainContext
        let controller = FetchedResultsController<User>(
            fetch: FetchDescriptor<User>(sortBy: [SortDescriptor(\.handle)]), context: main)
        try main.performAndWait { try controller.performFetch() }
        let id = try await a.write { context in
            let user = User.create(in: context)
            user.handle = "seen"
            return user.objectID
        }
        _ = try #require(await nextChange(changes))
        main.performAndWait {
            #expect(main.mergedRows.isEmpty)
            #expect(main.registry[id] != nil)
            #expect(controller.fetchedObjects.map(\.handle) == ["seen"])
        }
    }

    @Test(
        "the context merges a change by itself, no daemon: a held object takes the new values, an insert stays a row, a delete is forgotten"
    )
    func contextMerge() async throws {
        let store = try Skyros(inMemoryStack: testSchema)
        let ids = try await store.write { context in
            makeUsers([("John", "Doe"), ("Ann", "Roe")], in: context)
            return try User.all(sortedBy: [SortDescriptor(\.firstname, order: .reverse)], in: context).map(\.objectID)
        }
        let (johnID, annID) = (ids[0], ids[1])
        let main = store.mainContext
        let firstname = try #require(testSchema.entity(named: "User")?.property(named: "firstname")).index
        main.performAndWait {
            guard let john = main.object(with: johnID, as: User.self), let ann = main.object(with: annID, as: User.self)
            else {
                Issue.record("the objects are not in the main context")
                return
            }
            #expect(john.firstname == "John" && !main.reference.isObserved)
            let newID = ObjectID(entityName: "User", uuid: UUID())
            main.merge([
                StoreChange(
                    sequence: 1, author: "elsewhere",
                    inserted: [Snapshot(id: newID, values: ann.skyrosStorage.values, version: 1)],
                    updated: [
                        johnID: StoreChange.Update(
                            properties: ["firstname"], version: 2, values: [firstname: .text("Johnny")])
                    ],
                    deleted: [annID])
            ])
            #expect(john.firstname == "Johnny" && john.skyrosStorage.version == 2)
            #expect(main.mergedRows.peek(newID)?.version == 1 && main.registry[newID] == nil)
            #expect(ann.isDeleted && main.registry[annID] == nil)
        }
    }

    @Test(
        "an update no newer than what the context holds is not taken back: a read that overtook the event, history sent again after a reconnect"
    )
    func olderUpdateNotTaken() async throws {
        let store = try Skyros(inMemoryStack: testSchema)
        let johnID = try await store.write { context in
            makeUsers([("John", "Doe")], in: context)
            return try #require(try User.first(in: context)).objectID
        }
        let main = store.mainContext
        let firstname = try #require(testSchema.entity(named: "User")?.property(named: "firstname")).index
        /// Another process's change of `id`'s first name, `version` its version after it.
        func update(_ name: String, version: Int64, of id: ObjectID? = nil) -> StoreChange {
            StoreChange(
                sequence: UInt64(version), author: "elsewhere",
                updated: [
                    id ?? johnID: StoreChange.Update(
                        properties: ["firstname"], version: version, values: [firstname: .text(name)])
                ])
        }
        main.performAndWait {
            guard let john = main.object(with: johnID, as: User.self) else {
                Issue.record("John is not in the main context")
                return
            }
            // Read at version 3 (the store's row), then the events of versions 2 and 3 come.
            main.merge([update("Johnny", version: 3)])
            #expect(john.firstname == "Johnny" && john.skyrosStorage.version == 3)
            main.merge([update("Jo", version: 2)])
            #expect(john.firstname == "Johnny" && john.skyrosStorage.version == 3)
            main.merge([update("Jo", version: 3)])
            #expect(john.firstname == "Johnny")
            main.merge([update("Jon", version: 4)])
            #expect(john.firstname == "Jon" && john.skyrosStorage.version == 4)
            // A version counted at this context's own save is no such evidence: another
            // process's change committed before the save, its event not merged yet, may carry
            // the same number (the campaign's main contexts kept such a value for good).
            john.lastname = "Mine"
            do { try main.save() } catch { Issue.record("the save failed: \(error)") }
            #expect(john.skyrosStorage.version == 5 && john.skyrosStorage.versionRead == 4)
            main.merge([update("Old", version: 4)])  // still older than what was read
            #expect(john.firstname == "Jon" && john.lastname == "Mine")
            main.merge([update("Other", version: 5)])
            #expect(john.firstname == "Other" && john.lastname == "Mine")
            #expect(john.skyrosStorage.version == 5 && john.skyrosStorage.versionRead == 5)
            main.merge([update("Jon", version: 4)])
            #expect(john.firstname == "Other")
            // The same for an object kept as a row (another process's insert nobody asked for).
            let newID = ObjectID(entityName: "User", uuid: UUID())
            let values = john.skyrosStorage.values
            main.merge([
                StoreChange(
                    sequence: 5, author: "elsewhere", inserted: [Snapshot(id: newID, values: values, version: 3)])
            ])
            main.merge([update("Old", version: 2, of: newID)])
            #expect(main.mergedRows.peek(newID)?.version == 3)
            #expect(main.mergedRows.peek(newID)?.values[firstname] == .text("Other"))
            main.merge([update("New", version: 4, of: newID)])
            #expect(main.mergedRows.peek(newID)?.values[firstname] == .text("New"))
        }
    }
}
