import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A private PostgreSQL server for tests and benchmarks: its own cluster in a short temporary
/// directory, served on a free loopback port and on a Unix socket in that directory, started
/// as a child process of the test and stopped and removed with it, even when a test fails.
///
/// It needs PostgreSQL's server binaries: Debian's `postgresql` package (version 15 on
/// bookworm), found under `/usr/lib/postgresql/15/bin`, else the newest other version under
/// `/usr/lib/postgresql/*/bin`, else `initdb` and `postgres` on `PATH`.
///
/// PostgreSQL refuses to run as root. When the test runs as root (as CI does), `initdb` and
/// `postgres` run as `nobody` (uid and gid 65534) through util-linux's `setpriv`, which
/// changes credentials and then executes the program, so the child's pid is the postmaster's.
/// The directory belongs to that user and is readable by everyone, so clients running as any
/// user reach the socket; `psql` runs as the test's own user.
///
/// ```swift
/// let server = try PostgresServer.shared()
/// let database = try server.createUniqueDatabase()
/// _ = try server.psql("CREATE TABLE t (x int); INSERT INTO t VALUES (1)", database: database)
/// #expect(try server.psql("SELECT x FROM t", database: database) == "1")
/// ```
///
/// The process is signalled and reaped by its pid, never found by name. A test process that
/// is killed cannot clean up after itself: the next server made on the machine removes the
/// directories whose owner is gone and stops their postmasters (checked by pid and data
/// directory).
public final class PostgresServer: Sendable {
    /// How ``stop(mode:timeout:)`` asks the postmaster to shut down.
    public enum StopMode: Sendable {
        /// SIGINT: connections are ended, a shutdown checkpoint is written.
        case fast
        /// SIGQUIT: every process quits at once, without a checkpoint; the next start recovers
        /// from the write-ahead log, as after a crash.
        case immediate
    }

    /// The loopback address the server listens on.
    public let host = "127.0.0.1"
    /// The superuser made by `initdb`.
    public let superuser = "postgres"
    /// The TCP port, the same for every (re)start of this server.
    public let port: Int
    /// The server's own directory, `/tmp/skpg-<pid>-<random>`: the cluster (`data`), the log,
    /// and the Unix socket `.s.PGSQL.<port>`.
    public let directory: String
    /// The directory holding the Unix socket (`psql -h`, libpq's `host=`): ``directory``.
    public var socketDirectory: String { directory }
    /// The cluster's data directory.
    public var dataDirectory: String { directory + "/data" }
    /// The server's log: what `initdb` and then the postmaster wrote, across restarts.
    public var logFile: String { directory + "/postgres.log" }
    /// The directory of the PostgreSQL binaries in use.
    public let binDirectory: String
    /// The superuser's password when the server was made with one (TCP connections then
    /// authenticate with SCRAM-SHA-256; the Unix socket still trusts), else nil.
    public let password: String?
    /// The `-c` settings given to every start of the postmaster.
    public let settings: [String: String]

    private let psqlPath: String
    private let cluster: Cluster
    /// The directory's lock, held while this server lives (see ``sweepAbandonedDirectories()``).
    private let lockDescriptor: Int32
    private let state = Mutex(State())

    private struct State {
        /// The running postmaster, a child of this process.
        var pid: pid_t?
    }

    /// Makes a cluster and starts its server.
    ///
    /// - Parameters:
    ///   - password: when set, the superuser gets this password and TCP connections must
    ///     authenticate with it (SCRAM-SHA-256); connections through the Unix socket are
    ///     trusted either way. Nil: every connection is trusted.
    ///   - settings: extra server settings, each given as `-c name=value` (for instance
    ///     `["wal_level": "logical", "max_connections": "200"]`). `fsync` stays on unless set here.
    ///   - startTimeout: how long a start may take before it fails.
    /// - Throws: ``PostgresServerError`` when the binaries are missing, `initdb` fails, or the
    ///   server does not get ready in time; nothing is left behind.
    public convenience init(
        password: String? = nil, settings: [String: String] = [:], startTimeout: Duration = .seconds(30)
    ) throws {
        try self.init(password: password, settings: settings, startTimeout: startTimeout) { try $0.initialize() }
    }

