import Foundation
import SkyrosTestSupport
import Testing

/// The sync fault campaign (issue 35, docs/SYNC.md "Testing"), 20 seconds of it: three
/// `skyrosd` machines, four writers each (paced at the campaign's default 10 operations a
/// second each, like the long runs), and every kind of fault at least five times; the
/// history checker must pass and every machine converge within 10 s of the quiet period.
/// `skyros-bench sync-faults` runs the long campaigns.
@Suite("Sync fault campaign", .timeLimit(.minutes(4)))
struct SyncFaultCampaignTests {
    @Test(
        "20 s of partitions, black holes, slow links, daemon kills, PostgreSQL restarts, a full disk and psql writes: nothing lost, nothing doubled, every machine converges"
    )
    func campaign() async throws {
        // A fixed seed (the same plan of faults in every run), or SKYROS_CAMPAIGN_SEED.
        let seed = ProcessInfo.processInfo.environment["SKYROS_CAMPAIGN_SEED"].flatMap { UInt64($0) } ?? 35
        let report = try await SyncFaultCampaign.run(
            SyncFaultCampaign.Configuration(
                seed: seed, duration: 20, machines: 3, writersPerMachine: 4,
                skyrosd: ChildProcess.builtExecutable("skyrosd").path))
        #expect(report.verdict.passed, "\(report)")
        #expect((report.convergenceSeconds ?? .infinity) <= 10, "\(report)")
        for kind in SyncFaultCampaign.FaultKind.allCases {
            #expect(
                (report.faults[kind] ?? 0) >= 5,
                "\(kind.rawValue): \(report.faults[kind] ?? 0) injected; \(report.unavailable[kind] ?? "")")
        }
        // Something was written and acknowledged, and read.
        #expect(report.history.operations.filter { $0.kind != .read && $0.acknowledged }.count > 100, "\(report)")
        print(report)
    }
}
