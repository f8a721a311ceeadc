import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// `importBatch` (issue 18, DESIGN §7): chunks saved straight to the store, progress,
/// cancellation, failures by record, the main context told once.
@Suite("Batch import", .timeLimit(.minutes(3)))
struct BatchImportTests {
    final class Progress: @unchecked Sendable {
        private let lock = NSLock()
        private var _calls: [(Int, Int)] = []
        var calls: [(Int, Int)] { lock.withLock { _calls } }
        func record(_ done: Int, _ total: Int) { lock.withLock { _calls.append((done, total)) } }
    }

    @Test(
        "imports every record in chunks, with progress to the total; a controller sees them once",
        arguments: StoreKind.allCases)
    func imports(kind: StoreKind) async throws {
        let stack = try TestStack(kind)
        let store = stack.store
        let controller = FetchedResultsController<User>(
            fetch: FetchDescriptor(sortBy: [SortDescriptor(\.handle)]), context: store.mainContext)
        final class Calls: @unchecked Sendable { var count = 0 }
        let calls = Calls()
        controller.onChange = { _ in calls.count += 1 }
        try controller.performFetch()
        let progress = Progress()
        let records = (0..<2_500).map { "r\($0)" }
        let imported = try await store.importBatch(records, chunkSize: 1_000, progress: { progress.record($0, $1) }) {
            record, context in
            let user = User.create(in: context)
            user.handle = record
        }
        #expect(imported == 2_500)
        #expect(progress.calls.map(\.0) == [1_000, 2_000, 2_500] && progress.calls.allSatisfy { $0.1 == 2_500 })
        let count = try await store.read { context in try User.count(in: context) }
        #expect(count == 2_500)
        store.mainContext.performAndWait {
            #expect(calls.count == 1)
            #expect(controller.fetchedObjects.count == 2_500)
        }
    }

