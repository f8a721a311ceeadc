import Foundation
import Logging
import NIOPosix
import PostgresNIO
import Skyros
import SkyrosGateway
import SkyrosSync
import SkyrosTestSupport
import Testing

/// The gateway's sync rules (DESIGN §10): the file's form and its problems with file, line and
/// column; the rules against a schema; the buckets a token holds; and the rows a bucket holds,
/// selected by the rules' SQL from a real PostgreSQL.
@Suite("Sync rules", .timeLimit(.minutes(2)))
struct SyncRulesTests {
    static let rules = """
        buckets:
          own:                      # one per machine
            parameters:
              who: token.sub
            entities:
              Checklist: name = bucket.who
              Step: checklist.name = bucket.who
          store:
            parameters:
              store: token.store
            entities:
              Step: title = bucket.store and done = false
          news:
            entities:
              Checklist: true
        """

    /// A database of its own on the shared test server and a connection to it, for a group
    /// whose server schema is `schemaName`; with `tables`, the group's tables (of `orderSchema`) made.
    struct Database {
        let postgres: PostgresServer
        let name: String
        let connection: PostgresConnection
        let schema: ServerSchema
        let logger: Logger

        static func make(prefix: String, schemaName: String, tables: Bool = true) async throws -> Database {
            let postgres = try await PostgresServer.shared()
            let name = try postgres.createUniqueDatabase(prefix: prefix)
            let configuration = SyncConfiguration(
                host: postgres.host, port: postgres.port, username: postgres.superuser, database: name,
                schema: schemaName, tls: .disable)
            var logger = Logger(label: "test")
            logger.logLevel = .critical
            let connection = try await PostgresConnection.connect(
                on: MultiThreadedEventLoopGroup.singleton.any(),
                configuration: try configuration.connectionConfiguration(), id: 1, logger: logger)
            let database = Database(
                postgres: postgres, name: name, connection: connection,
                schema: ServerSchema(orderSchema, name: schemaName), logger: logger)
            if tables { try await database.makeTables() }
            return database
        }

        func makeTables() async throws {
            try await ServerSession(connection: connection, schema: schema, logger: logger).ensureSchema()
        }

        func psql(_ sql: String) throws { try postgres.psql(sql, database: name) }

        func close() { Task { [connection] in try? await connection.close() } }
    }

