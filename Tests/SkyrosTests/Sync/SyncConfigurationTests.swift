import Foundation
import Skyros
import SkyrosSync
import SkyrosTestSupport
import Testing

/// How a daemon is told to sync (DESIGN §9, issue 34 item 1): the sync URL, `sync.conf`, the
/// password's sources and their order, what a log may show, and skyrosd's flags.
@Suite("SyncConfiguration")
struct SyncConfigurationTests {
    /// The error a configuration throws, or nil when it throws none (or another kind).
    func error(_ body: () throws -> Any?) -> SkyrosError? {
        do {
            _ = try body()
            return nil
        } catch {
            return error as? SkyrosError
        }
    }

    /// Expects `body` to throw a ``SkyrosError/Code/syncConfiguration`` whose message has
    /// every fragment; returns the message.
    @discardableResult
    func expectRefused(
        _ fragments: [String], sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Any?
    ) -> String {
        guard let error = error(body) else {
            Issue.record("not refused with a SkyrosError", sourceLocation: sourceLocation)
            return ""
        }
        #expect(error.code == .syncConfiguration, sourceLocation: sourceLocation)
        for fragment in fragments {
            #expect(error.message.contains(fragment), "\(error.message)", sourceLocation: sourceLocation)
        }
        return error.message
    }

    // MARK: URL

    @Test(
        "a URL with only a user and a host: port 5432, the user's database, sslmode=prefer, the group's schema, 7 days")
    func defaults() throws {
        let configuration = try SyncConfiguration.parse(
            url: "postgresql://alice@db.example.com", group: "com.example.todo")
        #expect(configuration.host == "db.example.com")
        #expect(configuration.port == 5432)
        #expect(configuration.username == "alice")
        #expect(configuration.password == nil)
        #expect(configuration.database == "alice")
        #expect(configuration.schema == "com_example_todo")
        #expect(configuration.tls == .prefer)
        #expect(configuration.rootCertificate == nil)
        #expect(configuration.retention == 7 * 86_400)
        #expect(configuration.socketPath == nil)
    }

    /// A URL and what it says: host, port, user, database.
    struct Case: Sendable, CustomTestStringConvertible {
        let url: String
        let host: String
        let port: Int
        let user: String
        let database: String
        var testDescription: String { url }
    }

    @Test(
        "hosts, ports, IPv6, both schemes, percent-encoding",
        arguments: [
            Case(url: "postgresql://u@127.0.0.1:5433/db", host: "127.0.0.1", port: 5433, user: "u", database: "db"),
            Case(url: "postgres://u@localhost/db", host: "localhost", port: 5432, user: "u", database: "db"),
            Case(url: "POSTGRESQL://u@h:1/db", host: "h", port: 1, user: "u", database: "db"),
            Case(url: "postgresql://u@h:65535/", host: "h", port: 65535, user: "u", database: "u"),
            Case(url: "postgresql://u@[::1]/db", host: "::1", port: 5432, user: "u", database: "db"),
            Case(url: "postgresql://u@[::1]:6000/db", host: "::1", port: 6000, user: "u", database: "db"),
            Case(url: "postgresql://u@[2001:db8::7]:5432", host: "2001:db8::7", port: 5432, user: "u", database: "u"),
            Case(url: "postgresql://sky%40ros@h/my%20db", host: "h", port: 5432, user: "sky@ros", database: "my db"),
            Case(url: "postgresql://u@h?sslmode=disable", host: "h", port: 5432, user: "u", database: "u"),
            Case(
                url: "postgresql://u@%2Fvar%2Frun%2Fpostgresql/db", host: "/var/run/postgresql", port: 5432, user: "u",
                database: "db"),
        ])
    func parses(_ test: Case) throws {
        let configuration = try SyncConfiguration.parse(url: test.url, group: "g")
        #expect(configuration.host == test.host)
        #expect(configuration.port == test.port)
        #expect(configuration.username == test.user)
        #expect(configuration.database == test.database)
    }

    @Test("a host that is a directory is PostgreSQL's Unix socket there, without TLS")
    func unixSocket() throws {
        let configuration = try SyncConfiguration.parse(url: "postgresql://u@%2Ftmp%2Fpg:5444/db", group: "g")
        #expect(configuration.socketPath == "/tmp/pg/.s.PGSQL.5444")
        #expect(configuration.tls == .disable)
        #expect(try configuration.clientConfiguration().unixSocketPath == "/tmp/pg/.s.PGSQL.5444")
        #expect(configuration.redacted.hasPrefix("postgresql://u@%2Ftmp%2Fpg:5444/db ("))
        expectRefused(["Unix socket", "sslmode=require"]) {
            try SyncConfiguration.parse(url: "postgresql://u@%2Ftmp%2Fpg/db?sslmode=require", group: "g")
        }
    }

    @Test("every sslmode", arguments: SyncConfiguration.TLSMode.allCases)
    func sslmode(_ mode: SyncConfiguration.TLSMode) throws {
        let configuration = try SyncConfiguration.parse(url: "postgresql://u@h/db?sslmode=\(mode.rawValue)", group: "g")
        #expect(configuration.tls == mode)
        #expect(configuration.redacted.contains("sslmode=\(mode.rawValue)"))
    }

