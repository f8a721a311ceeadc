import Foundation
import Skyros
import SkyrosSync
import SkyrosTestSupport
import Testing

/// A hostile or broken server side (issue 35 item 5, docs/SYNC.md "Failure modes"): a group
/// table or the log truncated, a column or the whole schema dropped, a wrong password. The
/// daemon goes to `state: error` with a message an operator can act on while its apps go on
/// saving locally, loses no queued change set, and once the server is fixed uploads each
/// exactly once and converges with the other machines. (TLS required by the server but not
/// configured on the daemon: `SyncSecurityTests.hostsslOnly`.)
@Suite("Sync with a broken server", .serialized, .timeLimit(.minutes(3)))
struct SyncServerFaultTests {
    let sync = SyncTests()
    static let daemonPassword = "daemon secret"

    /// A server of the test's own (roles are the cluster's) with the group's schema set up by
    /// an owner, and two machines whose daemons have a DML-only role (docs/SYNC.md "Security"),
    /// as a server whose operator may break it should have.
    struct Group {
        let roles: SyncRoles
        let schema = "g_fault"
        let machines: (RunningDaemon, RunningDaemon)
        let a: Skyros
        let b: Skyros

        init() async throws {
            roles = try SyncRoles(try await PostgresServer.started(password: "superuser secret"))
            try await roles.setUp(schema: schema, models: testSchema)
            try roles.createDaemonRole("skyros_daemon", password: SyncServerFaultTests.daemonPassword)
            try roles.grant("skyros_daemon", schema: schema, models: testSchema)
            let configuration = roles.configuration(
                role: "skyros_daemon", password: SyncServerFaultTests.daemonPassword, schema: schema)
            machines = (try RunningDaemon(sync: configuration), try RunningDaemon(sync: configuration))
            a = try Skyros(sharedStack: testSchema, container: machines.0.container.url)
            b = try Skyros(sharedStack: testSchema, container: machines.1.container.url)
        }

        /// The server's users, `handle:firstname:lastname`, by handle.
        func onServer() throws -> String {
            try roles.psql(
                #"SELECT coalesce(string_agg(handle || ':' || firstname || ':' || lastname, ',' ORDER BY handle), '') FROM g_fault."User""#
            )
        }

        /// The change sets the server recorded (applied, none refused), and the refused ones.
        func uploads() throws -> String {
            try roles.psql(
                "SELECT count(*) FILTER (WHERE rejected IS NULL) || ' ' || count(rejected) FROM g_fault._skyros_uploads"
            )
        }
    }

    /// A machine's users as ``Group/onServer()`` lists the server's.
    func users(_ stack: Skyros) async throws -> String {
        try await stack.read { context in
            try User.all(in: context).sorted { $0.handle < $1.handle }.map {
                "\($0.handle):\($0.firstname):\($0.lastname)"
            }
            .joined(separator: ",")
        }
    }

    /// Expects both machines to come to hold what the server holds, and that to be `expected`.
    func expectConverged(
        _ group: Group, to expected: String, seconds: Double = 45, sourceLocation: SourceLocation = #_sourceLocation
    ) async {
        let converged = await sync.eventually(seconds: seconds) {
            let server = try group.onServer()
            let onA = try await users(group.a)
            let onB = try await users(group.b)
            return server == expected && onA == expected && onB == expected
        }
        if !converged {
            let states = await describe(group)
            Issue.record("not converged to \(expected): \(states)", sourceLocation: sourceLocation)
        }
    }

    /// Expects `daemon` to come to `expected` state, and returns its message.
    func expectState(
        _ expected: String, _ daemon: RunningDaemon, of group: Group, where matches: (String) -> Bool = { _ in true },
        sourceLocation: SourceLocation = #_sourceLocation
    ) async -> String {
        let result = await sync.reaches(expected, daemon, where: matches)
        if !result.ok {
            let states = await describe(group)
            Issue.record(
                "not \(expected): \(result.state) \(result.message); \(states)", sourceLocation: sourceLocation)
        }
        return result.message
    }

    /// The states of both machines and what each holds, for a failure's message.
    func describe(_ group: Group) async -> String {
        let onA = (try? await users(group.a)) ?? "?"
        let onB = (try? await users(group.b)) ?? "?"
        return
            "server: \((try? group.onServer()) ?? "?"); A: \(onA) \(sync.syncState(group.machines.0)); B: \(onB) \(sync.syncState(group.machines.1))"
    }