    /// Makes a server whose cluster `makeCluster` puts in its data directory (`initdb`, or a
    /// base backup of another server), and starts it.
    private init(
        password: String?, settings: [String: String], startTimeout: Duration, makeCluster: (Cluster) throws -> Void
    ) throws {
        Self.sweepOnce()
        let bin = try Self.locateBinaries()
        var setpriv: String?
        if geteuid() == 0 {
            guard let path = Self.which("setpriv") else {
                throw PostgresServerError.notInstalled(
                    "setpriv (Debian package util-linux) is needed to run PostgreSQL as nobody when the tests run as root"
                )
            }
            setpriv = path
        }
        let directory = "/tmp/skpg-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        guard mkdir(directory, 0o755) == 0 else {
            throw PostgresServerError.failed("mkdir \(directory): \(String(cString: strerror(errno)))")
        }
        let lock = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC)
        let cluster = Cluster(
            directory: directory, binDirectory: bin, setprivPath: setpriv, password: password, settings: settings,
            startTimeout: startTimeout)
        var port = 0
        var pid: pid_t = 0
        do {
            guard lock >= 0, flock(lock, LOCK_EX | LOCK_NB) == 0 else {
                throw PostgresServerError.failed("cannot lock \(directory)")
            }
            chmod(directory, 0o755)  // whatever the umask: every user reaches the socket
            if setpriv != nil, chown(directory, Self.unprivilegedID, Self.unprivilegedID) != 0 {
                throw PostgresServerError.failed("chown \(directory): \(String(cString: strerror(errno)))")
            }
            try makeCluster(cluster)
            var attempt = 0
            while true {
                attempt += 1
                port = try Self.freeLoopbackPort()
                do {
                    pid = try cluster.launch(port: port)
                    break
                } catch PostgresServerError.addressInUse where attempt < 10 {
                    continue  // another process took the port between the probe and the bind
                }
            }
        } catch {
            // launch leaves no process behind when it throws
            try? FileManager.default.removeItem(atPath: directory)
            if lock >= 0 { close(lock) }
            throw error
        }
        self.cluster = cluster
        self.directory = directory
        self.binDirectory = bin
        self.password = password
        self.settings = settings
        self.port = port
        lockDescriptor = lock
        psqlPath =
            FileManager.default.isExecutableFile(atPath: bin + "/psql") ? bin + "/psql" : Self.which("psql") ?? "psql"
        state.withLock { $0.pid = pid }
        Self.registry.withLock { $0[directory] = pid }
    }

    deinit {
        let pid = state.withLock { $0.pid }
        if let pid { Self.terminate(pid) }
        Self.registry.withLock { $0[directory] = nil }
        try? FileManager.default.removeItem(atPath: directory)
        close(lockDescriptor)
    }

    // MARK: Shared server

    private static let sharedServer = Mutex<Result<PostgresServer, any Error>?>(nil)

    /// The process's shared server, started on first use (trust authentication, default
    /// settings) and stopped, by pid, with its directory removed, when the process exits.
    ///
    /// Tests sharing it make their own database each (``createUniqueDatabase(prefix:)``), so
    /// they may run in parallel. A test that stops, restarts or kills the server must start its
    /// own `PostgresServer` instead: the shared one is everyone's.
    /// - Throws: the error of the first start, again on every call, when it failed.
    public static func shared() throws -> PostgresServer {
        try sharedSynchronously()
    }

    /// ``shared()`` for async code: the first start (`initdb`, the postmaster's), and the wait
    /// for it, hold a thread of their own, not one of Swift's cooperative pool (one per core:
    /// two tests starting servers at once on the 2-core CI machine stalled every other test of
    /// the process for as long, and one of them past its time limit).
    public static func shared() async throws -> PostgresServer {
        try await offThePool { try sharedSynchronously() }
    }

    /// A server made as ``init(password:settings:startTimeout:)`` does, on a thread of its own
    /// (see ``shared()-swift.type.method``): what async tests call.
    public static func started(
        password: String? = nil, settings: [String: String] = [:], startTimeout: Duration = .seconds(30)
    ) async throws -> PostgresServer {
        try await offThePool { try PostgresServer(password: password, settings: settings, startTimeout: startTimeout) }
    }

    private static func sharedSynchronously() throws -> PostgresServer {
        try sharedServer.withLock { cached in
            if let cached { return try cached.get() }
            let result = Result { try PostgresServer() }
            cached = result
            return try result.get()
        }
    }

    // MARK: Clients

    /// A connection URL, `postgresql://user[:password]@127.0.0.1:<port>/database`, with
    /// every part percent-encoded.
    public func url(database: String = "postgres", user: String = "postgres", password: String? = nil) -> String {
        var allowed = CharacterSet.alphanumerics.intersection(
            CharacterSet(charactersIn: Unicode.Scalar(0)..<Unicode.Scalar(128)))
        allowed.insert(charactersIn: "-._~")
        func encode(_ text: String) -> String { text.addingPercentEncoding(withAllowedCharacters: allowed) ?? text }
        let credentials = encode(user) + (password.map { ":" + encode($0) } ?? "")
        return "postgresql://\(credentials)@\(host):\(port)/\(encode(database))"
    }

    /// Runs an SQL script with `psql` and returns what it printed, unaligned and without
    /// headers (`-qAt`: one row a line, columns separated by `|`), without the final newline.
    ///
    /// The script goes to `psql` as a file, so it may hold several statements (each runs on
    /// its own, as in any script, unless wrapped in `BEGIN`/`COMMIT`) and psql's
    /// meta-commands; the first error stops it (`ON_ERROR_STOP`).
    /// - Parameters:
    ///   - database: the database to connect to.
    ///   - user: the role to connect as.
    ///   - password: nil: connect through the Unix socket (trusted). Otherwise connect over
    ///     TCP to ``host`` with this password, as remote clients do.
    ///   - timeout: how long psql may run before it is killed.
    /// - Throws: ``PostgresServerError/commandFailed(command:status:output:)`` with psql's
    ///   standard error when psql fails (a connection refused, an SQL error).
    @discardableResult
    public func psql(
        _ sql: String, database: String = "postgres", user: String = "postgres", password: String? = nil,
        timeout: Duration = .seconds(60)
    ) throws -> String {
        let script = directory + "/psql-\(UUID().uuidString).sql"
        guard FileManager.default.createFile(atPath: script, contents: Data(sql.utf8)) else {
            throw PostgresServerError.failed("cannot write \(script)")
        }
        defer { unlink(script) }
        var environment = Self.environment
        environment["PGCLIENTENCODING"] = "UTF8"
        if let password { environment["PGPASSWORD"] = password }
        let result = try Self.run(
            [
                psqlPath, "-X", "-v", "ON_ERROR_STOP=1", "-qAt", "-h", password == nil ? socketDirectory : host,
                "-p", String(port), "-U", user, "-d", database, "-f", script,
            ],
            environment: environment, outputDirectory: directory, timeout: timeout)
        guard result.status == 0 else {
            throw PostgresServerError.commandFailed(
                command: "psql -d \(database) -U \(user)", status: Self.describe(result.status), output: result.error)
        }
        return result.output.hasSuffix("\n") ? String(result.output.dropLast()) : result.output
    }

    /// Creates a database owned by the superuser.
    /// - Parameter name: the database's name, quoted as an identifier (any characters).
    public func createDatabase(_ name: String) throws {
        try psql("CREATE DATABASE \(Self.quoteIdentifier(name))")
    }

    /// Creates a database with a name no other caller of this server gets, and returns it.
    @discardableResult
    public func createUniqueDatabase(prefix: String = "test") throws -> String {
        let name = "\(prefix)_\(UUID().uuidString.replacingOccurrences(of: "-", with: "").prefix(16).lowercased())"
        try createDatabase(name)
        return name
    }

    /// `name` as an SQL identifier: in double quotes, its double quotes doubled.
    public static func quoteIdentifier(_ name: String) -> String {
        "\"" + name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
    }

    // MARK: Lifecycle

    /// The postmaster's pid while it runs, else nil.
    public var processIdentifier: pid_t? {
        state.withLock { state in
            guard let pid = state.pid else { return nil }
            guard Self.reapIfExited(pid) == nil else {
                state.pid = nil
                Self.registry.withLock { $0[directory] = -1 }
                return nil
            }
            return pid
        }
    }

    /// Whether the postmaster runs (one that ended by itself is reaped here).
    public var isRunning: Bool { processIdentifier != nil }

    /// Starts the server again on the same data directory and port, after
    /// ``stop(mode:timeout:)`` or ``kill()``, and returns once it accepts connections
    /// (after crash recovery, when it was killed). Does nothing when it runs.
    /// - Throws: ``PostgresServerError`` when it does not get ready in time (the port taken
    ///   meanwhile by another process, for instance); it is then not running.
    public func start() throws {
        try state.withLock { state in
            if let pid = state.pid, Self.reapIfExited(pid) == nil { return }
            state.pid = nil
            let pid = try cluster.launch(port: port)
            state.pid = pid
            Self.registry.withLock { $0[directory] = pid }
        }
    }

    /// Stops the server and reaps its postmaster, keeping the cluster for ``start()``.
    /// Does nothing when it is not running.
    /// - Parameters:
    ///   - mode: `.fast` (SIGINT) or `.immediate` (SIGQUIT).
    ///   - timeout: how long the shutdown may take; after it the postmaster and its children
    ///     are killed (SIGKILL) and the call throws.
    public func stop(mode: StopMode = .fast, timeout: Duration = .seconds(30)) throws {
        try state.withLock { state in
            guard let pid = state.pid else { return }
            state.pid = nil
            defer { Self.registry.withLock { $0[directory] = -1 } }
            if Self.reapIfExited(pid) != nil { return }
            Glibc.kill(pid, mode == .fast ? SIGINT : SIGQUIT)
            if Self.waitForExit(pid, timeout: timeout) == nil {
                Self.killTree(pid)
                throw PostgresServerError.timedOut("the postmaster (pid \(pid)) did not stop within \(timeout); killed")
            }
        }
    }

    /// Kills the server, as a crash of the server (not of the machine: what it wrote stays in
    /// the kernel's cache) would: the postmaster is stopped (SIGSTOP) so that it starts no
    /// more processes, its children and then itself get SIGKILL, and the call returns once
    /// they are gone, so that no backend keeps the old shared memory. ``start()`` then
    /// recovers the cluster from its write-ahead log. Does nothing when it is not running.
    public func kill() {
        state.withLock { state in
            guard let pid = state.pid else { return }
            state.pid = nil
            Self.killTree(pid)
            Self.registry.withLock { $0[directory] = -1 }
        }
    }

    // MARK: Replication

    /// Makes a streaming standby of this server, as an operator would: a base backup of its
    /// cluster (`pg_basebackup -R -X stream`, as the server's user, over this server's Unix
    /// socket with the superuser, whom the `local replication` line `initdb` writes in
    /// `pg_hba.conf` trusts) in a directory of its own, started on a free port with this
    /// server's password and settings. It is a hot standby: it answers reads, refuses writes,
    /// and follows this server until ``promote(timeout:)``. This server needs nothing set for
    /// it: `wal_level` is `replica` and `max_wal_senders` 10 by default.
    ///
    /// ```swift
    /// let primary = try PostgresServer()
    /// let standby = try primary.makeStandby()
    /// primary.kill()
    /// try standby.promote()
    /// ```
    ///
    /// - Parameters:
    ///   - synchronous: makes this server's replication synchronous (`synchronous_standby_names
    ///     = '*'` and `synchronous_commit = on`, by `ALTER SYSTEM` and a reload): a commit
    ///     returns only once the standby has flushed it to disk, so a failover to the standby
    ///     loses no commit a client was told of. Set after the base backup, so that the
    ///     standby does not copy it (promoted, it would wait for a standby of its own), and the
    ///     call returns once the standby is `sync` in `pg_stat_replication`. (A `-c` setting of
    ///     the same name in ``settings`` would override it.) False: asynchronous.
    ///   - timeout: how long the base backup, the standby's start and (synchronous) its
    ///     catching up may each take.
    /// - Throws: ``PostgresServerError`` when `pg_basebackup` is missing or fails, or the standby
    ///   does not start or become synchronous in time; nothing is left running.
    public func makeStandby(synchronous: Bool = true, timeout: Duration = .seconds(60)) throws -> PostgresServer {
        let source = (socketDirectory: socketDirectory, port: port)
        let standby = try PostgresServer(password: password, settings: settings, startTimeout: timeout) { cluster in
            try cluster.baseBackup(socketDirectory: source.socketDirectory, port: source.port, timeout: timeout)
        }
        guard synchronous else { return standby }
        try psql("ALTER SYSTEM SET synchronous_standby_names = '*'")
        try psql("ALTER SYSTEM SET synchronous_commit = on")
        try psql("SELECT pg_reload_conf()")
        let deadline = ContinuousClock.now + timeout
        while try psql("SELECT string_agg(sync_state, ',') FROM pg_stat_replication") != "sync" {
            guard ContinuousClock.now < deadline else {
                throw PostgresServerError.timedOut(
                    "the standby on port \(standby.port) was not synchronous within \(timeout)")
            }
            usleep(20_000)
        }
        return standby
    }

    /// Promotes a standby (see ``makeStandby(synchronous:timeout:)``) to a primary that takes
    /// writes, with `SELECT pg_promote(true, …)`, and returns once it does: it replays the
    /// write-ahead log it received, leaves recovery, and starts a new timeline. Does nothing
    /// to a server that is not a standby.
    /// - Throws: ``PostgresServerError`` when it is not promoted within `timeout`.
    public func promote(timeout: Duration = .seconds(30)) throws {
        guard try psql("SELECT pg_is_in_recovery()") == "t" else { return }
        let seconds = max(1, timeout.components.seconds)
        guard try psql("SELECT pg_promote(true, \(seconds))", timeout: timeout + .seconds(10)) == "t" else {
            throw PostgresServerError.timedOut("the standby on port \(port) was not promoted within \(timeout)")
        }
    }

    /// The pid of a standby's WAL receiver, the process that streams the primary's log
    /// (`pg_stat_wal_receiver`), or nil when none runs.
    public func walReceiverProcess() throws -> pid_t? {
        pid_t(try psql("SELECT pid FROM pg_stat_wal_receiver"))
    }

    // MARK: Binaries

    /// uid and gid of `nobody` and `nogroup` on Debian.
    static let unprivilegedID: UInt32 = 65534

    /// The directory holding `initdb` and `postgres`.
    static func locateBinaries() throws -> String {
        let fileManager = FileManager.default
        func hasServer(_ directory: String) -> Bool {
            fileManager.isExecutableFile(atPath: directory + "/initdb")
                && fileManager.isExecutableFile(atPath: directory + "/postgres")
        }
        let root = "/usr/lib/postgresql"
        let versions = ((try? fileManager.contentsOfDirectory(atPath: root)) ?? [])
            .sorted { (Int($0) ?? 0, $0) > (Int($1) ?? 0, $1) }
        for directory in ["\(root)/15/bin"] + versions.map({ "\(root)/\($0)/bin" }) where hasServer(directory) {
            return directory
        }
        if let initdb = which("initdb") {
            let directory = URL(fileURLWithPath: initdb).resolvingSymlinksInPath().deletingLastPathComponent().path
            if hasServer(directory) { return directory }
        }
        throw PostgresServerError.notInstalled(
            "PostgreSQL's server (initdb, postgres) is not installed: none in /usr/lib/postgresql/*/bin nor on PATH. "
                + "Install Debian's package: apt-get install -y postgresql")
    }

    /// The first executable named `name` on PATH.
    static func which(_ name: String) -> String? {
        let path = ProcessInfo.processInfo.environment["PATH"] ?? "/usr/local/bin:/usr/bin:/bin:/usr/sbin:/sbin"
        return path.split(separator: ":").map { "\($0)/\(name)" }.first {
            FileManager.default.isExecutableFile(atPath: $0)
        }
    }

    /// The children's environment: the test's, without the `PG…` variables (they would point
    /// psql elsewhere), in the C locale.
    static let environment: [String: String] = {
        var environment = ProcessInfo.processInfo.environment.filter {
            !$0.key.hasPrefix("PG") && !$0.key.hasPrefix("LC_")
        }
        environment["LANG"] = "C"
        environment["LC_ALL"] = "C"
        return environment
    }()

    // MARK: Processes

    /// glibc's `posix_spawn_file_actions_addchdir_np` (2.29) and `…_addclosefrom_np` (2.34),
    /// which Swift's Glibc module does not show.
    private typealias AddChdir =
        @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, UnsafePointer<CChar>) -> Int32
    private typealias AddClosefrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    private static let addChdir: AddChdir? = glibcFunction("posix_spawn_file_actions_addchdir_np")
    private static let addClosefrom: AddClosefrom? = glibcFunction("posix_spawn_file_actions_addclosefrom_np")

    private static func glibcFunction<Function>(_ name: String) -> Function? {
        guard let handle = dlopen(nil, RTLD_NOW), let symbol = dlsym(handle, name) else { return nil }
        return unsafeBitCast(symbol, to: Function.self)
    }

    /// Starts a child with the given standard descriptors, no other descriptor of this
    /// process (another test's pipe kept open by a long-lived server would never see its end
    /// of file), every signal at its default disposition and none blocked.
    static func spawn(
        _ arguments: [String], environment: [String: String], directory: String? = nil,
        stdin: Int32, stdout: Int32, stderr: Int32
    ) throws -> pid_t {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, stdin, 0)
        posix_spawn_file_actions_adddup2(&actions, stdout, 1)
        posix_spawn_file_actions_adddup2(&actions, stderr, 2)
        if let addClosefrom {
            _ = addClosefrom(&actions, 3)
        } else {  // older glibc: the descriptors open now
            let open = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
            for descriptor in open.compactMap({ Int32($0) }) where descriptor > 2 && fcntl(descriptor, F_GETFD) >= 0 {
                posix_spawn_file_actions_addclose(&actions, descriptor)
            }
        }
        if let directory, let addChdir { _ = addChdir(&actions, directory) }
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        defer { posix_spawnattr_destroy(&attributes) }
        var empty = sigset_t()
        sigemptyset(&empty)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in Int32(1)..<32 where signal != SIGKILL && signal != SIGSTOP { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigmask(&attributes, &empty)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        let argv = arguments.map { strdup($0) } + [nil]
        let envp = environment.map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer {
            argv.forEach { free($0) }
            envp.forEach { free($0) }
        }
        var pid: pid_t = 0
        let status = posix_spawn(&pid, arguments[0], &actions, &attributes, argv, envp)
        guard status == 0 else {
            throw PostgresServerError.failed("cannot start \(arguments[0]): \(String(cString: strerror(status)))")
        }
        return pid
    }

    /// Runs a command to its end (killed after `timeout`), its output and errors in files of
    /// `outputDirectory`; returns its wait status, output and errors.
    static func run(
        _ arguments: [String], environment: [String: String], directory: String? = nil, outputDirectory: String,
        timeout: Duration
    ) throws -> (status: Int32, output: String, error: String) {
        let base = outputDirectory + "/run-\(UUID().uuidString)"
        let output = open(base + ".out", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        let error = open(base + ".err", O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
        let null = open("/dev/null", O_RDONLY | O_CLOEXEC)
        defer {
            for descriptor in [output, error, null] where descriptor >= 0 { close(descriptor) }
            unlink(base + ".out")
            unlink(base + ".err")
        }
        guard output >= 0, error >= 0, null >= 0 else { throw PostgresServerError.failed("cannot create \(base).*") }
        let pid = try spawn(
            arguments, environment: environment, directory: directory, stdin: null, stdout: output, stderr: error)
        guard let status = waitForExit(pid, timeout: timeout) else {
            killTree(pid)
            throw PostgresServerError.timedOut("\(arguments.joined(separator: " ")) did not finish within \(timeout)")
        }
        func contents(_ path: String) -> String {
            (try? String(contentsOfFile: path, encoding: .utf8)) ?? ""
        }
        return (status, contents(base + ".out"), contents(base + ".err"))
    }

    /// The wait status of `pid`, a child, when it has ended (it is then reaped), else nil.
    static func reapIfExited(_ pid: pid_t) -> Int32? {
        var status: Int32 = 0
        while true {
            let result = waitpid(pid, &status, WNOHANG)
            if result == pid { return status }
            if result == 0 { return nil }
            if errno == EINTR { continue }
            return -1  // ECHILD: not ours anymore (reaped elsewhere)
        }
    }

    /// Waits for the child `pid` to end and reaps it; nil when it still runs after `timeout`.
    static func waitForExit(_ pid: pid_t, timeout: Duration) -> Int32? {
        let deadline = ContinuousClock.now + timeout
        while true {
            if let status = reapIfExited(pid) { return status }
            if ContinuousClock.now >= deadline { return nil }
            usleep(5_000)
        }
    }

    /// Stops the child `pid` for good: SIGSTOP so it forks no more, SIGKILL to its children
    /// and then to it; returns once it is reaped and its children are gone (bounded: 10 s).
    static func killTree(_ pid: pid_t) {
        guard reapIfExited(pid) == nil else { return }
        Glibc.kill(pid, SIGSTOP)
        var status: Int32 = 0
        let stopDeadline = ContinuousClock.now + .seconds(5)
        while ContinuousClock.now < stopDeadline {
            let result = waitpid(pid, &status, WNOHANG | WUNTRACED)
            if result == pid {
                if status & 0xff == 0x7f { break }  // WIFSTOPPED
                return  // it ended meanwhile, and is reaped
            }
            if result < 0, errno != EINTR { break }
            usleep(1_000)
        }
        let children = childProcesses(of: pid)
        for child in children { Glibc.kill(child, SIGKILL) }
        Glibc.kill(pid, SIGKILL)
        _ = waitForExit(pid, timeout: .seconds(10))
        let deadline = ContinuousClock.now + .seconds(10)
        while ContinuousClock.now < deadline, children.contains(where: isAlive) { usleep(5_000) }
    }

    /// The processes whose parent is `pid`, from /proc.
    static func childProcesses(of pid: pid_t) -> [pid_t] {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/proc")) ?? []
        return entries.compactMap { entry -> pid_t? in
            guard let child = pid_t(entry), let fields = statFields(child), fields.count > 1, fields[1] == String(pid)
            else { return nil }
            return child
        }
    }

    /// The fields of /proc/<pid>/stat after the command name: state, parent pid, …
    static func statFields(_ pid: pid_t) -> [String]? {
        guard let stat = try? String(contentsOfFile: "/proc/\(pid)/stat", encoding: .utf8),
            let close = stat.lastIndex(of: ")")
        else { return nil }
        return stat[stat.index(after: close)...].split(separator: " ").map(String.init)
    }

    /// Whether `pid` exists and has not ended (a zombie has ended).
    static func isAlive(_ pid: pid_t) -> Bool {
        guard let state = statFields(pid)?.first else { return false }
        return state != "Z" && state != "X"
    }

    /// Ends the postmaster `pid` at exit or in deinit: SIGQUIT (immediate shutdown: its
    /// children quit and it exits), then the hard way after 10 s.
    static func terminate(_ pid: pid_t) {
        guard reapIfExited(pid) == nil else { return }
        Glibc.kill(pid, SIGQUIT)
        if waitForExit(pid, timeout: .seconds(10)) == nil { killTree(pid) }
    }

    static func describe(_ status: Int32) -> String {
        if status == -1 { return "reaped elsewhere" }
        let signal = status & 0x7f
        return signal == 0 ? "exit status \((status >> 8) & 0xff)" : "signal \(signal)"
    }

    /// The end of the log, from byte `offset` on (the last 8 kB at most).
    static func logTail(_ path: String, from offset: off_t) -> String {
        guard let handle = FileHandle(forReadingAtPath: path) else { return "" }
        defer { try? handle.close() }
        let end = (try? handle.seekToEnd()) ?? 0
        let start = max(UInt64(max(offset, 0)), end > 8192 ? end - 8192 : 0)
        try? handle.seek(toOffset: start)
        return String(decoding: (try? handle.readToEnd()) ?? Data(), as: UTF8.self)
    }

    /// A free TCP port on the loopback address, as the kernel gives one to `bind(port 0)`.
    static func freeLoopbackPort() throws -> Int {
        let descriptor = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
        guard descriptor >= 0 else { throw PostgresServerError.failed("socket: \(String(cString: strerror(errno)))") }
        defer { close(descriptor) }
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = 0
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
                bind(descriptor, address, length) == 0 && getsockname(descriptor, address, &length) == 0
            }
        }
        guard bound else { throw PostgresServerError.failed("bind 127.0.0.1:0: \(String(cString: strerror(errno)))") }
        return Int(UInt16(bigEndian: address.sin_port))
    }

    // MARK: Cleaning up

    /// Every server's directory and postmaster pid (-1 while stopped), for the exit hook.
    private static let registry: Mutex<[String: pid_t]> = {
        atexit { PostgresServer.cleanUpAtExit() }
        return Mutex([:])
    }()

    /// At exit: the servers still alive (the shared one, any other never released) are
    /// stopped by pid and their directories removed.
    private static func cleanUpAtExit() {
        let servers = registry.withLock { servers in
            defer { servers.removeAll() }
            return servers
        }
        for (directory, pid) in servers {
            if pid > 0 { terminate(pid) }
            try? FileManager.default.removeItem(atPath: directory)
        }
    }

    private static let swept = Mutex(false)

    /// Runs ``sweepAbandonedDirectories()`` once per process.
    private static func sweepOnce() {
        let first = swept.withLock { swept in
            defer { swept = true }
            return !swept
        }
        if first { sweepAbandonedDirectories() }
        registry.withLock { _ in }  // its initialization installs the exit hook
    }

    /// Removes the servers' directories left by test processes that were killed: each live
    /// server holds a lock (`flock`) on its directory, so one nobody holds, a minute old or
    /// more, was abandoned. Its postmaster, when it still runs (checked by the pid in
    /// `postmaster.pid` and the data directory on its command line), is shut down first.
    public static func sweepAbandonedDirectories() {
        let entries = (try? FileManager.default.contentsOfDirectory(atPath: "/tmp")) ?? []
        for entry in entries where entry.hasPrefix("skpg-") {
            let directory = "/tmp/" + entry
            var information = stat()
            guard lstat(directory, &information) == 0, information.st_mode & S_IFMT == S_IFDIR,
                time(nil) - information.st_mtim.tv_sec > 60
            else { continue }
            let descriptor = open(directory, O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW)
            guard descriptor >= 0 else { continue }
            defer { close(descriptor) }
            guard flock(descriptor, LOCK_EX | LOCK_NB) == 0 else { continue }  // its server lives
            let data = directory + "/data"
            if let pidFile = try? String(contentsOfFile: data + "/postmaster.pid", encoding: .utf8),
                let line = pidFile.split(separator: "\n").first, let pid = pid_t(line),
                let commandLine = try? Data(contentsOf: URL(fileURLWithPath: "/proc/\(pid)/cmdline")),
                commandLine.split(separator: 0).map({ String(decoding: $0, as: UTF8.self) }).contains(data)
            {
                Glibc.kill(pid, SIGQUIT)
                let deadline = ContinuousClock.now + .seconds(10)
                while ContinuousClock.now < deadline, isAlive(pid) { usleep(10_000) }
                if isAlive(pid) { Glibc.kill(pid, SIGKILL) }
            }
            try? FileManager.default.removeItem(atPath: directory)
        }
    }
}

