import Foundation
import SkyrosTestSupport
import Synchronization

/// `skyros-bench sync-faults`: the sync fault campaign (issue 35, docs/SYNC.md "Testing"):
/// machines syncing with one PostgreSQL server while seeded faults break the links, the
/// daemons and the server, checked by the history checker. Not a speed benchmark: it prints
/// the campaign's report and exits 1 when a guarantee failed.
///
///     swift build -c release && .build/release/skyros-bench sync-faults --seed 7 --duration 120 --machines 3 --writers 4 [--rate 10] [--verbose]
enum SyncFaultsBenchmark {
    /// Runs the campaign; true when it passed.
    static func run(seed: UInt64, duration: Double, machines: Int, writers: Int, rate: Double, verbose: Bool) throws
        -> Bool
    {
        // skyrosd is a product of the same package, built next to this executable.
        let skyrosd = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath().deletingLastPathComponent()
            .appendingPathComponent("skyrosd").path
        var configuration = SyncFaultCampaign.Configuration(
            seed: seed, duration: duration, machines: machines, writersPerMachine: writers, rate: rate, skyrosd: skyrosd
        )
        if verbose {
            configuration.log = { @Sendable line in
                print(line)
                fflush(nil)
            }
        }
        // Ctrl-C or a kill: the daemons and the full-disk volume go too (and the server, at exit).
        signal(SIGINT, SIG_IGN)
        signal(SIGTERM, SIG_IGN)
        let interruptions = [SIGINT, SIGTERM].map { number in
            let source = DispatchSource.makeSignalSource(signal: number, queue: .global())
            source.setEventHandler {
                SyncFaultCampaign.cleanUpAfterInterruption()
                exit(130)
            }
            source.resume()
            return source
        }
        defer { interruptions.forEach { $0.cancel() } }
        let result = Mutex<Result<SyncFaultCampaign.Report, any Error>?>(nil)
        let done = DispatchSemaphore(value: 0)
        Task {
            let outcome: Result<SyncFaultCampaign.Report, any Error>
            do { outcome = .success(try await SyncFaultCampaign.run(configuration)) } catch {
                outcome = .failure(error)
            }
            result.withLock { $0 = outcome }
            done.signal()
        }
        done.wait()
        let report = try result.withLock { $0! }.get()
        print(report)
        return report.passed
    }
}