    @Test("sslrootcert, schema and retention in the query")
    func queryKeys() throws {
        let configuration = try SyncConfiguration.parse(
            url:
                "postgresql://u@h/db?sslmode=verify-full&sslrootcert=%2Fetc%2Fssl%2Fca.pem&schema=todo_1&retention=3600",
            group: "com.example.todo")
        #expect(configuration.tls == .verifyFull)
        #expect(configuration.rootCertificate == "/etc/ssl/ca.pem")
        #expect(configuration.schema == "todo_1")
        #expect(configuration.retention == 3600)
        let plain = try SyncConfiguration.parse(
            url: "postgresql://u@h/db?sslrootcert=/ca.pem&sslmode=verify-ca&", group: "g")
        #expect(plain.rootCertificate == "/ca.pem")
        #expect(try SyncConfiguration.parse(url: "postgresql://u@h/db?schema=_x").schema == "_x")
    }

    /// A URL the parser refuses, and what its message must say.
    struct Bad: Sendable, CustomTestStringConvertible {
        let url: String
        let says: [String]
        var testDescription: String { url }
    }

    @Test(
        "bad URLs are refused with .syncConfiguration and a message that names the problem",
        arguments: [
            Bad(url: "", says: ["does not start with postgresql://"]),
            Bad(url: "db.example.com:5432/db", says: ["does not start with postgresql://"]),
            Bad(url: "mysql://u@h/db", says: ["starts with mysql:// instead of postgresql://"]),
            Bad(url: "postgresql://h/db", says: ["names no user", "postgresql://user@host"]),
            Bad(url: "postgresql://@h/db", says: ["names no user"]),
            Bad(url: "postgresql://u@/db", says: ["names no host", "%2Fvar%2Frun%2Fpostgresql"]),
            Bad(url: "postgresql://u@h:0/db", says: ["port", "'0'", "1 to 65535"]),
            Bad(url: "postgresql://u@h:65536/db", says: ["'65536'", "1 to 65535"]),
            Bad(url: "postgresql://u@h:54x/db", says: ["'54x'", "not a number"]),
            Bad(url: "postgresql://u@h:/db", says: ["port", "not a number"]),
            Bad(url: "postgresql://u@::1/db", says: ["IPv6", "[::1]"]),
            Bad(url: "postgresql://u@[::1/db", says: ["no ']' closes"]),
            Bad(url: "postgresql://u@[::1]x/db", says: ["only ':PORT' may follow"]),
            Bad(url: "postgresql://u@[example.com]/db", says: ["not an IPv6 address"]),
            Bad(url: "postgresql://u@h1,,h2/db", says: ["empty entry (host 2 of 3)", "host1:port1,host2:port2"]),
            Bad(url: "postgresql://u@h1,/db", says: ["empty entry (host 2 of 2)"]),
            Bad(url: "postgresql://u@,h2/db", says: ["empty entry (host 1 of 2)"]),
            Bad(url: "postgresql://u@h1,h2:0/db", says: ["host 2 of 2", "'0'", "1 to 65535"]),
            Bad(url: "postgresql://u@h1,::1/db", says: ["host 2 of 2", "[::1]"]),
            Bad(url: "postgresql://u@h1:5433,h2/db?port=5434", says: ["ports both after its hosts and in port="]),
            Bad(url: "postgresql://u@h1,h2,h3/db?port=1,2", says: ["port= has 2 ports for 3 hosts"]),
            Bad(url: "postgresql://u@h1,h2/db?port=1,x", says: ["port= of the sync URL, 'x'", "1 to 65535"]),
            Bad(
                url: "postgresql://u@h1,h2/db?target_session_attrs=read-only",
                says: ["target_session_attrs=read-only is not one of any, read-write, primary", "the daemon writes"]),
            Bad(
                url: "postgresql://u@h1,h2/db?target_session_attrs=rw",
                says: ["target_session_attrs=rw is not one of any, read-write, primary"]),
            Bad(
                url: "postgresql://u@h1,%2Ftmp%2Fpg/db?sslmode=require",
                says: ["host %2Ftmp%2Fpg:5432 is a Unix socket directory", "sslmode=require"]),
            Bad(url: "postgresql://u@h/db/more", says: ["more than a database name"]),
            Bad(url: "postgresql://u@h/db#x", says: ["fragment"]),
            Bad(url: "postgresql://u@h/db%zz", says: ["database name", "percent-encoding"]),
            Bad(url: "postgresql://u@h/db?sslmode", says: ["'sslmode' without a value"]),
            Bad(
                url: "postgresql://u@h/db?sslmode=allow",
                says: ["sslmode=allow", "disable, prefer, require, verify-ca, verify-full"]),
            Bad(url: "postgresql://u@h/db?sslmode=require&sslmode=disable", says: ["sslmode twice"]),
            Bad(
                url: "postgresql://u@h/db?sslrootcert=/ca.pem", says: ["sslrootcert", "sslmode=prefer", "verify-full"]),
            Bad(url: "postgresql://u@h/db?sslmode=verify-full&sslrootcert=ca.pem", says: ["absolute path"]),
            Bad(
                url: "postgresql://u@h/db?application_name=x",
                says: ["unknown key 'application_name'", "sslmode, sslrootcert, schema, retention"]),
            Bad(url: "postgresql://u@h/db?host=h2", says: ["gives host", "postgresql://user@host:port/dbname"]),
            Bad(url: "postgresql://u@h/db?schema=Todo", says: ["schema name 'Todo'", "[a-z_][a-z0-9_]{0,62}"]),
            Bad(url: "postgresql://u@h/db?schema=1x", says: ["'1x'", "does not start with"]),
            Bad(url: "postgresql://u@h/db?schema=a-b", says: ["'a-b'", "outside [a-z0-9_]"]),
            Bad(url: "postgresql://u@h/db?schema=pg_x", says: ["'pg_x'", "reserves"]),
            Bad(url: "postgresql://u@h/db?schema=", says: ["schema name ''", "is empty"]),
            Bad(url: "postgresql://u@h/db?retention=0", says: ["retention '0'", "number of seconds greater than 0"]),
            Bad(url: "postgresql://u@h/db?retention=week", says: ["retention 'week'"]),
            Bad(url: "postgresql://u@h/db?retention=inf", says: ["retention 'inf'"]),
        ])
    func refuses(_ bad: Bad) {
        expectRefused(bad.says) { try SyncConfiguration.parse(url: bad.url, group: "g") }
    }

