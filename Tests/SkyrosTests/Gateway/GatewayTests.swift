import Foundation
import Logging
import NIOPosix
import PostgresNIO
import Skyros
import SkyrosGateway
import SkyrosShared
import SkyrosSync
import SkyrosTestSupport
import Synchronization
import Testing

/// Machines through a sync gateway (DESIGN §10): a real PostgreSQL, a gateway serving WebSockets
/// over TLS with certificates made for the test, tokens signed for real, and daemons whose sync
/// engine talks to the gateway.
@Suite("Sync gateway", .serialized, .timeLimit(.minutes(3)))
struct GatewayTests {
    static let rules = """
        buckets:
          own:
            parameters:
              who: token.sub
            entities:
              User: handle = bucket.who
              Post: author.handle = bucket.who
        """

    /// A database with the group's tables, a gateway in front of it, and what machines need to
    /// reach it (the CA, tokens).
    final class Fleet: Sendable {
        let postgres: PostgresServer
        let database: String
        let certificates: TestCertificates
        let gateway: GatewayServer
        let directory: String
        let secret = Data((0..<32).map { _ in UInt8.random(in: 0...255) })
        static let schemaName = "g_gateway"

        /// Between the gateway and PostgreSQL, when the test breaks that link.
        let proxy: FaultProxy?

        init(proxied: Bool = false) async throws {
            postgres = try await PostgresServer.shared()
            database = try postgres.createUniqueDatabase(prefix: "gateway")
            certificates = try TestCertificates()
            directory = "/tmp/skgw-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
            let configuration = SyncConfiguration(
                host: postgres.host, port: postgres.port, username: postgres.superuser, database: database,
                schema: Self.schemaName, tls: .disable)
            try await Self.setUp(configuration)
            let rules = try SyncRules.parse(GatewayTests.rules).resolvingDestinations(in: testSchema)
            proxy = proxied ? try FaultProxy(upstreamPort: postgres.port) : nil
            var database = configuration
            if let proxy { database.servers = [SyncConfiguration.Server(host: "127.0.0.1", port: proxy.port)] }
            var gatewayConfiguration = GatewayConfiguration(
                group: "g", database: database, rules: rules,
                verifier: try await SyncTokenVerifier(secret: secret), host: "127.0.0.1", port: 0,
                certificate: certificates.serverCertificate, key: certificates.serverKey)
            gatewayConfiguration.statementTimeout = .seconds(2)
            gateway = GatewayServer(configuration: gatewayConfiguration)
            try await gateway.start()
        }

        /// Makes the group's tables, or migrates them, as an operator's --sync-setup does.
        static func setUp(_ configuration: SyncConfiguration) async throws {
            var logger = Logger(label: "test")
            logger.logLevel = .critical
            let connection = try await PostgresConnection.connect(
                on: MultiThreadedEventLoopGroup.singleton.any(),
                configuration: try configuration.connectionConfiguration(), id: 1, logger: logger)
            do {
                try await ServerSession(
                    connection: connection, schema: ServerSchema(testSchema, name: schemaName), logger: logger
                ).ensureSchema()
            } catch {
                try? await connection.close()
                throw error
            }
            try await connection.close()
        }

        /// A token of `subject`, in a file of its own.
        func tokenFile(_ subject: String, expires: TimeInterval = 3600) async throws -> String {
            let token = try await SyncToken.mint(
                SyncTokenClaims(subject: subject, expiration: Date().addingTimeInterval(expires)), secret: secret)
            let path = directory + "/\(subject)-\(UInt32.random(in: 0...UInt32.max)).token"
            try token.write(toFile: path, atomically: true, encoding: .utf8)
            return path
        }

        /// A machine's sync configuration through the gateway with the token in `tokenFile`.
        func machineConfiguration(tokenFile: String) throws -> SyncConfiguration {
            let container = URL(fileURLWithPath: directory).appendingPathComponent("unused")
            guard
                let configuration = try SyncConfiguration.resolve(
                    group: "g", container: container,
                    url: "wss://127.0.0.1:\(gateway.port)/g?sslrootcert=\(certificates.authority)", passwordFile: nil,
                    tokenFile: tokenFile, environment: [:])
            else { throw SkyrosError(.syncConfiguration, "no configuration") }
            return configuration
        }

        /// A machine (a daemon and a client stack) syncing through the gateway as `subject`.
        func machine(_ subject: String) async throws -> (daemon: RunningDaemon, stack: Skyros) {
            let daemon = try RunningDaemon(sync: try machineConfiguration(tokenFile: try await tokenFile(subject)))
            let stack = try Skyros(sharedStack: testSchema, container: daemon.container.url)
            return (daemon, stack)
        }

