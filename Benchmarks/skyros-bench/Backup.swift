import Foundation
import Skyros
import SkyrosDaemon
import SkyrosWire
import SkyrosZeroMQ
import ZeroMQReference

/// `skyros-bench backup`: a store of about 1 GB (100 MB with --quick) served by a daemon,
/// backed up through an admin session (`skyros backup --group`: SQLite's online backup from a
/// held read transaction, on a thread of the daemon) while 4 writer processes save one object
/// at a time. Reported: the writers' save p99 during the backup against their p99 without it
/// (target ≤ 3×), and the backup's throughput against `sqlite3 .backup` of the same file in
/// the same run (when the sqlite3 command-line shell is installed).
///
/// The writers are this executable in the hidden role `flood-writer`.
struct BackupBenchmark {
    let directory: URL
    let megabytes: Int
    let writers = 4

    func run(report: (Row) -> Void) throws {
        let folder = directory.appendingPathComponent("backup")
        let container = GroupContainer(url: folder)
        try container.prepare()
        let rows = try Self.makeStore(container.store, megabytes: megabytes)
        let daemon = try SharedBenchmark.Daemon(folder, durability: .full)
        defer { daemon.stop() }
        _ = try Skyros(sharedStack: benchSchema, container: folder, timeout: 30)
        let storeBytes = Double(Self.fileSize(container.store.path))

        // Idle: the daemon's backup, then sqlite3's, of the same file (warm page cache for both).
        let idle = try Self.backupThroughDaemon(container, to: directory.appendingPathComponent("idle.sqlite").path)
        var shellSeconds = 0.0
        if let shell = ["/usr/bin/sqlite3", "/usr/local/bin/sqlite3"].first(
            where: FileManager.default.isExecutableFile(atPath:))
        {
            let copy = directory.appendingPathComponent("shell.sqlite").path
            shellSeconds = try Clock.seconds {
                let process = Process()
                process.executableURL = URL(fileURLWithPath: shell)
                process.arguments = [container.store.path, ".backup '\(copy)'"]
                try process.run()
                process.waitUntilExit()
            }
        }
        for name in ["idle.sqlite", "shell.sqlite"] {
            try? FileManager.default.removeItem(at: directory.appendingPathComponent(name))
        }

        // The writers alone, then beside a backup started when they start, for as long as it lasts.
        let seconds = max(2, idle.seconds * 1.2)
        let alone = try FloodBenchmark.launch(
            Array(repeating: "flood-writer", count: writers), target: folder.path,
            go: directory.appendingPathComponent("go-alone").path, seconds: seconds)
        final class Outcome: @unchecked Sendable {
            var result: Result<(seconds: Double, bytes: UInt64, sequence: UInt64), any Error>?
        }
        let outcome = Outcome()
        let finished = DispatchSemaphore(value: 0)
        let copy = directory.appendingPathComponent("during.sqlite").path
        let busy = try FloodBenchmark.launch(
            Array(repeating: "flood-writer", count: writers), target: folder.path,
            go: directory.appendingPathComponent("go-backup").path, seconds: seconds,
            beforeGo: {
                Thread.detachNewThread {
                    usleep(50_000)  // the writers are going
                    outcome.result = Result { try Self.backupThroughDaemon(container, to: copy) }
                    finished.signal()
                }
            })
        finished.wait()
        let during = try outcome.result?.get()
        let aloneLatencies = alone.flatMap { Array(FloodBenchmark.numbers(after: "RESULT ", in: $0).dropFirst()) }
        let busyLatencies = busy.flatMap { Array(FloodBenchmark.numbers(after: "RESULT ", in: $0).dropFirst()) }
        // The daemon's time includes its PRAGMA integrity_check of the copy; sqlite3's checks nothing.
        FileHandle.standardError.write(
            Data(
                String(
                    format:
                        "backup: a %.0f MB store of %d objects, 4 writers saving one object at a time (writeAndWait)\n",
                    storeBytes / 1_048_576, rows
                ).utf8))
        report(
            Row(
                name: "backup: writers' save p99 during backup (vs without)", unit: "us",
                skyros: percentile(busyLatencies, 99), baseline: percentile(aloneLatencies, 99)))
        report(
            Row(
                name: "backup: writers' save p50 during backup (vs without)", unit: "us",
                skyros: percentile(busyLatencies, 50), baseline: percentile(aloneLatencies, 50)))
        report(
            Row(
                name: "backup: writers' saves/s during backup (vs without)", unit: "saves/s",
                skyros: Double(busyLatencies.count) / seconds, baseline: Double(aloneLatencies.count) / seconds))
        report(
            Row(
                name: "backup: MB/s via daemon, idle (vs sqlite3 .backup)", unit: "MB/s",
                skyros: storeBytes / 1_048_576 / idle.seconds,
                baseline: shellSeconds > 0 ? storeBytes / 1_048_576 / shellSeconds : 0))
        report(
            Row(
                name: "backup: MB/s via daemon, 4 writers (vs sqlite3)", unit: "MB/s",
                skyros: storeBytes / 1_048_576 / (during?.seconds ?? 1),
                baseline: shellSeconds > 0 ? storeBytes / 1_048_576 / shellSeconds : 0))
        report(
            Row(
                name: "backup: seconds via daemon, 4 writers (vs idle)", unit: "s",
                skyros: during?.seconds ?? 0, baseline: idle.seconds))
    }

