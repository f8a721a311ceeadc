import Foundation
import NIOSSL
import PostgresNIO
import Skyros

// MARK: - Resolution

extension SyncConfiguration {
    /// The systemd credential (`LoadCredential=skyros-sync-password:…` in the unit) that
    /// holds the password, in `$CREDENTIALS_DIRECTORY`.
    package static let credentialName = "skyros-sync-password"

    /// How a group's daemon syncs, from its flags, its environment and its container, or nil
    /// when nothing asks it to (this machine only).
    ///
    /// The URL is the first of: `url` (`--sync`), `SKYROS_SYNC_URL`, `url` in the container's
    /// `sync.conf`. The schema: `schema` (`--sync-schema`), the URL's `schema=`, `schema` in
    /// `sync.conf`, ``schemaName(forGroup:)``. The retention: the URL's `retention=`, then
    /// `sync.conf`'s. The password is the first of: the file `passwordFile`
    /// (`--sync-password-file`, relative to the working directory), the file `password-file`
    /// of `sync.conf` (relative to the container), `SKYROS_SYNC_PASSWORD`, the systemd
    /// credential `$CREDENTIALS_DIRECTORY/skyros-sync-password`; none: no password (trust or
    /// peer authentication). A file's trailing newlines are not part of the password; a file
    /// that other users may read is used, with a warning in ``warnings``.
    ///
    /// - Parameters:
    ///   - group: The application group (validated by the caller).
    ///   - container: The group container, where `sync.conf` may be.
    ///   - url: `--sync`.
    ///   - passwordFile: `--sync-password-file`.
    ///   - schema: `--sync-schema`.
    ///   - environment: The process's environment (`ProcessInfo.processInfo.environment`).
    /// - Throws: ``SkyrosError/Code/syncConfiguration``, the message prefixed by where the
    ///   faulty setting came from: an invalid URL or `sync.conf`, a password file that cannot
    ///   be read or is empty, an invalid schema name, `--sync-password-file`, `--sync-schema`
    ///   or a `sync.conf` without any URL (a setting that would silently do nothing). The
    ///   environment's `SKYROS_SYNC_PASSWORD` alone is not refused (a service's environment may
    ///   be shared by groups that do not sync): see ``unusedEnvironment(_:)``.
    /// What the environment sets for sync that a group without a sync URL does not use, as a
    /// warning for the log (nil: nothing): `SKYROS_SYNC_PASSWORD` without any URL, which would
    /// otherwise be ignored without a word.
    package static func unusedEnvironment(_ environment: [String: String]) -> String? {
        guard let password = environment["SKYROS_SYNC_PASSWORD"], !password.isEmpty else { return nil }
        return
            "SKYROS_SYNC_PASSWORD is set, but no sync URL is (--sync, SKYROS_SYNC_URL or url in sync.conf): this group does not sync"
    }

    package static func resolve(
        group: String, container: URL, url: String?, passwordFile: String?, schema: String? = nil,
        tokenFile: String? = nil, environment: [String: String]
    ) throws -> SyncConfiguration? {
        let file = try File.read(in: container)
        let given: (text: String, source: String)
        if let url {
            given = (url, "--sync")
        } else if let url = environment["SKYROS_SYNC_URL"], !url.isEmpty {
            given = (url, "SKYROS_SYNC_URL")
        } else if let file, let url = file.url {
            given = (url, file.path)
        } else {
            let settings = [
                passwordFile.map { _ in "--sync-password-file" }, schema.map { _ in "--sync-schema" },
                file.map { "\($0.path) (which has no url)" },
            ].compactMap { $0 }
            if settings.isEmpty { return nil }
            throw invalid(
                "no sync URL for \(settings.joined(separator: " and ")): give it with --sync, SKYROS_SYNC_URL, or "
                    + "url = postgresql://user@host/db in \(container.appendingPathComponent(fileName).path)")
        }
        if given.text.hasPrefix("wss://") || given.text.hasPrefix("ws://") {
            return try resolveGateway(
                given, group: group, container: container, file: file, tokenFile: tokenFile, environment: environment)
        }
        let parsed: ParsedURL
        do {
            parsed = try parseURL(given.text)
        } catch let error as SkyrosError {
            throw invalid("\(given.source): \(error.message)")
        }
        var configuration = SyncConfiguration(
            servers: parsed.servers, targetSessionAttributes: parsed.targetSessionAttributes,
            username: parsed.username, database: parsed.database, schema: "", tls: parsed.tls,
            rootCertificate: parsed.rootCertificate,
            retention: parsed.retention ?? file?.retention ?? defaultRetention, source: given.source)
        configuration.group = group
        if let schema {
            configuration.schema = try checkedSchema(schema, from: "--sync-schema")
        } else if let named = parsed.schema ?? file?.schema {
            configuration.schema = named
        } else {
            configuration.schema = try derivedSchema(forGroup: group)
        }
        if let passwordFile {
            try configuration.readPassword(from: passwordFile, relativeTo: nil, setting: "--sync-password-file")
        } else if let file, let passwordFile = file.passwordFile {
            try configuration.readPassword(
                from: passwordFile, relativeTo: container, setting: "password-file in \(file.path)")
        } else if let password = environment["SKYROS_SYNC_PASSWORD"], !password.isEmpty {
            configuration.password = password
            configuration.passwordSource = "SKYROS_SYNC_PASSWORD"
        } else if let directory = environment["CREDENTIALS_DIRECTORY"], !directory.isEmpty {
            let path = URL(fileURLWithPath: directory).appendingPathComponent(credentialName).path
            if FileManager.default.fileExists(atPath: path) {
                try configuration.readPassword(
                    from: path, relativeTo: nil, setting: "the systemd credential \(credentialName)", checkMode: false)
                configuration.passwordSource = "the systemd credential \(credentialName)"
            }
        }
        return configuration
    }