    @Test("the rules' form: buckets, parameters from token claims, conditions through to-one relationships")
    func parse() throws {
        let rules = try SyncRules.parse(Self.rules, file: "rules.yaml")
        #expect(rules.buckets.map(\.name) == ["own", "store", "news"])
        let own = rules.buckets[0]
        #expect(own.parameters.map(\.name) == ["who"])
        #expect(own.parameters.map(\.claim) == ["sub"])
        #expect(own.entities.map(\.entity) == ["Checklist", "Step"])
        #expect(
            own.entities[1].condition
                == .comparisons([SyncRules.Comparison(path: ["checklist", "name"], operand: .parameter("who"))]))
        #expect(own.entities[1].location.description == "rules.yaml:7:13")
        #expect(
            rules.buckets[1].entities[0].condition
                == .comparisons([
                    SyncRules.Comparison(path: ["title"], operand: .parameter("store")),
                    SyncRules.Comparison(path: ["done"], operand: .bool(false)),
                ]))
        #expect(rules.buckets[2].entities[0].condition == .all)
        // " and " inside a quoted text is the text's; a quote inside is written twice.
        let quoted = try SyncRules.parse(
            "buckets:\n  a:\n    entities:\n      Step: title = 'rock and roll' and done = false\n      Checklist: name = \"it''s\"\n"
        )
        #expect(
            quoted.buckets[0].entities[0].condition
                == .comparisons([
                    SyncRules.Comparison(path: ["title"], operand: .text("rock and roll")),
                    SyncRules.Comparison(path: ["done"], operand: .bool(false)),
                ]))
        #expect(
            quoted.buckets[0].entities[1].condition
                == .comparisons([SyncRules.Comparison(path: ["name"], operand: .text("it''s"))]))
        let doubled = try SyncRules.parse("buckets:\n  a:\n    entities:\n      Step: title = 'it''s'\n")
        #expect(
            doubled.buckets[0].entities[0].condition
                == .comparisons([SyncRules.Comparison(path: ["title"], operand: .text("it's"))]))
        #expect(rules.check(against: orderSchema).isEmpty)
    }

    /// Each broken file, and the one problem it must give (its line and column, and words of it).
    @Test(
        "a broken rules file names each problem with its file, line and column",
        arguments: [
            (
                "buckets:\n  a:\n    entities:\n      Step: title = bucket.nobody\n", "r.yaml:4:13",
                "no parameter `nobody`"
            ),
            (
                "buckets:\n  a:\n    parameters:\n      p: sub\n    entities:\n      Step: true\n", "r.yaml:4:10",
                "token.<claim>"
            ),
            ("buckets:\n  a:\n    entities:\n      Step: title == 3\n", "r.yaml:4:13", "not an operand"),
            ("buckets:\n  a:\n    entities:\n      Step: title\n", "r.yaml:4:13", "not `path = operand`"),
            ("buckets:\n  a:\n    parameters: {}\n", "r.yaml:2:3", "selects no entity"),
            ("buckets:\n  a:\n    entities:\n      Step: true\n    extra: 1\n", "r.yaml:5:5", "unknown key `extra`"),
            ("rules:\n  a: 1\n", "r.yaml:1:1", "`buckets:`"),
            ("buckets:\n  a:\n    entities:\n  - x\n", "r.yaml:4:3", "not YAML"),
            (
                "buckets:\n  a:\n    entities:\n      Step: true\n  a:\n    entities:\n      Step: true\n",
                "r.yaml:5:3", "defined twice"
            ),
            (
                "buckets:\n  a:\n    parameters:\n      p: token.sub\n      p: token.x\n    entities:\n      Step: true\n",
                "r.yaml:5:7", "defined twice"
            ),
            ("buckets:\n  a:\n    entities:\n      Step: true\n      Step: done = true\n", "r.yaml:5:7", "named twice"),
        ])
    func brokenFiles(_ text: String, _ location: String, _ words: String) throws {
        do {
            _ = try SyncRules.parse(text, file: "r.yaml")
            Issue.record("parsed: \(text)")
        } catch let invalid as SyncRules.Invalid {
            #expect(invalid.problems.count == 1, "\(invalid)")
            #expect(invalid.problems.first?.location.description == location, "\(invalid)")
            #expect(invalid.problems.first?.message.contains(words) == true, "\(invalid)")
            #expect(invalid.skyrosError.code == .syncConfiguration)
        }
    }

    @Test(
        "the rules against a schema: unknown entities and properties, paths through to-manys or past attributes, constants of the wrong kind"
    )
    func againstTheSchema() throws {
        let rules = try SyncRules.parse(
            """
            buckets:
              a:
                entities:
                  Nothing: true
                  Step: checklist.owner = 'x'
                  Checklist: steps.title = 'x'
              b:
                entities:
                  Step: checklist = 'x'
                  Checklist: name.length = 3
              c:
                entities:
                  Step: done = 'yes'
            """, file: "r.yaml")
        let problems = rules.check(against: orderSchema).map(\.description)
        #expect(
            problems == [
                "r.yaml:4:16: the schema has no entity `Nothing` (bucket `a`)",
                "r.yaml:5:13: Step: `Checklist` has no property `owner`",
                "r.yaml:6:18: Checklist: `steps` is a to-many relationship: a path goes through to-ones only",
                "r.yaml:9:13: Step: `checklist` is a relationship: compare one of its destination's attributes (`checklist.…`)",
                "r.yaml:10:18: Checklist: `name` is an attribute: the path cannot go on past it",
                "r.yaml:13:13: Step: `done` (boolean) cannot equal 'yes'",
            ], "\(problems)")
    }

    @Test("a token holds one instance of each bucket whose claims it has; a bucket without parameters, always")
    func instances() throws {
        let rules = try SyncRules.parse(Self.rules)
        let withStore = SyncTokenClaims(
            subject: "kiosk-7", expiration: .distantFuture, claims: ["store": .string("berlin")])
        #expect(
            rules.instances(for: withStore).map(\.description) == ["own[who=kiosk-7]", "store[store=berlin]", "news[]"])
        let without = SyncTokenClaims(subject: "kiosk-8", expiration: .distantFuture)
        #expect(rules.instances(for: without).map(\.description) == ["own[who=kiosk-8]", "news[]"])
        let numbered = SyncTokenClaims(subject: "k", expiration: .distantFuture, claims: ["store": .integer(12)])
        #expect(rules.instances(for: numbered)[1].values == ["store": "12"])
    }

    @Test("each bucket instance's SQL selects exactly its rows from the server's tables, through the to-one")
    func rowsOnTheServer() async throws {
        let server = try await Database.make(prefix: "rules", schemaName: "g_rules")
        defer { server.close() }
        let (connection, schema, logger) = (server.connection, server.schema, server.logger)
        let a = UUID()
        let b = UUID()
        try server.psql(
            """
            INSERT INTO g_rules."Checklist" ("_id", name) VALUES ('\(a)', 'kiosk-7'), ('\(b)', 'kiosk-8');
            INSERT INTO g_rules."Step" (title, done, checklist) VALUES ('a1', false, '\(a)'), ('a2', true, '\(a)'),
              ('berlin', false, '\(b)'), ('berlin', true, '\(b)'), ('loose', false, NULL);
            """)
        let rules = try SyncRules.parse(Self.rules).resolvingDestinations(in: orderSchema)
        func rows(_ entity: String, _ instance: SyncRules.Instance, column: String) async throws -> [String] {
            let (condition, parameters) = try #require(
                rules.sqlCondition(entity: entity, instance: instance, qualify: { schema.qualified($0) }))
            var bindings = PostgresBindings()
            for parameter in parameters { bindings.append(parameter) }
            let sql = "SELECT t.\(column)::text FROM \(schema.qualified(entity)) AS t WHERE \(condition) ORDER BY 1"
            var result: [String] = []
            for try await row in try await connection.query(
                PostgresQuery(unsafeSQL: sql, binds: bindings), logger: logger)
            {
                result.append(try row.decode(String.self))
            }
            return result
        }
        let own7 = SyncRules.Instance(bucket: "own", values: ["who": "kiosk-7"])
        #expect(try await rows("Checklist", own7, column: "name") == ["kiosk-7"])
        #expect(try await rows("Step", own7, column: "title") == ["a1", "a2"])
        let own8 = SyncRules.Instance(bucket: "own", values: ["who": "kiosk-8"])
        #expect(try await rows("Step", own8, column: "title") == ["berlin", "berlin"])
        let store = SyncRules.Instance(bucket: "store", values: ["store": "berlin"])
        #expect(try await rows("Step", store, column: "done") == ["false"])
        #expect(
            try await rows("Checklist", SyncRules.Instance(bucket: "news", values: [:]), column: "name") == [
                "kiosk-7", "kiosk-8",
            ])
        // An instance without its parameter's value, or rules whose relationships' destinations
        // are unknown, give no condition (never a comparison with '' or a guessed table).
        #expect(
            rules.sqlCondition(
                entity: "Step", instance: SyncRules.Instance(bucket: "own", values: [:]), qualify: { $0 }) == nil)
        let unresolved = try SyncRules.parse(Self.rules)
        #expect(unresolved.sqlCondition(entity: "Step", instance: own7, qualify: { $0 }) == nil)
        #expect(unresolved.resolvingDestinations(in: SyncRules.catalog(of: orderSchema)) == rules)
        // A bucket that holds no row of an entity gives no condition.
        #expect(
            rules.sqlCondition(
                entity: "Step", instance: SyncRules.Instance(bucket: "news", values: [:]), qualify: { $0 }) == nil)
        // A value that would be SQL goes as a parameter.
        let hostile = SyncRules.Instance(bucket: "own", values: ["who": "x' OR '1'='1"])
        #expect(try await rows("Step", hostile, column: "title").isEmpty)
    }

    @Test(
        "skyros-gateway --check: valid rules pass; rules that do not fit the server's tables, bad keys, no database fail, each said"
    )
    func gatewayCheck() async throws {
        let group = "com.example.rules"
        let server = try await Database.make(
            prefix: "gwcheck", schemaName: SyncConfiguration.schemaName(forGroup: group), tables: false)
        defer { server.close() }
        let (postgres, database) = (server.postgres, server.name)
        let directory = try TemporaryDirectory()
        let rulesFile = directory.file("sync-rules.yaml").path
        let secretFile = directory.file("secret").path
        try Data(repeating: 65, count: 40).write(to: URL(fileURLWithPath: secretFile))
        let gateway = ChildProcess.builtExecutable("skyros-gateway").path
        func check(_ rules: String, secret: String? = nil, url: String? = nil) throws -> ToolRun {
            try Data(rules.utf8).write(to: URL(fileURLWithPath: rulesFile))
            return try OperatingToolTests.run(
                [
                    "--check", "--group", group, "--database",
                    url ?? postgres.url(database: database) + "?sslmode=disable",
                    "--rules", rulesFile, "--secret-file", secret ?? secretFile,
                ], launcher: [gateway])
        }
        // Before an operator made the group's tables: said so, and unavailable (69: systemd
        // tries again), not a configuration error.
        let empty = try check(Self.rules)
        #expect(empty.status == 69)
        #expect(empty.stderr.contains("an operator sets them up first (skyrosd --sync-setup"), "\(empty.stderr)")
        try await server.makeTables()
        let ok = try check(Self.rules)
        #expect(ok.status == 0, "\(ok.stderr)")
        #expect(ok.stdout.hasPrefix("ok: 3 buckets over 2 entities"), "\(ok.stdout)")
        // Against the server's tables: the to-one is the foreign key's column.
        let unfit = try check(
            "buckets:\n  a:\n    entities:\n      Step: checklist.owner = 'x'\n      Checklist: steps.name = 'x'\n")
        #expect(unfit.status == 64)
        #expect(
            unfit.stderr.contains("\(rulesFile):4:13: Step: `Checklist` has no property `owner`"), "\(unfit.stderr)")
        #expect(
            unfit.stderr.contains("\(rulesFile):5:18: Checklist: `Checklist` has no property `steps`"),
            "\(unfit.stderr)")
        let broken = try check("buckets:\n  a:\n    entities:\n      Step: title ==\n")
        #expect(broken.status == 64)
        #expect(broken.stderr.contains("\(rulesFile):4:13:"), "\(broken.stderr)")
        let short = directory.file("short").path
        try Data("short".utf8).write(to: URL(fileURLWithPath: short))
        let badKey = try check(Self.rules, secret: short)
        #expect(badKey.status == 64)
        #expect(badKey.stderr.contains("at least 32"), "\(badKey.stderr)")
        let unreachable = try check(Self.rules, url: "postgresql://postgres@127.0.0.1:1/\(database)?sslmode=disable")
        #expect(unreachable.status == 69, "\(unreachable.stderr)")
    }

    /// The write check as the gateway runs it: the objects an upload updates or deletes must be
    /// in the machine's buckets before, those it inserts or updates must be after (in the
    /// same transaction), or the upload is refused.
    @Test("writes inside one's buckets pass; outside, or moving a row out of them, are caught before or after")
    func writeChecks() async throws {
        let server = try await Database.make(prefix: "rulesw", schemaName: "g_w")
        defer { server.close() }
        let (connection, schema, logger) = (server.connection, server.schema, server.logger)
        let mine = UUID()
        let theirs = UUID()
        let myStep = UUID()
        let theirStep = UUID()
        try server.psql(
            """
            INSERT INTO g_w."Checklist" ("_id", name) VALUES ('\(mine)', 'kiosk-7'), ('\(theirs)', 'kiosk-8');
            INSERT INTO g_w."Step" ("_id", title, checklist) VALUES ('\(myStep)', 'a', '\(mine)'), ('\(theirStep)', 'b', '\(theirs)');
            """)
        let rules = try SyncRules.parse(Self.rules).resolvingDestinations(in: orderSchema)
        let claims = SyncTokenClaims(subject: "kiosk-7", expiration: .distantFuture)
        // `news` (every checklist, every machine) is among them: read-only, it grants no write.
        let instances = rules.instances(for: claims)
        #expect(instances.map(\.bucket).contains("news"))
        /// The ids of `ids` outside the machine's buckets now.
        func outside(_ entity: String, _ ids: [UUID]) async throws -> Set<UUID> {
            let (sql, parameters) = rules.outsideStatement(
                entity: entity, instances: instances, qualify: { schema.qualified($0) })
            var bindings = PostgresBindings()
            bindings.append("{" + ids.map { $0.uuidString.lowercased() }.joined(separator: ",") + "}")
            for parameter in parameters { bindings.append(parameter) }
            var result: Set<UUID> = []
            for try await row in try await connection.query(
                PostgresQuery(unsafeSQL: sql, binds: bindings), logger: logger)
            {
                if let id = UUID(uuidString: try row.decode(String.self)) { result.insert(id) }
            }
            return result
        }
        // Before: updating or deleting one's own step passes, another machine's does not.
        #expect(try await outside("Step", [myStep, theirStep]) == [theirStep])
        #expect(try await outside("Checklist", [mine, theirs]) == [theirs])
        // After: a step inserted into one's own list passes; into another's, caught.
        let inserted = UUID()
        let intruder = UUID()
        try server.psql(
            """
            INSERT INTO g_w."Step" ("_id", title, checklist) VALUES ('\(inserted)', 'c', '\(mine)'), ('\(intruder)', 'd', '\(theirs)'),
            ('\(UUID())', 'loose', NULL);
            """)
        #expect(try await outside("Step", [inserted, intruder]) == [intruder])
        // Moving one's step into another machine's list: allowed before, caught after.
        #expect(try await outside("Step", [myStep]).isEmpty)
        try server.psql("UPDATE g_w.\"Step\" SET checklist = '\(theirs)' WHERE \"_id\" = '\(myStep)'")
        #expect(try await outside("Step", [myStep]) == [myStep])
        // A step in no list is in none of the machine's buckets.
        let loose = try server.postgres.psql(
            "SELECT \"_id\" FROM g_w.\"Step\" WHERE title = 'loose'", database: server.name)
        #expect(try await outside("Step", [try #require(UUID(uuidString: loose))]).count == 1)
        // Renaming another machine's list to one's own name (which would bring its steps into
        // one's own bucket): the list is outside before, though `news` lets every machine read it.
        #expect(try await outside("Checklist", [theirs]) == [theirs])
        // An entity no bucket of the machine holds: every row is outside.
        let none = SyncRules(buckets: [])
        let (sql, parameters) = none.outsideStatement(entity: "Step", instances: [], qualify: { schema.qualified($0) })
        #expect(parameters.isEmpty)
        #expect(!sql.contains("NOT"))
    }
}
