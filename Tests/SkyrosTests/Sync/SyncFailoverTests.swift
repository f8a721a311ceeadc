import Foundation
import Logging
import NIOPosix
import PostgresNIO
import Skyros
import SkyrosShared
import SkyrosSync
import SkyrosTestSupport
import Testing

#if canImport(Glibc)
    import Glibc
#endif

/// Failover (issue 35 item 4): a PostgreSQL primary with a synchronous streaming standby, two
/// machines given both in a multi-host sync URL; the primary is killed with uploads waiting
/// for their commit, the standby promoted, and the machines must find it, converge, and have
/// every change set on it exactly once.
@Suite("Sync failover", .serialized, .timeLimit(.minutes(2)))
struct SyncFailoverTests {
    /// The helpers of the sync tests: `eventually`, `syncStatus`, `handles`.
    let sync = SyncTests()

    /// Saves users `<prefix>0`, `<prefix>1`, … on `stack` until `stop` is set, about one every
    /// 10 ms (a pace, not a synchronization), counting the saves the daemon acknowledged. It
    /// saves on a thread of its own, with the synchronous API: Swift's cooperative threads (one
    /// per core) are shared with every test of the process, and tests that wait for their child
    /// processes hold them; a writer there saved 18 times in 30 s in CI (2026-11-29), where 20
    /// were needed before the failover.
    func writer(_ stack: Skyros, prefix: String, saved: Locked<Int>, stop: Locked<Bool>) -> Task<Void, any Error> {
        Task {
            try await withCheckedThrowingContinuation { (continuation: CheckedContinuation<Void, any Error>) in
                let thread = Thread {
                    do {
                        while !stop.value {
                            let handle = "\(prefix)\(saved.value)"
                            let durable = DispatchSemaphore(value: 0)
                            let failure = Locked<SkyrosError?>(nil)
                            stack.writeSync(
                                { context in User.create(in: context).handle = handle },
                                completion: { error in
                                    failure.withValue { $0 = error }
                                    durable.signal()
                                })
                            guard durable.wait(timeout: .now() + 30) == .success else {
                                throw SkyrosError(
                                    .daemonUnavailable, "the save of \(handle) was not durable within 30 s")
                            }
                            if let error = failure.value { throw error }
                            saved.withValue { $0 += 1 }
                            usleep(10_000)
                        }
                        continuation.resume()
                    } catch {
                        continuation.resume(throwing: error)
                    }
                }
                thread.name = "writer \(prefix)"
                thread.start()
            }
        }
    }

    /// The machine id a daemon's log names (`sync: machine <uuid> syncs with …`).
    func machineID(_ log: Locked<[String]>) -> String? {
        for line in log.value where line.hasPrefix("sync: machine ") {
            return line.dropFirst("sync: machine ".count).split(separator: " ").first.map(String.init)
        }
        return nil
    }

