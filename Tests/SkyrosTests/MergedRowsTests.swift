import Foundation
@testable import Skyros
@testable import SkyrosShared
import SkyrosTestModels
import SkyrosWire
import Testing

/// Another process's inserts merged into a main context nobody observes are kept as rows:
/// no object is made for them until someone asks, and asking costs no request to the daemon
/// (by identifier, through a relationship, from a scratch context); later merges keep the
/// rows current. A daemon in this process, two clients with their own connections.
@Suite("Merged rows of an unobserved main context", .timeLimit(.minutes(1)))
struct MergedRowsTests {
    @Test("inserts merged as rows are read by ID, through a relationship and from a scratch context with no request; updates and deletes keep them current")
    func rows() async throws {
        let daemon = try RunningDaemon()
        let a = try Skyros(sharedStack: testSchema, container: daemon.container.url)
        let remote = try RemoteStore(schema: testSchema, container: GroupContainer(url: daemon.container.url))
        let b = Skyros(sharedStack: remote)
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
        #expect(try #require(await nextChange(changes)).updated[other] == ["firstname"])
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

    @Test("an observed main context still makes the inserted objects (its observers are handed them)")
    func observed() async throws {
        let daemon = try RunningDaemon()
        let a = try Skyros(sharedStack: testSchema, container: daemon.container.url)
        let b = try Skyros(sharedStack: testSchema, container: daemon.container.url)
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
}
