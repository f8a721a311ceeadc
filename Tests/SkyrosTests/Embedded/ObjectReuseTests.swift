import Foundation
import SkyrosTestSupport
import Testing

@testable import Skyros

/// A batched fetch over a store file reuses the objects of a released batch that nothing
/// references for its next rows (``ObjectReuse``): an object someone holds — strongly,
/// weakly — or that has changes is never reused; a class with a stored property of its own
/// (`@Transient`) is never reused; every row reads as itself.
@Suite("Object reuse in batched fetches", .timeLimit(.minutes(2)))
struct ObjectReuseTests {
    /// 1,000 posts, titles p0000…p0999, scores 0…999.
    func fill(_ store: Skyros, count: Int = 1_000) throws {
        try store.writeAndWait { context in
            for index in 0..<count {
                let post = Post.create(in: context)
                post.title = String(format: "p%04d", index)
                post.score = Double(index)
            }
        }
    }

    func onMain(_ store: Skyros, _ body: (ObjectContext) throws -> Void) throws {
        let main = store.mainContext
        try main.performAndWait { try body(main) }
    }

    @Test(
        "a context holding nothing reuses the objects of released batches; every row reads as itself; a weakly held object is never another row's"
    )
    func nothingHeldReuses() throws {
        let stack = try TestStack(.sqlite)
        try fill(stack.store)
        try onMain(stack.store) { context in
            context.reset()
            var iterator = try context.fetch(FetchDescriptor<Post>(sortBy: [SortDescriptor(\.title)]), batchSize: 50)
                .makeIterator()
            var ids = Set<ObjectID>()
            weak var weaklyHeld: Post?
            var weakID: ObjectID?
            var index = 0
            while let post = iterator.next() {
                #expect(post.title == String(format: "p%04d", index) && post.score == Double(index), "row \(index)")
                #expect(!post.hasChanges && !post.isFault)
                if index == 700 { #expect(context.object(with: post.objectID) === post) }  // that batch is released by identifier
                ids.insert(post.objectID)
                if index == 5 {
                    weaklyHeld = post
                    weakID = post.objectID
                }
                if let weaklyHeld {
                    #expect(
                        weaklyHeld.objectID == weakID && weaklyHeld.title == "p0005",
                        "a weakly held object became another row's")
                }
                index += 1
            }
            #expect(index == 1_000 && ids.count == 1_000)
            #expect(weaklyHeld == nil)
            #expect(iterator.state.reuses == true)
            #expect(iterator.state.reused >= 850, "only \(iterator.state.reused) rows reused an object")
            #expect(context.registeredObjects.isEmpty)
        }
    }

