import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// The behaviour every store must have: the same tests run against each.
@Suite("Conformance", .timeLimit(.minutes(3)))
struct ConformanceTests {
    @Test(
        "a sync refusal told before any error handler was set reaches the handler once set; other errors are not held"
    )
    func refusalsWaitForTheHandler() async throws {
        // A shared stack tells outstanding refusals as soon as it is made, before the line
        // after `init` sets a handler: CI saw the refusal go to no handler (2026-11-29).
        let store = try Skyros(inMemoryStack: testSchema)
        let refusal = SyncRejection(number: 7, date: Date(), reason: "taken", objectIDs: []).error
        store.handleError(SkyrosError(.storeFailure, "not held"))
        store.handleError(refusal)
        let told = Locked<[SkyrosError]>([])
        let delivered = DispatchSemaphore(value: 0)
        store.errorHandler = { error in
            told.withValue { $0.append(error) }
            delivered.signal()
        }
        #expect(delivered.wait(timeout: .now() + 10) == .success)
        #expect(told.value.map(\.rejectionNumber) == [7])
        // Told once: a handler set again gets nothing more.
        store.errorHandler = { error in told.withValue { $0.append(error) } }
        store.completionQueue.sync {}
        #expect(told.value.count == 1)
    }

    @Test("creating one object takes the count from 0 to 1", arguments: StoreKind.allCases)
    func createOne(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var before = -1
        var after = -1
        stack.store.read { before = try User.count(in: $0) }
            .writeSync { _ = User.create(in: $0) }
            .read { after = try User.count(in: $0) }
        #expect(before == 0)
        #expect(after == 1)
    }

    @Test("two created then one deleted in a later write leaves 1", arguments: StoreKind.allCases)
    func createTwoDeleteOneLater(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var count = -1
        stack.store.writeSync { makeUsers([("A", "X"), ("B", "Y")], in: $0) }
            .writeSync { context in try User.first(in: context)!.delete(in: context) }
            .read { count = try User.count(in: $0) }
        #expect(count == 1)
    }

    @Test("two created and one deleted in the same write leaves 1", arguments: StoreKind.allCases)
    func createTwoDeleteOneSameWrite(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var count = -1
        stack.store.writeSync { context in
            let a = User.create(in: context)
            a.handle = "a"
            let b = User.create(in: context)
            b.handle = "b"
            b.delete(in: context)
        }.read { count = try User.count(in: $0) }
        #expect(count == 1)
    }

