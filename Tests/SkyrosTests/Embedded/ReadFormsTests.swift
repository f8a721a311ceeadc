import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// The three forms of `read` (DESIGN §3): chaining, synchronous with a value, async with a value.
@Suite("read forms") struct ReadFormsTests {
    private func stack(_ directory: TemporaryDirectory) throws -> Skyros {
        let store = try Skyros(sqliteStack: testSchema, at: directory.file("store.sqlite"))
        try store.writeAndWait { context in
            for (first, handle) in [("Ann", "ann"), ("John", "john")] {
                let user = User.create(in: context)
                user.firstname = first
                user.handle = handle
            }
        }
        return store
    }

    @Test("in an async function, `try await store.read` returns the block's value")
    func asyncValue() async throws {
        let directory = try TemporaryDirectory()
        let store = try stack(directory)
        let names = try await store.read { context in try User.all(in: context).map(\.firstname) }
        #expect(names.sorted() == ["Ann", "John"])
        let id = try await store.write { context in User.create(in: context).objectID }
        let found = try await store.read { context in try context.existingObject(with: id).objectID }
        #expect(found == id)
    }

    @Test("the synchronous value form returns the value and throws the block's error as a SkyrosError")
    func synchronousValue() throws {
        let directory = try TemporaryDirectory()
        let store = try stack(directory)
        let count = try store.read { context in try User.count(in: context) }
        #expect(count == 2)
        let failure = #expect(throws: SkyrosError.self) {
            _ = try store.read { _ -> Int in throw SkyrosError(.objectNotFound, "no such user") }
        }
        #expect(failure?.code == .objectNotFound)
    }

    @Test("the chaining form still chains, and reports errors to handleError")
    func chaining() throws {
        let directory = try TemporaryDirectory()
        let store = try stack(directory)
        let errors = Locked<[SkyrosError.Code]>([])
        store.errorHandler = { error in errors.withValue { $0.append(error.code) } }
        let seen = Locked<[Int]>([])
        store.read { context in
            let count = try User.count(in: context)
            seen.withValue { $0.append(count) }
        }
        .read { _ in throw SkyrosError(.objectNotFound, "chained failure") }
        .read { _ in seen.withValue { $0.append(-1) } }
        // A chaining read as the only statement of a closure that returns Void.
        let run: () -> Void = { store.read { _ in seen.withValue { $0.append(0) } } }
        run()
        #expect(seen.withValue { $0 } == [2, -1, 0])
        #expect(errors.withValue { $0 } == [.objectNotFound])
    }

    @Test("top-level code: `let names = try await store.read { … }` gives [String] (examples/TopLevel)")
    func topLevelExample() throws {
        let example = try ChildProcess([], executable: ChildProcess.builtExecutable("skyros-toplevel"))
        #expect(example.wait(seconds: 30) == .exited(0))
        let output = example.readAll()
        #expect(output.contains("names: Ann, John"), "\(output)")
        #expect(output.contains("created: skyros://User/"), "\(output)")
    }
}
