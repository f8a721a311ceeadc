import Foundation
import Skyros
import SkyrosDaemon
import SkyrosTestSupport
import SkyrosWire
import Testing

/// The lines a daemon logs, collected from any thread.
final class LogLines: @unchecked Sendable {
    private let lock = NSLock()
    private var lines: [String] = []

    func append(_ line: String) { lock.withLock { lines.append(line) } }
    var all: [String] { lock.withLock { lines } }
    func matching(_ text: String) -> [String] { all.filter { $0.contains(text) } }
}

/// A temporary directory with a group container `g` in it, removed at the end.
final class TemporaryGroup {
    let directory = "/tmp/skc-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
    var container: GroupContainer { GroupContainer(url: URL(fileURLWithPath: directory).appendingPathComponent("g")) }
    var store: URL { container.store }

    init() throws {
        try FileManager.default.createDirectory(at: container.url, withIntermediateDirectories: true)
    }

    deinit { try? FileManager.default.removeItem(atPath: directory) }
}

@Suite("Damaged stores refused", .timeLimit(.minutes(1)))
struct StoreCheckTests {
    /// Starts a daemon on `group`, expects it to refuse the store with a message naming the
    /// file and containing `problem`, and the file to be byte for byte as it was, with no
    /// `-wal` or `-shm` file made next to it.
    func expectRefusal(_ group: TemporaryGroup, _ problem: String, sourceLocation: SourceLocation = #_sourceLocation)
        throws
    {
        let before = try Data(contentsOf: group.store)
        do {
            let server = try DaemonServer(configuration: .init(container: group.container))
            server.close()
            Issue.record("the daemon served the store", sourceLocation: sourceLocation)
        } catch let error as SkyrosError {
            #expect(error.code == .storeFailure, sourceLocation: sourceLocation)
            #expect(
                error.message.contains("the store at \(group.store.path) "), "\(error.message)",
                sourceLocation: sourceLocation)
            #expect(error.message.contains(problem), "\(error.message)", sourceLocation: sourceLocation)
            #expect(error.message.contains("the file was left untouched"), sourceLocation: sourceLocation)
        }
        #expect(try Data(contentsOf: group.store) == before, "the file changed", sourceLocation: sourceLocation)
        for suffix in ["-wal", "-shm", "-journal"] {
            #expect(
                !FileManager.default.fileExists(atPath: group.store.path + suffix), "\(suffix) made",
                sourceLocation: sourceLocation)
        }
        // Nothing serves: the lock is released and no socket is left.
        for path in group.container.sockets {
            #expect(!FileManager.default.fileExists(atPath: path), sourceLocation: sourceLocation)
        }
    }

    @Test("a 0-byte store.sqlite is damage, never a new store: refused, still 0 bytes")
    func emptyFile() throws {
        let group = try TemporaryGroup()
        #expect(FileManager.default.createFile(atPath: group.store.path, contents: Data()))
        try expectRefusal(group, "is empty (0 bytes)")
        #expect(try FileManager.default.attributesOfItem(atPath: group.store.path)[.size] as? Int == 0)
    }

    @Test("a text file named store.sqlite is refused, byte for byte unchanged")
    func textFile() throws {
        let group = try TemporaryGroup()
        try StoreFiles.makeTextFile(at: group.store)
        try expectRefusal(group, "is not a Skyros store: it is not an SQLite database")
    }

    @Test("an SQLite database without Skyros' metadata is refused, unchanged")
    func foreignDatabase() throws {
        let group = try TemporaryGroup()
        try StoreFiles.makeForeignDatabase(at: group.store)
        try expectRefusal(group, "is not a Skyros store: it is an SQLite database without Skyros' metadata table")
    }

    @Test(
        "a damaged Skyros store is refused (quick_check's findings in the message), unchanged; the full check refuses it too"
    )
    func damagedStore() throws {
        let group = try TemporaryGroup()
        try StoreFiles.makeStore(at: group.store, users: 300)
        #expect(try StoreCheck.verify(group.store, depth: .full))
        try StoreFiles.damage(group.store)
        try expectRefusal(group, "is damaged: PRAGMA quick_check found: On tree page")
        let before = try Data(contentsOf: group.store)
        #expect(throws: SkyrosError.self) { try StoreCheck.verify(group.store, depth: .full) }
        #expect(try Data(contentsOf: group.store) == before)
    }

    @Test("a healthy store passes the check unchanged and is served; no file: nothing to check")
    func healthyStore() throws {
        let group = try TemporaryGroup()
        #expect(try !StoreCheck.verify(group.store, depth: .quick))
        try StoreFiles.makeStore(at: group.store, users: 10)
        let before = try Data(contentsOf: group.store)
        #expect(try StoreCheck.verify(group.store, depth: .quick))
        #expect(try StoreCheck.verify(group.store, depth: .full))
        #expect(try Data(contentsOf: group.store) == before)
        let daemon = try RunningDaemon(directory: group.directory)
        let client = try RawClient(daemon)
        _ = try client.hello()
        #expect(try client.call(.count(StoreRequest(entityName: "User"))) == .countReply(10))
    }

    @Test(
        "a WAL store whose committed transactions are still in its -wal file (a daemon that died) is checked with them, unchanged"
    )
    func storeWithWAL() throws {
        let original = try TemporaryGroup()
        let copy = try TemporaryGroup()
        let store = try SQLiteStore(schema: testSchema, url: original.store)
        defer { try? store.close() }
        try store.save(ChangeSet(inserted: [userSnapshot("w1")]))
        // A copy of the files while the store is open: what a crash leaves.
        let wal = original.store.path + "-wal"
        try #require(FileManager.default.fileExists(atPath: wal))
        try FileManager.default.copyItem(atPath: original.store.path, toPath: copy.store.path)
        try FileManager.default.copyItem(atPath: wal, toPath: copy.store.path + "-wal")
        let before = try Data(contentsOf: copy.store)
        let walBefore = try Data(contentsOf: URL(fileURLWithPath: copy.store.path + "-wal"))
        #expect(try StoreCheck.verify(copy.store, depth: .quick))
        #expect(try StoreCheck.verify(copy.store, depth: .full))
        #expect(try Data(contentsOf: copy.store) == before)
        #expect(try Data(contentsOf: URL(fileURLWithPath: copy.store.path + "-wal")) == walBefore)
        let daemon = try RunningDaemon(directory: copy.directory)
        let client = try RawClient(daemon)
        _ = try client.hello()
        #expect(try client.call(.count(StoreRequest(entityName: "User"))) == .countReply(1))
    }

    @Test("a reset (deleteAll) is logged: by whom, and how many objects it deleted")
    func resetLogged() throws {
        let log = LogLines()
        let daemon = try RunningDaemon(log: { log.append($0) })
        let client = try RawClient(daemon)
        _ = try client.hello()
        _ = try client.saveUsers(1...3, handlePrefix: "r")
        #expect(log.matching("reset").isEmpty)
        #expect(try client.call(.deleteAll(clientID: .named("c"), saveNumber: 4)) == .saved(sequence: 4))
        #expect(log.matching("reset").count == 1)
        #expect(
            log.matching(
                "reset (deleteAll) by 'test' (client \(UUID.named("c")), save 4): deleted 3 objects, sequence 4"
            ).count == 1)
    }

    @Test(
        "pruning is logged with how many change sets it removed: at once the first time, the rest when the daemon closes"
    )
    func pruningLogged() throws {
        let log = LogLines()
        let daemon = try RunningDaemon(historyCount: 2, log: { log.append($0) })
        let client = try RawClient(daemon)
        _ = try client.hello()
        _ = try client.saveUsers(1...2, handlePrefix: "p")
        #expect(log.matching("pruned").isEmpty)
        _ = try client.saveUsers(3...5, handlePrefix: "p")
        let first = log.matching("pruned")
        #expect(first.count == 1)
        #expect(first.first?.contains("the last 2 change sets") == true)
        #expect(first.first?.contains("removed 1 change set and 0 exactly-once records") == true, "\(first)")
        daemon.shutDown()
        let all = log.matching("pruned")
        #expect(all.count == 2)
        #expect(
            all.last?.contains(
                "removed 2 change sets and 0 exactly-once records of silent clients since the last such line") == true,
            "\(all)")
    }
}