    @Test("deleteAll of 2 leaves 0; count is 2 before, 1 with a predicate", arguments: StoreKind.allCases)
    func deleteAllAndCounts(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var total = -1
        var does = -1
        var after = -1
        stack.store.writeSync { makeUsers([("John", "Doe"), ("Mark", "Smith")], in: $0) }
            .read { context in
                total = try User.count(in: context)
                does = try User.count(where: #Predicate { $0.lastname == "Doe" }, in: context)
            }
            .writeSync { try User.deleteAll(in: $0) }
            .read { after = try User.count(in: $0) }
        #expect(total == 2)
        #expect(does == 1)
        #expect(after == 0)
    }

    @Test("all, sorted ascending and descending; first found and not found", arguments: StoreKind.allCases)
    func allAndFirst(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var ascending: [String] = []
        var descending: [String] = []
        var firstDoe: User?
        var firstNobody: User?
        stack.store.writeSync { makeUsers([("John", "Doe"), ("Jane", "Doe"), ("Mark", "Smith")], in: $0) }
            .read { context in
                ascending = try User.all(
                    where: #Predicate { $0.lastname == "Doe" }, sortedBy: [SortDescriptor(\.firstname)], in: context
                ).map(\.firstname)
                descending = try User.all(
                    where: #Predicate { $0.lastname == "Doe" },
                    sortedBy: [SortDescriptor(\.firstname, order: .reverse)], in: context
                ).map(\.firstname)
                firstDoe = try User.first(where: #Predicate { $0.lastname == "Doe" }, in: context)
                firstNobody = try User.first(where: #Predicate { $0.lastname == "Nobody" }, in: context)
            }
        #expect(ascending == ["Jane", "John"])
        #expect(descending == ["John", "Jane"])
        #expect(firstDoe != nil)
        #expect(firstNobody == nil)
    }

    @Test("chaining: create 2, delete 1 through inContext, read 1", arguments: StoreKind.allCases)
    func chaining(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var created: [User] = []
        var count = -1
        stack.store.writeSync { context in
            makeUsers([("A", "X"), ("B", "Y")], in: context)
        }.read { context in
            created = try User.all(in: context)
        }.writeSync { context in
            created[0].inContext(context)!.delete(in: context)
        }.read { context in
            count = try User.count(in: context)
        }
        #expect(created.count == 2)
        #expect(count == 1)
    }

    @Test("five chained steps run in order", arguments: StoreKind.allCases)
    func ordering(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var steps: [Int] = []
        stack.store.writeSync { _ in steps.append(1) }
            .read { _ in steps.append(2) }
            .writeSync { _ in steps.append(3) }
            .read { _ in steps.append(4) }
            .writeSync { _ in steps.append(5) }
        #expect(steps == [1, 2, 3, 4, 5])
    }

    @Test(
        "writeSync runs its block before returning; the completion comes later, once, with nil",
        arguments: StoreKind.allCases)
    func writeSyncThenCompletion(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        let probe = CompletionProbe()
        var ran = false
        var seen = -1
        stack.store.writeSync(
            { context in
                ran = true
                makeUsers([("A", "X")], in: context)
            }, completion: probe.completion)
        #expect(ran)
        stack.store.read { seen = try User.count(in: $0) }
        #expect(seen == 1)
        #expect(probe.wait())
        #expect(probe.calls.count == 1)
        #expect(probe.calls.first! == nil)
        #expect(!probe.wait(seconds: 0.2), "the completion must be called exactly once")
        if let url = stack.url {
            // The data is in the file: an independent stack sees it.
            let other = try Skyros(sqliteStack: testSchema, at: url)
            var count = -1
            other.read { count = try User.count(in: $0) }
            #expect(count == 1)
        }
    }

    @Test(
        "a write block that throws saves nothing; completion and handleError get the error",
        arguments: StoreKind.allCases)
    func throwingWrite(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        let recorder = ErrorRecorder()
        stack.store.errorHandler = { recorder.record($0) }
        let probe = CompletionProbe()
        stack.store.writeSync(
            { context in
                makeUsers([("A", "X"), ("B", "Y")], in: context)
                throw TestFailure(reason: "boom")
            }, completion: probe.completion)
        #expect(probe.wait())
        let error = try #require(probe.calls.first ?? nil)
        #expect(error.code == .blockFailed)
        #expect(error.underlyingError as? TestFailure == TestFailure(reason: "boom"))
        #expect(recorder.errors.map(\.code) == [.blockFailed])
        var count = -1
        stack.store.read { count = try User.count(in: $0) }
        #expect(count == 0)
        // The next write works and does not see the discarded objects.
        stack.store.writeSync { makeUsers([("C", "Z")], in: $0) }.read { count = try User.count(in: $0) }
        #expect(count == 1)
    }

    @Test("a fetch inside a write sees pending inserts and deletions; count agrees", arguments: StoreKind.allCases)
    func pendingChanges(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var matching: [String] = []
        var afterDelete: [String] = []
        var counts: [Int] = []
        stack.store.writeSync { makeUsers([("Saved", "Doe")], in: $0) }
        stack.store.writeSync { context in
            makeUsers([("John", "Doe"), ("Jane", "Doe"), ("Mark", "Smith")], in: context)
            let does = #Predicate<User> { $0.lastname == "Doe" }
            matching = try User.all(where: does, sortedBy: [SortDescriptor(\.firstname)], in: context).map(\.firstname)
            counts.append(try User.count(where: does, in: context))
            try User.first(where: #Predicate { $0.firstname == "John" }, in: context)!.delete(in: context)
            afterDelete = try User.all(where: does, sortedBy: [SortDescriptor(\.firstname)], in: context).map(
                \.firstname)
            counts.append(try User.count(where: does, in: context))
            // A pending update is matched on its new value.
            try User.first(where: #Predicate { $0.firstname == "Saved" }, in: context)!.lastname = "Renamed"
            counts.append(try User.count(where: does, in: context))
            counts.append(try User.count(where: #Predicate { $0.lastname == "Renamed" }, in: context))
        }
        #expect(matching == ["Jane", "John", "Saved"])
        #expect(afterDelete == ["Jane", "Saved"])
        #expect(counts == [3, 2, 1, 1])
    }

    @Test("inverse relationships are set at once, before any save", arguments: StoreKind.allCases)
    func inverseImmediately(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var titles: [String] = []
        var authorAfterMove: String?
        var left: [String] = []
        stack.store.writeSync { context in
            let john = User.create(in: context)
            john.handle = "john"
            let jane = User.create(in: context)
            jane.handle = "jane"
            let post = Post.create(in: context)
            post.title = "hello"
            post.author = john
            titles = john.posts.map(\.title)
            jane.posts = [post]
            authorAfterMove = post.author?.handle
            left = john.posts.map(\.title)
        }
        #expect(titles == ["hello"])
        #expect(authorAfterMove == "jane")
        #expect(left == [])
    }

    @Test("one-to-one inverses stay in sync on both sides, before and after a save", arguments: StoreKind.allCases)
    func oneToOne(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var pending: [String?] = []
        var saved: [String?] = []
        stack.store.writeSync { context in
            let ann = Person.create(in: context)
            ann.name = "Ann"
            let bob = Person.create(in: context)
            bob.name = "Bob"
            let passport = Passport.create(in: context)
            passport.number = "P1"
            ann.passport = passport
            pending.append(passport.holder?.name)  // "Ann"
            passport.holder = bob  // moves it: Ann loses it, Bob gets it
            pending.append(ann.passport?.number)  // nil
            pending.append(bob.passport?.number)  // "P1"
        }.read { context in
            let people = try Person.all(sortedBy: [SortDescriptor(\.name)], in: context)
            saved = people.map { $0.passport?.number } + [try Passport.first(in: context)?.holder?.name]
        }
        #expect(pending == ["Ann", nil, "P1"])
        #expect(saved == [nil, "P1", "Bob"])
    }

    @Test("cascade delete of a user removes its posts", arguments: StoreKind.allCases)
    func cascade(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var posts = -1
        stack.store.writeSync { context in
            let user = User.create(in: context)
            for title in ["a", "b"] {
                let post = Post.create(in: context)
                post.title = title
                post.author = user
            }
            let other = Post.create(in: context)
            other.title = "orphan"
        }.writeSync { context in
            try User.first(in: context)!.delete(in: context)
        }.read { posts = try Post.count(in: $0) }
        #expect(posts == 1)
    }

    @Test("nullify leaves players without a team", arguments: StoreKind.allCases)
    func nullify(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var teams = -1
        var players: [String?] = []
        stack.store.writeSync { context in
            let team = Team.create(in: context)
            team.name = "red"
            for name in ["p1", "p2"] {
                let player = Player.create(in: context)
                player.name = name
                player.team = team
            }
        }.writeSync { context in
            try Team.first(in: context)!.delete(in: context)
        }.read { context in
            teams = try Team.count(in: context)
            players = try Player.all(in: context).map { $0.team?.name }
        }
        #expect(teams == 0)
        #expect(players == [nil, nil])
    }

    @Test("deny refuses the delete with a typed error and keeps everything", arguments: StoreKind.allCases)
    func deny(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        let probe = CompletionProbe()
        var counts: [Int] = []
        stack.store.writeSync { context in
            let team = Team.create(in: context)
            let badge = Badge.create(in: context)
            badge.team = team
        }.writeSync(
            { context in
                try Team.first(in: context)!.delete(in: context)
            }, completion: probe.completion)
        #expect(probe.wait())
        #expect(probe.calls.first??.code == .deleteDenied)
        stack.store.read { context in
            counts = [try Team.count(in: context), try Badge.count(in: context)]
        }
        #expect(counts == [1, 1])
    }

    @Test("a required relationship left empty fails the save", arguments: StoreKind.allCases)
    func requiredRelationship(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        let probe = CompletionProbe()
        stack.store.writeSync({ context in _ = Badge.create(in: context) }, completion: probe.completion)
        #expect(probe.wait())
        #expect(probe.calls.first??.code == .missingRequiredRelationship)
        var count = -1
        stack.store.read { count = try Badge.count(in: $0) }
        #expect(count == 0)
    }

    @Test(
        "a duplicate unique value fails the second save; the first user survives alone", arguments: StoreKind.allCases)
    func unique(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        let first = CompletionProbe()
        let second = CompletionProbe()
        var handles: [String] = []
        stack.store.writeSync(
            { context in
                let user = User.create(in: context)
                user.handle = "same"
                user.firstname = "first"
            }, completion: first.completion)
        stack.store.writeSync(
            { context in
                let user = User.create(in: context)
                user.handle = "same"
                user.firstname = "second"
            }, completion: second.completion)
        #expect(first.wait() && second.wait())
        #expect(first.calls.first! == nil)
        #expect(second.calls.first??.code == .uniqueConstraintViolation)
        let message = second.calls.first??.message ?? ""
        #expect(message.contains("User.handle must be unique") && message.contains("'same'"), "\(message)")
        stack.store.read { handles = try User.all(in: $0).map(\.firstname) }
        #expect(handles == ["first"])
        // Two duplicates in one write fail too.
        let third = CompletionProbe()
        stack.store.writeSync(
            { context in
                for _ in 0..<2 { User.create(in: context).handle = "twin" }
            }, completion: third.completion)
        #expect(third.wait())
        #expect(third.calls.first??.code == .uniqueConstraintViolation)
    }

    @Test("nuke empties the store and the stack stays usable", arguments: StoreKind.allCases)
    func nuke(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var counts: [Int] = []
        stack.store.writeSync { makeUsers([("A", "X")], in: $0) }.read { counts.append(try User.count(in: $0)) }
        try stack.store.nuke()
        stack.store.read { counts.append(try User.count(in: $0)) }
            .writeSync { makeUsers([("B", "Y")], in: $0) }
            .read { counts.append(try User.count(in: $0)) }
        #expect(counts == [1, 0, 1])
    }

    @Test(
        "writeAndWait returns once durable, after the writes before it; its errors are thrown and handled",
        arguments: StoreKind.allCases)
    func writeAndWait(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        let store = stack.store
        let recorder = ErrorRecorder()
        store.errorHandler = { recorder.record($0) }
        let earlier = CompletionProbe()
        store.writeSync({ makeUsers([("Early", "X")], in: $0) }, completion: earlier.completion)
        try store.writeAndWait { context in
            let user = User.create(in: context)
            user.firstname = "Now"
            user.handle = "now"
        }
        // Durable: the store under the root context has both.
        let stored = try store.store.fetchSnapshots(StoreRequest(entityName: "User"))
        #expect(stored.count == 2)
        #expect(earlier.wait())
        #expect(earlier.calls.count == 1 && earlier.calls.first! == nil)
        // A duplicate unique value: thrown, handled, and nothing of the write is kept.
        #expect {
            try store.writeAndWait { context in
                User.create(in: context).handle = "now"
                User.create(in: context).firstname = "Also lost"
            }
        } throws: { ($0 as? SkyrosError)?.code == .uniqueConstraintViolation }
        // A block that throws: the block's error, nothing saved.
        #expect(throws: SkyrosError.self) {
            try store.writeAndWait { context in
                User.create(in: context).firstname = "Never"
                throw TestFailure(reason: "changed my mind")
            }
        }
        var names: [String] = []
        store.read { names = try User.all(in: $0).map(\.firstname).sorted() }
        #expect(names == ["Early", "Now"])
        #expect(try store.store.count(StoreRequest(entityName: "User")) == 2)
        store.completionQueue.sync {}  // handleError runs there
        #expect(recorder.errors.map(\.code).first == .uniqueConstraintViolation)
        #expect(recorder.errors.count == 2)
    }

    @Test(
        "completions run in order on the completion queue, and may read, write and nuke", arguments: StoreKind.allCases)
    func completionsInOrder(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        let store = stack.store
        let key = DispatchSpecificKey<Int>()
        store.completionQueue.setSpecific(key: key, value: 1)
        let order = Locked<[Int]>([])
        let done = CompletionProbe()
        // A failed write's completion comes in turn, after those of the writes before it.
        for index in 0..<12 {
            store.writeAsync(
                { context in
                    if index == 5 { throw TestFailure(reason: "write 5 fails") }
                    makeUsers([("U\(index)", "X")], in: context)
                },
                completion: { error in
                    order.withValue {
                        $0.append(
                            DispatchQueue.getSpecific(key: key) == 1 && (error == nil) == (index != 5) ? index : -1)
                    }
                    if index == 11 { done.completion(nil) }
                })
        }
        #expect(done.wait())
        #expect(order.value == Array(0..<12))
        // From a completion: a read, a write (whose own completion comes after), then a nuke.
        let counts = Locked<[Int]>([])
        let inner = CompletionProbe()
        store.writeSync(
            { makeUsers([("V", "Y")], in: $0) },
            completion: { _ in
                store.read { context in counts.withValue { $0.append((try? User.count(in: context)) ?? -1) } }
                store.writeSync({ makeUsers([("W", "Z")], in: $0) }, completion: inner.completion)
            })
        #expect(inner.wait())
        let nuked = CompletionProbe()
        store.writeSync(
            { makeUsers([("N", "N")], in: $0) },
            completion: { _ in
                do { try store.nuke() } catch { nuked.completion(SkyrosError.wrap(error)) }
                nuked.completion(nil)
            })
        #expect(nuked.wait())
        #expect(nuked.calls.count == 1 && nuked.calls.first! == nil)
        store.read { context in counts.withValue { $0.append((try? User.count(in: context)) ?? -1) } }
        #expect(counts.value == [12, 0])
    }

    @Test("strings sort byte by byte", arguments: StoreKind.allCases)
    func binarySort(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var sorted: [String] = []
        var pendingSorted: [String] = []
        let names = ["iOS", "a", "Swift", "1", "A", "#"]
        stack.store.writeSync { context in
            for name in names { User.create(in: context).handle = name }
        }.read { context in
            sorted = try User.all(sortedBy: [SortDescriptor(\.handle)], in: context).map(\.handle)
        }.writeSync { context in
            // Pending objects sort the same way in memory.
            try User.deleteAll(in: context)
            for name in names { User.create(in: context).handle = name + "!" }
            pendingSorted = try User.all(sortedBy: [SortDescriptor(\.handle)], in: context).map(\.handle)
        }
        #expect(sorted == ["#", "1", "A", "Swift", "a", "iOS"])
        #expect(pendingSorted == ["#!", "1!", "A!", "Swift!", "a!", "iOS!"])
    }

    @Test("inContext works for saved and unsaved objects", arguments: StoreKind.allCases)
    func inContext(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var results: [Bool] = []
        stack.store.writeSync { makeUsers([("Saved", "X")], in: $0) }
        let saved = try stack.store.mainContext.performAndWait { try User.first(in: stack.store.mainContext)! }
        stack.store.writeSync { context in
            results.append(saved.inContext(context)?.firstname == "Saved")
            let fresh = User.create(in: context)
            fresh.handle = "fresh"
            results.append(fresh.inContext(context) === fresh)
            results.append(fresh.inContext(stack.store.mainContext) == nil)  // not saved to main yet
        }
        // Created in main without saving: visible from a scratch context through its parent.
        let main = stack.store.mainContext
        let unsaved = main.performAndWait { () -> User in
            let user = User.create(in: main)
            user.handle = "unsaved-in-main"
            return user
        }
        stack.store.writeSync { context in
            results.append(unsaved.inContext(context)?.handle == "unsaved-in-main")
        }
        #expect(results == [true, true, true, true])
    }

    @Test("async read and write return values and throw", arguments: StoreKind.allCases)
    func asyncAPI(kind: StoreKind) async throws {
        let stack = try TestStack(kind)
        let id = try await stack.store.write { context in
            let user = User.create(in: context)
            user.firstname = "Async"
            user.handle = "async"
            return user.objectID
        }
        let name = try await stack.store.read { context in
            context.object(with: id, as: User.self)?.firstname
        }
        #expect(name == "Async")
        await #expect(throws: SkyrosError.self) {
            try await stack.store.write { context in
                User.create(in: context).handle = "async"  // duplicate
            }
        }
        let count = try await stack.store.read { try User.count(in: $0) }
        #expect(count == 1)
    }

    @Test("writeAsync completes once, in order, after the data is durable", arguments: StoreKind.allCases)
    func writeAsync(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        let probes = (0..<5).map { _ in CompletionProbe() }
        let order = ErrorRecorder()  // records the order through fake errors' messages
        for (index, probe) in probes.enumerated() {
            stack.store.writeAsync(
                { context in
                    User.create(in: context).handle = "u\(index)"
                },
                completion: { error in
                    order.record(SkyrosError(.blockFailed, "\(index)"))
                    probe.completion(error)
                })
        }
        for probe in probes { #expect(probe.wait()) }
        #expect(order.errors.map(\.message) == ["0", "1", "2", "3", "4"])
        var count = -1
        stack.store.read { count = try User.count(in: $0) }
        #expect(count == 5)
    }

    @Test("concurrent writings each get a scratch context and all land", arguments: StoreKind.allCases)
    func concurrentWritings(kind: StoreKind) throws {
        let stack = try TestStack(kind, allowsConcurrentWritings: true)
        let probes = (0..<20).map { _ in CompletionProbe() }
        DispatchQueue.concurrentPerform(iterations: 20) { index in
            stack.store.writeSync(
                { context in
                    User.create(in: context).handle = "c\(index)"
                }, completion: probes[index].completion)
        }
        for probe in probes { #expect(probe.wait()) }
        var count = -1
        stack.store.read { count = try User.count(in: $0) }
        #expect(count == 20)
    }

    @Test("the hand-written entity works like a generated one", arguments: StoreKind.allCases)
    func handWrittenEntity(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var labels: [String] = []
        let probe = CompletionProbe()
        stack.store.writeSync { context in
            let tag = Tag.create(in: context)
            tag.label = "swift"
            tag.uses = 3
        }.writeSync(
            { context in
                Tag.create(in: context).label = "swift"
            }, completion: probe.completion
        )
        .read { context in
            labels = try Tag.all(where: #Predicate { $0.uses > 2 }, in: context).map(\.label)
        }
        #expect(labels == ["swift"])
        #expect(probe.wait())
        #expect(probe.calls.first??.code == .uniqueConstraintViolation)
    }
}

/// A subclass overriding the error hook, Skopelos style.
final class RecordingSkyros: Skyros, @unchecked Sendable {
    let recorder = ErrorRecorder()
    override func handleError(_ error: SkyrosError) { recorder.record(error) }
}

@Suite("Error handling", .timeLimit(.minutes(3)))
struct ErrorHandlingTests {
    @Test("a subclass's handleError receives write and read errors")
    func subclassHook() throws {
        let store = try RecordingSkyros(inMemoryStack: testSchema)
        let probe = CompletionProbe()
        store.writeSync({ _ in throw TestFailure(reason: "write") }, completion: probe.completion)
        #expect(probe.wait())
        store.read { _ in throw TestFailure(reason: "read") }
        let reasons = store.recorder.errors.compactMap { ($0.underlyingError as? TestFailure)?.reason }
        #expect(reasons == ["write", "read"])
    }

    @Test("writeAsync reports a failing block once, to the completion and to handleError")
    func writeAsyncFailure() throws {
        let store = try RecordingSkyros(inMemoryStack: testSchema)
        let probe = CompletionProbe()
        store.writeAsync(
            { context in
                User.create(in: context).handle = "x"
                throw TestFailure(reason: "async")
            }, completion: probe.completion)
        #expect(probe.wait())
        #expect(!probe.wait(seconds: 0.2))
        #expect(probe.calls.count == 1)
        #expect(store.recorder.errors.count == 1)
        var count = -1
        store.read { count = try User.count(in: $0) }
        #expect(count == 0)
    }
}
