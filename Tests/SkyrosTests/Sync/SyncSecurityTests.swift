import Foundation
import Logging
import NIOPosix
import PostgresNIO
import Skyros
import SkyrosSync
import SkyrosTestSupport
import Testing

/// What a daemon's PostgreSQL role and connection need, and what they cannot do (issue 35
/// item 6, docs/SYNC.md "Security"): a DML-only role with exactly the documented grants,
/// TLS with certificate verification against a CA made for the test, a server that accepts
/// only TLS, and one group's role kept out of another group's schema. Each test has a server
/// of its own: roles are the cluster's, and TLS and `pg_hba.conf` are its configuration.
@Suite("Sync security", .serialized, .timeLimit(.minutes(3)))
struct SyncSecurityTests {
    let sync = SyncTests()
    static let daemonPassword = "daemon secret"

    /// The SQLSTATE with which the server refuses `sql` run as `configuration`'s role on a
    /// connection of its own (nil: it did not refuse).
    func refusal(_ sql: String, as configuration: SyncConfiguration) async throws -> String? {
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let connection = try await PostgresConnection.connect(
            on: MultiThreadedEventLoopGroup.singleton.any(), configuration: try configuration.connectionConfiguration(),
            id: 7,
            logger: logger)
        var state: String?
        do {
            _ = try await connection.query(PostgresQuery(unsafeSQL: sql), logger: logger).collect()
        } catch {
            state = ServerSession.serverReport(error)?.state ?? "not a server error: \(String(reflecting: error))"
        }
        try await connection.close()
        return state
    }

    @Test(
        "a DML-only role with exactly the documented grants: inserts, updates and deletes both ways, the log compacted; without DELETE on _skyros_log, error 42501"
    )
    func dmlOnlyRole() async throws {
        let postgres = try await PostgresServer.started(password: "superuser secret")
        let roles = try SyncRoles(postgres)
        try await roles.setUp(schema: "g_sec", models: testSchema)
        try roles.createDaemonRole("skyros_daemon", password: Self.daemonPassword)
        try roles.grant("skyros_daemon", schema: "g_sec", models: testSchema)
        // No superuser, no DDL: the role may not create a table in the schema, nor a schema.
        #expect(
            try postgres.psql(
                "SELECT rolsuper::text || rolcreatedb::text || rolcreaterole::text FROM pg_roles WHERE rolname = 'skyros_daemon'"
            ) == "falsefalsefalse")
        let daemonRole = roles.configuration(
            role: "skyros_daemon", password: Self.daemonPassword, schema: "g_sec", retention: 1)
        #expect(try await refusal("CREATE TABLE g_sec.intruder (x int)", as: daemonRole) == "42501")
        #expect(try await refusal("CREATE SCHEMA intruder", as: daemonRole) == "42501")
        #expect(try await refusal("TRUNCATE g_sec.\"User\"", as: daemonRole) == "42501")
        let horizon = { UInt64(try roles.psql("SELECT value FROM g_sec._skyros_meta WHERE key = 'horizon'")) ?? 0 }
        let horizonAtSetup = try horizon()

        var settings = SyncEngine.Settings()
        settings.compactionInterval = .seconds(1)
        settings.pollInterval = .milliseconds(500)
        let machineA = try RunningDaemon(sync: daemonRole, syncSettings: settings)
        let machineB = try RunningDaemon(sync: daemonRole, syncSettings: settings)
        let a = try Skyros(sharedStack: testSchema, container: machineA.container.url)
        let b = try Skyros(sharedStack: testSchema, container: machineB.container.url)
        _ = try await sync.handles(b)  // B's daemon syncs from its first client on