/// What starts a ``PostgresServer``'s cluster: `initdb`, and the postmaster.
private struct Cluster: Sendable {
    let directory: String
    let binDirectory: String
    /// setpriv, when the server runs as nobody (the tests run as root).
    let setprivPath: String?
    let password: String?
    let settings: [String: String]
    let startTimeout: Duration
    let host = "127.0.0.1"
    let superuser = "postgres"
    var socketDirectory: String { directory }
    var dataDirectory: String { directory + "/data" }
    var logFile: String { directory + "/postgres.log" }

    /// Runs `initdb` into ``dataDirectory``.
    func initialize() throws {
        var arguments = [
            binDirectory + "/initdb", "-D", dataDirectory, "--auth=trust", "--username=\(superuser)",
            "--encoding=UTF8", "--locale=C", "--no-sync", "--no-instructions",
        ]
        let passwordFile = directory + "/pwfile"
        if let password {
            guard
                FileManager.default.createFile(
                    atPath: passwordFile, contents: Data((password + "\n").utf8), attributes: [.posixPermissions: 0o600]
                )
            else { throw PostgresServerError.failed("cannot write \(passwordFile)") }
            if setprivPath != nil { chown(passwordFile, PostgresServer.unprivilegedID, PostgresServer.unprivilegedID) }
            arguments += ["--auth-host=scram-sha-256", "--auth-local=trust", "--pwfile=\(passwordFile)"]
        }
        defer { if password != nil { unlink(passwordFile) } }
        let result = try PostgresServer.run(
            asServerUser(arguments), environment: PostgresServer.environment, directory: directory,
            outputDirectory: directory,
            timeout: .seconds(120))
        try? Data((result.output + result.error).utf8).write(to: URL(fileURLWithPath: logFile))
        guard result.status == 0 else {
            throw PostgresServerError.commandFailed(
                command: "initdb", status: PostgresServer.describe(result.status), output: result.output + result.error)
        }
    }