    @Test(
        "the engine's probe: a server accepting connections over TCP and its Unix socket, none once PostgreSQL stops, again once it starts"
    )
    func probe() async throws {
        let postgres = try await PostgresServer.started()
        func server(_ host: String) -> PostgresSyncServer {
            PostgresSyncServer(
                configuration: SyncConfiguration(
                    host: host, port: postgres.port, username: postgres.superuser, database: "postgres",
                    schema: "g_probe", tls: .disable),
                statementTimeout: .seconds(10), createsSchema: false, executor: SyncExecutor())
        }
        let tcp = server(postgres.host)
        let socket = server(postgres.socketDirectory)
        #expect(await tcp.probe())
        #expect(await socket.probe())
        try postgres.stop(mode: .fast)
        #expect(!(await tcp.probe()))
        #expect(!(await socket.probe()))
        try postgres.start()
        #expect(await tcp.probe())
        #expect(await socket.probe())
        // A probe is only a connection: the server has no session left of it.
        #expect(
            await sync.eventually {
                try postgres.psql(
                    "SELECT count(*) FROM pg_stat_activity WHERE backend_type = 'client backend' AND pid <> pg_backend_pid()"
                ) == "0"
            })
    }

    @Test(
        "a group table truncated on the server (TRUNCATE … CASCADE): every machine deletes its rows, and goes on syncing"
    )
    func truncatedTable() async throws {
        let (server, machines, a, b) = try sync.twoMachines()
        defer { withExtendedLifetime(machines) {} }
        for handle in ["u1", "u2", "u3"] { try await sync.insert(handle, into: a) }
        try await a.write { context in
            let post = Post.create(in: context)
            post.title = "by u1"
            post.author = try User.all(in: context).first { $0.handle == "u1" }
        }
        let posts = { (stack: Skyros) in try await stack.read { context in try Post.all(in: context).count } }
        #expect(
            await sync.eventually {
                let handles = try await sync.handles(b)
                let count = try await posts(b)
                return handles == ["u1", "u2", "u3"] && count == 1
            })

        // TRUNCATE fires no row trigger: the BEFORE TRUNCATE trigger logs the rows it removes.
        try server.psql(#"TRUNCATE g_sync."User" CASCADE"#)
        #expect(try server.psql(#"SELECT count(DISTINCT id) FROM g_sync._skyros_log WHERE entity = 'User'"#) == "3")
        #expect(
            await sync.eventually {
                let onA = try await sync.handles(a)
                let onB = try await sync.handles(b)
                let postsOnA = try await posts(a)
                let postsOnB = try await posts(b)
                return onA.isEmpty && onB.isEmpty && postsOnA == 0 && postsOnB == 0
            })
        #expect(sync.syncState(machines.0).state == "online")
        #expect(sync.syncState(machines.1).state == "online")
        try await sync.insert("after", into: b)
        #expect(await sync.eventually { try await sync.handles(a) == ["after"] })
    }

    @Test(
        "the change log truncated on the server: the horizon moves, and a machine that was away re-syncs from a snapshot, deletions included"
    )
    func truncatedLog() async throws {
        let server = try SyncTests.Server()
        let machineA = try RunningDaemon(sync: server.configuration)
        let a = try Skyros(sharedStack: testSchema, container: machineA.container.url)
        // Kept to the end: a RunningDaemon's deinit removes its directory, and B must come
        // back with its store (and its checkpoint), not as a new machine.
        let machineB = try RunningDaemon(sync: server.configuration)
        var b: Skyros? = try Skyros(sharedStack: testSchema, container: machineB.container.url)
        try await sync.insert("kept", into: a)
        try await sync.insert("doomed", into: a)
        #expect(await sync.eventually { try await sync.handles(b!) == ["doomed", "kept"] })
        b = nil
        machineB.shutDown()

        let horizon = { UInt64(try server.psql("SELECT value FROM g_sync._skyros_meta WHERE key = 'horizon'")) ?? 0 }
        let before = try horizon()
        try server.psql(#"DELETE FROM g_sync."User" WHERE handle = 'doomed'"#)
        try server.psql("TRUNCATE g_sync._skyros_log")
        #expect(try horizon() > before)
        #expect(await sync.eventually { try await sync.handles(a) == ["kept"] })

        let restarted = try RunningDaemon(directory: machineB.directory, sync: server.configuration)
        let again = try Skyros(sharedStack: testSchema, container: restarted.container.url)
        #expect(await sync.eventually { try await sync.handles(again) == ["kept"] })
        try await sync.insert("after", into: again)
        #expect(await sync.eventually { try await sync.handles(a) == ["after", "kept"] })
    }

    @Test(
        "a column dropped on the server: error naming it and --sync-setup, saves queued; set up again, each uploaded once, every machine converges to the server"
    )
    func droppedColumn() async throws {
        let group = try await Group()
        // Carl is not touched after the drop: only a re-read of every row brings him the
        // server's value.
        let ann = try await group.a.write { context in
            let carl = User.create(in: context)
            carl.handle = "carl"
            carl.lastname = "Jones"
            let user = User.create(in: context)
            user.handle = "ann"
            user.lastname = "Smith"
            return user.objectID
        }
        await expectConverged(group, to: "ann::Smith,carl::Jones")

        try group.roles.psql(#"ALTER TABLE g_fault."User" DROP COLUMN lastname"#)
        try await group.a.write { context in try #require(context.object(with: ann, as: User.self)).firstname = "Ann" }
        try await sync.insert("bob", into: group.a)
        // (First, maybe, the server's own words: `column "lastname" does not exist`.)
        let refused = await expectState("error", group.machines.0, of: group) { $0.contains("--sync-setup") }
        #expect(refused.contains("g_fault.User.lastname"), "\(refused)")
        #expect(refused.contains("--sync-setup"), "\(refused)")
        #expect(try await users(group.a) == "ann:Ann:Smith,bob::,carl::Jones")  // saved locally all the same
        #expect((try sync.syncStatus(group.machines.0)["uploadQueue"] as? Int ?? 0) >= 1)

        // The operator runs --sync-setup: the column comes back with its default, the horizon
        // moves past the repair, and every machine re-reads the server's values.
        try await group.roles.setUp(schema: group.schema, models: testSchema)
        await expectConverged(group, to: "ann:Ann:,bob::,carl::")
        _ = await expectState("online", group.machines.0, of: group)
        #expect(try group.uploads() == "3 0")
    }

    @Test(
        "the group's schema dropped: error with --sync-setup, saves queued; set up and granted again, each queued save uploaded once, and every machine converges to the server"
    )
    func droppedSchema() async throws {
        let group = try await Group()
        try await sync.insert("before", into: group.a)
        await expectConverged(group, to: "before::")

        try group.roles.psql("DROP SCHEMA g_fault CASCADE")
        try await sync.insert("after-1", into: group.a)
        try await sync.insert("after-2", into: group.a)
        let refused = await expectState("error", group.machines.0, of: group) { $0.contains("--sync-setup") }
        #expect(refused.contains("g_fault._skyros_log"), "\(refused)")
        #expect(refused.contains("--sync-setup"), "\(refused)")
        #expect(try await users(group.a) == "after-1::,after-2::,before::")
        #expect(try sync.syncStatus(group.machines.0)["uploadQueue"] as? Int == 2)

        // Made again, empty: the server is the system of record, so `before` is gone
        // everywhere, and the queued saves are uploaded, once each.
        try await group.roles.setUp(schema: group.schema, models: testSchema)
        try group.roles.grant("skyros_daemon", schema: group.schema, models: testSchema)
        await expectConverged(group, to: "after-1::,after-2::")
        #expect(try group.uploads() == "2 0")
        _ = await expectState("online", group.machines.0, of: group)
        _ = await expectState("online", group.machines.1, of: group)
    }

    @Test(
        "the daemon's password changed on the server: error saying so, saves queued; the password back, each uploaded once"
    )
    func wrongPassword() async throws {
        let group = try await Group()
        try await sync.insert("first", into: group.a)
        await expectConverged(group, to: "first::")

        try group.roles.postgres.psql(
            """
            ALTER ROLE skyros_daemon PASSWORD 'changed';
            SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity WHERE usename = 'skyros_daemon';
            """)
        try await sync.insert("queued", into: group.a)
        let refused = await expectState("error", group.machines.0, of: group) { $0.contains("28P01") }
        #expect(refused.contains("password authentication failed for user \"skyros_daemon\""), "\(refused)")
        #expect(refused.contains("28P01"), "\(refused)")
        #expect(try await users(group.a) == "first::,queued::")
        #expect(try sync.syncStatus(group.machines.0)["uploadQueue"] as? Int == 1)
        #expect(try group.onServer() == "first::")

        try group.roles.postgres.psql("ALTER ROLE skyros_daemon PASSWORD '\(Self.daemonPassword)'")
        await expectConverged(group, to: "first::,queued::")
        #expect(try group.uploads() == "2 0")
        _ = await expectState("online", group.machines.0, of: group)
    }
}
