import Foundation
import Skyros
import SkyrosGateway
import SkyrosTestSupport
import Testing

/// The sync fault campaign (issue 35, docs/SYNC.md "Testing"), 20 seconds of it: three
/// `skyrosd` machines, four writers each (paced at the campaign's default 10 operations a
/// second each, like the long runs), and every kind of fault at least five times; the
/// history checker must pass and every machine converge within 10 s of the quiet period.
/// `skyros-bench sync-faults` runs the long campaigns.
@Suite("Sync fault campaign", .serialized, .timeLimit(.minutes(4)))
struct SyncFaultCampaignTests {
    @Test(
        "20 s of partitions, black holes, slow links, daemon kills, PostgreSQL restarts, a full disk, psql writes, and sync switched off and on: nothing lost, nothing doubled, every machine converges"
    )
    func campaign() async throws {
        // A fixed seed (the same plan of faults in every run), or SKYROS_CAMPAIGN_SEED.
        let seed = ProcessInfo.processInfo.environment["SKYROS_CAMPAIGN_SEED"].flatMap { UInt64($0) } ?? 35
        var configuration = SyncFaultCampaign.Configuration(
            seed: seed, duration: 20, machines: 3, writersPerMachine: 4,
            skyrosd: ChildProcess.builtExecutable("skyrosd").path)
        // Not the operator's restore and rename rollout here: alone, with them, this test passed
        // 6 of 6 runs (28.5-33.9 s); inside the whole suite's load it once ran 104 s with 90
        // operations (64 saves acknowledged, 100 needed), its writers paused while the restore
        // and the upgrade waited (issue 57, open). `skyros-bench sync-faults` runs them.
        configuration.kinds = SyncFaultCampaign.FaultKind.allCases.filter {
            $0 != .renameRollout && $0 != .restoreBackup
        }
        let report = try await SyncFaultCampaign.run(configuration)
        for check in report.verdict.checks { #expect(check.passed, "\(report)") }
        Self.expectRefusalsTold(report)
        #expect((report.convergenceSeconds ?? .infinity) <= 10, "\(report)")
        // Every kind attempted as planned (five times each). The kinds that act
        // whatever the traffic (a kill of a running daemon, a stop of a running server, a psql
        // update, sync switched off) take
        // effect at least once each. A network fault takes effect only when traffic meets it,
        // and a full disk only when PostgreSQL extends a file of the tablespace in its window:
        // in 20 s of short faults one kind of them may meet none (a CI run had slow 0 of 5,
        // cut 1, black hole 3), so the network kinds are required to take effect together.
        let traffic: Set<SyncFaultCampaign.FaultKind> = [.cut, .blackHole, .slow, .diskFull]
        for kind in report.configuration.kinds {
            #expect(
                (report.attempted[kind] ?? 0) >= kind.planned(perKind: 5)
                    && (traffic.contains(kind) || (report.faults[kind] ?? 0) >= 1),
                "\(kind.rawValue): \(report.faults[kind] ?? 0) of \(report.attempted[kind] ?? 0) took effect; \(report.unavailable[kind] ?? "")"
            )
        }
        let network = [SyncFaultCampaign.FaultKind.cut, .blackHole, .slow].map { report.faults[$0] ?? 0 }
        #expect(network.reduce(0, +) >= 3, "network faults that took effect: \(network)")
        // The late machine saved before its first checkpoint, one of those saves refused.
        #expect(report.writtenBeforeFirstCheckpoint == 2, "\(report)")
        // Something was written and acknowledged, and read.
        #expect(report.history.operations.filter { $0.kind != .read && $0.acknowledged }.count > 100, "\(report)")
        print(report)
    }

    @Test(
        "the campaign through two sync gateways: three machines, each through a gateway process of its own link, with every fault of the direct campaign; nothing lost, nothing doubled, every machine converges"
    )
    func campaignThroughGateways() async throws {
        let seed = ProcessInfo.processInfo.environment["SKYROS_CAMPAIGN_SEED"].flatMap { UInt64($0) } ?? 60
        var configuration = SyncFaultCampaign.Configuration(
            seed: seed, duration: 20, machines: 3, writersPerMachine: 4,
            skyrosd: ChildProcess.builtExecutable("skyrosd").path)
        configuration.kinds = SyncFaultCampaign.FaultKind.allCases.filter {
            $0 != .renameRollout && $0 != .restoreBackup
        }
        // Every machine holds and may write every row: one bucket of the team claim, with every
        // entity in it.
        let entities = testSchema.entities.map { "      \($0.name): true" }.joined(separator: "\n")
        let rules = "buckets:\n  campaign:\n    parameters:\n      team: token.team\n    entities:\n\(entities)\n"
        let secret = Data((0..<32).map { _ in UInt8.random(in: 0...255) })
        var tokens: [String] = []
        for index in 0..<configuration.machines {
            tokens.append(
                try await SyncToken.mint(
                    SyncTokenClaims(
                        subject: "m\(index)", expiration: Date().addingTimeInterval(3_600),
                        claims: ["team": .string("campaign")]), secret: secret))
        }
        configuration.gateways = SyncFaultCampaign.Configuration.Gateways(
            count: 2, executable: ChildProcess.builtExecutable("skyros-gateway").path, secret: secret, tokens: tokens,
            rules: rules)
        let report = try await SyncFaultCampaign.run(configuration)
        for check in report.verdict.checks { #expect(check.passed, "\(report)") }
        Self.expectRefusalsTold(report)
        #expect((report.convergenceSeconds ?? .infinity) <= 10, "\(report)")
        #expect(report.writtenBeforeFirstCheckpoint == 2, "\(report)")
        #expect(report.history.operations.filter { $0.kind != .read && $0.acknowledged }.count > 100, "\(report)")
        for kind in [SyncFaultCampaign.FaultKind.daemonKill, .postgresFast, .postgresImmediate, .psqlWrite] {
            #expect((report.faults[kind] ?? 0) >= 1, "\(kind.rawValue) never took effect: \(report)")
        }
        print(report)
    }

    /// Expects the apps and rejected logs to be told of every refusal, the late machine's
    /// (refused before its first checkpoint, issue 57 item 1) included.
    static func expectRefusalsTold(_ report: SyncFaultCampaign.Report) {
        guard let check = report.verdict[.refusalsTold] else {
            Issue.record("no refusals-told check")
            return
        }
        #expect(check.passed, "\(report)")
    }
}