        // Insert on A, update on B, insert on B, delete on A.
        let ann = try await sync.insert("ann", into: a)
        #expect(await sync.eventually { try await sync.handles(b) == ["ann"] })
        try await b.write { context in try #require(context.object(with: ann, as: User.self)).firstname = "Ann" }
        let firstname = { try await a.read { context in context.object(with: ann, as: User.self)?.firstname } }
        #expect(await sync.eventually { try await firstname() == "Ann" })
        try await sync.insert("bob", into: b)
        #expect(await sync.eventually { try await sync.handles(a) == ["ann", "bob"] })
        try await a.write { context in try #require(context.object(with: ann, as: User.self)).delete(in: context) }
        #expect(await sync.eventually { try await sync.handles(b) == ["bob"] })
        #expect(try roles.psql(#"SELECT string_agg(handle, ',') FROM g_sec."User""#) == "bob")
        #expect(try roles.psql("SELECT count(*) FROM g_sec._skyros_uploads WHERE rejected IS NULL") == "4")

        // The daemons compact the log (retention 1 s): rows deleted, horizon moved.
        let compacted = await sync.eventually(seconds: 20) {
            try roles.psql("SELECT count(*) FROM g_sec._skyros_log") == "0"
        }
        #expect(
            compacted,
            "log: \((try? roles.psql("SELECT count(*) FROM g_sec._skyros_log")) ?? "?"), A: \(sync.syncState(machineA))"
        )
        #expect(try horizon() > horizonAtSetup)
        #expect(sync.syncState(machineA).state == "online")

        // Without DELETE on the log, the next compaction is refused: error, with the server's words.
        try roles.psql("REVOKE DELETE ON g_sec._skyros_log FROM skyros_daemon")
        try await sync.insert("carl", into: a)
        let refused = await sync.reaches("error", machineA)
        #expect(refused.ok, "A: \(refused.state): \(refused.message)")
        #expect(refused.message == "permission denied for table _skyros_log [SQLSTATE 42501]", "\(refused.message)")
        #expect(try await sync.handles(a) == ["bob", "carl"])  // the apps go on
        // Granted again, it goes back online by itself and nothing was lost.
        try roles.psql("GRANT DELETE ON g_sec._skyros_log TO skyros_daemon")
        #expect(await sync.eventually { try await sync.handles(b) == ["bob", "carl"] })
        #expect(await sync.reaches("online", machineA).ok)
        #expect(try roles.psql("SELECT count(*) FROM g_sec._skyros_uploads WHERE rejected IS NULL") == "5")
    }

    /// A database on `postgres` and a superuser daemon configuration with `tls`.
    func tlsConfiguration(
        _ postgres: PostgresServer, database: String, _ tls: SyncConfiguration.TLSMode, rootCertificate: String? = nil,
        host: String? = nil
    ) -> SyncConfiguration {
        SyncConfiguration(
            host: host ?? postgres.host, port: postgres.port, username: postgres.superuser, database: database,
            schema: "g_tls", tls: tls,
            rootCertificate: rootCertificate)
    }