        @discardableResult
        func psql(_ sql: String) throws -> String { try postgres.psql(sql, database: database) }

        /// A `skyros-gateway` process in front of the same database (`port` 0: any free one),
        /// with the same rules and secret; returns once it listens, with its port.
        func spawnGateway(port: Int = 0) throws -> (process: ChildProcess, port: Int) {
            let rules = directory + "/sync-rules.yaml"
            let secret = directory + "/secret"
            if !FileManager.default.fileExists(atPath: rules) {
                try GatewayTests.rules.write(toFile: rules, atomically: true, encoding: .utf8)
                _ = FileManager.default.createFile(
                    atPath: secret, contents: self.secret, attributes: [.posixPermissions: 0o600])
            }
            let process = try ChildProcess(
                [
                    "--group", "g",
                    "--database",
                    "postgresql://\(postgres.superuser)@\(postgres.host):\(postgres.port)/\(database)?sslmode=disable&schema=\(Self.schemaName)",
                    "--rules", rules, "--secret-file", secret, "--listen", "127.0.0.1:\(port)",
                    "--tls-cert", certificates.serverCertificate, "--tls-key", certificates.serverKey,
                    "--handshake-timeout", "5",
                ], executable: ChildProcess.builtExecutable("skyros-gateway"))
            guard process.waitForOutput(containing: "listening on 127.0.0.1:") else {
                throw SkyrosError(.storeFailure, "the gateway did not start: \(process.readAll())")
            }
            // "listening on 127.0.0.1:PORT"
            var output = ""
            _ = process.waitForOutput(containing: "\n", seconds: 1)
            output = process.outputSoFar
            guard let line = output.split(separator: "\n").first(where: { $0.contains("listening on 127.0.0.1:") }),
                let listened = Int(line.split(separator: ":").last ?? "")
            else { throw SkyrosError(.storeFailure, "the gateway's port is not in its output: \(output)") }
            return (process, listened)
        }

        /// A machine's sync configuration through a gateway at `port`.
        func machineConfiguration(tokenFile: String, port: Int) throws -> SyncConfiguration {
            let container = URL(fileURLWithPath: directory).appendingPathComponent("unused")
            guard
                let configuration = try SyncConfiguration.resolve(
                    group: "g", container: container,
                    url: "wss://127.0.0.1:\(port)/g?sslrootcert=\(certificates.authority)", passwordFile: nil,
                    tokenFile: tokenFile, environment: [:])
            else { throw SkyrosError(.syncConfiguration, "no configuration") }
            return configuration
        }

        func stop() async {
            await gateway.stop()
            proxy?.stop()
        }

        deinit {
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    func eventually(seconds: Double = 30, _ condition: () async throws -> Bool) async -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if (try? await condition()) == true { return true }
            try? await Task.sleep(for: .milliseconds(20))
        }
        return (try? await condition()) == true
    }

    func handles(_ stack: Skyros) async throws -> [String] {
        try await stack.read { context in try User.all(in: context).map(\.handle).sorted() }
    }

    func titles(_ stack: Skyros) async throws -> [String] {
        try await stack.read { context in try Post.all(in: context).map(\.title).sorted() }
    }

    /// `skyros status --json`'s `sync` of a machine.
    func syncStatus(_ daemon: RunningDaemon) throws -> [String: Any] {
        let run = try OperatingToolTests.run(["status", "--group", "g", "--groups-dir", daemon.directory, "--json"])
        let object = try JSONSerialization.jsonObject(with: Data(run.stdout.utf8)) as? [String: Any]
        return object?["sync"] as? [String: Any] ?? [:]
    }