    @Test("a bad record fails its chunk, naming the record; the chunks before it stay")
    func badRecord() async throws {
        let stack = try TestStack(.sqlite)
        let records = Array(0..<30)
        let error = await #expect(throws: SkyrosError.self) {
            try await stack.store.importBatch(records, chunkSize: 10) { record, context in
                if record == 25 { throw TestFailure(reason: "bad row") }
                Tag.create(in: context).label = "t\(record)"
            }
        }
        #expect(
            error?.message.contains("record 25") == true && error?.message.contains("20..<30") == true,
            "\(String(describing: error))")
        let count = try await stack.store.read { context in try Tag.count(in: context) }
        #expect(count == 20)
        // A unique attribute imported twice: the chunk's save fails, nothing of it is kept.
        let duplicate = await #expect(throws: SkyrosError.self) {
            try await stack.store.importBatch(["x", "y", "x"], chunkSize: 10) { record, context in
                Tag.create(in: context).label = record
            }
        }
        #expect(duplicate?.code == .uniqueConstraintViolation)
        #expect(duplicate?.message.contains("record 2 of the import") == true, "\(String(describing: duplicate))")
        let after = try await stack.store.read { context in try Tag.count(in: context) }
        #expect(after == 20)
    }

    @Test(
        "a record whose object breaks a unique constraint is named by its position, in its chunk or against a stored object",
        arguments: StoreKind.allCases)
    func constraintNamesRecord(kind: StoreKind) async throws {
        let stack = try TestStack(kind)
        // Chunks [a, b] and [c, b]: the second b is refused against the stored one.
        let error = await #expect(throws: SkyrosError.self) {
            try await stack.store.importBatch(["a", "b", "c", "b"], chunkSize: 2) { record, context in
                Tag.create(in: context).label = record
            }
        }
        #expect(error?.code == .uniqueConstraintViolation)
        #expect(
            error?.message.contains("record 3 of the import") == true && error?.message.contains("2..<4") == true,
            "\(String(describing: error))")
        let labels = try await stack.store.read { context in try Tag.all(in: context).map(\.label).sorted() }
        #expect(labels == ["a", "b"])
        // A value that cannot be stored (NaN) in the third record of a chunk: that record is named.
        let notANumber = Double("nan")!  // a run-time value: the compiler warns of a literal NaN
        let unstorable = await #expect(throws: SkyrosError.self) {
            try await stack.store.importBatch([1.0, 2.0, notANumber, 4.0], chunkSize: 10) { record, context in
                Post.create(in: context).score = record
            }
        }
        #expect(unstorable?.code == .valueNotStorable)
        #expect(unstorable?.message.contains("record 2 of the import") == true, "\(String(describing: unstorable))")
        let posts = try await stack.store.read { context in try Post.count(in: context) }
        #expect(posts == 0)
    }

    @Test("cancelling stops after the current chunk; what was saved stays and is counted")
    func cancel() async throws {
        let stack = try TestStack(.sqlite)
        let store = stack.store
        let started = AsyncStream<Void>.makeStream()
        let task = Task {
            try await store.importBatch(Array(0..<10_000), chunkSize: 100) { record, context in
                if record == 150 { started.continuation.yield() }
                if record >= 150 { usleep(200) }  // slow enough to be cancelled mid-import
                Tag.create(in: context).label = "c\(record)"
            }
        }
        var iterator = started.stream.makeAsyncIterator()
        await iterator.next()
        task.cancel()
        let imported = try await task.value
        #expect(imported < 10_000 && imported >= 200 && imported % 100 == 0, "\(imported)")
        let count = try await store.read { context in try Tag.count(in: context) }
        #expect(count == imported)
    }

    struct Person: Sendable {
        var handle: String
        var age: Int
    }

    @Test(
        "an upserting import updates the objects whose key is stored and inserts the others, never a unique violation",
        arguments: StoreKind.allCases)
    func upsert(kind: StoreKind) async throws {
        let stack = try TestStack(kind)
        let store = stack.store
        let kept = try await store.write { context in
            let user = User.create(in: context)
            (user.handle, user.firstname, user.age) = ("h3", "kept", 1)
            return user.objectID
        }
        // Held by the main context: the import refreshes it.
        let held = try #require(
            store.mainContext.performAndWait { store.mainContext.object(with: kept, as: User.self) })
        let first = (0..<10).map { Person(handle: "h\($0)", age: $0) }
        let imported = try await store.importBatch(
            first, upserting: User.self, by: \.handle, key: \.handle, chunkSize: 4
        ) { record, user, _ in
            user.age = record.age + 100
        }
        #expect(imported == 10)
        // Overlapping records (h5…h14), a key twice in one chunk (the later record wins), and
        // twice across chunks.
        let second =
            (5..<15).map { Person(handle: "h\($0)", age: $0) } + [
                Person(handle: "h14", age: 1_000), Person(handle: "h6", age: 2_000),
            ]
        let again = try await store.importBatch(second, upserting: User.self, by: \.handle, key: \.handle, chunkSize: 4)
        { record, user, _ in
            user.age = record.age + 200
        }
        #expect(again == 12)
        let users = try await store.read { context in
            try User.all(sortedBy: [SortDescriptor(\.handle)], in: context).map { ($0.handle, $0.age, $0.firstname) }
        }
        #expect(users.count == 15, "\(users)")
        let ages = Dictionary(uniqueKeysWithValues: users.map { ($0.0, $0.1) })
        #expect(ages["h0"] == 100 && ages["h4"] == 104 && ages["h5"] == 205 && ages["h9"] == 209 && ages["h13"] == 213)
        #expect(ages["h14"] == 1_200 && ages["h6"] == 2_200)
        // The stored object was updated in place: same identifier, its other attributes kept.
        #expect(users.first { $0.0 == "h3" }?.2 == "kept")
        store.mainContext.performAndWait {
            #expect(held.objectID == kept && held.age == 103 && held.firstname == "kept")
        }
    }

    @Test("an upserting import keyed by an attribute that is not unique is refused before anything is saved")
    func upsertNeedsUniqueKey() async throws {
        let stack = try TestStack(.sqlite)
        let error = await #expect(throws: SkyrosError.self) {
            try await stack.store.importBatch(
                [Person(handle: "a", age: 1)], upserting: User.self, by: \.firstname, key: \.handle
            ) { _, _, _ in }
        }
        #expect(
            error?.code == .unsupportedPredicate && error?.message.contains("unique") == true,
            "\(String(describing: error))")
        let count = try await stack.store.read { context in try User.count(in: context) }
        #expect(count == 0)
    }
}