    @Test(
        "TLS with verify-full against the test's CA syncs over TLS, by address and by name; a daemon trusting another CA is in error about the certificate and uploads nothing"
    )
    func verifyFull() async throws {
        let certificates = try TestCertificates()
        let postgres = try await PostgresServer.started(settings: certificates.serverSettings)
        let database = try postgres.createUniqueDatabase(prefix: "tls")
        let machineA = try RunningDaemon(
            sync: tlsConfiguration(postgres, database: database, .verifyFull, rootCertificate: certificates.authority))
        let a = try Skyros(sharedStack: testSchema, container: machineA.container.url)
        try await sync.insert("over-tls", into: a)
        #expect(
            await sync.eventually {
                try postgres.psql(#"SELECT count(*) FROM g_tls."User""#, database: database) == "1"
            })
        #expect(sync.syncState(machineA).state == "online")
        // Its connections are encrypted (psql itself comes through the Unix socket).
        let encrypted = try postgres.psql(
            "SELECT count(*) FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) WHERE a.datname = '\(database)' AND s.ssl",
            database: database)
        #expect((Int(encrypted) ?? 0) >= 1, "\(encrypted)")
        // By name too: the certificate names localhost.
        let machineC = try RunningDaemon(
            sync: tlsConfiguration(
                postgres, database: database, .verifyFull, rootCertificate: certificates.authority, host: "localhost"))
        let c = try Skyros(sharedStack: testSchema, container: machineC.container.url)
        #expect(await sync.eventually { try await sync.handles(c) == ["over-tls"] })
        #expect(sync.syncState(machineC).state == "online")

        let machineB = try RunningDaemon(
            sync: tlsConfiguration(
                postgres, database: database, .verifyFull, rootCertificate: certificates.otherAuthority))
        let b = try Skyros(sharedStack: testSchema, container: machineB.container.url)
        try await sync.insert("untrusting", into: b)
        let refused = await sync.reaches("error", machineB)
        #expect(refused.ok, "B: \(refused.state): \(refused.message)")
        #expect(refused.message.contains("certificate"), "\(refused.message)")
        #expect(refused.message.contains(certificates.otherAuthority), "\(refused.message)")
        #expect(try await sync.handles(b) == ["untrusting"])
        #expect(try sync.syncStatus(machineB)["uploadQueue"] as? Int == 1)
        #expect(
            try postgres.psql(#"SELECT string_agg(handle, ',') FROM g_tls."User""#, database: database) == "over-tls")
    }

    @Test(
        "a certificate of the test's CA for another host: verify-ca syncs, verify-full is in error saying the certificate does not name the host"
    )
    func verifyFullChecksTheHost() async throws {
        let certificates = try TestCertificates(serverNames: ["DNS:db.example.com"])
        let postgres = try await PostgresServer.started(settings: certificates.serverSettings)
        let database = try postgres.createUniqueDatabase(prefix: "tls")
        let machineA = try RunningDaemon(
            sync: tlsConfiguration(postgres, database: database, .verifyCA, rootCertificate: certificates.authority))
        let a = try Skyros(sharedStack: testSchema, container: machineA.container.url)
        try await sync.insert("ca-only", into: a)
        #expect(
            await sync.eventually {
                try postgres.psql(#"SELECT count(*) FROM g_tls."User""#, database: database) == "1"
            })

        let machineB = try RunningDaemon(
            sync: tlsConfiguration(postgres, database: database, .verifyFull, rootCertificate: certificates.authority))
        let b = try Skyros(sharedStack: testSchema, container: machineB.container.url)
        try await sync.insert("strict", into: b)
        let refused = await sync.reaches("error", machineB)
        #expect(refused.ok, "B: \(refused.state): \(refused.message)")
        #expect(refused.message.contains("it does not name the host"), "\(refused.message)")
        #expect(refused.message.contains("name the host 127.0.0.1"), "\(refused.message)")
        #expect(try sync.syncStatus(machineB)["uploadQueue"] as? Int == 1)
        #expect(
            try postgres.psql(#"SELECT string_agg(handle, ',') FROM g_tls."User""#, database: database) == "ca-only")
    }

    @Test(
        "a server that accepts only TLS (hostssl): sslmode=require syncs; sslmode=disable is in error with advice, keeps its queue, and uploads it once when pg_hba.conf lets it in"
    )
    func hostsslOnly() async throws {
        let certificates = try TestCertificates()
        let postgres = try await PostgresServer.started(settings: certificates.serverSettings)
        try postgres.replaceHostBasedAuthentication(["hostssl all all 127.0.0.1/32 trust"])
        let database = try postgres.createUniqueDatabase(prefix: "tls")
        let onServer = {
            try postgres.psql(
                #"SELECT coalesce(string_agg(handle, ',' ORDER BY handle), '') FROM g_tls."User""#, database: database)
        }

        let machineB = try RunningDaemon(sync: tlsConfiguration(postgres, database: database, .require))
        let b = try Skyros(sharedStack: testSchema, container: machineB.container.url)
        try await sync.insert("b", into: b)
        #expect(await sync.eventually { try onServer() == "b" })

        let machineA = try RunningDaemon(sync: tlsConfiguration(postgres, database: database, .disable))
        let a = try Skyros(sharedStack: testSchema, container: machineA.container.url)
        try await sync.insert("a", into: a)
        let refused = await sync.reaches("error", machineA)
        #expect(refused.ok, "A: \(refused.state): \(refused.message)")
        #expect(refused.message.contains("no encryption"), "\(refused.message)")
        #expect(refused.message.contains("sslmode=verify-full"), "\(refused.message)")
        #expect(try await sync.handles(a) == ["a"])
        #expect(try sync.syncStatus(machineA)["uploadQueue"] as? Int == 1)
        #expect(try onServer() == "b")

        // The server lets unencrypted connections in again: A resumes, its save uploaded once.
        try postgres.replaceHostBasedAuthentication([
            "hostssl all all 127.0.0.1/32 trust", "host all all 127.0.0.1/32 trust",
        ])
        #expect(await sync.eventually(seconds: 45) { try onServer() == "a,b" })
        #expect(
            await sync.eventually {
                let onA = try await sync.handles(a)
                let onB = try await sync.handles(b)
                return onA == ["a", "b"] && onB == ["a", "b"]
            })
        #expect(await sync.reaches("online", machineA).ok)
        #expect(try postgres.psql("SELECT count(*) FROM g_tls._skyros_uploads", database: database) == "2")
    }

    @Test(
        "one group's role cannot read or write another group's schema (42501); a daemon given X's role and Y's schema is in error and writes nothing"
    )
    func groupsAreIsolated() async throws {
        let postgres = try await PostgresServer.started(password: "superuser secret")
        let roles = try SyncRoles(postgres)
        for (schema, role) in [("g_x", "skyros_x"), ("g_y", "skyros_y")] {
            try await roles.setUp(schema: schema, models: testSchema)
            try roles.createDaemonRole(role, password: Self.daemonPassword)
            try roles.grant(role, schema: schema, models: testSchema)
        }
        try roles.psql(#"INSERT INTO g_y."User" (handle) VALUES ('y-user')"#)
        let x = { (schema: String) in
            roles.configuration(role: "skyros_x", password: Self.daemonPassword, schema: schema)
        }

        // A direct connection with X's role: its own schema yes, Y's no.
        #expect(try await refusal(#"SELECT count(*) FROM g_x."User""#, as: x("g_x")) == nil)
        #expect(try await refusal(#"SELECT count(*) FROM g_y."User""#, as: x("g_x")) == "42501")
        #expect(try await refusal(#"INSERT INTO g_y."User" (handle) VALUES ('intruder')"#, as: x("g_x")) == "42501")
        #expect(try await refusal("SELECT count(*) FROM g_y._skyros_log", as: x("g_x")) == "42501")
        #expect(
            try await refusal("UPDATE g_y._skyros_meta SET value = '0' WHERE key = 'horizon'", as: x("g_x")) == "42501")

        // A daemon with X's credentials pointed at Y's schema.
        let everything = {
            try roles.psql(
                """
                SELECT (SELECT string_agg(handle, ',') FROM g_y."User") || ' ' || (SELECT count(*) FROM g_y._skyros_log) || ' ' || \
                (SELECT count(*) FROM g_y._skyros_uploads) || ' ' || (SELECT string_agg(key || '=' || value, ',' ORDER BY key) FROM g_y._skyros_meta)
                """)
        }
        let before = try everything()
        let machine = try RunningDaemon(sync: x("g_y"))
        let stack = try Skyros(sharedStack: testSchema, container: machine.container.url)
        try await sync.insert("intruder", into: stack)
        let refused = await sync.reaches("error", machine)
        #expect(refused.ok, "\(refused.state): \(refused.message)")
        #expect(refused.message.contains("skyros_x may not use the schema g_y"), "\(refused.message)")
        #expect(refused.message.contains("42501"), "\(refused.message)")
        #expect(try await sync.handles(stack) == ["intruder"])  // the machine's apps go on, locally
        #expect(try everything() == before)
        #expect(before.hasPrefix("y-user 1 0 "), "\(before)")
    }
}
