import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// Certificates for testing TLS with a real PostgreSQL: a certificate authority made for the
/// test, a server certificate it signs for `127.0.0.1` and `localhost` (or other names), and a second CA that
/// signed nothing (a client that trusts only it must refuse the server). Made with the
/// `openssl` command line (Debian's `openssl` package) in a temporary directory, removed with
/// this value, even when a test fails.
///
/// PostgreSQL refuses a key file that others may read, and reads it as the server's own user:
/// the key is mode 0600 and, when the tests run as root (the server then runs as `nobody`),
/// owned by `nobody`.
///
/// ```swift
/// let certificates = try TestCertificates()
/// let server = try await PostgresServer.started(settings: certificates.serverSettings)
/// // a client with sslmode=verify-full and sslrootcert=certificates.authority
/// ```
public final class TestCertificates: Sendable {
    /// The directory holding every file, `/tmp/skcert-<pid>-<random>`.
    public let directory: String
    /// The CA certificate (PEM) that signed the server's: a client's `sslrootcert`.
    public var authority: String { directory + "/ca.crt" }
    /// Another CA's certificate (PEM), which signed nothing the server has.
    public var otherAuthority: String { directory + "/other-ca.crt" }
    /// The server's certificate (PEM), for `127.0.0.1` and `localhost` unless told otherwise.
    public var serverCertificate: String { directory + "/server.crt" }
    /// The server's private key (PEM), mode 0600, owned by the server's user.
    public var serverKey: String { directory + "/server.key" }

    /// The settings that make a ``PostgresServer`` offer TLS with these certificates:
    /// `ssl=on`, `ssl_cert_file`, `ssl_key_file`.
    public var serverSettings: [String: String] {
        ["ssl": "on", "ssl_cert_file": serverCertificate, "ssl_key_file": serverKey]
    }

    /// Makes the two CAs and the server's key and certificate (elliptic-curve P-256 keys,
    /// valid for two days).
    /// - Parameter serverNames: the names the server's certificate holds, as openssl's
    ///   `subjectAltName` entries (a certificate for another host: `["DNS:db.example.com"]`).
    /// - Throws: ``PostgresServerError/notInstalled(_:)`` without `openssl`,
    ///   ``PostgresServerError/commandFailed(command:status:output:)`` when a command fails;
    ///   nothing is left behind.
    public init(serverNames: [String] = ["IP:127.0.0.1", "DNS:localhost"]) throws {
        guard let openssl = PostgresServer.which("openssl") else {
            throw PostgresServerError.notInstalled(
                "openssl (Debian package openssl) is needed to make the tests' certificates")
        }
        let directory = "/tmp/skcert-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        guard mkdir(directory, 0o755) == 0 else {
            throw PostgresServerError.failed("mkdir \(directory): \(String(cString: strerror(errno)))")
        }
        chmod(directory, 0o755)  // the server's user reads the certificate and key here
        self.directory = directory
        do {
            try Self.make(in: directory, openssl: openssl, serverNames: serverNames)
        } catch {
            try? FileManager.default.removeItem(atPath: directory)
            throw error
        }
    }

    deinit {
        try? FileManager.default.removeItem(atPath: directory)
    }

    private static func make(in directory: String, openssl: String, serverNames: [String]) throws {
        func run(_ arguments: [String]) throws {
            let result = try PostgresServer.run(
                [openssl] + arguments, environment: PostgresServer.environment, directory: directory,
                outputDirectory: directory,
                timeout: .seconds(30))
            guard result.status == 0 else {
                throw PostgresServerError.commandFailed(
                    command: "openssl \(arguments.first ?? "")", status: PostgresServer.describe(result.status),
                    output: result.output + result.error)
            }
        }
        let key = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        for (name, subject) in [("ca", "/CN=Skyros test CA"), ("other-ca", "/CN=Skyros other test CA")] {
            try run(
                ["req", "-x509"] + key + [
                    "-keyout", "\(name).key", "-out", "\(name).crt", "-days", "2", "-subj", subject,
                    "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
                ])
        }
        try run(["req", "-new"] + key + ["-keyout", "server.key", "-out", "server.csr", "-subj", "/CN=localhost"])
        let extensions = """
            subjectAltName = \(serverNames.joined(separator: ", "))
            basicConstraints = CA:FALSE
            keyUsage = critical, digitalSignature, keyEncipherment
            extendedKeyUsage = serverAuth

            """
        guard FileManager.default.createFile(atPath: directory + "/server.ext", contents: Data(extensions.utf8)) else {
            throw PostgresServerError.failed("cannot write \(directory)/server.ext")
        }
        try run([
            "x509", "-req", "-in", "server.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out",
            "server.crt",
            "-days", "2", "-extfile", "server.ext",
        ])
        let serverKey = directory + "/server.key"
        for file in ["ca.crt", "other-ca.crt", "server.crt"] { chmod(directory + "/" + file, 0o644) }
        guard chmod(serverKey, 0o600) == 0 else {
            throw PostgresServerError.failed("chmod \(serverKey): \(String(cString: strerror(errno)))")
        }
        if geteuid() == 0, chown(serverKey, PostgresServer.unprivilegedID, PostgresServer.unprivilegedID) != 0 {
            throw PostgresServerError.failed("chown \(serverKey): \(String(cString: strerror(errno)))")
        }
    }
}

extension PostgresServer {
    /// Replaces the cluster's `pg_hba.conf` with `lines` (after the Unix socket's `local all
    /// all trust`, which ``psql(_:database:user:password:timeout:)`` needs) and makes the
    /// server read it again; returns once it has (`pg_hba_file_rules` shows no error).
    ///
    /// For instance `["hostssl all all 127.0.0.1/32 trust"]`: TCP clients only over TLS.
    public func replaceHostBasedAuthentication(_ lines: [String]) throws {
        let path = dataDirectory + "/pg_hba.conf"
        let text = (["local all all trust"] + lines).joined(separator: "\n") + "\n"
        // Written in place: the file keeps its owner (the server's user) and mode.
        guard let handle = FileHandle(forWritingAtPath: path) else {
            throw PostgresServerError.failed("cannot open \(path)")
        }
        defer { try? handle.close() }
        try handle.truncate(atOffset: 0)
        try handle.write(contentsOf: Data(text.utf8))
        try handle.synchronize()
        let errors = try psql("SELECT pg_reload_conf(); SELECT count(*) FROM pg_hba_file_rules WHERE error IS NOT NULL")
        guard errors.split(separator: "\n").last == "0" else {
            throw PostgresServerError.failed("pg_hba.conf refused: \(errors)")
        }
    }
}
