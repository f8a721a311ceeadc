import Foundation
import Skyros
import SkyrosSync
import SkyrosTestSupport
import Testing

/// Unique values permuted on the server in one transaction (issue 57, item 6): every machine
/// applies the checkpoint (or the snapshot) that carries them, stays online, and goes on
/// syncing. Against a real PostgreSQL.
@Suite("Sync: unique values permuted in one checkpoint", .serialized, .timeLimit(.minutes(3)))
struct SyncUniquePermutationTests {
    let sync = SyncTests()

    /// Each user's handle, by object.
    func handlesByID(_ stack: Skyros) async throws -> [ObjectID: String] {
        try await stack.read { context in
            Dictionary(uniqueKeysWithValues: try User.all(in: context).map { ($0.objectID, $0.handle) })
        }
    }

    /// Waits until every stack has `expected`, or a machine is in the error state (45 s at
    /// most); then expects both machines online with `expected`.
    func expectApplied(
        _ expected: [ObjectID: String], on stacks: [Skyros], _ machines: [RunningDaemon],
        sourceLocation: SourceLocation = #_sourceLocation
    ) async {
        _ = await sync.eventually(seconds: 45) {
            var all = true
            for stack in stacks where try await handlesByID(stack) != expected { all = false }
            return all || machines.contains { sync.syncState($0).state == "error" }
        }
        for (number, stack) in stacks.enumerated() {
            let held = (try? await handlesByID(stack)) ?? [:]
            #expect(held == expected, "machine \(number)", sourceLocation: sourceLocation)
        }
        for (number, machine) in machines.enumerated() {
            let (state, message) = sync.syncState(machine)
            #expect(state == "online", "machine \(number): \(message)", sourceLocation: sourceLocation)
        }
    }

    /// Saves on both machines after the permutation reach the other one.
    func expectLaterSavesCross(_ a: Skyros, _ b: Skyros, have before: [String]) async throws {
        try await sync.insert("after-1", into: a)
        try await sync.insert("after-2", into: b)
        try await sync.insert("after-3", into: a)
        let all = (before + ["after-1", "after-2", "after-3"]).sorted()
        for (name, stack) in [("A", a), ("B", b)] {
            let arrived = await sync.eventually { try await sync.handles(stack) == all }
            let held = (try? await sync.handles(stack)) ?? []
            #expect(arrived, "\(name) has \(held)")
        }
    }

    @Test(
        "two handles swapped by psql in one transaction, through a temporary value: both machines swap them, stay online, and later saves cross"
    )
    func swap() async throws {
        let (server, machines, a, b) = try sync.twoMachines()
        defer { withExtendedLifetime(machines) {} }
        let jane = try await sync.insert("jane", into: a)
        let john = try await sync.insert("john", into: a)
        #expect(await sync.eventually { try await sync.handles(b) == ["jane", "john"] })

        try server.psql(
            """
            BEGIN;
            UPDATE g_sync."User" SET handle = 'jane-tmp' WHERE handle = 'jane';
            UPDATE g_sync."User" SET handle = 'jane' WHERE handle = 'john';
            UPDATE g_sync."User" SET handle = 'john' WHERE handle = 'jane-tmp';
            COMMIT;
            """)
        await expectApplied([jane: "john", john: "jane"], on: [a, b], [machines.0, machines.1])
        try await expectLaterSavesCross(a, b, have: ["jane", "john"])
    }

    @Test(
        "a three-way rotation of handles in one server transaction (a takes b's, b c's, c a's) is applied on both machines"
    )
    func rotation() async throws {
        let (server, machines, a, b) = try sync.twoMachines()
        defer { withExtendedLifetime(machines) {} }
        let ann = try await sync.insert("ann", into: a)
        let bob = try await sync.insert("bob", into: b)
        let cy = try await sync.insert("cy", into: a)
        #expect(await sync.eventually { try await sync.handles(a) == ["ann", "bob", "cy"] })
        #expect(await sync.eventually { try await sync.handles(b) == ["ann", "bob", "cy"] })

        try server.psql(
            """
            BEGIN;
            UPDATE g_sync."User" SET handle = 'rotating' WHERE handle = 'ann';
            UPDATE g_sync."User" SET handle = 'ann' WHERE handle = 'cy';
            UPDATE g_sync."User" SET handle = 'cy' WHERE handle = 'bob';
            UPDATE g_sync."User" SET handle = 'bob' WHERE handle = 'rotating';
            COMMIT;
            """)
        await expectApplied([ann: "bob", bob: "cy", cy: "ann"], on: [a, b], [machines.0, machines.1])
        try await expectLaterSavesCross(a, b, have: ["ann", "bob", "cy"])
    }

    @Test(
        "a machine back past the log's retention applies a snapshot in which the server swapped two handles and gave a freed one to a new user"
    )
    func snapshot() async throws {
        // A server of its own: the compaction stops at the oldest transaction still running
        // in the whole cluster, which another test's may be.
        let server = try SyncTests.Server(try await PostgresServer.started())
        let directory = "/tmp/skp-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let machineA = try RunningDaemon(sync: server.configuration)
        let a = try Skyros(sharedStack: testSchema, container: machineA.container.url)
        let machineB = try RunningDaemon(directory: directory, sync: server.configuration)
        var b: Skyros? = try Skyros(sharedStack: testSchema, container: machineB.container.url)
        let jane = try await sync.insert("jane", into: a)
        let john = try await sync.insert("john", into: a)
        let kim = try await sync.insert("kim", into: a)
        #expect(await sync.eventually { try await sync.handles(b!) == ["jane", "john", "kim"] })
        b = nil
        machineB.shutDown()  // kept (not released): a RunningDaemon's deinit removes its directory

        let newcomer = UUID()
        try server.psql(
            """
            BEGIN;
            UPDATE g_sync."User" SET handle = 'jane-tmp' WHERE handle = 'jane';
            UPDATE g_sync."User" SET handle = 'jane' WHERE handle = 'john';
            UPDATE g_sync."User" SET handle = 'john' WHERE handle = 'jane-tmp';
            UPDATE g_sync."User" SET handle = 'kim-old' WHERE handle = 'kim';
            INSERT INTO g_sync."User" ("_id", handle) VALUES ('\(newcomer.uuidString)', 'kim');
            COMMIT;
            """)
        try await server.compactLog()
        #expect(try server.psql("SELECT count(*) FROM g_sync._skyros_log") == "0")

        let restarted = try RunningDaemon(directory: directory, sync: server.configuration)
        let again = try Skyros(sharedStack: testSchema, container: restarted.container.url)
        let expected = [
            jane: "john", john: "jane", kim: "kim-old", ObjectID(entityName: "User", uuid: newcomer): "kim",
        ]
        await expectApplied(expected, on: [a, again], [machineA, restarted])
        try await expectLaterSavesCross(a, again, have: ["jane", "john", "kim", "kim-old"])
    }
}
