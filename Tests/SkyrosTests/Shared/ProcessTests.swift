import Foundation
import Skyros
import SkyrosTestSupport
import Testing

@Suite("Processes", .timeLimit(.minutes(3)))
struct ProcessTests {
    /// The number of users in the store file a child wrote, read by a new stack.
    func userCount(at path: String) throws -> Int {
        let store = try Skyros(sqliteStack: testSchema, at: URL(fileURLWithPath: path))
        var count = -1
        store.read { count = try User.count(in: $0) }
        return count
    }

    @Test("SIGTERM or SIGINT right after writeAsync still saves the write", arguments: [SIGTERM, SIGINT])
    func saveOnSignal(signal: Int32) throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("store.sqlite").path
        let child = try ChildProcess(["write-and-wait", path, "500"])
        #expect(child.waitForLine("WRITING"))
        kill(child.pid, signal)
        #expect(child.wait() == .signalled(signal))
        #expect(try userCount(at: path) == 500)
    }

    @Test("a normal exit right after writeAsync still saves the write")
    func saveOnExit() throws {
        let directory = try TemporaryDirectory()
        let path = directory.file("store.sqlite").path
        let child = try ChildProcess(["write-and-exit", path, "300"])
        #expect(child.wait() == .exited(0))
        #expect(try userCount(at: path) == 300)
    }

    @Test("the schema fingerprint is the same in another process")
    func fingerprintAcrossProcesses() throws {
        let child = try ChildProcess(["fingerprint"])
        #expect(child.wait() == .exited(0))
        let printed = child.readAll().trimmingCharacters(in: .whitespacesAndNewlines)
        #expect(printed == testSchema.fingerprint)
        #expect(printed.count == 32)
    }

    @Test("SKYROS_CONCURRENCY_DEBUG=1 traps an access off the context's queue, naming entity and context")
    func concurrencyDebug() async throws {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            setenv("SKYROS_CONCURRENCY_DEBUG", "1", 1)
            let store = try Skyros(inMemoryStack: testSchema)
            store.writeSync { context in User.create(in: context).firstname = "John" }
            var leaked: User?
            store.read { leaked = try User.first(in: $0) }
            _ = leaked?.firstname  // off the main context's queue
        }
        let stderr = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("entity User"))
        #expect(stderr.contains("context 'main'"))
    }

    @Test("SKYROS_CONCURRENCY_DEBUG=1 also traps on an object a batched fetch reused for another row")
    func concurrencyDebugReusedObject() async throws {
        let result = await #expect(processExitsWith: .failure, observing: [\.standardErrorContent]) {
            setenv("SKYROS_CONCURRENCY_DEBUG", "1", 1)
            // A store file: only a cursor (SQLite) reuses objects. Removed before the trap
            // (the open files stay readable), as the process cannot clean up after it.
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent(
                "skyros-concurrency-\(getpid())")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let store = try Skyros(sqliteStack: testSchema, at: directory.appendingPathComponent("store.sqlite"))
            try store.writeAndWait { context in
                for index in 0..<30 { Post.create(in: context).title = "p\(index)" }
            }
            var leaked: Post?
            store.read { context in
                context.reset()  // nothing registered: the fetch makes its objects (Post has no @Transient)
                // Batches of 10: the objects of a batch are the previous batch's, reused when
                // nothing holds them (so the one kept is taken once the last batch is made).
                for (index, post) in try context.fetch(FetchDescriptor<Post>(), batchSize: 10).enumerated()
                where index == 20 {
                    leaked = post
                }
            }
            try FileManager.default.removeItem(at: directory)
            _ = leaked?.title  // off the main context's queue
        }
        let stderr = String(decoding: result?.standardErrorContent ?? [], as: UTF8.self)
        #expect(stderr.contains("entity Post"))
        #expect(stderr.contains("context 'main'"))
    }

    @Test("without the variable, the same access does not trap")
    func noConcurrencyDebug() async throws {
        await #expect(processExitsWith: .success) {
            unsetenv("SKYROS_CONCURRENCY_DEBUG")
            let store = try Skyros(inMemoryStack: testSchema)
            store.writeSync { context in User.create(in: context).firstname = "John" }
            var leaked: User?
            store.read { leaked = try User.first(in: $0) }
            guard leaked?.firstname == "John" else { exit(1) }
        }
    }
}
