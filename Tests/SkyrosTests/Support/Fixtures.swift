import Foundation
import Skyros
import SkyrosShared
import SkyrosTestSupport
import Testing

/// The stores the conformance suite runs against.
enum StoreKind: String, CaseIterable, CustomTestStringConvertible, Sendable {
    case inMemory
    case sqlite
    /// Through a group daemon, over ZeroMQ.
    case shared

    var testDescription: String { rawValue }
}

/// A temporary directory removed when the value goes away, even when a test fails.
final class TemporaryDirectory: @unchecked Sendable {
    let url: URL

    init() throws {
        url = FileManager.default.temporaryDirectory
            .appendingPathComponent("skyros-tests-\(getpid())-\(UUID().uuidString.prefix(8))")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    func file(_ name: String) -> URL { url.appendingPathComponent(name) }

    deinit { try? FileManager.default.removeItem(at: url) }
}

/// A stack of the requested kind, with its directory kept alive as long as it is.
struct TestStack {
    let store: Skyros
    let directory: TemporaryDirectory
    let url: URL?
    let daemon: RunningDaemon?

    init(_ kind: StoreKind, schema testSchema: Schema = testSchema, allowsConcurrentWritings: Bool = false) throws {
        directory = try TemporaryDirectory()
        daemon = kind == .shared ? try RunningDaemon() : nil
        switch kind {
        case .shared:
            url = nil
            store = try Skyros(
                sharedStack: testSchema, container: daemon!.container.url,
                allowsConcurrentWritings: allowsConcurrentWritings)
        case .inMemory:
            url = nil
            store = try Skyros(inMemoryStack: testSchema, allowsConcurrentWritings: allowsConcurrentWritings)
        case .sqlite:
            let url = directory.file("store.sqlite")
            self.url = url
            store = try Skyros(sqliteStack: testSchema, at: url, allowsConcurrentWritings: allowsConcurrentWritings)
        }
    }
}

/// Records what a completion received, and waits for it with a bound.
final class CompletionProbe: @unchecked Sendable {
    private let lock = NSLock()
    private let semaphore = DispatchSemaphore(value: 0)
    private var _calls: [SkyrosError?] = []

    var calls: [SkyrosError?] { lock.withLock { _calls } }

    var completion: @Sendable (SkyrosError?) -> Void {
        { error in
            self.lock.withLock { self._calls.append(error) }
            self.semaphore.signal()
        }
    }

    /// Waits for one call; false on timeout.
    func wait(seconds: Double = 10) -> Bool {
        semaphore.wait(timeout: .now() + seconds) == .success
    }
}

/// Collects errors given to a stack's error handler.
final class ErrorRecorder: @unchecked Sendable {
    private let lock = NSLock()
    private var _errors: [SkyrosError] = []
    var errors: [SkyrosError] { lock.withLock { _errors } }
    func record(_ error: SkyrosError) { lock.withLock { _errors.append(error) } }
}

struct TestFailure: Error, Equatable {
    let reason: String
}

/// Creates users with (firstname, lastname) pairs.
func makeUsers(_ names: [(String, String)], in context: ObjectContext) {
    for (first, last) in names {
        let user = User.create(in: context)
        user.firstname = first
        user.lastname = last
        user.handle = "\(first)-\(last)".lowercased()
    }
}

/// The next change delivered on `changes` (that `matches`), or nil after `seconds`.
func nextChange(
    _ changes: AsyncStream<StoreChange>, seconds: Double = 5,
    where matches: @escaping @Sendable (StoreChange) -> Bool = { _ in true }
) async -> StoreChange? {
    await withTaskGroup(of: StoreChange?.self) { group in
        group.addTask {
            for await change in changes where matches(change) { return change }
            return nil
        }
        group.addTask {
            try? await Task.sleep(for: .seconds(seconds))
            return nil
        }
        let first = await group.next() ?? nil
        group.cancelAll()
        return first
    }
}

/// Inserts a user with `handle` in one write; returns its identifier once durable.
func insertUser(handle: String, into stack: Skyros) async throws -> ObjectID {
    try await stack.write { context in
        let user = User.create(in: context)
        user.handle = handle
        return user.objectID
    }
}

/// A value shared between a test and the closures it hands out.
final class Locked<Value>: @unchecked Sendable {
    private let lock = NSLock()
    private var _value: Value
    init(_ value: Value) { _value = value }
    var value: Value { lock.withLock { _value } }
    func withValue<T>(_ body: (inout Value) -> T) -> T { lock.withLock { body(&_value) } }
}
