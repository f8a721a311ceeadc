// skyros-gateway: the sync gateway of a group (docs/SYNC.md). This first part checks a
// gateway's configuration (`--check`): its sync rules against the group's tables on the
// server, its token keys, its database. Serving machines comes with the rest of the gateway.
import ArgumentParser
import Foundation
import Logging
import NIOPosix
import PostgresNIO
import ServiceLifecycle
import Skyros
import SkyrosGateway
import SkyrosSync
import Synchronization

@main
struct SkyrosGatewayCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "skyros-gateway",
        abstract: "The sync gateway of a group: machines sync through it with tokens, each holding its rules' rows.",
        discussion: """
            --check validates the configuration and exits: the sync rules (each problem with its file, line and \
            column), against the group's tables on the server; the token keys; the database. The database \
            password comes from --database-password-file, SKYROS_SYNC_PASSWORD or the systemd credential \
            skyros-sync-password, never from the command line. Exit status: 0 valid; 64 the configuration or \
            the rules are invalid; 69 the database cannot be reached.
            """)

    @Option(
        help: ArgumentHelp(
            "A configuration file: key = value lines (# comments) with the options' names as keys (group, database, database-password-file, rules, secret-file, keys, audience, listen, tls-cert, tls-key, pool-size); an option given on the command line wins.",
            valueName: "path"))
    var config: String?

    @Option(help: ArgumentHelp("The application group.", valueName: "id"))
    var group: String?

    @Option(help: ArgumentHelp("The group's PostgreSQL database (postgresql://user@host/db).", valueName: "url"))
    var database: String?

    @Option(
        name: .customLong("database-password-file"),
        help: ArgumentHelp("A file holding the database password.", valueName: "path"))
    var passwordFile: String?

    @Option(help: ArgumentHelp("The sync rules (sync-rules.yaml).", valueName: "path"))
    var rules: String?

    @Option(
        name: .customLong("secret-file"),
        help: ArgumentHelp("The HS256 secret tokens are signed with.", valueName: "path"))
    var secretFile: String?

    @Option(
        help: ArgumentHelp(
            "A JWKS file of the public keys tokens are signed with (RS256, ES256, EdDSA).", valueName: "path"))
    var keys: String?

    @Option(help: ArgumentHelp("The audience tokens must name.", valueName: "name"))
    var audience: String?

    @Option(help: ArgumentHelp("The address and port machines connect to.", valueName: "host:port"))
    var listen: String?

    @Option(
        name: .customLong("tls-cert"),
        help: ArgumentHelp("The gateway's TLS certificate chain (PEM).", valueName: "path"))
    var tlsCertificate: String?

    @Option(
        name: .customLong("tls-key"), help: ArgumentHelp("The TLS certificate's private key (PEM).", valueName: "path"))
    var tlsKey: String?

    @Option(
        name: .customLong("pool-size"),
        help: ArgumentHelp(
            "PostgreSQL connections for machines' requests (the LISTEN connection is one more).", valueName: "n"))
    var poolSize: Int?

    @Option(
        name: .customLong("handshake-timeout"),
        help: ArgumentHelp(
            "Seconds a connection may take from its accept to its accepted hello (TLS, the WebSocket upgrade, the token) before it is closed (default 10).",
            valueName: "seconds"))
    var handshakeTimeout: Double?

    @Flag(help: "Validate the configuration and exit.")
    var check = false

    /// The options a configuration file may give.
    static let configKeys = [
        "group", "database", "database-password-file", "rules", "secret-file", "keys", "audience", "listen", "tls-cert",
        "tls-key", "pool-size",
    ]

    /// The command with the configuration file's values where the command line gave none.
    func merged() -> SkyrosGatewayCommand {
        guard let config else { return self }
        guard let text = try? String(contentsOfFile: config, encoding: .utf8) else {
            fail(64, "the configuration file \(config) cannot be read")
        }
        var values: [String: String] = [:]
        for (index, raw) in text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline).enumerated() {
            let line = raw.trimmingCharacters(in: .whitespaces)
            if line.isEmpty || line.hasPrefix("#") { continue }
            guard let equals = line.firstIndex(of: "=") else {
                fail(64, "\(config) line \(index + 1): expected key = value")
            }
            let key = line[..<equals].trimmingCharacters(in: .whitespaces)
            var value = line[line.index(after: equals)...].trimmingCharacters(in: .whitespaces)
            if value.count >= 2, let quote = value.first, quote == "\"" || quote == "'", value.last == quote {
                value = String(value.dropFirst().dropLast())
            }
            guard Self.configKeys.contains(key) else {
                fail(
                    64,
                    "\(config) line \(index + 1): unknown key '\(key.prefix(40))'; the keys are \(Self.configKeys.joined(separator: ", "))"
                )
            }
            guard values.updateValue(value, forKey: key) == nil else {
                fail(64, "\(config) line \(index + 1): \(key) is given a second time")
            }
        }
        var command = self
        command.group = group ?? values["group"]
        command.database = database ?? values["database"]
        command.passwordFile = passwordFile ?? values["database-password-file"]
        command.rules = rules ?? values["rules"]
        command.secretFile = secretFile ?? values["secret-file"]
        command.keys = keys ?? values["keys"]
        command.audience = audience ?? values["audience"]
        command.listen = listen ?? values["listen"]
        command.tlsCertificate = tlsCertificate ?? values["tls-cert"]
        command.tlsKey = tlsKey ?? values["tls-key"]
        if poolSize == nil, let text = values["pool-size"] {
            guard let size = Int(text), (1...64).contains(size) else {
                fail(64, "\(config): pool-size is a number of connections from 1 to 64")
            }
            command.poolSize = size
        }
        return command
    }

    func run() async throws {
        try await merged().serve()
    }

    func serve() async throws {
        guard let group else { fail(64, "give the group: --group ID (or group in --config)") }
        guard let database else { fail(64, "give the group's database: --database URL (or database in --config)") }
        guard let rules else { fail(64, "give the sync rules: --rules PATH (or rules in --config)") }
        var address: (host: String, port: Int)?
        if !check {
            guard let listen, let colon = listen.lastIndex(of: ":"),
                let port = Int(listen[listen.index(after: colon)...]),
                (0...65_535).contains(port)
            else { fail(64, "give the address machines connect to: --listen HOST:PORT") }
            guard tlsCertificate != nil, tlsKey != nil else {
                fail(64, "machines connect over TLS only: give --tls-cert and --tls-key (PEM files)")
            }
            var host = String(listen[..<colon])
            if host.hasPrefix("["), host.hasSuffix("]") { host = String(host.dropFirst().dropLast()) }
            address = (host, port)
        }
        // The rules: their form first, every problem with its place.
        let parsed: SyncRules
        do {
            parsed = try SyncRules.load(rules)
        } catch let invalid as SyncRules.Invalid {
            for problem in invalid.problems { printError(problem.description) }
            fail(64, "the sync rules have \(invalid.problems.count) problem\(invalid.problems.count == 1 ? "" : "s")")
        } catch let error as SkyrosError {
            fail(64, error.message)
        }
        // The token keys.
        let keyDescription: String
        let verifier: SyncTokenVerifier
        do {
            switch (secretFile, keys) {
            case (let secret?, nil):
                verifier = try await SyncTokenVerifier(secretFile: secret, audience: audience)
                keyDescription = "an HS256 secret"
            case (nil, let jwks?):
                verifier = try await SyncTokenVerifier(jwksFile: jwks, audience: audience)
                keyDescription = "the public keys of \(jwks)"
            default:
                fail(64, "give the token keys: --secret-file or --keys, one of them")
            }
        } catch let error as SkyrosError {
            fail(64, error.message)
        }
        // The database, and the rules against the group's tables there.
        let configuration: SyncConfiguration
        do {
            guard
                let resolved = try SyncConfiguration.resolve(
                    group: group, container: URL(fileURLWithPath: "/nonexistent-skyros-gateway"), url: database,
                    passwordFile: passwordFile, environment: ProcessInfo.processInfo.environment)
            else { fail(64, "--database is required") }
            var named = resolved
            named.source = nil  // (resolve's label is skyrosd's --sync)
            configuration = named
        } catch let error as SkyrosError {
            fail(64, error.message)
        }
        var logger = Logger(label: "skyros-gateway")
        logger.logLevel = .critical
        let catalog: [String: [String: ServerSession.CatalogColumn]]
        do {
            let connection = try await PostgresConnection.connect(
                on: MultiThreadedEventLoopGroup.singleton.any(),
                configuration: try configuration.connectionConfiguration(), id: 1, logger: logger)
            defer { connection.closeInBackground() }
            catalog = try await ServerSession.catalog(schema: configuration.schema, on: connection, logger: logger)
        } catch {
            fail(69, "cannot read the group's tables from \(database): \(String(reflecting: error).prefix(300))")
        }
        guard !catalog.isEmpty else {
            fail(
                69,
                "the server has no table of group \(group) in schema \(configuration.schema): an operator sets them up first (skyrosd --sync-setup, or a machine of the group in direct mode); the gateway never creates them"
            )
        }
        let problems = parsed.check(against: Self.rulesCatalog(catalog))
        guard problems.isEmpty else {
            for problem in problems { printError(problem.description) }
            fail(
                64,
                "the sync rules do not fit the group's tables (\(problems.count) problem\(problems.count == 1 ? "" : "s"))"
            )
        }
        let entities = Set(parsed.buckets.flatMap { $0.entities.map(\.entity) })
        guard let address, let tlsCertificate, let tlsKey else {
            print(
                "ok: \(parsed.buckets.count) bucket\(parsed.buckets.count == 1 ? "" : "s") over \(entities.count) entit\(entities.count == 1 ? "y" : "ies"); tokens signed with \(keyDescription); schema \(configuration.schema) on the server"
            )
            return
        }
        var gatewayConfiguration = GatewayConfiguration(
            group: group, database: configuration, rules: parsed.resolvingDestinations(in: Self.rulesCatalog(catalog)),
            verifier: verifier, host: address.host, port: address.port, certificate: tlsCertificate, key: tlsKey)
        gatewayConfiguration.poolSize = max(1, poolSize ?? 3)
        if let handshakeTimeout {
            guard handshakeTimeout > 0, handshakeTimeout <= 3600 else {
                fail(64, "--handshake-timeout is a number of seconds above 0, at most 3600")
            }
            gatewayConfiguration.handshakeTimeout = .milliseconds(Int64(handshakeTimeout * 1000))
        }
        var serving = Logger(label: "skyros-gateway")
        serving.logLevel = .info
        let gateway = GatewayServer(configuration: gatewayConfiguration, logger: serving)
        // ServiceLifecycle runs it until SIGTERM or SIGINT, then stops it gracefully: every
        // machine's connection closed with 1001, the server connections closed.
        let services = ServiceGroup(
            configuration: .init(
                services: [GatewayService(gateway: gateway, address: address, fail: Self.fail)],
                gracefulShutdownSignals: [.sigterm, .sigint], logger: serving))
        try await services.run()
    }

    /// The gateway as a service of ServiceLifecycle: started, announced on stdout with its
    /// port (for whoever started it with --listen HOST:0), run until the graceful shutdown.
    struct GatewayService: Service {
        let gateway: GatewayServer
        let address: (host: String, port: Int)
        let fail: @Sendable (Int32, String) -> Never

        func run() async throws {
            do {
                try await gateway.start()
            } catch {
                fail(69, "cannot listen on \(address.host):\(address.port): \(error)")
            }
            FileHandle.standardOutput.write(Data("listening on \(address.host):\(gateway.port)\n".utf8))
            try? await gracefulShutdown()
            await gateway.stop()
        }
    }

    /// The server's tables as the rules see them: a column referencing another table is a
    /// to-one relationship; the others are attributes of a kind.
    static func rulesCatalog(_ catalog: [String: [String: ServerSession.CatalogColumn]]) -> SyncRules.Catalog {
        catalog.mapValues { columns in
            columns.mapValues { column -> SyncRules.CatalogProperty in
                if let references = column.references { return .toOne(destination: references) }
                let kind =
                    switch column.type {
                    case _ where column.type == "text" || column.type.hasPrefix("character"): "text"
                    case "bigint", "integer", "smallint": "integer"
                    case "double precision", "real", "numeric": "real"
                    case "timestamp with time zone": "timestamp"
                    case "boolean": "boolean"
                    case "bytea", "jsonb": "blob"
                    default: column.type
                    }
                return .attribute(kind: kind)
            }
        }
    }

    private func printError(_ line: String) { Self.printError(line) }

    private func fail(_ status: Int32, _ message: String) -> Never { Self.fail(status, message) }

    private static func printError(_ line: String) {
        FileHandle.standardError.write(Data((line + "\n").utf8))
    }

    /// Says `message` on stderr and exits with `status`.
    @Sendable static func fail(_ status: Int32, _ message: String) -> Never {
        printError("skyros-gateway: \(message)")
        Foundation.exit(status)
    }
}
