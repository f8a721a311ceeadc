import Foundation
import SkyrosTestSupport
import Testing

/// The private PostgreSQL server the tests of sync run against (DESIGN §9): a real server,
/// started, stopped, crashed and restarted by pid, cleaned up with its directory.
@Suite("A private PostgreSQL server", .timeLimit(.minutes(3)))
struct PostgresServerTests {
    /// The uid fields (real, effective, saved, file system) of /proc/<pid>/status.
    func uids(_ pid: pid_t) throws -> [UInt32] {
        let status = try String(contentsOfFile: "/proc/\(pid)/status", encoding: .utf8)
        let line = try #require(status.split(separator: "\n").first { $0.hasPrefix("Uid:") })
        return line.split(whereSeparator: \.isWhitespace).dropFirst().compactMap { UInt32($0) }
    }

    /// Whether `pid` is gone for good: not running, and not a zombie waiting to be reaped.
    func isReaped(_ pid: pid_t) -> Bool {
        kill(pid, 0) == -1 && errno == ESRCH
    }

    /// Whether `pid` runs (a zombie does not: it only waits to be reaped, by someone else).
    func isAlive(_ pid: pid_t) -> Bool {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return false }
        return !["Z", "X"].contains(stat[stat.index(after: close)...].split(separator: " ").first)
    }

    @Test("data survives a fast stop, an immediate stop and a kill; the port stays; everything is cleaned by deinit")
    func lifecycle() async throws {
        let directory: String
        let last: pid_t
        do {
            let running = try await PostgresServer.started()
            let port = running.port
            directory = running.directory
            #expect(directory.utf8.count + "/.s.PGSQL.65535".utf8.count <= 107)
            #expect(FileManager.default.fileExists(atPath: "\(running.socketDirectory)/.s.PGSQL.\(port)"))
            let database = try running.createUniqueDatabase()
            try running.psql(
                """
                CREATE TABLE items (id int PRIMARY KEY, name text NOT NULL);
                INSERT INTO items VALUES (1, 'one'), (2, 'ünïcödé');
                """, database: database)
            #expect(
                try running.psql("SELECT id, name FROM items ORDER BY id", database: database) == "1|one\n2|ünïcödé")

            let first = try #require(running.processIdentifier)
            try running.stop(mode: .fast)
            #expect(!running.isRunning)
            #expect(isReaped(first))
            #expect(throws: PostgresServerError.self) { try running.psql("SELECT 1") }
            #expect(
                try String(contentsOfFile: running.logFile, encoding: .utf8).contains("database system is shut down"))

            try running.start()
            #expect(running.port == port)
            #expect(try running.psql("SELECT count(*) FROM items", database: database) == "2")
            try running.psql("INSERT INTO items VALUES (3, 'three')", database: database)

            let second = try #require(running.processIdentifier)
            #expect(second != first)
            try running.stop(mode: .immediate)
            #expect(isReaped(second))
            try running.start()
            #expect(try running.psql("SELECT count(*) FROM items", database: database) == "3")
            try running.psql("INSERT INTO items VALUES (4, 'four')", database: database)

            // A client in the middle of a query when the server is killed: its backend goes too.
            let third = try #require(running.processIdentifier)
            let clientDone = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                _ = try? running.psql("SELECT pg_sleep(120)", timeout: .seconds(150))
                clientDone.signal()
            }
            let backendQuery = "SELECT pid FROM pg_stat_activity WHERE query = 'SELECT pg_sleep(120)'"
            var backend: pid_t?
            for _ in 0..<1000 where backend == nil {
                backend = pid_t(try running.psql(backendQuery))
                if backend == nil { usleep(10_000) }
            }
            let sleeping = try #require(backend)
            running.kill()
            #expect(!running.isRunning)
            #expect(isReaped(third))
            #expect(!isAlive(sleeping))
            #expect(clientDone.wait(timeout: .now() + 30) == .success)
            try running.start()
            #expect(
                try running.psql("SELECT string_agg(name, ',' ORDER BY id) FROM items", database: database)
                    == "one,ünïcödé,three,four")
            #expect(
                try String(contentsOfFile: running.logFile, encoding: .utf8).contains("database system was interrupted")
            )

            last = try #require(running.processIdentifier)
        }  // the server is released here
        #expect(isReaped(last))
        #expect(!FileManager.default.fileExists(atPath: directory))
    }

    @Test("the server never runs as root: as nobody when the tests run as root, else as the tests' user")
    func notRoot() async throws {
        let server = try await PostgresServer.started()
        let pid = try #require(server.processIdentifier)
        let ids = try uids(pid)
        #expect(ids.count == 4)
        #expect(!ids.contains(0))
        #expect(ids.allSatisfy { $0 == (getuid() == 0 ? 65534 : getuid()) })
        // The pid is the postmaster's itself (setpriv executes it, it does not fork it).
        let commandLine = try Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/cmdline"))
        let arguments = commandLine.split(separator: 0).map { String(decoding: $0, as: UTF8.self) }
        #expect(arguments.first?.hasSuffix("/postgres") == true)
        #expect(arguments.contains(server.dataDirectory))
        #expect(try server.psql("SELECT current_user") == "postgres")
    }

    @Test("the postmaster inherits no descriptor of the test process")
    func noInheritedDescriptors() async throws {
        var descriptors: [Int32] = [0, 0]
        #expect(pipe(&descriptors) == 0)  // without O_CLOEXEC, as ChildProcess makes them
        defer { descriptors.forEach { close($0) } }
        var information = stat()
        fstat(descriptors[1], &information)
        let server = try await PostgresServer.started()
        let pid = try #require(server.processIdentifier)
        let entries = try FileManager.default.contentsOfDirectory(atPath: "/proc/\(pid)/fd")
        let targets = entries.compactMap {
            try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/\(pid)/fd/\($0)")
        }
        #expect(!targets.isEmpty)
        #expect(!targets.contains("pipe:[\(information.st_ino)]"))
    }

    @Test("the shared server: one per process, a database per test, a URL, SQL errors carry psql's message")
    func shared() async throws {
        let server = try await PostgresServer.shared()
        #expect(try await PostgresServer.shared() === server)
        let a = try server.createUniqueDatabase(prefix: "shared")
        let b = try server.createUniqueDatabase(prefix: "shared")
        #expect(a != b)
        #expect(server.url(database: a) == "postgresql://postgres@127.0.0.1:\(server.port)/\(a)")
        #expect(
            server.url(database: "d", user: "u", password: "p@ss/word")
                == "postgresql://u:p%40ss%2Fword@127.0.0.1:\(server.port)/d")
        #expect(
            try server.psql("SELECT datname FROM pg_database WHERE datname IN ('\(a)', '\(b)') ORDER BY 1")
                == [a, b].sorted().joined(separator: "\n"))
        try server.createDatabase("with \"quotes\" and spaces")
        #expect(try server.psql("SELECT 1", database: "with \"quotes\" and spaces") == "1")
        let error = #expect(throws: PostgresServerError.self) {
            try server.psql("SELECT 1; SELECT * FROM missing_table; SELECT 2", database: a)
        }
        #expect(error?.description.contains("relation \"missing_table\" does not exist") == true)
        #expect(
            try server.psql("SHOW server_encoding; SHOW fsync; SHOW server_version_num", database: a)
                .split(separator: "\n").prefix(2) == ["UTF8", "on"])
    }

    @Test("a password for TCP clients (SCRAM-SHA-256) and extra settings")
    func passwordAndSettings() throws {
        let server = try PostgresServer(
            password: "s3cret", settings: ["max_connections": "37", "wal_level": "logical"])
        #expect(try server.psql("SHOW max_connections; SHOW wal_level") == "37\nlogical")
        #expect(try server.psql("SELECT 42", password: "s3cret") == "42")
        #expect(
            try server.psql("SELECT DISTINCT auth_method FROM pg_hba_file_rules WHERE type = 'host'") == "scram-sha-256"
        )
        let error = #expect(throws: PostgresServerError.self) { try server.psql("SELECT 1", password: "wrong") }
        #expect(error?.description.contains("password authentication failed") == true)
        #expect(!FileManager.default.fileExists(atPath: server.directory + "/pwfile"))
    }
}