    /// The configuration of a machine syncing through a gateway (`wss://host[:port]/G`): its
    /// token file is the first of `--sync-token-file`, `token-file` in sync.conf,
    /// `SKYROS_SYNC_TOKEN_FILE` and the systemd credential `skyros-sync-token`. The token itself
    /// is read at each connection.
    private static func resolveGateway(
        _ given: (text: String, source: String), group: String, container: URL, file: File?, tokenFile: String?,
        environment: [String: String]
    ) throws -> SyncConfiguration {
        guard given.text.hasPrefix("wss://") else {
            throw invalid("\(given.source): a gateway is reached over TLS only: wss://, not ws://")
        }
        var endpoint: GatewayEndpoint
        do {
            endpoint = try GatewayEndpoint.parse(given.text)
        } catch let error as SkyrosError {
            throw invalid("\(given.source): \(error.message)")
        }
        if let tokenFile {
            endpoint.tokenFile = tokenFile
            endpoint.tokenSource = "the file \(tokenFile) (--sync-token-file)"
        } else if let file, let path = file.tokenFile {
            let resolved = path.hasPrefix("/") ? path : container.appendingPathComponent(path).path
            endpoint.tokenFile = resolved
            endpoint.tokenSource = "the file \(resolved) (token-file in \(file.path))"
        } else if let path = environment["SKYROS_SYNC_TOKEN_FILE"], !path.isEmpty {
            endpoint.tokenFile = path
            endpoint.tokenSource = "the file \(path) (SKYROS_SYNC_TOKEN_FILE)"
        } else if let directory = environment["CREDENTIALS_DIRECTORY"], !directory.isEmpty,
            FileManager.default.fileExists(atPath: directory + "/skyros-sync-token")
        {
            endpoint.tokenFile = directory + "/skyros-sync-token"
            endpoint.tokenSource = "the systemd credential skyros-sync-token"
        } else {
            throw invalid(
                "\(given.source): the gateway \(endpoint.url) needs the machine's token: give its file with --sync-token-file, token-file in sync.conf, SKYROS_SYNC_TOKEN_FILE, or the systemd credential skyros-sync-token"
            )
        }
        var configuration = SyncConfiguration(
            host: endpoint.host, port: endpoint.port, username: "gateway", database: endpoint.group,
            schema: schemaName(forGroup: group), tls: .require, source: given.source)
        configuration.group = group
        configuration.gateway = endpoint
        return configuration
    }

    /// Reads the password again from ``passwordFilePath`` (when it came from a file): an
    /// operator who corrected the file is heard at the next connection. A file that cannot be
    /// read now, or is empty, leaves the password as it was (the connection then fails as
    /// before, and says so).
    package mutating func rereadPassword() {
        guard let path = passwordFilePath, var text = try? String(contentsOfFile: path, encoding: .utf8) else {
            return
        }
        while text.hasSuffix("\n") || text.hasSuffix("\r") { text.removeLast() }
        if !text.isEmpty { password = text }
    }

    /// Sets ``password`` to the contents of a file, its trailing newlines removed; warns when
    /// other users may read it.
    package mutating func readPassword(
        from path: String, relativeTo base: URL?, setting: String, checkMode: Bool = true
    ) throws {
        let resolved = base.map { path.hasPrefix("/") ? path : $0.appendingPathComponent(path).path } ?? path
        var password = try Self.readText(resolved, what: "the password file of \(setting)")
        while password.hasSuffix("\n") || password.hasSuffix("\r") || password.hasSuffix("\r\n") {
            password.removeLast()
        }
        guard !password.isEmpty else {
            throw Self.invalid("the password file \(resolved) (\(setting)) is empty: write the role's password in it")
        }
        self.password = password
        passwordFilePath = resolved
        passwordSource = "the file \(resolved)"
        var status = stat()
        if checkMode, stat(resolved, &status) == 0, status.st_mode & 0o077 != 0 {
            warnings.append(
                "the password file \(resolved) may be read by other users (mode \(String(status.st_mode & 0o777, radix: 8))): "
                    + "chmod 600 it, or 640 with a group only the daemon's user is in")
        }
    }
}