    @Test("held and changed objects keep their identity and values; the save writes the one change")
    func heldObjectsKept() throws {
        let stack = try TestStack(.sqlite)
        try fill(stack.store)
        try onMain(stack.store) { context in
            context.reset()
            var kept: Post?
            var changedID: ObjectID?
            var index = 0
            for post in try context.fetch(FetchDescriptor<Post>(sortBy: [SortDescriptor(\.title)]), batchSize: 50) {
                #expect(post.title == String(format: "p%04d", index) && post.score == Double(index), "row \(index)")
                switch index {
                case 3: kept = post
                case 11:
                    post.score = -1
                    changedID = post.objectID
                default: break
                }
                if let kept { #expect(kept.title == "p0003" && kept.score == 3) }
                index += 1
            }
            #expect(index == 1_000)
            let keptPost = try #require(kept)
            #expect(context.object(with: keptPost.objectID) === keptPost)
            let id = try #require(changedID)
            let changed = try #require(context.object(with: id, as: Post.self))
            #expect(changed.score == -1 && changed.hasChanges && changed.title == "p0011")
            try context.save()
            let all = try context.fetch(FetchDescriptor<Post>(sortBy: [SortDescriptor(\.title)]))
            #expect(all.count == 1_000)
            for (position, post) in all.enumerated() {
                #expect(post.title == String(format: "p%04d", position))
                #expect(post.score == (position == 11 ? -1 : Double(position)))
            }
        }
    }

    @Test("a lookup by identifier during the iteration (the registry indexed) leaves every row right")
    func lookupDuringIteration() throws {
        let stack = try TestStack(.sqlite)
        try fill(stack.store)
        try onMain(stack.store) { context in
            context.reset()
            let firstID = try #require(
                try context.fetch(FetchDescriptor<Post>(predicate: #Predicate { $0.title == "p0000" })).first?.objectID)
            var index = 0
            var previous: ObjectID?
            for post in try context.fetch(FetchDescriptor<Post>(sortBy: [SortDescriptor(\.title)]), batchSize: 40) {
                #expect(post.title == String(format: "p%04d", index) && post.score == Double(index), "row \(index)")
                if index % 33 == 0 {
                    // Indexes the registry: the batch is released by identifier.
                    #expect(context.object(with: firstID, as: Post.self)?.title == "p0000")
                    if let previous {
                        #expect(context.object(with: previous, as: Post.self)?.score == Double(index - 1))
                    }
                }
                previous = post.objectID
                index += 1
            }
            #expect(index == 1_000)
            #expect(context.registeredObjects.count <= 41)
        }
    }

    @Test("a class with a stored property of its own (@Transient) is never reused")
    func transientNotReused() throws {
        let stack = try TestStack(.sqlite)
        try stack.store.writeAndWait { context in
            for index in 0..<300 {
                let user = User.create(in: context)
                user.handle = "u\(index)"
            }
        }
        try onMain(stack.store) { context in
            context.reset()
            var iterator = try context.fetch(FetchDescriptor<User>(), batchSize: 25).makeIterator()
            var seen = 0
            while let user = iterator.next() {
                #expect(user.scratchNote == "not stored", "a user carried another row's transient value")
                user.scratchNote = "used"
                seen += 1
            }
            #expect(seen == 300)
            #expect(iterator.state.reuses == false && iterator.state.reused == 0)
        }
    }

    /// 30 posts and 30 players.
    func fillTwoEntities(_ store: Skyros) throws {
        try store.writeAndWait { context in
            for index in 0..<30 {
                Post.create(in: context).title = "p\(index)"
                Player.create(in: context).name = "n\(index)"
            }
        }
    }

    @Test(
        "a batched fetch of another entity after one that reused objects (ended or left early) makes its own class's objects"
    )
    func anotherEntityAfterwards() throws {
        let stack = try TestStack(.sqlite)
        try fillTwoEntities(stack.store)
        try onMain(stack.store) { context in
            var posts = 0
            for post in try context.fetch(FetchDescriptor<Post>(), batchSize: 10) where post.title.hasPrefix("p") {
                posts += 1
            }
            #expect(posts == 30)
            #expect(context.registry.spareCount == 0, "spares outlived their iteration")
            for _ in try context.fetch(FetchDescriptor<Post>(), batchSize: 10).prefix(15) {}  // left early
            #expect(context.registry.spareCount == 0)
            var iterator = try context.fetch(FetchDescriptor<Player>(sortBy: [SortDescriptor(\.name)]), batchSize: 10)
                .makeIterator()
            var names: [String] = []
            while let player = iterator.next() {
                #expect(type(of: player as AnyObject) == Player.self && player.objectID.entityName == "Player")
                names.append(player.name)
            }
            #expect(names == (0..<30).map { "n\($0)" }.sorted())
            #expect(iterator.state.reused >= 10)
        }
    }

    @Test("a reset and a fetch of another entity inside the loop: the rows stay the fetched entity's")
    func resetAndNestedFetch() throws {
        let stack = try TestStack(.sqlite)
        try fillTwoEntities(stack.store)
        try onMain(stack.store) { context in
            var iterator = try context.fetch(FetchDescriptor<Post>(sortBy: [SortDescriptor(\.title)]), batchSize: 10)
                .makeIterator()
            var titles: [String] = []
            while let post = iterator.next() {
                #expect(type(of: post as AnyObject) == Post.self && post.objectID.entityName == "Post")
                titles.append(post.title)
                if titles.count == 1 || titles.count == 15 {
                    context.reset()
                    #expect(try context.fetch(FetchDescriptor<Player>()).count == 30)
                }
                if titles.count == 22 {
                    #expect(try context.fetch(FetchDescriptor<Player>()).allSatisfy { $0.name.hasPrefix("n") })
                }
            }
            #expect(titles == (0..<30).map { "p\($0)" }.sorted())
        }
    }

    @Test("an object whose storage alone is held is never reused")
    func storageHeld() throws {
        let stack = try TestStack(.sqlite)
        try fill(stack.store, count: 300)
        try onMain(stack.store) { context in
            var storage: ObjectStorage?
            var heldID: ObjectID?
            var iterator = try context.fetch(FetchDescriptor<Post>(sortBy: [SortDescriptor(\.title)]), batchSize: 20)
                .makeIterator()
            var index = 0
            while let post = iterator.next() {
                if index == 4 {
                    storage = post.skyrosStorage
                    heldID = post.objectID
                }
                if let storage { #expect(storage.objectID == heldID, "row \(index) took the storage of a held object") }
                index += 1
            }
            #expect(index == 300 && iterator.state.reused >= 200)
            #expect(storage?.objectID == heldID)
        }
    }

    @Test("the reference count word is read as the Swift runtime lays it out")
    func referenceCountWord() {
        final class Probe {}
        func isSole(_ reference: inout Probe?) -> Bool {
            withUnsafePointer(to: &reference) { ObjectReuse.isSoleReference(at: $0) }
        }
        var strong: Probe? = Probe()
        #expect(isSole(&strong))
        var second = strong
        #expect(!isSole(&strong))
        second = nil
        #expect(isSole(&strong) && second == nil)
        weak let weak = strong
        #expect(!isSole(&strong), "a weak reference makes a side table")
        strong = nil
        #expect(weak == nil)
        var none: Probe? = nil
        #expect(!isSole(&none))
    }
}