    /// Copies the cluster served on `port` through the Unix socket in `socketDirectory` into
    /// ``dataDirectory`` as its streaming standby: `pg_basebackup -R` (`standby.signal`, and
    /// `primary_conninfo` naming that socket and port), with the log it needs streamed along
    /// (`-X stream`), after a fast checkpoint.
    func baseBackup(socketDirectory source: String, port: Int, timeout: Duration) throws {
        let program = binDirectory + "/pg_basebackup"
        guard FileManager.default.isExecutableFile(atPath: program) else {
            throw PostgresServerError.notInstalled("\(program) is missing (Debian package postgresql-client)")
        }
        let arguments = [
            program, "-D", dataDirectory, "-h", source, "-p", String(port), "-U", superuser, "-w", "-R", "-X", "stream",
            "-c", "fast", "--no-sync",
        ]
        let result = try PostgresServer.run(
            asServerUser(arguments), environment: PostgresServer.environment, directory: directory,
            outputDirectory: directory,
            timeout: timeout)
        try? Data((result.output + result.error).utf8).write(to: URL(fileURLWithPath: logFile))
        guard result.status == 0 else {
            throw PostgresServerError.commandFailed(
                command: "pg_basebackup", status: PostgresServer.describe(result.status),
                output: result.output + result.error)
        }
    }

