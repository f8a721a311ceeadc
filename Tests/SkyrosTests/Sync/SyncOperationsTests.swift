import Foundation
import GRDB
import Skyros
import SkyrosDaemon
import SkyrosShared
import SkyrosSync
import SkyrosTestSupport
import Testing
import TodoModel

#if canImport(Glibc)
    import Glibc
#endif

/// Sync under an operator's hands (issue 57): a daemon restarted with nobody talking to it,
/// sync switched off and on, a store written by `skyros import --store`. Each loses nothing.
@Suite("Sync under operations", .serialized, .timeLimit(.minutes(3)))
struct SyncOperationsTests {
    let sync = SyncTests()

    /// The handles of the users in a store file, read directly (nobody talks to its daemon).
    static func handlesInStoreFile(_ container: URL) throws -> [String] {
        var options = GRDB.Configuration()
        options.readonly = true
        let queue = try DatabaseQueue(
            path: container.appendingPathComponent("store.sqlite").path, configuration: options)
        defer { try? queue.close() }
        return try queue.read { db in try String.fetchAll(db, sql: #"SELECT handle FROM "User" ORDER BY handle"#) }
    }

    /// The handles of the users on the server, comma-separated in order.
    static func handlesOnServer(_ server: SyncTests.Server) throws -> String {
        try server.psql(#"SELECT coalesce(string_agg(handle, ',' ORDER BY handle), '') FROM g_sync."User""#)
    }

    @Test(
        "sync starts with the daemon: a restarted skyrosd that no app or tool talks to uploads its queue and applies the server's changes"
    )
    func syncStartsWithTheDaemon() async throws {
        let postgres = try await PostgresServer.started()
        let server = try SyncTests.Server(postgres)
        let process = DaemonProcessTests()
        let groups = process.groupsDirectory()
        defer { try? FileManager.default.removeItem(atPath: groups) }
        var daemon: ChildProcess? = try sync.startDaemon(groups, server)
        defer {
            if let daemon {
                kill(daemon.pid, SIGKILL)
                _ = daemon.wait()
            }
        }
        let container = URL(fileURLWithPath: groups).appendingPathComponent("g")
        do {
            let app = try Skyros(sharedStack: testSchema, container: container, timeout: 10, savesOnStop: false)
            try await sync.insert("first", into: app)
            #expect(await sync.eventually { try Self.handlesOnServer(server) == "first" })
            // Saved while the server is down: queued.
            try postgres.stop(mode: .fast)
            try await sync.insert("queued", into: app)
        }
        let stopping = try #require(daemon)
        kill(stopping.pid, SIGTERM)
        #expect(await stopping.wait() == .exited(0), "\(stopping.readAll())")
        daemon = nil
        try postgres.start()
        try server.psql(#"INSERT INTO g_sync."User" (handle) VALUES ('from-psql')"#)

        // Started again; nothing connects to it, not even `skyros status`.
        daemon = try sync.startDaemon(groups, server)
        #expect(await sync.eventually { try Self.handlesOnServer(server) == "first,from-psql,queued" })
        #expect(
            await sync.eventually { try Self.handlesInStoreFile(container) == ["first", "from-psql", "queued"] },
            "\((try? Self.handlesInStoreFile(container)) ?? [])")
        #expect(try server.psql("SELECT count(*) FROM g_sync._skyros_uploads") == "2", "each save uploaded once")
    }

    @Test(
        "sync off and on: saves made while the daemon of a synced store runs without sync are uploaded once sync is on again"
    )
    func syncOffAndOn() async throws {
        let server = try SyncTests.Server()
        let directory = "/tmp/sko-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let other = try RunningDaemon(sync: server.configuration)
        let b = try Skyros(sharedStack: testSchema, container: other.container.url)
        let first = try RunningDaemon(directory: directory, sync: server.configuration)
        var a: Skyros? = try Skyros(sharedStack: testSchema, container: first.container.url)
        try await sync.insert("synced", into: a!)
        #expect(await sync.eventually { try await sync.handles(b) == ["synced"] })
        a = nil
        first.shutDown()

        // Without sync: the saves are queued all the same.
        let log = Locked<[String]>([])
        let off = try RunningDaemon(directory: directory, log: { line in log.withValue { $0.append(line) } })
        var offApp: Skyros? = try Skyros(sharedStack: testSchema, container: off.container.url)
        for index in 0..<5 { try await sync.insert("off\(index)", into: offApp!) }
        #expect(
            log.withValue { $0 }.contains { $0.contains("sync is off; the store has synced") },
            "\(log.withValue { $0 })")
        offApp = nil
        off.shutDown()

        // On again: uploaded once each, seen by the other machine.
        let again = try RunningDaemon(directory: directory, sync: server.configuration)
        defer { withExtendedLifetime([first, off, again]) {} }  // a released one removes the directory
        let all = ["off0", "off1", "off2", "off3", "off4", "synced"]
        #expect(await sync.eventually { try await sync.handles(b) == all })
        #expect(try Self.handlesOnServer(server) == all.joined(separator: ","))
        #expect(try server.psql("SELECT count(*) FROM g_sync._skyros_uploads") == "6")
        let onA = try Skyros(sharedStack: testSchema, container: again.container.url)
        #expect(try await sync.handles(onA) == all)
    }

    @Test("skyros import --store on a synced store queues what it writes: uploaded when the daemon syncs again")
    func importIntoSyncedStore() async throws {
        let server = try SyncTests.Server()
        let directory = "/tmp/ski-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let machine = try RunningDaemon(directory: directory, sync: server.configuration)
        var app: Skyros? = try Skyros(sharedStack: testSchema, container: machine.container.url)
        try await sync.insert("before", into: app!)
        #expect(await sync.eventually { try Self.handlesOnServer(server) == "before" })
        app = nil
        machine.shutDown()

        let id = UUID()
        let file = directory + "/import.jsonl"
        try
            #"{"entity": "User", "id": "\#(id.uuidString)", "values": {"handle": "imported", "firstname": "I", "lastname": "M", "age": 3}}"#
            .write(toFile: file, atomically: true, encoding: .utf8)
        let run = try OperatingToolTests.run(["import", file, "--store", machine.container.store.path])
        #expect(run.status == 0, "\(run.stderr)")

        let again = try RunningDaemon(directory: directory, sync: server.configuration)
        defer { withExtendedLifetime([machine, again]) {} }
        #expect(await sync.eventually { try Self.handlesOnServer(server) == "before,imported" })
        #expect(
            try server.psql(#"SELECT "_id"::text || ':' || age FROM g_sync."User" WHERE handle = 'imported'"#)
                == "\(id.uuidString.lowercased()):3")
    }

    @Test(
        "credentials that recover: a corrected password file is used at the next retry, without a restart; sync errors are logged at error level"
    )
    func correctedPasswordFile() async throws {
        let postgres = try await PostgresServer.started(password: "superuser secret")
        let roles = try SyncRoles(postgres)
        try await roles.setUp(schema: "g_pw", models: testSchema)
        try roles.createDaemonRole("skyros_pw", password: "right")
        try roles.grant("skyros_pw", schema: "g_pw", models: testSchema)
        let directory = "/tmp/skp-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let file = directory + "/password"
        try "wrong\n".write(toFile: file, atomically: true, encoding: .utf8)
        var configuration = roles.configuration(role: "skyros_pw", password: nil, schema: "g_pw")
        try configuration.readPassword(from: file, relativeTo: nil, setting: "--sync-password-file", checkMode: false)
        #expect(configuration.password == "wrong" && configuration.passwordFilePath == file)

        let log = Locked<[String]>([])
        let machine = try RunningDaemon(sync: configuration, log: { line in log.withValue { $0.append(line) } })
        let app = try Skyros(sharedStack: testSchema, container: machine.container.url)
        try await sync.insert("waiting", into: app)
        let failing = await sync.reaches("error", machine) { $0.contains("password") || $0.contains("28P01") }
        #expect(failing.ok, "\(failing)")
        let errorLine = log.withValue { $0 }.first { $0.hasPrefix("sync: error") }
        #expect(errorLine.map { DaemonLogLevel.of($0) } == .error, "\(log.withValue { $0 })")

        // The operator corrects the file; nothing is restarted.
        try "right\n".write(toFile: file, atomically: true, encoding: .utf8)
        let online = await sync.reaches("online", machine, seconds: 30)
        #expect(online.ok, "\(online)")
        #expect(
            await sync.eventually { try roles.psql(#"SELECT string_agg(handle, ',') FROM g_pw."User""#) == "waiting" })
    }

    @Test("the daemon's log levels: sync errors at error, offline and refusals at warning, the rest at info")
    func logLevels() {
        #expect(DaemonLogLevel.of("sync: error: password authentication failed for user \"x\"") == .error)
        #expect(DaemonLogLevel.of("sync: cannot start: the store cannot be read") == .error)
        #expect(DaemonLogLevel.of("sync: offline: connection refused; saves go on locally and are queued") == .warning)
        #expect(DaemonLogLevel.of("sync: change set 4 was refused by the server: duplicate key") == .warning)
        #expect(DaemonLogLevel.of("sync: online with postgresql://u@h:5432/d (schema s)") == .info)
        #expect(DaemonLogLevel.of("created the store for schema abc") == .info)
    }

    @Test(
        "one group, one server schema: a second group whose id maps to the same schema is refused with a clear error and gets none of the first group's rows"
    )
    func oneGroupOneSchema() async throws {
        let server = try SyncTests.Server()
        var first = server.configuration
        first.group = "com-example-todo"
        var second = server.configuration
        second.group = "com.example.todo"
        #expect(
            SyncConfiguration.schemaName(forGroup: first.group!)
                == SyncConfiguration.schemaName(forGroup: second.group!))
        let machineA = try RunningDaemon(sync: first)
        let a = try Skyros(sharedStack: testSchema, container: machineA.container.url)
        for index in 0..<3 { try await sync.insert("a\(index)", into: a) }
        #expect(await sync.eventually { try Self.handlesOnServer(server) == "a0,a1,a2" })
        #expect(try server.psql("SELECT value FROM g_sync._skyros_meta WHERE key = 'group'") == "com-example-todo")

        let machineB = try RunningDaemon(sync: second)
        let b = try Skyros(sharedStack: testSchema, container: machineB.container.url)
        try await sync.insert("b0", into: b)
        let refused = await sync.reaches("error", machineB) { $0.contains("holds the group com-example-todo") }
        #expect(refused.ok, "\(refused)")
        #expect(refused.message.contains("--sync-schema"), "\(refused.message)")
        // Nothing crossed either way.
        try await sync.insert("a3", into: a)
        #expect(await sync.eventually { try Self.handlesOnServer(server) == "a0,a1,a2,a3" })
        #expect(try await sync.handles(b) == ["b0"])
        #expect(try sync.syncStatus(machineB)["uploadQueue"] as? Int == 1, "B's save stays queued")
    }

    /// A restore test's scene: the server, machine B with an app, and the directory of machine
    /// A with its backup's beside it (`removeDirectories()` at the end).
    struct RestoreScene {
        let server: SyncTests.Server
        let directory: String
        let backup: URL
        let other: RunningDaemon
        let b: Skyros

        init(_ prefix: String) throws {
            server = try SyncTests.Server()
            directory = "/tmp/\(prefix)-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            backup = URL(fileURLWithPath: directory + "-backup")
            other = try RunningDaemon(sync: server.configuration)
            b = try Skyros(sharedStack: testSchema, container: other.container.url)
        }

        func removeDirectories() {
            try? FileManager.default.removeItem(atPath: directory)
            try? FileManager.default.removeItem(at: backup)
        }
    }

    /// Copies the store files (`store.sqlite` and its WAL, if any) of container `from` to `to`,
    /// replacing what `to` has: a backup restored, or a store copied to another machine.
    static func copyStore(from: URL, to: URL) throws {
        let files = FileManager.default
        try files.createDirectory(at: to, withIntermediateDirectories: true)
        for suffix in ["", "-wal", "-shm"] {
            let target = to.appendingPathComponent("store.sqlite" + suffix)
            try? files.removeItem(at: target)
            let source = from.appendingPathComponent("store.sqlite" + suffix)
            if files.fileExists(atPath: source.path) { try files.copyItem(at: source, to: target) }
        }
    }

    @Test(
        "a store restored from an older backup is detected: it goes on under a new machine id, its next saves reach the other machine, and the saves made after the backup come back"
    )
    func restoredFromOlderBackup() async throws {
        let scene = try RestoreScene("skb")
        defer { scene.removeDirectories() }
        let (server, directory, backup, b) = (scene.server, scene.directory, scene.backup, scene.b)
        let first = try RunningDaemon(directory: directory, sync: server.configuration)
        var a: Skyros? = try Skyros(sharedStack: testSchema, container: first.container.url)
        for index in 0..<2 { try await sync.insert("early\(index)", into: a!) }
        #expect(await sync.eventually { try await sync.handles(b) == ["early0", "early1"] })
        a = nil
        first.shutDown()
        try Self.copyStore(from: first.container.url, to: backup)  // the backup

        let second = try RunningDaemon(directory: directory, sync: server.configuration)
        a = try Skyros(sharedStack: testSchema, container: second.container.url)
        for index in 0..<3 { try await sync.insert("later\(index)", into: a!) }
        #expect(await sync.eventually { try await sync.handles(b).count == 5 })
        a = nil
        second.shutDown()

        // Restored: the store forgets the three later saves, which the server has.
        try Self.copyStore(from: backup, to: second.container.url)
        let log = Locked<[String]>([])
        let restored = try RunningDaemon(
            directory: directory, sync: server.configuration, log: { line in log.withValue { $0.append(line) } })
        defer { withExtendedLifetime([first, second, restored]) {} }  // a released one removes the directory
        let again = try Skyros(sharedStack: testSchema, container: restored.container.url)
        // Before it saves anything under its new id, it applies checkpoints: the later saves
        // come back, and so does a row written on the server.
        try server.psql(#"INSERT INTO g_sync."User" (handle) VALUES ('from-psql')"#)
        let back = ["early0", "early1", "from-psql", "later0", "later1", "later2"]
        let cameBack = await sync.eventually { try await sync.handles(again) == back }
        let seen = (try? await sync.handles(again)) ?? []
        #expect(cameBack, "\(seen)")
        for index in 0..<5 { try await sync.insert("after\(index)", into: again) }
        let all = [
            "after0", "after1", "after2", "after3", "after4", "early0", "early1", "from-psql", "later0", "later1",
            "later2",
        ]
        let reachedB = await sync.eventually { try await sync.handles(b) == all }
        let onB = (try? await sync.handles(b)) ?? []
        #expect(reachedB, "\(onB)")
        #expect(await sync.eventually { try await sync.handles(again) == all })
        #expect(
            log.withValue { $0 }.contains { $0.contains("is not the one the server knows as machine") },
            "\(log.withValue { $0 })")
        // Each save uploaded once: 2 + 3 under the old id, 5 under the new one.
        #expect(try server.psql("SELECT count(*) FROM g_sync._skyros_uploads") == "10")
        #expect(try server.psql("SELECT count(DISTINCT machine) FROM g_sync._skyros_uploads") == "2")
    }

    @Test(
        "a save made offline after a restore that repeats what the original saved under its queue number is uploaded, not taken for the original's and dropped"
    )
    func restoredStoreRepeatsASave() async throws {
        let scene = try RestoreScene("skr")
        defer { scene.removeDirectories() }
        let (server, directory, backup, b) = (scene.server, scene.directory, scene.backup, scene.b)
        func firstname(_ stack: Skyros) async throws -> String {
            try await stack.read { context in try User.all(in: context).first?.firstname ?? "?" }
        }
        func setFirstname(_ name: String, on stack: Skyros) async throws {
            try await stack.write { context in try User.all(in: context).first?.firstname = name }
        }
        let first = try RunningDaemon(directory: directory, sync: server.configuration)
        var a: Skyros? = try Skyros(sharedStack: testSchema, container: first.container.url)
        try await sync.insert("ann", into: a!)  // change set 1
        #expect(await sync.eventually { try await sync.handles(b) == ["ann"] })
        a = nil
        first.shutDown()
        try Self.copyStore(from: first.container.url, to: backup)

        let second = try RunningDaemon(directory: directory, sync: server.configuration)
        a = try Skyros(sharedStack: testSchema, container: second.container.url)
        try await setFirstname("checked", on: a!)  // change set 2
        #expect(await sync.eventually { try await firstname(b) == "checked" })
        a = nil
        second.shutDown()
        try server.psql(#"UPDATE g_sync."User" SET firstname = 'unchecked'"#)

        // Restored, and offline: the same save again is its change set 2, the same content.
        try Self.copyStore(from: backup, to: second.container.url)
        var unreachable = server.configuration
        unreachable.servers[0].port = 1
        let offline = try RunningDaemon(directory: directory, sync: unreachable)
        a = try Skyros(sharedStack: testSchema, container: offline.container.url)
        try await setFirstname("checked", on: a!)
        a = nil
        offline.shutDown()

        let restored = try RunningDaemon(directory: directory, sync: server.configuration)
        defer { withExtendedLifetime([first, second, offline, restored]) {} }  // a released one removes the directory
        let again = try Skyros(sharedStack: testSchema, container: restored.container.url)
        let uploaded = await sync.eventually {
            try server.psql(#"SELECT firstname FROM g_sync."User""#) == "checked"
        }
        #expect(uploaded, "the server has \((try? server.psql(#"SELECT firstname FROM g_sync."User""#)) ?? "?")")
        #expect(await sync.eventually { try await firstname(b) == "checked" })
        #expect(await sync.eventually { try await firstname(again) == "checked" })
    }

    @Test(
        "a restored store drops what its backup held and the server never kept: an insert whose delete went up in the same batch is gone after the restore (fault campaign, seed 2)"
    )
    func restoredStoreHoldsWhatTheServerNeverKept() async throws {
        let scene = try RestoreScene("skg")
        defer { scene.removeDirectories() }
        let (server, directory, backup, b) = (scene.server, scene.directory, scene.backup, scene.b)
        try await sync.insert("real", into: b)
        var unreachable = server.configuration
        unreachable.servers[0].port = 1
        // Synced once (the store has a machine id and a checkpoint), then offline: the insert
        // is queued (change set 1), and the backup is taken.
        let first = try RunningDaemon(directory: directory, sync: server.configuration)
        var a: Skyros? = try Skyros(sharedStack: testSchema, container: first.container.url)
        #expect(await sync.eventually { try await sync.handles(a!) == ["real"] })
        a = nil
        first.shutDown()
        let offline = try RunningDaemon(directory: directory, sync: unreachable)
        a = try Skyros(sharedStack: testSchema, container: offline.container.url)
        try await sync.insert("ghost", into: a!)
        a = nil
        offline.shutDown()
        try Self.copyStore(from: offline.container.url, to: backup)
        // Still offline, the insert is deleted (change set 2); online, both go up in one batch:
        // the server never has the object, and never logs it.
        let second = try RunningDaemon(directory: directory, sync: unreachable)
        a = try Skyros(sharedStack: testSchema, container: second.container.url)
        try await a!.write { context in
            for user in try User.all(in: context) where user.handle == "ghost" { user.delete(in: context) }
        }
        a = nil
        second.shutDown()
        let third = try RunningDaemon(directory: directory, sync: server.configuration)
        #expect(await sync.eventually { try server.psql("SELECT count(*) FROM g_sync._skyros_uploads") == "3" })
        #expect(try server.psql(#"SELECT count(*) FROM g_sync."User" WHERE handle = 'ghost'"#) == "0")
        third.shutDown()

        // Restored: the store holds the ghost again; the server has change set 1 (dropped from
        // the queue as the server's) and nothing of the ghost.
        try Self.copyStore(from: backup, to: third.container.url)
        let restored = try RunningDaemon(directory: directory, sync: server.configuration)
        defer { withExtendedLifetime([first, offline, second, third, restored]) {} }  // a released one removes the directory
        let again = try Skyros(sharedStack: testSchema, container: restored.container.url)
        try await sync.insert("after", into: again)
        let converged = await sync.eventually { try await sync.handles(again) == ["after", "real"] }
        let seen = (try? await sync.handles(again)) ?? []
        #expect(converged, "the restored machine has \(seen)")
        #expect(await sync.eventually { try await sync.handles(b) == ["after", "real"] })
        #expect(try Self.handlesInStoreFile(restored.container.url) == ["after", "real"])
    }

    @Test(
        "a save queued before a migration that renamed its property is uploaded with its value under the new name"
    )
    func saveQueuedBeforeARename() async throws {
        let server = try SyncTests.Server()
        let directory = "/tmp/skn-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var unreachable = server.configuration
        unreachable.servers[0].port = 1
        // Offline, version 1 saves a title (queued under `title`); version 2 (`title` renamed
        // `name`) migrates the store with that change set still queued.
        let offline = try RunningDaemon(directory: directory, sync: unreachable)
        var v1: Skyros? = try Skyros(sharedStack: MixedVersionModels.v1, container: offline.container.url)
        try await v1!.write { context in TaskV1.create(in: context).title = "queued before" }
        v1 = nil
        let v2 = try Skyros(sharedStack: MixedVersionModels.v2, container: offline.container.url)
        #expect(try await v2.read { context in try TaskV2.all(in: context).map(\.name) } == ["queued before"])
        offline.shutDown()
        // Online: the value reaches the server under the new name.
        let online = try RunningDaemon(directory: directory, sync: server.configuration)
        defer { withExtendedLifetime([offline, online]) {} }  // a released one removes the directory
        let uploaded = await sync.eventually {
            try server.psql(#"SELECT count(*) FROM g_sync._skyros_uploads"#) == "1"
        }
        #expect(uploaded)
        #expect(try server.psql(#"SELECT name FROM g_sync."Task""#) == "queued before")
    }

    @Test(
        "a change set the server committed while the machine never heard of it (a lost reply, a daemon stopped in between) leaves the machine's queue once it connects again (fault campaign: 177 change sets queued for good)"
    )
    func committedWithoutTheMachineHearingLeavesTheQueue() async throws {
        let server = try SyncTests.Server()
        let directory = "/tmp/skq-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let store = URL(fileURLWithPath: directory + "/g/store.sqlite").path
        func read<T>(_ body: (Database) throws -> T) throws -> T {
            var options = GRDB.Configuration()
            options.readonly = true
            let queue = try DatabaseQueue(path: store, configuration: options)
            defer { try? queue.close() }
            return try queue.read(body)
        }
        func queued() throws -> Int {
            try read { db in try Int.fetchOne(db, sql: "SELECT count(*) FROM skyros_sync_queue") ?? -1 }
        }
        let online = try RunningDaemon(directory: directory, sync: server.configuration)
        var app: Skyros? = try Skyros(sharedStack: testSchema, container: online.container.url)
        try await sync.insert("first", into: app!)
        #expect(await sync.eventually { try server.psql("SELECT count(*) FROM g_sync._skyros_uploads") == "1" })
        #expect(await sync.eventually { try queued() == 0 })
        app = nil
        online.shutDown()
        // Offline, change set 2 is queued; the server then takes it as an upload would whose
        // reply never came back: its record (with its digest) and its row.
        var unreachable = server.configuration
        unreachable.servers[0].port = 1
        let offline = try RunningDaemon(directory: directory, sync: unreachable)
        app = try Skyros(sharedStack: testSchema, container: offline.container.url)
        try await sync.insert("second", into: app!)
        app = nil
        offline.shutDown()
        let (machine, data) = try read { db in
            (
                try String.fetchOne(db, sql: "SELECT value FROM skyros_metadata WHERE key = 'syncMachine'") ?? "",
                try Data.fetchOne(db, sql: "SELECT changes FROM skyros_sync_queue WHERE number = 2") ?? Data()
            )
        }
        let changes = try QueuedChangeSet.decode(data)
        let id = try #require(changes.inserted.first?.id)
        try server.psql(
            """
            INSERT INTO g_sync._skyros_uploads (machine, number, digest) VALUES ('\(machine.lowercased())', 2, \(changes.digest));
            INSERT INTO g_sync."User" ("_id", handle) VALUES ('\(id.uuidString.lowercased())', 'second')
            """)
        #expect(try queued() == 1)

        let again = try RunningDaemon(directory: directory, sync: server.configuration)
        defer { withExtendedLifetime([online, offline, again]) {} }  // a released one removes the directory
        let drained = await sync.eventually { try queued() == 0 }
        #expect(drained, "\((try? queued()) ?? -1) change sets still queued")
        #expect(try server.psql("SELECT count(*) FROM g_sync._skyros_uploads") == "2")
        #expect(try Self.handlesOnServer(server) == "first,second")
    }

    @Test(
        "a store copied to another machine is detected: both go on, one under a new machine id, and every save of both reaches everyone once"
    )
    func copiedToAnotherMachine() async throws {
        let server = try SyncTests.Server()
        let directory = "/tmp/skc-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let copyDirectory = directory + "-copy"
        defer {
            try? FileManager.default.removeItem(atPath: directory)
            try? FileManager.default.removeItem(atPath: copyDirectory)
        }
        let other = try RunningDaemon(sync: server.configuration)
        let b = try Skyros(sharedStack: testSchema, container: other.container.url)
        let first = try RunningDaemon(directory: directory, sync: server.configuration)
        var a: Skyros? = try Skyros(sharedStack: testSchema, container: first.container.url)
        try await sync.insert("original", into: a!)
        #expect(await sync.eventually { try await sync.handles(b) == ["original"] })
        a = nil
        first.shutDown()
        try Self.copyStore(
            from: first.container.url, to: URL(fileURLWithPath: copyDirectory).appendingPathComponent("g"))

        // Both run, each saving while the other does.
        let machineA = try RunningDaemon(directory: directory, sync: server.configuration)
        let machineC = try RunningDaemon(directory: copyDirectory, sync: server.configuration)
        defer { withExtendedLifetime([first, machineA, machineC]) {} }
        let onA = try Skyros(sharedStack: testSchema, container: machineA.container.url)
        let onC = try Skyros(sharedStack: testSchema, container: machineC.container.url)
        for index in 0..<5 {
            try await sync.insert("a\(index)", into: onA)
            try await sync.insert("c\(index)", into: onC)
        }
        let all = ["a0", "a1", "a2", "a3", "a4", "c0", "c1", "c2", "c3", "c4", "original"]
        for (name, stack) in [("B", b), ("A", onA), ("C", onC)] {
            let reached = await sync.eventually { try await sync.handles(stack) == all }
            let handles = (try? await sync.handles(stack)) ?? []
            #expect(reached, "\(name): \(handles)")
        }
        #expect(try Self.handlesOnServer(server) == all.joined(separator: ","))
        #expect(try server.psql("SELECT count(*) FROM g_sync._skyros_uploads WHERE rejected IS NULL") == "11")
        // The original id, and the new one the second of A and C to sync took.
        #expect(try server.psql("SELECT count(DISTINCT machine) FROM g_sync._skyros_uploads") == "2")
    }

    @Test(
        "a rolling upgrade with a rename (examples/Todo v1 → v2, title renamed text): saves on both machines before, during and after it, every value everywhere"
    )
    func rollingUpgradeWithRename() async throws {
        let server = try SyncTests.Server()
        let machineA = try RunningDaemon(sync: server.configuration)
        let machineB = try RunningDaemon(sync: server.configuration)
        let titles = { (stack: Skyros) in
            try await stack.read { context in try TodoItem.all(in: context).map(\.title).sorted() }
        }
        let texts = { (stack: Skyros) in
            try await stack.read { context in try TodoItemV2.all(in: context).map(\.text).sorted() }
        }
        func add(_ title: String, _ stack: Skyros) async throws {
            try await stack.write { context in TodoItem.create(in: context).title = title }
        }
        func addV2(_ text: String, _ stack: Skyros) async throws {
            try await stack.write { context in TodoItemV2.create(in: context).text = text }
        }
        let a1 = try Skyros(sharedStack: todoSchema, container: machineA.container.url)
        let b1 = try Skyros(sharedStack: todoSchema, container: machineB.container.url)
        try await add("a-before", a1)
        try await add("b-before", b1)
        let before = ["a-before", "b-before"]
        #expect(
            await sync.eventually {
                let a = try await titles(a1)
                let b = try await titles(b1)
                return a == before && b == before
            })

        // A upgrades (its store and the server migrate); B stays on version 1 and both write.
        let a2 = try Skyros(sharedStack: todoSchemaV2, container: machineA.container.url)
        #expect(await sync.eventually { try await texts(a2) == before })
        try await addV2("a-during", a2)
        try await add("b-during", b1)
        try await b1.write { context in
            try #require(try TodoItem.all(in: context).first { $0.title == "a-before" }).title =
                "a-before, edited on B (v1)"
        }
        try await a2.write { context in
            try #require(try TodoItemV2.all(in: context).first { $0.text == "b-before" }).text =
                "b-before, edited on A (v2)"
        }
        let during = ["a-before, edited on B (v1)", "a-during", "b-before, edited on A (v2)", "b-during"]
        let seenDuring = await sync.eventually {
            let a = try await texts(a2)
            let b = try await titles(b1)
            return a == during && b == during
        }
        let (onA, onB) = ((try? await texts(a2)) ?? [], (try? await titles(b1)) ?? [])
        #expect(seenDuring, "A (v2): \(onA); B (v1): \(onB)")
        #expect(await sync.eventually { try await titles(a1) == during }, "A's version-1 app too")

        // B upgrades; both write again.
        let b2 = try Skyros(sharedStack: todoSchemaV2, container: machineB.container.url)
        try await addV2("a-after", a2)
        try await addV2("b-after", b2)
        let after = (during + ["a-after", "b-after"]).sorted()
        let seenAfter = await sync.eventually {
            let a = try await texts(a2)
            let b = try await texts(b2)
            return a == after && b == after
        }
        let (lastA, lastB) = ((try? await texts(a2)) ?? [], (try? await texts(b2)) ?? [])
        #expect(seenAfter, "A: \(lastA); B: \(lastB)")
        // On the server both names hold every value (the old column is kept, mirrored).
        #expect(
            try server.psql(#"SELECT count(*) FROM g_sync."TodoItem" WHERE text IS DISTINCT FROM title"#) == "0")
        #expect(try server.psql(#"SELECT count(*) FROM g_sync."TodoItem""#) == "6")
    }

    @Test(
        "snapshots that finish: a new machine's snapshot completes while its app saves 10 times a second, and no server transaction stays open for its length"
    )
    func snapshotWhileSaving() async throws {
        let server = try SyncTests.Server()
        try await SyncSetup.run(server.configuration, schema: testSchema, log: { _ in })
        let rows = 20_000
        try server.psql(
            #"INSERT INTO g_sync."User" ("_id", handle, age) SELECT gen_random_uuid(), 'server' || n, 1 FROM generate_series(1, \#(rows)) AS n"#
        )
        var settings = SyncEngine.Settings()
        settings.snapshotPageSize = 200  // 100 pages: a snapshot long enough for many saves
        let machine = try RunningDaemon(sync: server.configuration, syncSettings: settings)
        let app = try Skyros(sharedStack: testSchema, container: machine.container.url)

        // The longest-running transaction on the server, sampled while the snapshot is read.
        let longest = Locked(0.0)
        let sampling = Task {
            while !Task.isCancelled {
                if let text = try? server.psql(
                    "SELECT coalesce(max(extract(epoch FROM clock_timestamp() - xact_start)), 0) FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() AND xact_start IS NOT NULL"
                ), let seconds = Double(text) {
                    longest.withValue { $0 = max($0, seconds) }
                }
                try? await Task.sleep(for: .milliseconds(100))
            }
        }
        // The app saves every 100 ms from the start, through the whole snapshot.
        var saved = 0
        let started = Date()
        var completedAfter: Double?
        while Date().timeIntervalSince(started) < 90 {
            try await sync.insert("local\(saved)", into: app)
            saved += 1
            // (`skyros status` is a process: asked every fifth save, so the saves keep their pace.)
            if completedAfter == nil, saved % 5 == 0,
                (try? sync.syncStatus(machine)["checkpoint"] as? Int ?? 0) ?? 0 > 0
            {
                completedAfter = Date().timeIntervalSince(started)
            }
            if let completedAfter, Date().timeIntervalSince(started) > completedAfter + 1 { break }
            try await Task.sleep(for: .milliseconds(100))
        }
        sampling.cancel()
        _ = await sampling.value
        #expect(completedAfter != nil, "no checkpoint applied in 90 s while the app saved \(saved) times")
        #expect(saved >= 10, "the app saved \(saved) times")
        // Everything: the server's rows and the app's saves, here and on the server.
        let total = rows + saved
        let counted = await sync.eventually(seconds: 30) {
            try await app.read { context in try User.count(in: context) } == total
        }
        let have = (try? await app.read { context in try User.count(in: context) }) ?? -1
        #expect(counted, "\(have) of \(total)")
        #expect(await sync.eventually { try server.psql(#"SELECT count(*) FROM g_sync."User""#) == "\(total)" })
        let held = longest.withValue { $0 }
        #expect(held < 3, "a server transaction stayed open \(held) s")
        print(
            "snapshot of \(rows) rows: first checkpoint after \(completedAfter ?? -1) s, \(saved) saves meanwhile, longest server transaction \(held) s"
        )
    }
}