    /// Swift's cooperative pool blocked, every thread of it (by this process's other tests in
    /// CI, by an app's synchronous work): a machine still connects through the in-process
    /// gateway and is online before the pool is let go. Every task of the gateway and of a
    /// machine's link runs on SwiftNIO's event loops; when some ran on the pool, CI's loaded
    /// run had a machine wait past 30 s for its first checkpoint.
    @Test(
        "a machine connects through the gateway, and is online, while every thread of Swift's cooperative pool is blocked"
    )
    func blockedPool() async throws {
        let fleet = try await Fleet()
        try fleet.psql(#"INSERT INTO g_gateway."User" (handle, firstname) VALUES ('ann', 'Ann')"#)
        let configuration = try fleet.machineConfiguration(tokenFile: try await fleet.tokenFile("ann"))
        let width = ProcessInfo.processInfo.activeProcessorCount
        let started = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        for _ in 0..<width {
            Task.detached {
                started.signal()
                _ = release.wait(timeout: .now() + 10)  // bounded, whatever happens below
            }
        }
        // Off the pool: a thread that waits for every blocker to hold its thread, starts the
        // machine and an app's stack, and lets the pool go once the machine is online (5 s at
        // most).
        let outcome: (blocked: Bool, online: Bool, daemon: RunningDaemon?, stack: Skyros?) =
            await withCheckedContinuation {
                continuation in
                Thread.detachNewThread {
                    var blocked = true
                    for _ in 0..<width where started.wait(timeout: .now() + 10) == .timedOut { blocked = false }
                    let online = DispatchSemaphore(value: 0)
                    let daemon = try? RunningDaemon(sync: configuration) { line in
                        if line.hasPrefix("sync: online") { online.signal() }
                    }
                    // A daemon syncs once a client brought it the schema (its hello).
                    let stack = daemon.flatMap { try? Skyros(sharedStack: testSchema, container: $0.container.url) }
                    let wasOnline = stack != nil && online.wait(timeout: .now() + 5) == .success
                    // The pool was blocked indeed only if a task made meanwhile did not run.
                    let probe = Mutex(false)
                    if blocked {
                        Task.detached { probe.withLock { $0 = true } }
                        usleep(50_000)  // a chance to run, were a thread free (not a synchronization)
                        blocked = !probe.withLock { $0 }
                    }
                    for _ in 0..<width { release.signal() }
                    continuation.resume(returning: (blocked, wasOnline, daemon, stack))
                }
            }
        let daemon = try #require(outcome.daemon)
        let stack = try #require(outcome.stack)
        #expect(outcome.blocked, "the cooperative pool was not blocked: the test proved nothing")
        #expect(outcome.online, "the machine was not online within 5 s while the pool was blocked")
        #expect(await eventually { try await handles(stack) == ["ann"] })
        withExtendedLifetime(daemon) {}
        await fleet.stop()
    }

    @Test(
        "two machines with different tokens: each has only its rows; a row moved on the server leaves one and reaches the other, with the posts it reaches; writes outside one's buckets are refused"
    )
    func twoMachines() async throws {
        let fleet = try await Fleet()
        try fleet.psql(
            """
            INSERT INTO g_gateway."User" (handle, firstname) VALUES ('ann', 'Ann'), ('bob', 'Bob'), ('carl', 'Carl');
            INSERT INTO g_gateway."Post" (title, author) SELECT 'by ' || handle, "_id" FROM g_gateway."User";
            """)
        let ann = try await fleet.machine("ann")
        let bob = try await fleet.machine("bob")
        defer { withExtendedLifetime((ann, bob)) {} }
        #expect(await eventually { try await handles(ann.stack) == ["ann"] })
        #expect(await eventually { try await handles(bob.stack) == ["bob"] })
        #expect(try await titles(ann.stack) == ["by ann"])
        #expect(try await titles(bob.stack) == ["by bob"])
        let status = try syncStatus(ann.daemon)
        #expect(status["via"] as? String == "gateway")
        #expect(status["state"] as? String == "online")

        // A psql insert reaches exactly the machine whose bucket holds it.
        try fleet.psql(
            #"INSERT INTO g_gateway."Post" (title, author) SELECT 'second by ann', "_id" FROM g_gateway."User" WHERE handle = 'ann'"#
        )
        #expect(await eventually { try await titles(ann.stack) == ["by ann", "second by ann"] })

        // A write inside one's bucket goes to the server.
        try await ann.stack.write { context in
            try User.all(in: context).first { $0.handle == "ann" }?.firstname = "Anne"
        }
        #expect(
            await eventually {
                try fleet.psql(#"SELECT firstname FROM g_gateway."User" WHERE handle = 'ann'"#) == "Anne"
            })

        // A write outside it (a user Ann's token does not hold) is refused, and the object goes away on Ann.
        try await ann.stack.write { context in
            let user = User.create(in: context)
            user.handle = "mallory"
        }
        #expect(
            await eventually {
                (try syncStatus(ann.daemon))["rejected"] as? Int ?? 0 >= 1
            })
        #expect(try fleet.psql(#"SELECT count(*) FROM g_gateway."User" WHERE handle = 'mallory'"#) == "0")
        #expect(await eventually { try await handles(ann.stack) == ["ann"] })
        // What /metrics shows: two machines (four connections), the refusal by its reason.
        let metrics = await fleet.gateway.metrics.text(gateway: fleet.gateway)
        #expect(metrics.contains("skyros_gateway_connected_machines 2"), "\(metrics)")
        #expect(metrics.contains("skyros_gateway_listening 1"), "\(metrics)")
        #expect(metrics.contains(#"skyros_gateway_refusals_total{reason="rules"} 1"#), "\(metrics)")

        // Moving a user on the server: it leaves Ann, reaches Bob, with the posts it reaches.
        try fleet.psql(
            #"BEGIN; UPDATE g_gateway."User" SET handle = 'old-bob' WHERE handle = 'bob'; UPDATE g_gateway."User" SET handle = 'bob' WHERE handle = 'ann'; COMMIT"#
        )
        #expect(await eventually { try await handles(ann.stack) == [] })
        #expect(await eventually { try await titles(ann.stack) == [] })
        #expect(await eventually { try await handles(bob.stack) == ["bob"] })
        #expect(await eventually { try await titles(bob.stack) == ["by ann", "second by ann"] })
        await fleet.stop()
    }