    /// `arguments` prefixed with setpriv's when the server must run as nobody.
    func asServerUser(_ arguments: [String]) -> [String] {
        guard let setprivPath else { return arguments }
        let id = String(PostgresServer.unprivilegedID)
        return [setprivPath, "--reuid=\(id)", "--regid=\(id)", "--clear-groups", "--"] + arguments
    }

    /// Starts the postmaster on `port` and returns its pid once it accepts connections.
    func launch(port: Int) throws -> pid_t {
        let log = open(logFile, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0o644)
        guard log >= 0 else { throw PostgresServerError.failed("cannot open \(logFile)") }
        defer { close(log) }
        let logStart = lseek(log, 0, SEEK_END)
        let null = open("/dev/null", O_RDONLY | O_CLOEXEC)
        defer { close(null) }
        var arguments = [
            binDirectory + "/postgres", "-D", dataDirectory, "-k", socketDirectory, "-p", String(port), "-h", host,
        ]
        for (name, value) in settings.sorted(by: { $0.key < $1.key }) { arguments += ["-c", "\(name)=\(value)"] }
        let pid = try PostgresServer.spawn(
            asServerUser(arguments), environment: PostgresServer.environment, directory: directory,
            stdin: null, stdout: log, stderr: log)
        // Ready when postmaster.pid names this process and says "ready", as `pg_ctl -w` waits.
        let deadline = ContinuousClock.now + startTimeout
        while true {
            if let status = PostgresServer.reapIfExited(pid) {
                let tail = PostgresServer.logTail(logFile, from: logStart)
                if tail.contains("Address already in use") { throw PostgresServerError.addressInUse }
                throw PostgresServerError.startFailed(status: PostgresServer.describe(status), log: tail)
            }
            if let lines = try? String(contentsOfFile: dataDirectory + "/postmaster.pid", encoding: .utf8)
                .split(separator: "\n", omittingEmptySubsequences: false),
                lines.count >= 8, lines[0] == String(pid), lines[7].trimmingCharacters(in: .whitespaces) == "ready"
            {
                return pid
            }
            if ContinuousClock.now >= deadline {
                PostgresServer.killTree(pid)
                throw PostgresServerError.timedOut(
                    "the server did not accept connections within \(startTimeout):\n"
                        + PostgresServer.logTail(logFile, from: logStart))
            }
            usleep(10_000)
        }
    }
}