    /// A URL of several hosts and the servers and target it gives.
    struct Hosts: Sendable, CustomTestStringConvertible {
        let url: String
        let servers: [String]
        let target: SyncConfiguration.TargetSessionAttributes
        var testDescription: String { url }
    }

    @Test(
        "several hosts as libpq writes them: in order, each with its port, 5432 or the port= list; read-write unless target_session_attrs says",
        arguments: [
            Hosts(url: "postgresql://u@h1:5433,h2/db", servers: ["h1:5433", "h2:5432"], target: .readWrite),
            Hosts(
                url: "postgresql://u@127.0.0.1:6001,127.0.0.1:6002/db?target_session_attrs=read-write",
                servers: ["127.0.0.1:6001", "127.0.0.1:6002"], target: .readWrite),
            Hosts(
                url: "postgresql://u@h1,h2,h3/db?target_session_attrs=any", servers: ["h1:5432", "h2:5432", "h3:5432"],
                target: .any),
            Hosts(
                url: "postgres://u@[::1]:5433,[2001:db8::7]/db?target_session_attrs=primary",
                servers: ["[::1]:5433", "[2001:db8::7]:5432"], target: .primary),
            Hosts(
                url: "postgresql://u@%2Ftmp%2Fpg,db.example.com:5444/db",
                servers: ["%2Ftmp%2Fpg:5432", "db.example.com:5444"], target: .readWrite),
            Hosts(url: "postgresql://u@h1,h2/db?port=6000", servers: ["h1:6000", "h2:6000"], target: .readWrite),
            Hosts(
                url: "postgresql://u@h1,h2,h3/db?port=6001,,6003", servers: ["h1:6001", "h2:5432", "h3:6003"],
                target: .readWrite),
            Hosts(url: "postgresql://u@h/db?port=6000", servers: ["h:6000"], target: .any),
            Hosts(url: "postgresql://u@h/db?target_session_attrs=read-write", servers: ["h:5432"], target: .readWrite),
            Hosts(url: "postgresql://u@h/db", servers: ["h:5432"], target: .any),
        ])
    func severalHosts(_ test: Hosts) throws {
        let configuration = try SyncConfiguration.parse(url: test.url, group: "g")
        #expect(configuration.servers.map(\.description) == test.servers)
        #expect(configuration.targetSessionAttributes == test.target)
        #expect(configuration.host == configuration.servers[0].host)
        #expect(configuration.port == configuration.servers[0].port)
        #expect(configuration.database == "db")
        for server in configuration.servers {
            let connection = try configuration.connectionConfiguration(to: server)
            #expect(connection.host == (server.socketPath == nil ? server.host : nil))
            #expect(connection.port == (server.socketPath == nil ? server.port : nil))
            #expect(connection.unixSocketPath == server.socketPath)
            #expect(connection.options.connectTimeout == .seconds(5))
        }
    }

    @Test("a list mixing a Unix socket and TCP keeps sslmode for the TCP hosts; only sockets: no TLS")
    func socketsInAList() throws {
        let mixed = try SyncConfiguration.parse(url: "postgresql://u@%2Ftmp%2Fpg,h2/db", group: "g")
        #expect(mixed.tls == .prefer)
        #expect(mixed.servers[0].socketPath == "/tmp/pg/.s.PGSQL.5432")
        #expect(mixed.servers[1].socketPath == nil)
        let sockets = try SyncConfiguration.parse(url: "postgresql://u@%2Ftmp%2Fa,%2Ftmp%2Fb:5433/db", group: "g")
        #expect(sockets.tls == .disable)
        #expect(sockets.servers.map(\.socketPath) == ["/tmp/a/.s.PGSQL.5432", "/tmp/b/.s.PGSQL.5433"])
    }