    /// A store of at least `megabytes` MB: rows of about 250 bytes (small enough to need no
    /// overflow pages) written with SQL in batches of 50,000 until the file is that large,
    /// then opened once by Skyros. Returns the number of objects.
    static func makeStore(_ url: URL, megabytes: Int) throws -> Int {
        let store = try SQLiteStore(schema: benchSchema, url: url, durability: .normal)
        let batch = 50_000
        var rows = 0
        while fileSize(url.path) + fileSize(url.path + "-wal") < Int64(megabytes) * 1_048_576 {
            try store.transaction { transaction in
                try transaction.execute(
                    """
                    WITH RECURSIVE n(i) AS (SELECT ? UNION ALL SELECT i + 1 FROM n WHERE i < ?)
                    INSERT INTO "Item" ("_id", "_version", "name", "value", "score", "flag", "created")
                    SELECT CAST(printf('%016d', i) AS BLOB), 1, hex(randomblob(100)), i, i * 0.5, i % 2, 0.0 FROM n
                    """, [.integer(Int64(rows)), .integer(Int64(rows + batch - 1))])
            }
            rows += batch
        }
        try store.close()
        return rows
    }

    /// `skyros backup --group` in the benchmark: an admin session asking the daemon for a backup.
    static func backupThroughDaemon(_ container: GroupContainer, to path: String) throws
        -> (seconds: Double, bytes: UInt64, sequence: UInt64)
    {
        let context = try ZeroMQContext()
        defer { context.shutdown() }
        let dealer = try ZeroMQSocket(context: context, kind: .dealer)
        defer { dealer.close() }
        try dealer.setReceiveTimeout(milliseconds: 600_000)
        try dealer.connect(container.requestsEndpoint)
        try dealer.send([
            Data(AdminMessage.hello(clientName: "skyros-bench", pid: UInt64(getpid())).encoded(requestID: 1))
        ])
        _ = try dealer.receive()
        let start = Clock.now()
        try dealer.send([Data(AdminMessage.backup(path: path, pagesPerStep: 0).encoded(requestID: 2))])
        while true {
            let bytes = [UInt8](try dealer.receive().last ?? Data())
            guard case .backupProgress(let progress)? = try? AdminMessage.decode(bytes).message else {
                throw SkyrosError(
                    .storeFailure, "the backup failed: \((try? WireMessage.decode(bytes).body).map { "\($0)" } ?? "?")")
            }
            if progress.done {
                try? FileManager.default.removeItem(atPath: path)
                return (Double(Clock.now() - start) / 1e9, progress.bytes, progress.sequence)
            }
        }
    }

    static func fileSize(_ path: String) -> Int64 {
        var info = stat()
        return stat(path, &info) == 0 ? Int64(info.st_size) : 0
    }
}