/// Why a ``PostgresServer`` could not be made, started, stopped or queried.
public enum PostgresServerError: Error, CustomStringConvertible {
    /// A program the server needs is missing; the message names the package to install.
    case notInstalled(String)
    /// A command (`initdb`, `psql`) failed: how it ended, and what it wrote.
    case commandFailed(command: String, status: String, output: String)
    /// The postmaster ended while starting: how, and the end of its log.
    case startFailed(status: String, log: String)
    /// Something did not happen in time.
    case timedOut(String)
    /// Any other failure (a file that could not be made, for instance).
    case failed(String)
    /// The port was taken between its probe and the server's bind (retried with another port).
    case addressInUse

    public var description: String {
        switch self {
        case .notInstalled(let message): message
        case .commandFailed(let command, let status, let output): "\(command) failed (\(status)):\n\(output)"
        case .startFailed(let status, let log): "postgres failed to start (\(status)):\n\(log)"
        case .timedOut(let message): message
        case .failed(let message): message
        case .addressInUse: "the port was taken by another process"
        }
    }
}

/// Runs `work` on a thread of its own and returns its result: blocking work (a child process
/// waited for) that must not hold one of Swift's cooperative threads.
public func offThePool<T: Sendable>(_ work: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
        Thread.detachNewThread { continuation.resume(with: Result { try work() }) }
    }
}