    @Test(
        "connect tries the servers in order: read-write and primary pass over a standby and a read-only server, any takes the first that answers; none qualifying names each and why"
    )
    func connectChoosesAServer() async throws {
        let primary = try await PostgresServer.started()
        let standby = try primary.makeStandby(synchronous: false)
        try primary.psql("CREATE DATABASE readonly; ALTER DATABASE readonly SET default_transaction_read_only = on")
        let closed = SyncConfiguration.Server(host: "127.0.0.1", port: 1)  // nothing listens on port 1
        let first = SyncConfiguration.Server(host: "127.0.0.1", port: primary.port)
        let second = SyncConfiguration.Server(host: "127.0.0.1", port: standby.port)
        var logger = Logger(label: "test")
        logger.logLevel = .critical
        let quiet = logger
        @Sendable func connect(
            _ servers: [SyncConfiguration.Server], _ target: SyncConfiguration.TargetSessionAttributes?,
            database: String = "postgres"
        ) async throws -> SyncConfiguration.Server {
            let configuration = SyncConfiguration(
                servers: servers, targetSessionAttributes: target, username: "postgres", database: database,
                schema: "s", tls: .disable)
            let (connection, server) = try await configuration.connect(
                on: MultiThreadedEventLoopGroup.singleton.any(), id: 1, logger: quiet)
            try await connection.close()
            return server
        }
        // The standby has the database once it replayed it (replication is asynchronous here).
        let replayed = await sync.eventually {
            try standby.psql("SELECT count(*) FROM pg_database WHERE datname = 'readonly'") == "1"
        }
        #expect(replayed)

        #expect(try await connect([closed, second, first], nil) == first)  // read-write: the default with several
        #expect(try await connect([closed, second, first], .primary) == first)
        #expect(try await connect([closed, second, first], .any) == second)
        #expect(try await connect([first, second], .readWrite) == first)
        #expect(try await connect([first], .readWrite) == first)
        // A primary whose sessions are read-only is no read-write server, but it is a primary.
        #expect(try await connect([first, second], .primary, database: "readonly") == first)
        do {
            let chosen = try await connect([closed, first, second], .readWrite, database: "readonly")
            Issue.record("read-write took \(chosen), a read-only primary or a standby")
        } catch let failure as SyncConfiguration.NoServerAvailable {
            #expect(failure.attempts.map(\.server) == [closed, first, second])
            let message = failure.description
            #expect(
                message.hasPrefix(
                    "no server of the sync URL could be used (target_session_attrs=read-write): 127.0.0.1:1: cannot reach the server ("
                ), "\(message)")
            #expect(
                message.contains("; 127.0.0.1:\(primary.port): read-only (transaction_read_only is on); "), "\(message)"
            )
            #expect(message.hasSuffix("; 127.0.0.1:\(standby.port): a standby (in recovery), read-only"), "\(message)")
        }
        // One server, any: postgres-nio's own error, as the engine always classified it.
        await #expect(throws: PSQLError.self) { try await connect([closed], .any) }
        await #expect(throws: SyncConfiguration.NoServerAvailable.self) { try await connect([second], .primary) }
    }

    @Test(
        "the primary killed while uploads wait for their commit, the standby promoted: both machines reconnect to it through the multi-host URL, converge, and every change set is on it exactly once"
    )
    func primaryKilledStandbyPromoted() async throws {
        let started = ContinuousClock.now
        let primary = try await PostgresServer.started()
        let standby = try primary.makeStandby(synchronous: true)
        let database = try primary.createUniqueDatabase(prefix: "failover")
        let url =
            "postgresql://postgres@127.0.0.1:\(primary.port),127.0.0.1:\(standby.port)/\(database)?sslmode=disable&schema=g_sync"
        let configuration = try SyncConfiguration.parse(url: url)
        #expect(configuration.servers.count == 2)
        #expect(configuration.targetSessionAttributes == .readWrite)  // the default with several hosts

        let logs = [Locked<[String]>([]), Locked<[String]>([])]
        let machineA = try RunningDaemon(sync: configuration, log: { line in logs[0].withValue { $0.append(line) } })
        let machineB = try RunningDaemon(sync: configuration, log: { line in logs[1].withValue { $0.append(line) } })
        let machines = [machineA, machineB]
        let a = try Skyros(sharedStack: testSchema, container: machineA.container.url)
        let b = try Skyros(sharedStack: testSchema, container: machineB.container.url)
        let onServer = { (server: PostgresServer) in
            try server.psql(
                #"SELECT coalesce(string_agg(handle, ',' ORDER BY handle), '') FROM g_sync."User""#, database: database)
        }

        // Both machines save continuously, from before the failover to after it.
        let stop = Locked(false)
        let saved = [Locked(0), Locked(0)]
        let writers = [
            writer(a, prefix: "a", saved: saved[0], stop: stop), writer(b, prefix: "b", saved: saved[1], stop: stop),
        ]
        defer {
            stop.withValue { $0 = true }
            for task in writers { task.cancel() }
        }
        let uploading = await sync.eventually {
            let counts = try primary.psql(
                #"SELECT count(*) FILTER (WHERE handle LIKE 'a%') || ',' || count(*) FILTER (WHERE handle LIKE 'b%') FROM g_sync."User""#,
                database: database)
            return counts.split(separator: ",").allSatisfy { (Int($0) ?? 0) >= 20 }
        }
        if !uploading {
            stop.withValue { $0 = true }
            var endings: [String] = []
            for task in writers {
                do { try await task.value } catch { endings.append("\(error)") }
            }
            let counts = try? primary.psql(
                #"SELECT count(*) FILTER (WHERE handle LIKE 'a%') || ',' || count(*) FILTER (WHERE handle LIKE 'b%') FROM g_sync."User""#,
                database: database)
            Issue.record(
                """
                the machines' saves did not reach the primary: saved \(saved[0].value) and \(saved[1].value), \
                on the primary \(counts ?? "?"), the writers' errors \(endings); A: \(logs[0].value), B: \(logs[1].value)
                """)
            return
        }
        #expect(try standby.psql(#"SELECT count(*) > 0 FROM g_sync."User""#, database: database) == "t")

        // The standby stops taking the primary's log: every commit on the primary now waits for
        // it (synchronous replication), and the next uploads of both machines are in flight when
        // the primary is killed: one committed there and waiting for the standby, its reply never
        // sent; the other behind it.
        let receiver = try #require(try standby.walReceiverProcess())
        kill(receiver, SIGSTOP)
        var receiverStopped = true
        defer { if receiverStopped { kill(receiver, SIGCONT) } }
        // One waits in SyncRep (at its batch's COMMIT); the other behind it, for the lock a
        // transaction that notifies holds through its commit.
        let inFlight = """
            SELECT count(*) FILTER (WHERE wait_event = 'SyncRep') || ',' || count(*) FROM pg_stat_activity
            WHERE state = 'active' AND wait_event IS NOT NULL AND (query LIKE '%_skyros_uploads%' OR query = 'COMMIT')
            """
        let waiting = await sync.eventually(seconds: 15) {
            let counts = try primary.psql(inFlight).split(separator: ",").compactMap { Int($0) }
            return counts.count == 2 && counts[0] >= 1 && counts[1] >= 2
        }
        #expect(
            waiting,
            """
            uploads of both machines were not waiting for their commit: \(
                (try? primary.psql("SELECT wait_event, state, left(query, 80) FROM pg_stat_activity")) ?? "?")
            """)
        let savedBeforeKill = saved.map(\.value)
        primary.kill()
        kill(receiver, SIGCONT)
        receiverStopped = false

        // Neither server qualifies: the first is gone, the second a standby. The machines say so,
        // naming both, and keep saving locally.
        for (index, machine) in machines.enumerated() {
            let told = await sync.eventually {
                let status = try sync.syncStatus(machine)
                let message = status["message"] as? String ?? ""
                return status["state"] as? String == "offline" && message.contains("127.0.0.1:\(primary.port): ")
                    && message.contains("127.0.0.1:\(standby.port): a standby")
            }
            #expect(told, "machine \(index): \((try? sync.syncStatus(machine)).map { "\($0)" } ?? "?")")
        }

        try standby.promote()
        #expect(try standby.psql("SELECT pg_is_in_recovery()") == "f")
        for (index, machine) in machines.enumerated() {
            let online = await sync.eventually { try sync.syncStatus(machine)["state"] as? String == "online" }
            #expect(online, "machine \(index): \((try? sync.syncStatus(machine)).map { "\($0)" } ?? "?")")
            #expect(logs[index].value.contains("sync: connected to 127.0.0.1:\(standby.port)"), "\(logs[index].value)")
        }
        // A few more saves on the new primary, then the writers stop.
        let savedAtPromotion = saved.map(\.value)
        #expect(
            await sync.eventually {
                saved[0].value >= savedAtPromotion[0] + 10 && saved[1].value >= savedAtPromotion[1] + 10
            })
        stop.withValue { $0 = true }
        for task in writers { try await task.value }
        let counts = saved.map(\.value)
        #expect(counts[0] > savedBeforeKill[0] && counts[1] > savedBeforeKill[1])

        // Converged: queues drained, both stores equal the new primary's table, which holds
        // every save of both machines.
        let expected = (0..<counts[0]).map { "a\($0)" } + (0..<counts[1]).map { "b\($0)" }
        let all = expected.sorted().joined(separator: ",")
        let converged = await sync.eventually(seconds: 45) {
            let queues = try machines.map { try sync.syncStatus($0)["uploadQueue"] as? Int }
            let onA = try await sync.handles(a).joined(separator: ",")
            let onB = try await sync.handles(b).joined(separator: ",")
            let server = try onServer(standby)
            return queues == [0, 0] && onA == all && onB == all && server == all
        }
        if !converged {
            Issue.record(
                """
                not converged: saved \(counts); server has \(((try? onServer(standby)) ?? "?").split(separator: ",").count) \
                rows; A: \((try? sync.syncStatus(machineA)).map { "\($0)" } ?? "?"), \
                B: \((try? sync.syncStatus(machineB)).map { "\($0)" } ?? "?")
                """)
        }

        // Exactly once: one upload record per change set each machine saved, none refused (a
        // change set applied twice would have been refused by the unique handle).
        for index in 0..<2 {
            let machine = try #require(machineID(logs[index]), "no machine id in \(logs[index].value)")
            let records = try standby.psql(
                "SELECT count(*) || ',' || count(rejected) || ',' || coalesce(max(number), 0) FROM g_sync._skyros_uploads WHERE machine = '\(machine)'",
                database: database)
            #expect(records == "\(counts[index]),0,\(counts[index])", "machine \(index): saved \(counts[index])")
        }
        #expect(
            try standby.psql("SELECT count(DISTINCT machine) FROM g_sync._skyros_uploads", database: database) == "2")
        #expect(ContinuousClock.now - started < .seconds(60))
    }
}
