import Foundation
import Skyros
import SkyrosShared
import SkyrosSync
import SkyrosTestModels
import Testing

/// Sync with PostgreSQL (DESIGN §9): daemons of one group on two "machines" (two group
/// containers, two daemons) and one real PostgreSQL server.
@Suite("Sync with PostgreSQL", .timeLimit(.minutes(3)))
struct SyncTests {
    /// A database of its own on the suite's server, and the sync configuration of a daemon.
    struct Server {
        let postgres: PostgresServer
        let database: String
        let schema = "g_sync"

        init(_ postgres: PostgresServer? = nil) throws {
            self.postgres = try postgres ?? PostgresServer.shared()
            database = try self.postgres.createUniqueDatabase(prefix: "sync")
        }

        var configuration: SyncConfiguration {
            SyncConfiguration(
                host: postgres.host, port: postgres.port, username: postgres.superuser, database: database, schema: schema,
                tls: .disable)
        }

        @discardableResult
        func psql(_ sql: String) throws -> String { try postgres.psql(sql, database: database) }
    }

    /// Waits until `condition` holds (polled every 20 ms), `seconds` at most.
    func eventually(seconds: Double = 15, _ condition: () async throws -> Bool) async rethrows -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if try await condition() { return true }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return try await condition()
    }

    func handles(_ stack: Skyros) async throws -> [String] {
        try await stack.read { context in try User.all(in: context).map(\.handle).sorted() }
    }

    @Test("a save on A reaches B's main context; psql inserts, updates and deletes reach both")
    func twoMachines() async throws {
        let server = try Server()
        let machineA = try RunningDaemon(sync: server.configuration, log: { print("A: \($0)") })
        let machineB = try RunningDaemon(sync: server.configuration, log: { print("B: \($0)") })
        let a = try Skyros(sharedStack: testSchema, container: machineA.container.url)
        let b = try Skyros(sharedStack: testSchema, container: machineB.container.url)
        // B's daemon has a store (and syncs) once its first client said hello.
        _ = try await handles(b)
        let bChanges = b.changes

        try await a.write { context in
            let user = User.create(in: context)
            user.handle = "ann"
            user.firstname = "Ann"
        }
        let arrived = try #require(await nextChange(bChanges, seconds: 15))
        #expect(arrived.inserted.count == 1)
        #expect(try await handles(b) == ["ann"])
        #expect(try server.psql(#"SELECT handle, firstname FROM g_sync."User""#) == "ann|Ann")

        try server.psql(#"INSERT INTO g_sync."User" (handle, firstname) VALUES ('bob', 'Bob')"#)
        #expect(try await eventually { try await handles(a) == ["ann", "bob"] })
        #expect(try await eventually { try await handles(b) == ["ann", "bob"] })

        try server.psql(#"UPDATE g_sync."User" SET firstname = 'Bobby' WHERE handle = 'bob'"#)
        let firstname = { (stack: Skyros) in
            try await stack.read { context in try User.all(in: context).first { $0.handle == "bob" }?.firstname }
        }
        #expect(try await eventually {
            let onA = try await firstname(a)
            let onB = try await firstname(b)
            return onA == "Bobby" && onB == "Bobby"
        })

        try server.psql(#"DELETE FROM g_sync."User" WHERE handle = 'ann'"#)
        #expect(try await eventually {
            let onA = try await handles(a)
            let onB = try await handles(b)
            return onA == ["bob"] && onB == ["bob"]
        })
    }
}