    @Test(
        "the gateway reads each change once for all its machines: six machines, six changes, each reaching its machine only"
    )
    func sharedReads() async throws {
        let fleet = try await Fleet()
        let subjects = (0..<6).map { "u\($0)" }
        try fleet.psql(
            #"INSERT INTO g_gateway."User" (handle) VALUES "# + subjects.map { "('\($0)')" }.joined(separator: ", "))
        var machines: [(daemon: RunningDaemon, stack: Skyros)] = []
        for subject in subjects { machines.append(try await fleet.machine(subject)) }
        defer { withExtendedLifetime(machines) {} }
        for (index, machine) in machines.enumerated() {
            #expect(await eventually { try await handles(machine.stack) == [subjects[index]] })
        }
        let before = await fleet.gateway.feedReads()
        for (index, subject) in subjects.enumerated() {
            try fleet.psql(
                #"INSERT INTO g_gateway."Post" (title, author) SELECT 'post of "# + subject
                    + #"', "_id" FROM g_gateway."User" WHERE handle = '"# + subject + "'")
            #expect(await eventually { try await titles(machines[index].stack) == ["post of \(subject)"] })
        }
        for (index, machine) in machines.enumerated() {
            #expect(try await titles(machine.stack) == ["post of \(subjects[index])"])
        }
        let reads = await fleet.gateway.feedReads() - before
        // One read per change (a notification that comes during a read may add one), where
        // reading for each machine would be 36.
        #expect(reads >= subjects.count && reads <= 2 * subjects.count, "\(reads) reads for \(subjects.count) changes")
        await fleet.stop()
        // Each change was told to its machine only: six notifications, where every machine
        // would be 36.
        #expect(told(fleet) == subjects.count, "\(told(fleet)) notifications for \(subjects.count) changes")
    }

    @Test(
        "a token file that changes while the machine is connected: it connects again with the new token within seconds, and goes on syncing"
    )
    func tokenRenewed() async throws {
        let fleet = try await Fleet()
        try fleet.psql(#"INSERT INTO g_gateway."User" (handle) VALUES ('ann')"#)
        let file = try await fleet.tokenFile("ann")
        let onlines = Mutex(0)
        let said = Mutex(false)
        let daemon = try RunningDaemon(sync: try fleet.machineConfiguration(tokenFile: file)) { line in
            if line.hasPrefix("sync: online") { onlines.withLock { $0 += 1 } }
            if line.contains("the token file changed: connecting again with its token") { said.withLock { $0 = true } }
        }
        let stack = try Skyros(sharedStack: testSchema, container: daemon.container.url)
        #expect(await eventually { try await handles(stack) == ["ann"] })
        #expect(onlines.withLock { $0 } == 1)
        // Renewed in place, as an operator's rotation does (a new expiry; other claims alike).
        let renewed = try await SyncToken.mint(
            SyncTokenClaims(subject: "ann", expiration: Date().addingTimeInterval(7_200)), secret: fleet.secret)
        try renewed.write(toFile: file, atomically: true, encoding: .utf8)
        // The engine's next request (its poll: every 5 s) finds it; the listening connection
        // at its next wake-up.
        #expect(await eventually(seconds: 20) { onlines.withLock { $0 } >= 2 })
        #expect(said.withLock { $0 })
        try fleet.psql(
            #"INSERT INTO g_gateway."Post" (title, author) SELECT 'after', "_id" FROM g_gateway."User" WHERE handle = 'ann'"#
        )
        #expect(await eventually { try await titles(stack) == ["after"] })
        withExtendedLifetime(daemon) {}
        await fleet.stop()
    }

    /// Notifications written to machines by the fleet's gateway so far.
    func told(_ fleet: Fleet) -> Int { fleet.gateway.metrics.toldTotal.withLock { $0 } }

    @Test(
        "a change is told only to the machines it concerns: a new row to its bucket's machine, a row moved to the machine that held it and the one that holds it, a row the gateway never saw change to every machine"
    )
    func targetedNotifications() async throws {
        let fleet = try await Fleet()
        try fleet.psql(
            #"INSERT INTO g_gateway."User" (handle, firstname) VALUES ('ann', 'Ann'), ('bob', 'Bob'), ('carl', 'Carl')"#
        )
        let ann = try await fleet.machine("ann")
        let bob = try await fleet.machine("bob")
        let carl = try await fleet.machine("carl")
        defer { withExtendedLifetime((ann, bob, carl)) {} }
        #expect(await eventually { try await handles(ann.stack) == ["ann"] })
        #expect(await eventually { try await handles(bob.stack) == ["bob"] })
        #expect(await eventually { try await handles(carl.stack) == ["carl"] })
        func firstname(_ stack: Skyros) async throws -> String? {
            try await stack.read { context in try User.all(in: context).first?.firstname }
        }

        // A new row: its machine only (one notification, where every machine would be three;
        // the count grows by the machines told at once, so a wider fan-out never reaches 1).
        var before = told(fleet)
        try fleet.psql(
            #"INSERT INTO g_gateway."Post" (title, author) SELECT 'p', "_id" FROM g_gateway."User" WHERE handle = 'ann'"#
        )
        #expect(await eventually { try await titles(ann.stack) == ["p"] })
        #expect(await eventually { told(fleet) - before == 1 }, "\(told(fleet) - before) machines told")

        // Moved to bob: the machine that held it (it must delete it) and the one that holds it.
        before = told(fleet)
        try fleet.psql(
            #"UPDATE g_gateway."Post" SET author = (SELECT "_id" FROM g_gateway."User" WHERE handle = 'bob') WHERE title = 'p'"#
        )
        #expect(await eventually { try await titles(ann.stack) == [] })
        #expect(await eventually { try await titles(bob.stack) == ["p"] })
        #expect(await eventually { told(fleet) - before == 2 }, "\(told(fleet) - before) machines told")
        #expect(try await titles(carl.stack) == [])

        // A row the gateway's reads never met: where it was is not known, so every machine.
        before = told(fleet)
        try fleet.psql(#"UPDATE g_gateway."User" SET firstname = 'Carlos' WHERE handle = 'carl'"#)
        #expect(await eventually { try await firstname(carl.stack) == "Carlos" })
        #expect(await eventually { told(fleet) - before == 3 }, "\(told(fleet) - before) machines told")
        // Met now: its machine only.
        before = told(fleet)
        try fleet.psql(#"UPDATE g_gateway."User" SET firstname = 'Charles' WHERE handle = 'carl'"#)
        #expect(await eventually { try await firstname(carl.stack) == "Charles" })
        #expect(await eventually { told(fleet) - before == 1 }, "\(told(fleet) - before) machines told")
        #expect(try await firstname(ann.stack) == "Ann")
        await fleet.stop()
    }

    @Test(
        "a server whose log does not record operations (set up by an earlier version): every change is told to every machine, nothing is lost; --sync-setup adds the column"
    )
    func logWithoutOperations() async throws {
        let fleet = try await Fleet()
        // The server as an earlier version set it up: no op column, a function that writes none.
        let schema = ServerSchema(testSchema, name: Fleet.schemaName)
        guard let function = schema.syncTablesSQL.first(where: { $0.contains("_skyros_changes() RETURNS trigger") })
        else {
            Issue.record("no change function in the sync tables' statements")
            return
        }
        let earlier = function.replacingOccurrences(of: ", op)", with: ")")
            .replacingOccurrences(of: ", 'i' FROM", with: " FROM")
            .replacingOccurrences(of: ", 'u' FROM", with: " FROM")
            .replacingOccurrences(of: ", 'd' FROM", with: " FROM")
        #expect(!earlier.contains("op"), "\(earlier)")
        try fleet.psql(earlier + "; ALTER TABLE g_gateway._skyros_log DROP COLUMN op")
        try fleet.psql(#"INSERT INTO g_gateway."User" (handle) VALUES ('ann'), ('bob')"#)
        let ann = try await fleet.machine("ann")
        let bob = try await fleet.machine("bob")
        defer { withExtendedLifetime((ann, bob)) {} }
        #expect(await eventually { try await handles(ann.stack) == ["ann"] })
        #expect(await eventually { try await handles(bob.stack) == ["bob"] })
        let before = told(fleet)
        try fleet.psql(
            #"INSERT INTO g_gateway."Post" (title, author) SELECT 'p', "_id" FROM g_gateway."User" WHERE handle = 'ann'"#
        )
        #expect(await eventually { try await titles(ann.stack) == ["p"] })
        #expect(await eventually { told(fleet) - before == 2 }, "\(told(fleet) - before) machines told")
        #expect(try await titles(bob.stack) == [])

        // Set up again (what --sync-setup does): the column and the function that fills it.
        try await Fleet.setUp(
            SyncConfiguration(
                host: fleet.postgres.host, port: fleet.postgres.port, username: fleet.postgres.superuser,
                database: fleet.database, schema: Fleet.schemaName, tls: .disable))
        #expect(
            try fleet.psql(
                "SELECT count(*) FROM information_schema.columns WHERE table_schema = 'g_gateway' AND table_name = '_skyros_log' AND column_name = 'op'"
            ) == "1")
        try fleet.psql(#"INSERT INTO g_gateway."User" (handle) VALUES ('dan')"#)
        #expect(try fleet.psql(#"SELECT op FROM g_gateway._skyros_log ORDER BY at DESC LIMIT 1"#) == "i")
        await fleet.stop()
    }

    @Test(
        "a partition between the gateway and PostgreSQL: machines go offline and keep saving; once it heals, every save is on the server once and the server's changes reach them"
    )
    func serverPartition() async throws {
        let fleet = try await Fleet(proxied: true)
        guard let proxy = fleet.proxy else { return }
        try fleet.psql(#"INSERT INTO g_gateway."User" (handle) VALUES ('ann')"#)
        let ann = try await fleet.machine("ann")
        let reader = try await fleet.machine("ann")
        defer { withExtendedLifetime((ann, reader)) {} }
        #expect(await eventually { try await handles(ann.stack) == ["ann"] })
        #expect(await eventually { try await handles(reader.stack) == ["ann"] })
        // Bytes vanish both ways, without a reset: only the gateway's bounds notice.
        let partition = proxy.inject(.blackHole)
        for index in 0..<20 {
            try await ann.stack.write { context in
                let post = Post.create(in: context)
                post.title = "offline \(index)"
                post.author = try User.all(in: context).first
            }
        }
        try fleet.psql(
            #"INSERT INTO g_gateway."Post" (title, author) SELECT 'from psql', "_id" FROM g_gateway."User""#)
        #expect(
            await eventually {
                (try syncStatus(ann.daemon))["state"] as? String == "offline"
            }, "\((try? syncStatus(ann.daemon)) ?? [:])")
        #expect(try fleet.psql(#"SELECT count(*) FROM g_gateway."Post" WHERE title LIKE 'offline %'"#) == "0")
        #expect(proxy.heal(partition))
        let total = #"SELECT count(*), count(DISTINCT title) FROM g_gateway."Post" WHERE title LIKE 'offline %'"#
        #expect(await eventually(seconds: 60) { try fleet.psql(total) == "20|20" })
        #expect(await eventually(seconds: 60) { try await titles(ann.stack).contains("from psql") })
        #expect(await eventually(seconds: 60) { try await titles(reader.stack).count == 21 })
        #expect(try fleet.psql(total) == "20|20")
        await fleet.stop()
    }

    @Test(
        "writes outside one's buckets are refused under any name: an entity's former name the machine's schema gives it, an entity of no table, a reset"
    )
    func writesUnderOtherNames() async throws {
        let fleet = try await Fleet()
        try fleet.psql(#"INSERT INTO g_gateway."User" (handle) VALUES ('ann')"#)
        guard let endpoint = try fleet.machineConfiguration(tokenFile: try await fleet.tokenFile("ann")).gateway else {
            throw SkyrosError(.syncConfiguration, "no gateway")
        }
        let server = GatewaySyncServer(endpoint: endpoint, statementTimeout: .seconds(10), executor: SyncExecutor())
        let machine = UUID()
        let connection = try await server.connect(machine: machine) {}
        defer { connection.close() }
        // The machine says User was once called Member (a rename its model made).
        var description = testSchema.schemaDescription
        if let index = description.entities.firstIndex(where: { $0.name == "User" }) {
            description.entities[index].originalName = "Member"
        }
        let schema = ServerSchema(description, version: UInt64(testSchema.version), name: Fleet.schemaName)
        try await connection.prepare(schema)
        func change(_ entity: String, handle: String, reset: Bool = false) -> QueuedChangeSet {
            var changes = QueuedChangeSet()
            changes.inserted = [QueuedChangeSet.Row(entity: entity, id: UUID(), values: ["handle": .text(handle)])]
            changes.reset = reset
            changes.nonce = UInt64.random(in: 1...UInt64.max)
            return changes
        }
        guard let annID = UUID(uuidString: try fleet.psql(#"SELECT "_id" FROM g_gateway."User" WHERE handle = 'ann'"#))
        else { throw SkyrosError(.storeFailure, "no ann") }
        var update = QueuedChangeSet()
        update.updated = [QueuedChangeSet.Row(entity: "Member", id: annID, values: ["firstname": .text("Anne")])]
        update.nonce = 1
        let batch: [QueuedEntry] = [
            (1, change("Member", handle: "mallory")),  // outside ann's bucket, under the former name
            (2, change("Nowhere", handle: "ann")),  // an entity of no table
            (3, change("User", handle: "ann", reset: true)),  // a reset would delete every row
            (4, update),  // inside, under the former name: applied
        ]
        let (outcomes, _) = try await connection.upload(batch, machine: machine)
        #expect(outcomes.count == 4)
        for (index, outcome) in outcomes.prefix(3).enumerated() {
            guard case .rejected(let reason) = outcome else {
                Issue.record("change set \(index + 1) was not refused: \(outcome)")
                continue
            }
            #expect(reason.hasPrefix("not permitted by the sync rules"), "\(reason)")
        }
        #expect(outcomes.last == .applied)
        #expect(try fleet.psql(#"SELECT handle, firstname FROM g_gateway."User" ORDER BY handle"#) == "ann|Anne")
        await fleet.stop()
    }

    @Test("tokens refused with nothing applied: forged, expired, alg none; a machine id bound to another subject")
    func refusedTokens() async throws {
        let fleet = try await Fleet()
        try fleet.psql(#"INSERT INTO g_gateway."User" (handle) VALUES ('ann')"#)
        let executor = SyncExecutor()
        func attempt(token: String, machine: UUID = UUID()) async -> String {
            let path = fleet.directory + "/attempt-\(UUID().uuidString).token"
            try? token.write(toFile: path, atomically: true, encoding: .utf8)
            guard let configuration = try? fleet.machineConfiguration(tokenFile: path),
                let endpoint = configuration.gateway
            else { return "no configuration" }
            let server = GatewaySyncServer(endpoint: endpoint, statementTimeout: .seconds(10), executor: executor)
            do {
                let connection = try await server.connect(machine: machine) {}
                connection.close()
                return "accepted"
            } catch {
                let (state, message) = server.classify(error)
                return "\(state.rawValue): \(message)"
            }
        }
        let good = try String(contentsOfFile: try await fleet.tokenFile("ann"), encoding: .utf8)
        #expect(await attempt(token: good) == "accepted")
        // Forged: signed with another secret.
        let forged = try await SyncToken.mint(
            SyncTokenClaims(subject: "ann", expiration: Date().addingTimeInterval(3600)),
            secret: Data(repeating: 7, count: 32))
        let forgedAnswer = await attempt(token: forged)
        #expect(forgedAnswer.hasPrefix("error: the gateway refused the token"), "\(forgedAnswer)")
        #expect(forgedAnswer.contains("forged"), "\(forgedAnswer)")
        // Expired (past the leeway).
        let expired = try String(contentsOfFile: try await fleet.tokenFile("ann", expires: -120), encoding: .utf8)
        let expiredAnswer = await attempt(token: expired)
        #expect(expiredAnswer.contains("expired"), "\(expiredAnswer)")
        // alg: none.
        let parts = good.split(separator: ".")
        let none =
            Data(#"{"alg":"none","typ":"JWT"}"#.utf8).base64EncodedString().replacingOccurrences(of: "=", with: "")
            + "." + parts[1] + "."
        let noneAnswer = await attempt(token: none)
        #expect(noneAnswer.hasPrefix("error: the gateway refused the token"), "\(noneAnswer)")
        // A machine id bound to another subject.
        let machine = UUID()
        #expect(await attempt(token: good, machine: machine) == "accepted")
        let bob = try String(contentsOfFile: try await fleet.tokenFile("bob"), encoding: .utf8)
        let stolen = await attempt(token: bob, machine: machine)
        #expect(stolen.hasPrefix("error: the gateway refused this machine"), "\(stolen)")
        // Nothing was applied by any of them.
        #expect(try fleet.psql(#"SELECT count(*) FROM g_gateway."User""#) == "1")
        await fleet.stop()
    }

    @Test(
        "a gateway killed mid-stream: its machines continue on a second instance at the same address; nothing lost or applied twice"
    )
    func gatewayKilled() async throws {
        let fleet = try await Fleet()
        try fleet.psql(#"INSERT INTO g_gateway."User" (handle) VALUES ('ann')"#)
        var first = try fleet.spawnGateway()
        let port = first.port
        let writer = try RunningDaemon(
            sync: try fleet.machineConfiguration(tokenFile: try await fleet.tokenFile("ann"), port: port))
        let reader = try RunningDaemon(
            sync: try fleet.machineConfiguration(tokenFile: try await fleet.tokenFile("ann"), port: port))
        let a = try Skyros(sharedStack: testSchema, container: writer.container.url)
        let b = try Skyros(sharedStack: testSchema, container: reader.container.url)
        defer { withExtendedLifetime((writer, reader)) {} }
        #expect(await eventually { try await handles(a) == ["ann"] })
        #expect(await eventually { try await handles(b) == ["ann"] })
        let count = 200
        for index in 0..<count {
            try await a.write { context in
                let post = Post.create(in: context)
                post.title = "p\(index)"
                post.author = try User.all(in: context).first
            }
            if index == count / 2 {
                // Mid-stream: saves are being uploaded and read through it.
                #expect(kill(first.process.pid, SIGKILL) == 0)
                _ = await first.process.wait(seconds: 10)
                first = try fleet.spawnGateway(port: port)
            }
        }
        let total = #"SELECT count(*), count(DISTINCT title) FROM g_gateway."Post""#
        #expect(await eventually(seconds: 60) { try fleet.psql(total) == "\(count)|\(count)" })
        #expect(await eventually(seconds: 60) { try await titles(b).count == count })
        #expect(Set(try await titles(b)) == Set((0..<count).map { "p\($0)" }))
        #expect(try fleet.psql(total) == "\(count)|\(count)")
        kill(first.process.pid, SIGTERM)
        #expect(await first.process.wait(seconds: 10) == .exited(0))
    }

    @Test(
        "a message over the size limit closes its connection only; 10,000 connections that never finish their handshake do not starve a machine and are closed after the bound"
    )
    func abuse() async throws {
        let fleet = try await Fleet()
        try fleet.psql(#"INSERT INTO g_gateway."User" (handle) VALUES ('ann')"#)
        let gateway = try fleet.spawnGateway()
        let ann = try RunningDaemon(
            sync: try fleet.machineConfiguration(tokenFile: try await fleet.tokenFile("ann"), port: gateway.port))
        let stack = try Skyros(sharedStack: testSchema, container: ann.container.url)
        defer { withExtendedLifetime(ann) {} }
        #expect(await eventually { try await handles(stack) == ["ann"] })

        // A frame over 16 MiB, after a good hello: that connection is closed (1009), nothing applied.
        let executor = SyncExecutor()
        guard
            let endpoint = try fleet.machineConfiguration(
                tokenFile: try await fleet.tokenFile("ann"), port: gateway.port
            ).gateway
        else { throw SkyrosError(.syncConfiguration, "no gateway") }
        let server = GatewaySyncServer(endpoint: endpoint, statementTimeout: .seconds(10), executor: executor)
        let connection = try await server.connect(machine: UUID()) {}
        var big = QueuedChangeSet()
        big.inserted = [
            QueuedChangeSet.Row(
                entity: "User", id: UUID(),
                values: ["handle": .text("ann"), "email": .blob(Data(repeating: 1, count: 17 << 20))])
        ]
        await #expect(throws: (any Error).self) {
            _ = try await connection.upload([(1, big)], machine: UUID())
        }
        connection.close()

        // 10,000 connections that open TCP and send nothing. The gateway's open descriptors
        // say what it holds: they rise with the connections it accepted, and fall back once
        // each was closed after its bound. (A client cannot tell: the connections the kernel's
        // full accept queue dropped look open on its side until their SYN-ACKs run out.)
        let descriptors = {
            (try? FileManager.default.contentsOfDirectory(atPath: "/proc/\(gateway.process.pid)/fd").count) ?? -1
        }
        let before = descriptors()
        var sockets: [Int32] = []
        defer { for socket in sockets { close(socket) } }
        for _ in 0..<10_000 {
            let socket = Self.connectNonBlocking(port: gateway.port)
            guard socket >= 0 else { break }
            sockets.append(socket)
        }
        #expect(sockets.count == 10_000)
        // The established machine still gets a change within a bound.
        try fleet.psql(#"INSERT INTO g_gateway."Post" (title, author) SELECT 'during', "_id" FROM g_gateway."User""#)
        #expect(await eventually(seconds: 10) { try await titles(stack) == ["during"] })
        var peak = before
        #expect(
            await eventually(seconds: 20) {
                peak = max(peak, descriptors())
                return peak >= before + 1_000
            }, "the gateway held at most \(peak - before) more descriptors")
        // Every one it accepted closed after its bound (5 s here).
        #expect(
            await eventually(seconds: 130) { descriptors() <= before + 10 },
            "\(descriptors()) descriptors, \(before) before")
        #expect(try fleet.psql(#"SELECT count(*) FROM g_gateway."User""#) == "1")
    }

    /// A non-blocking TCP connection to 127.0.0.1:`port` (its connect under way), or -1.
    static func connectNonBlocking(port: Int) -> Int32 {
        let socket = Glibc.socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard socket >= 0 else { return -1 }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        let result = withUnsafePointer(to: &address) {
            $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                Glibc.connect(socket, $0, socklen_t(MemoryLayout<sockaddr_in>.size))
            }
        }
        if result != 0 && errno != EINPROGRESS {
            close(socket)
            return -1
        }
        return socket
    }
}