    @Test("a configuration made in code: read-write with several servers unless told, any with one")
    func targetDefaults() {
        let servers = [SyncConfiguration.Server(host: "h1"), SyncConfiguration.Server(host: "h2", port: 5433)]
        #expect(
            SyncConfiguration(servers: servers, username: "u", database: "d", schema: "s").targetSessionAttributes
                == .readWrite)
        #expect(
            SyncConfiguration(
                servers: servers, targetSessionAttributes: .primary, username: "u", database: "d", schema: "s"
            )
            .targetSessionAttributes == .primary)
        #expect(SyncConfiguration(host: "h", username: "u", database: "d", schema: "s").targetSessionAttributes == .any)
        #expect(
            SyncConfiguration(servers: [servers[1]], username: "u", database: "d", schema: "s").servers == [servers[1]])
    }

    @Test("none of several servers available: the message names each server and why, in order")
    func noServerAvailable() {
        struct Unreachable: Error, CustomStringConvertible {
            var description: String { "connection refused" }
        }
        let failure = SyncConfiguration.NoServerAvailable(
            attempts: [
                .init(server: .init(host: "10.0.0.1"), error: Unreachable()),
                .init(server: .init(host: "::1", port: 5433), refusal: "a standby (in recovery), read-only"),
            ],
            target: .readWrite)
        #expect(
            failure.description
                == "no server of the sync URL could be used (target_session_attrs=read-write): "
                + "10.0.0.1:5432: connection refused; [::1]:5433: a standby (in recovery), read-only")
        #expect(
            failure.description(reasons: ["down", "standby"])
                == "no server of the sync URL could be used (target_session_attrs=read-write): 10.0.0.1:5432: down; [::1]:5433: standby"
        )
    }

    @Test("a schema name of 63 characters is accepted, 64 is refused")
    func schemaLength() throws {
        let longest = String(repeating: "a", count: 63)
        #expect(try SyncConfiguration.parse(url: "postgresql://u@h/db?schema=\(longest)").schema == longest)
        expectRefused(["longer than PostgreSQL's 63 characters"]) {
            try SyncConfiguration.parse(url: "postgresql://u@h/db?schema=\(longest)a")
        }
    }

    @Test("without schema= and without a group, the URL names no schema")
    func noSchema() {
        expectRefused(["names no schema", "schema=NAME"]) { try SyncConfiguration.parse(url: "postgresql://u@h/db") }
    }

    @Test(
        "a password in the URL is refused, and the message says where a password goes without showing it",
        arguments: [
            "postgresql://u:secret@h/db", "postgres://u:secret@[::1]:5433/db?sslmode=require", "postgresql://u:@h/db",
            "postgresql://u@h/db?password=secret", "postgresql://u:se/cret@h/db", "postgresql://u:se?cret@h/db",
            "postgresql://u:se#cret@h/db", "postgresql://u:secret@h:bad/db?nonsense=1",
        ])
    func passwordRefused(url: String) {
        let message = expectRefused([
            "password", "--sync-password-file", "SKYROS_SYNC_PASSWORD", "skyros-sync-password",
        ]) {
            try SyncConfiguration.parse(url: url, group: "g")
        }
        #expect(!message.contains("secret"), "\(message)")
        #expect(!message.contains("cret"), "\(message)")
    }

    @Test("schemaName(forGroup:) lowercases and makes every character outside [a-z0-9_] '_'")
    func schemaNames() throws {
        #expect(SyncConfiguration.schemaName(forGroup: "com.example.todo") == "com_example_todo")
        #expect(SyncConfiguration.schemaName(forGroup: "Com.Ex-1") == "com_ex_1")
        #expect(SyncConfiguration.schemaName(forGroup: "a_b") == "a_b")
        #expect(SyncConfiguration.schemaName(forGroup: "é.x") == "__x")
    }

    @Test("a group id whose derived schema name is invalid asks for a configured one")
    func derivedSchemaInvalid() throws {
        expectRefused(["the group 1app", "'1app'", "--sync-schema"]) {
            try SyncConfiguration.parse(url: "postgresql://u@h/db", group: "1app")
        }
        expectRefused(["pg_stat", "--sync-schema"]) {
            try SyncConfiguration.parse(url: "postgresql://u@h/db", group: "pg.stat")
        }
        #expect(try SyncConfiguration.parse(url: "postgresql://u@h/db?schema=app", group: "1app").schema == "app")
    }

    // MARK: What a log shows

    @Test("redacted, description, String(reflecting:) and dump never contain the password")
    func redacted() throws {
        let container = try TemporaryDirectory()
        let file = container.file("pw")
        try Data("hunter2-very-secret\n".utf8).write(to: file)
        chmod(file.path, 0o600)
        let configuration = try #require(
            try SyncConfiguration.resolve(
                group: "com.example.todo", container: container.url, url: "postgresql://alice@db.example.com:5433/app",
                passwordFile: file.path, environment: [:]))
        #expect(configuration.password == "hunter2-very-secret")
        #expect(
            configuration.redacted
                == "postgresql://alice@db.example.com:5433/app (schema com_example_todo, sslmode=prefer, password from the file \(file.path), from --sync)"
        )
        var dumped = ""
        dump(configuration, to: &dumped)
        for text in [
            configuration.redacted, configuration.description, "\(configuration)", String(reflecting: configuration),
            dumped,
        ] {
            #expect(!text.contains("hunter2"), "\(text)")
        }
        #expect(dumped.contains("<redacted>"))
        let ipv6 = SyncConfiguration(host: "::1", username: "u", database: "d", schema: "s", retention: 60)
        #expect(ipv6.redacted == "postgresql://u@[::1]:5432/d (schema s, sslmode=prefer, retention 60 s, no password)")
    }

    @Test("several servers: redacted lists them as the URL does, with target_session_attrs, and never the password")
    func redactedServers() throws {
        var configuration = try SyncConfiguration.parse(
            url: "postgresql://alice@db1.example.com,[::1]:5433,%2Fvar%2Frun%2Fpostgresql/app?sslmode=disable",
            group: "com.example.todo")
        configuration.password = "hunter2-very-secret"
        #expect(
            configuration.redacted
                == "postgresql://alice@db1.example.com:5432,[::1]:5433,%2Fvar%2Frun%2Fpostgresql:5432/app "
                + "(schema com_example_todo, sslmode=disable, target_session_attrs=read-write, no password)")
        configuration.targetSessionAttributes = .any
        #expect(!configuration.redacted.contains("target_session_attrs"))
        var dumped = ""
        dump(configuration, to: &dumped)
        #expect(dumped.contains("db1.example.com:5432"), "\(dumped)")
        #expect(dumped.contains("<redacted>"))
        for text in [configuration.redacted, "\(configuration)", String(reflecting: configuration), dumped] {
            #expect(!text.contains("hunter2"), "\(text)")
        }
    }

    // MARK: postgres-nio

    @Test("clientConfiguration: server, role, password, database, a short connect timeout and a keep-alive")
    func clientConfiguration() throws {
        var configuration = try SyncConfiguration.parse(url: "postgresql://u@[::1]:5433/db?sslmode=require", group: "g")
        configuration.password = "pw"
        let client = try configuration.clientConfiguration()
        #expect(client.host == "::1")
        #expect(client.port == 5433)
        #expect(client.username == "u")
        #expect(client.password == "pw")
        #expect(client.database == "db")
        #expect(client.unixSocketPath == nil)
        #expect(client.options.connectTimeout == .seconds(5))
        #expect(client.options.keepAliveBehavior?.frequency == .seconds(30))
        for mode in SyncConfiguration.TLSMode.allCases {
            configuration.tls = mode
            #expect(throws: Never.self) { try configuration.clientConfiguration() }
        }
    }

    @Test("verify-full with a CA file that cannot be read is refused naming the file")
    func unreadableRootCertificate() throws {
        let configuration = try SyncConfiguration.parse(
            url: "postgresql://u@h/db?sslmode=verify-full&sslrootcert=/nonexistent/ca.pem", group: "g")
        expectRefused(["/nonexistent/ca.pem", "sslrootcert", "No such file"]) {
            try configuration.clientConfiguration()
        }
    }

    // MARK: sync.conf

    @Test("sync.conf: key = value lines, blank lines, # comments, CRLF, spaces around '='")
    func file() throws {
        let text = """
            # The group's server

            url = postgresql://skyros@db.example.com/skyros?sslmode=verify-full\r
              schema=todo
            password-file =  secrets/pw
            retention = 86400
              # the end
            """
        let file = try SyncConfiguration.File(parsing: text, path: "/c/sync.conf")
        #expect(file.url == "postgresql://skyros@db.example.com/skyros?sslmode=verify-full")
        #expect(file.schema == "todo")
        #expect(file.passwordFile == "secrets/pw")
        #expect(file.retention == 86_400)
        #expect(
            try SyncConfiguration.File(parsing: "", path: "/c/sync.conf")
                == SyncConfiguration.File(parsing: "# x\n\n", path: "/c/sync.conf"))
    }

    @Test("sync.conf: a value in double or single quotes is the text inside them; a lone quote stays")
    func quotedValues() throws {
        let quoted = try SyncConfiguration.File(
            parsing: """
                url = "postgresql://skyros@db.example.com/skyros"
                schema = 'todo'
                password-file = " secrets/pw "
                """, path: "/c/sync.conf")
        #expect(quoted.url == "postgresql://skyros@db.example.com/skyros")
        #expect(quoted.schema == "todo")
        #expect(quoted.passwordFile == "secrets/pw")
        // Not a pair of quotes: the value as written (and a URL with a quote is refused later).
        let lone = try SyncConfiguration.File(parsing: "url = \"postgresql://u@h/d\n", path: "/c/sync.conf")
        #expect(lone.url == "\"postgresql://u@h/d")
    }

    @Test("sync.conf errors name the file and the line, and never echo a value")
    func fileErrors() {
        expectRefused(["/c/sync.conf line 3: unknown key 'pasword-file'", "url, schema, password-file, retention"]) {
            try SyncConfiguration.File(
                parsing: "# x\nurl = postgresql://u@h/db\npasword-file = /p\n", path: "/c/sync.conf")
        }
        expectRefused(["line 1", "expected key = value"]) {
            try SyncConfiguration.File(parsing: "url postgresql://u@h", path: "/c/sync.conf")
        }
        expectRefused(["line 2: url is given a second time"]) {
            try SyncConfiguration.File(parsing: "url = a\nurl = b", path: "/c/sync.conf")
        }
        expectRefused(["line 1: schema has no value"]) {
            try SyncConfiguration.File(parsing: "schema =", path: "/c/sync.conf")
        }
        expectRefused(["line 1", "schema name 'Bad'"]) {
            try SyncConfiguration.File(parsing: "schema = Bad", path: "/c/sync.conf")
        }
        expectRefused(["line 2", "retention '-1'"]) {
            try SyncConfiguration.File(parsing: "\nretention = -1", path: "/c/sync.conf")
        }
        let password = expectRefused(["line 1", "holds no password itself", "password-file"]) {
            try SyncConfiguration.File(parsing: "password = topsecret", path: "/c/sync.conf")
        }
        #expect(!password.contains("topsecret"))
        expectRefused(["line 1: sslmode goes in the url's query", "?sslmode="]) {
            try SyncConfiguration.File(parsing: "sslmode = require", path: "/c/sync.conf")
        }
        expectRefused(["line 1: target_session_attrs goes in the url's query", "?target_session_attrs="]) {
            try SyncConfiguration.File(parsing: "target_session_attrs = read-write", path: "/c/sync.conf")
        }
        expectRefused(["line 1: hosts and ports go in the url", "host1:port1,host2:port2"]) {
            try SyncConfiguration.File(parsing: "host = db2", path: "/c/sync.conf")
        }
        let unknown = expectRefused(["line 1", "unknown key"]) {
            try SyncConfiguration.File(parsing: "pass word = topsecret", path: "/c/sync.conf")
        }
        #expect(!unknown.contains("topsecret"))
    }

    // MARK: Resolution

    /// A group container with a `sync.conf`, when given, and a password file `name`, when given.
    func container(conf: String? = nil, passwordFile: (name: String, contents: String)? = nil) throws
        -> TemporaryDirectory
    {
        let directory = try TemporaryDirectory()
        if let conf { try Data(conf.utf8).write(to: directory.file("sync.conf")) }
        if let passwordFile {
            try Data(passwordFile.contents.utf8).write(to: directory.file(passwordFile.name))
            chmod(directory.file(passwordFile.name).path, 0o600)
        }
        return directory
    }

    @Test("nothing configured: no sync")
    func nothing() throws {
        let directory = try container()
        #expect(
            try SyncConfiguration.resolve(
                group: "g", container: directory.url, url: nil, passwordFile: nil,
                environment: ["SKYROS_SYNC_URL": "", "SKYROS_SYNC_PASSWORD": "x"]) == nil)
    }

    @Test("the URL: --sync over SKYROS_SYNC_URL over sync.conf, each named as the source")
    func urlPrecedence() throws {
        let directory = try container(conf: "url = postgresql://u@from-file/db\n")
        let environment = ["SKYROS_SYNC_URL": "postgresql://u@from-env/db"]
        let flag = try #require(
            try SyncConfiguration.resolve(
                group: "g", container: directory.url, url: "postgresql://u@from-flag/db", passwordFile: nil,
                environment: environment))
        #expect(flag.host == "from-flag")
        #expect(flag.source == "--sync")
        let env = try #require(
            try SyncConfiguration.resolve(
                group: "g", container: directory.url, url: nil, passwordFile: nil, environment: environment))
        #expect(env.host == "from-env")
        #expect(env.source == "SKYROS_SYNC_URL")
        let conf = try #require(
            try SyncConfiguration.resolve(
                group: "g", container: directory.url, url: nil, passwordFile: nil, environment: [:]))
        #expect(conf.host == "from-file")
        #expect(conf.source == directory.file("sync.conf").path)
        #expect(conf.redacted.hasSuffix("from \(directory.file("sync.conf").path))"))
    }

    @Test("sync.conf's url may list several servers, with target_session_attrs; a bad list is refused naming the file")
    func fileWithSeveralServers() throws {
        let directory = try container(
            conf: "url = postgresql://u@db1:5433,db2/db?target_session_attrs=primary\n")
        let configuration = try #require(
            try SyncConfiguration.resolve(
                group: "g", container: directory.url, url: nil, passwordFile: nil, environment: [:]))
        #expect(configuration.servers == [.init(host: "db1", port: 5433), .init(host: "db2", port: 5432)])
        #expect(configuration.targetSessionAttributes == .primary)
        #expect(configuration.source == directory.file("sync.conf").path)
        let bad = try container(conf: "url = postgresql://u@db1,,db2/db\n")
        expectRefused(["\(bad.file("sync.conf").path): the sync URL's list of hosts has an empty entry"]) {
            try SyncConfiguration.resolve(group: "g", container: bad.url, url: nil, passwordFile: nil, environment: [:])
        }
    }

    @Test("a bad URL's message says where it came from")
    func urlErrorSource() throws {
        let directory = try container(conf: "url = postgresql://u:secret@h/db\n")
        let message = expectRefused(["\(directory.file("sync.conf").path): the sync URL carries a password"]) {
            try SyncConfiguration.resolve(
                group: "g", container: directory.url, url: nil, passwordFile: nil, environment: [:])
        }
        #expect(!message.contains("secret"))
        expectRefused(["SKYROS_SYNC_URL: the sync URL names no user"]) {
            try SyncConfiguration.resolve(
                group: "g", container: directory.url, url: nil, passwordFile: nil,
                environment: ["SKYROS_SYNC_URL": "postgresql://h"])
        }
        expectRefused(["--sync: the sync URL names no host"]) {
            try SyncConfiguration.resolve(
                group: "g", container: directory.url, url: "postgresql://u@", passwordFile: nil, environment: [:])
        }
    }

    @Test("sync settings without a URL are refused: they would silently do nothing")
    func settingsWithoutURL() throws {
        let empty = try container()
        expectRefused(["no sync URL for --sync-password-file", "--sync, SKYROS_SYNC_URL"]) {
            try SyncConfiguration.resolve(
                group: "g", container: empty.url, url: nil, passwordFile: "/pw", environment: [:])
        }
        expectRefused(["no sync URL for --sync-schema"]) {
            try SyncConfiguration.resolve(
                group: "g", container: empty.url, url: nil, passwordFile: nil, schema: "s", environment: [:])
        }
        let noURL = try container(conf: "schema = s\n")
        expectRefused(["no sync URL for \(noURL.file("sync.conf").path) (which has no url)", "url = postgresql://"]) {
            try SyncConfiguration.resolve(
                group: "g", container: noURL.url, url: nil, passwordFile: nil, environment: [:])
        }
        // The environment's password alone is not refused (a service's environment may be
        // shared by groups that do not sync), but it is not silent either: skyrosd warns.
        let unused = try #require(SyncConfiguration.unusedEnvironment(["SKYROS_SYNC_PASSWORD": "secret"]))
        #expect(unused.contains("SKYROS_SYNC_PASSWORD is set, but no sync URL is") && !unused.contains("secret"))
        #expect(SyncConfiguration.unusedEnvironment(["SKYROS_SYNC_PASSWORD": ""]) == nil)
        #expect(SyncConfiguration.unusedEnvironment([:]) == nil)
        let invalid = try container(conf: "colour = blue\n")
        expectRefused(["sync.conf line 1: unknown key 'colour'"]) {
            try SyncConfiguration.resolve(
                group: "g", container: invalid.url, url: "postgresql://u@h", passwordFile: nil, environment: [:])
        }
    }

    @Test("the schema: --sync-schema over the URL's schema= over sync.conf's over the group's")
    func schemaPrecedence() throws {
        let directory = try container(conf: "schema = from_file\nretention = 60\n")
        func resolve(_ url: String, _ schema: String? = nil) throws -> SyncConfiguration? {
            try SyncConfiguration.resolve(
                group: "com.example.todo", container: directory.url, url: url, passwordFile: nil, schema: schema,
                environment: [:])
        }
        #expect(try resolve("postgresql://u@h?schema=from_url", "from_flag")?.schema == "from_flag")
        #expect(try resolve("postgresql://u@h?schema=from_url")?.schema == "from_url")
        #expect(try resolve("postgresql://u@h")?.schema == "from_file")
        #expect(try resolve("postgresql://u@h")?.retention == 60)
        #expect(try resolve("postgresql://u@h?retention=120")?.retention == 120)
        expectRefused(["--sync-schema: the schema name 'Bad'"]) { try resolve("postgresql://u@h", "Bad") }
        let bare = try container()
        #expect(
            try SyncConfiguration.resolve(
                group: "com.example.todo", container: bare.url, url: "postgresql://u@h", passwordFile: nil,
                environment: [:])?.schema
                == "com_example_todo")
    }

    @Test(
        "the password: --sync-password-file, then sync.conf's password-file, then SKYROS_SYNC_PASSWORD, then the systemd credential"
    )
    func passwordPrecedence() throws {
        let credentials = try TemporaryDirectory()
        try Data("from-credential\n".utf8).write(to: credentials.file("skyros-sync-password"))
        let flagFile = try TemporaryDirectory()
        try Data("from-flag\r\n\n".utf8).write(to: flagFile.file("pw"))
        chmod(flagFile.file("pw").path, 0o600)
        let directory = try container(
            conf: "url = postgresql://u@h/db\npassword-file = conf-pw\n", passwordFile: ("conf-pw", "from-conf\n"))
        let bare = try container(conf: "url = postgresql://u@h/db\n")
        let all = ["SKYROS_SYNC_PASSWORD": "from-env", "CREDENTIALS_DIRECTORY": credentials.url.path]
        func resolve(_ container: TemporaryDirectory, _ passwordFile: String?, _ environment: [String: String]) throws
            -> SyncConfiguration
        {
            try #require(
                try SyncConfiguration.resolve(
                    group: "g", container: container.url, url: nil, passwordFile: passwordFile, environment: environment
                ))
        }

        var configuration = try resolve(directory, flagFile.file("pw").path, all)
        #expect(configuration.password == "from-flag")
        #expect(configuration.passwordSource == "the file \(flagFile.file("pw").path)")
        configuration = try resolve(directory, nil, all)
        #expect(configuration.password == "from-conf")
        #expect(configuration.passwordSource == "the file \(directory.file("conf-pw").path)")
        configuration = try resolve(bare, nil, all)
        #expect(configuration.password == "from-env")
        #expect(configuration.passwordSource == "SKYROS_SYNC_PASSWORD")
        configuration = try resolve(
            bare, nil, ["SKYROS_SYNC_PASSWORD": "", "CREDENTIALS_DIRECTORY": credentials.url.path])
        #expect(configuration.password == "from-credential")
        #expect(configuration.passwordSource == "the systemd credential skyros-sync-password")
        #expect(configuration.warnings.isEmpty)
        configuration = try resolve(bare, nil, ["CREDENTIALS_DIRECTORY": flagFile.url.path])
        #expect(configuration.password == nil)
        #expect(configuration.passwordSource == nil)
        #expect(configuration.redacted.contains("no password"))
    }

    @Test("a password file others may read is used with a warning; a missing or empty one is refused naming it")
    func passwordFiles() throws {
        let directory = try container(conf: "url = postgresql://u@h/db\n")
        let file = directory.file("pw")
        try Data("pw with spaces  \n".utf8).write(to: file)
        chmod(file.path, 0o644)
        let configuration = try #require(
            try SyncConfiguration.resolve(
                group: "g", container: directory.url, url: nil, passwordFile: file.path, environment: [:]))
        #expect(configuration.password == "pw with spaces  ")
        #expect(configuration.warnings.count == 1)
        #expect(configuration.warnings.first?.contains("\(file.path) may be read by other users (mode 644)") == true)
        #expect(configuration.warnings.first?.contains("chmod 600") == true)

        let missing = directory.file("absent").path
        expectRefused(["cannot read \(missing)", "--sync-password-file", "No such file"]) {
            try SyncConfiguration.resolve(
                group: "g", container: directory.url, url: nil, passwordFile: missing, environment: [:])
        }
        try Data("\n".utf8).write(to: file)
        expectRefused(["\(file.path)", "is empty"]) {
            try SyncConfiguration.resolve(
                group: "g", container: directory.url, url: nil, passwordFile: file.path, environment: [:])
        }
    }

    // MARK: skyrosd

    /// A groups directory for `skyrosd --groups-dir`, removed by the caller.
    func groupsDirectory() throws -> String {
        let directory = "/tmp/sks-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        return directory
    }

    @Test("skyrosd --sync with a password in the URL exits 64, and its output never shows the password")
    func daemonRefusesPassword() throws {
        let groups = try groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let daemon = try ChildProcess(
            ["--group", "g", "--groups-dir", groups, "--sync", "postgresql://u:secret@127.0.0.1/db"],
            executable: DaemonProcessTests.skyrosd)
        #expect(daemon.wait() == .exited(64))
        let output = daemon.readAll()
        #expect(output.contains("--sync: the sync URL carries a password"), "\(output)")
        #expect(output.contains("--sync-password-file"), "\(output)")
        #expect(!output.contains("secret"), "\(output)")
        #expect(!FileManager.default.fileExists(atPath: groups + "/g/store.sqlite"))
    }

    @Test("skyrosd with SKYROS_SYNC_PASSWORD but no sync URL serves the group without sync, and says why in its log")
    func daemonWarnsOfUnusedPassword() throws {
        let groups = try groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        let notify = try NotifySocket()
        let daemon = try ChildProcess(
            ["--group", "g", "--groups-dir", groups], executable: DaemonProcessTests.skyrosd,
            environment: ["SKYROS_SYNC_PASSWORD": "topsecret", "SKYROS_SYNC_URL": "", "NOTIFY_SOCKET": notify.path])
        let warned = daemon.waitForOutput(containing: "SKYROS_SYNC_PASSWORD is set, but no sync URL is")
        #expect(notify.waitFor("READY=1"), "skyrosd did not get ready")
        kill(daemon.pid, SIGTERM)
        #expect(daemon.wait() == .exited(0))
        let output = daemon.readAll()
        #expect(warned, "\(output)")
        #expect(!output.contains("topsecret"))
    }

    @Test("skyrosd with an invalid sync.conf exits 64 naming the line")
    func daemonRefusesFile() throws {
        let groups = try groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        try FileManager.default.createDirectory(atPath: groups + "/g", withIntermediateDirectories: true)
        try Data("url = postgresql://u@127.0.0.1/db\ncolour = blue\n".utf8).write(
            to: URL(fileURLWithPath: groups + "/g/sync.conf"))
        let daemon = try ChildProcess(["--group", "g", "--groups-dir", groups], executable: DaemonProcessTests.skyrosd)
        #expect(daemon.wait() == .exited(64))
        let output = daemon.readAll()
        #expect(output.contains("\(groups)/g/sync.conf line 2: unknown key 'colour'"), "\(output)")
    }

    @Test(
        "skyrosd --sync-setup needs a sync URL (64) and the group's store (1); --check and --sync-setup exclude each other"
    )
    func daemonSyncSetupNeeds() throws {
        let groups = try groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        var daemon = try ChildProcess(
            ["--group", "g", "--groups-dir", groups, "--sync-setup"], executable: DaemonProcessTests.skyrosd,
            environment: ["SKYROS_SYNC_URL": ""])
        #expect(daemon.wait() == .exited(64))
        var output = daemon.readAll()
        #expect(output.contains("--sync-setup needs the sync server"), "\(output)")

        daemon = try ChildProcess(
            ["--group", "g", "--groups-dir", groups, "--sync", "postgresql://u@127.0.0.1:1/db", "--sync-setup"],
            executable: DaemonProcessTests.skyrosd)
        #expect(daemon.wait() == .exited(1))
        output = daemon.readAll()
        #expect(
            output.contains("sync: postgresql://u@127.0.0.1:1/db (schema g, sslmode=prefer, no password, from --sync)"),
            "\(output)")
        #expect(
            output.contains(
                "--sync-setup takes the schema from the group's store, and there is none at \(groups)/g/store.sqlite"),
            "\(output)")

        // With a store: its schema goes to SyncSetup, and a server that cannot be reached is a
        // failure (1); the store is read without being written to.
        let store = URL(fileURLWithPath: groups + "/g/store.sqlite")
        try StoreFiles.makeStore(at: store, users: 3)
        let before = try Data(contentsOf: store)
        daemon = try ChildProcess(
            [
                "--group", "g", "--groups-dir", groups, "--sync", "postgresql://u@127.0.0.1:1/db?sslmode=disable",
                "--sync-setup",
            ],
            executable: DaemonProcessTests.skyrosd)
        #expect(daemon.wait(seconds: 40) == .exited(1))
        output = daemon.readAll()
        #expect(output.contains("--sync-setup failed: "), "\(output)")
        #expect(try Data(contentsOf: store) == before)
        #expect(!FileManager.default.fileExists(atPath: store.path + "-wal"))

        daemon = try ChildProcess(
            ["--group", "g", "--groups-dir", groups, "--check", "--sync-setup"], executable: DaemonProcessTests.skyrosd)
        #expect(daemon.wait() == .exited(64))
        output = daemon.readAll()
        #expect(output.contains("--check and --sync-setup"), "\(output)")
    }
}
