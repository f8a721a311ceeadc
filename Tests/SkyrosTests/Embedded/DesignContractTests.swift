import Foundation
import Skyros
import SkyrosShared
import SkyrosTestSupport
import Testing

/// The public API of DESIGN §3 and §5, written as the design writes it.
@Suite("DESIGN §3 contract", .timeLimit(.minutes(3)))
struct DesignContractTests {
    /// The chaining forms are for synchronous code (DESIGN §3): in an async function `read`
    /// and `write` are the async forms, as in GRDB. So the synchronous forms are written in
    /// synchronous helpers, and the async ones here.
    @Test("the Skopelos-style API compiles and behaves as written")
    func contract() async throws {
        let directory = try TemporaryDirectory()
        let store = try chainingForms(directory)
        let names = try await store.read { context in try User.all(in: context).map(\.firstname) }
        let id = try await store.write { context in
            let user = User.create(in: context)
            user.handle = "j4"  // handles are unique; the first user has ""
            return user.objectID
        }
        #expect(names.contains("John"))
        try helpers(store, id)
    }

    /// Stacks, `read`, `writeSync`, `writeAsync` and chaining.
    func chainingForms(_ directory: TemporaryDirectory) throws -> Skyros {
        let fileURL = directory.file("store.sqlite")
        let schema = Schema([User.self, Post.self])
        _ = try Skyros(inMemoryStack: schema)
        _ = try Skyros(inMemoryStack: schema, allowsConcurrentWritings: true)
        let store = try Skyros(sqliteStack: testSchema, at: fileURL)

        store.read { context in print(try User.all(in: context)) }
        store.writeSync { context in
            let user = User.create(in: context)
            user.firstname = "John"
        }
        let durable = CompletionProbe()
        store.writeSync({ context in User.create(in: context).handle = "j2" }, completion: durable.completion)
        store.writeAsync({ context in User.create(in: context).handle = "j3" }, completion: { _ in })
        store.writeSync { _ in }.writeSync { _ in }.read { _ in }
        #expect(durable.wait())
        return store
    }

    /// The entity helpers, the context calls, and ObjectID.
    func helpers(_ store: Skyros, _ id: ObjectID) throws {
        let schema = Schema([User.self, Post.self])
        // The throwing form: an error fails the test (the chaining form would hand it to
        // `handleError` and skip the assertions after it).
        let checked: Bool = try store.read { context in
            let user = try #require(context.object(with: id, as: User.self))
            let counts = [
                try User.count(in: context),
                try User.count(where: #Predicate<User> { $0.age > 30 }, in: context),
                try User.all(
                    where: #Predicate { $0.firstname == "John" }, sortedBy: [SortDescriptor(\.handle)], in: context
                )
                .count,
            ]
            #expect(counts == [4, 0, 1])
            let firsts = [
                try User.first(in: context),
                try User.first(where: #Predicate { $0.firstname == "John" }, sortedBy: [], in: context),
            ]
            #expect(firsts.allSatisfy { $0 != nil })
            #expect(user.inContext(context) === user)
            #expect(context.object(with: id) != nil)
            #expect(!context.hasChanges)
            context.reset()
            return true
        }
        #expect(checked)
        let before = try store.read { context in try User.count(in: context) }
        #expect(before == 4)
        // delete(in:) one user, then deleteAll the rest; each write is durable when its
        // completion runs.
        let deletedOne = CompletionProbe()
        store.writeSync(
            { context in
                let first = try #require(
                    try User.first(where: #Predicate { $0.firstname == "John" }, sortedBy: [], in: context))
                first.delete(in: context)
                try context.save()
            }, completion: deletedOne.completion)
        #expect(deletedOne.wait())
        #expect(deletedOne.calls.first! == nil)
        #expect(try store.read { context in try User.count(in: context) } == 3)
        #expect(
            try store.read { context in try User.count(where: #Predicate { $0.firstname == "John" }, in: context) } == 0
        )
        let deletedAll = CompletionProbe()
        store.writeSync({ context in try User.deleteAll(in: context) }, completion: deletedAll.completion)
        #expect(deletedAll.wait())
        #expect(deletedAll.calls.first! == nil)
        #expect(try store.read { context in try User.count(in: context) } == 0)
        // ObjectID: Sendable, Hashable, Codable, with a URI form.
        let decoded = try JSONDecoder().decode(ObjectID.self, from: JSONEncoder().encode(id))
        #expect(decoded == id && Set([id, decoded]).count == 1)
        #expect(ObjectID(uriRepresentation: id.uriRepresentation) == id)
        // The shared stack's initializer, as written (no daemon for this group: a typed error).
        #expect(throws: SkyrosError.self) {
            _ = try Skyros(sharedStack: schema, applicationGroup: "com.example.todo", timeout: 0.2)
        }
    }

    /// DESIGN §5 as written, with the plain closures an application (or a test) writes:
    /// callbacks that capture local state.
    @Test("observation (DESIGN §5) compiles and behaves as written")
    func observation() async throws {
        let store = try Skyros(inMemoryStack: testSchema)
        let controller = FetchedResultsController<User>(
            fetch: FetchDescriptor(predicate: #Predicate { $0.age > 30 }, sortBy: [SortDescriptor(\.lastname)]),
            sectionKeyPath: \.lastnameInitial,
            context: store.mainContext)
        let changed = DispatchSemaphore(value: 0)
        var inserted: [IndexPath] = []
        controller.onChange = { (changes: FetchedResultsChanges<User>) in
            for case .insert(_, let indexPath) in changes.objects { inserted.append(indexPath) }
            changed.signal()
        }
        try controller.performFetch()
        let monitor = EntityMonitor<User>(
            context: store.mainContext, frequency: .onSave,
            filter: #Predicate<User> { $0.age > 30 })
        var monitored = 0
        monitor.onChange = { (change: EntityMonitorChange<User>) in monitored += change.inserted.count }
        let values = store.observe({ context in try User.count(in: context) })
        var iterator = values.makeAsyncIterator()
        #expect(try await iterator.next() == 0)
        _ = try await store.write { context in
            let user = User.create(in: context)
            user.lastname = "Doe"
            user.age = 40
            user.handle = "doe"
        }
        #expect(changed.wait(timeout: .now() + 5) == .success)
        #expect(try await iterator.next() == 1)
        store.mainContext.performAndWait {
            #expect(inserted == [IndexPath(item: 0, section: 0)])
            #expect(monitored == 1)
            #expect(controller.sections.map(\.name) == ["D"])
            #expect(controller.fetchedObjects.count == 1)
            #expect(controller.object(at: IndexPath(item: 0, section: 0)).lastname == "Doe")
            #expect(controller.indexPath(for: controller.fetchedObjects[0])?.item == 0)
        }
        _ = monitor
    }
}
