import Foundation
import SkyrosTestSupport
import Testing

/// The sync fault campaign's checker catches what it claims to (issue 57, item 10): each
/// test runs a short campaign (two machines, three writers each, no seeded fault) against
/// daemons built with one defect on purpose (`SKYROS_DEBUG_DEFECT`, a debug build of
/// `skyrosd` only; see `DebugDefect` in SkyrosDaemon), and the check meant to catch that defect must fail,
/// with the violation that names it. The control runs the same campaign on sound daemons:
/// every check passes, so each failure below is the defect's.
@Suite("Sync checker", .serialized, .timeLimit(.minutes(2)))
struct SyncCheckerTests {
    /// A short campaign with `defect`, its convergence awaited 5 s at most.
    static func campaign(
        _ defect: SyncFaultCampaign.Defect?, seed: UInt64 = 57, faultsPerKind: Int = 0, longestFault: Double? = nil
    ) async throws -> SyncFaultCampaign.Report {
        var configuration = SyncFaultCampaign.Configuration(
            seed: seed, duration: 8, machines: 2, writersPerMachine: 3, faultsPerKind: faultsPerKind,
            longestFault: longestFault, skyrosd: ChildProcess.builtExecutable("skyrosd").path)
        configuration.defect = defect
        configuration.convergenceLimit = 5
        configuration.convergencePatience = 0
        // Refusals after the first checkpoints too: unique values from a small pool.
        configuration.sharedHandles = 4
        let report = try await SyncFaultCampaign.run(configuration)
        print(report)
        return report
    }

    /// Expects `guarantee`'s check to fail with a violation containing `violation`.
    static func expectFailure(
        _ report: SyncFaultCampaign.Report, _ guarantee: SyncHistory.Guarantee, _ violation: String,
        sourceLocation: SourceLocation = #_sourceLocation
    ) {
        let check = report.verdict[guarantee]
        #expect(check?.passed == false, "\(report)", sourceLocation: sourceLocation)
        #expect(
            check?.violations.contains { $0.contains(violation) } == true, "\(report)", sourceLocation: sourceLocation)
        // Something was written and acknowledged: the campaign ran.
        #expect(
            report.history.operations.filter { $0.kind != .read && $0.acknowledged }.count > 50, "\(report)",
            sourceLocation: sourceLocation)
    }

    @Test(
        "control: the same campaign on sound daemons passes every check, a refusal told before the late machine's first checkpoint"
    )
    func control() async throws {
        let report = try await Self.campaign(nil)
        for check in report.verdict.checks { #expect(check.passed, "\(report)") }
        #expect((report.convergenceSeconds ?? .infinity) <= 5, "\(report)")
        // The late machine saved before its first checkpoint, and the server refused one of those saves.
        #expect(report.writtenBeforeFirstCheckpoint == 2, "\(report)")
        #expect(report.history.uploads.contains { $0.rejected != nil }, "\(report)")
    }

    @Test("dropChangeSet: a numbered change set never uploaded fails 'no lost write'")
    func droppedChangeSet() async throws {
        Self.expectFailure(try await Self.campaign(.dropChangeSet), .noLostWrite, "never recorded by the server")
    }

    @Test("skipUpdate: an acknowledged update never queued fails 'no lost write'")
    func skippedUpdate() async throws {
        Self.expectFailure(try await Self.campaign(.skipUpdate), .noLostWrite, "not on the server, not refused")
    }

    @Test("applyTwice: a change set applied twice fails 'exactly once'")
    func appliedTwice() async throws {
        Self.expectFailure(try await Self.campaign(.applyTwice), .exactlyOnce, "went back to")
    }

    @Test("divergeMachine: a store that differs from the server fails 'convergence'")
    func divergedMachine() async throws {
        Self.expectFailure(try await Self.campaign(.divergeMachine), .convergence, "'s store:")
    }

    @Test("readStale: an older value read after a newer one fails 'read-your-writes and monotonic reads'")
    func staleRead() async throws {
        Self.expectFailure(try await Self.campaign(.readStale), .sessions, "after reading")
    }

    @Test("swallowRefusal: a refusal the apps are not told of fails 'refusals told'")
    func swallowedRefusal() async throws {
        // The late machine's saves before its first checkpoint include a refused one, which a
        // sound daemon tells its apps (the control); this one does not.
        Self.expectFailure(try await Self.campaign(.swallowRefusal), .refusalsTold, "told of 0")
    }
}

/// The "no lost write" rules on histories written by hand: what the campaigns met once, each
/// with its counterpart that must fail.
@Suite("Sync checker rules")
struct SyncCheckerRuleTests {
    let machine = UUID(uuidString: "00000000-0000-4000-8000-0000000000AA")!
    let object = UUID(uuidString: "00000000-0000-4000-8000-000000000567")!

    /// One machine, two clients: client 0's update acknowledged at 1.1 s, then client 1's update
    /// of the same property, started at 1.5 s, failed with its outcome unknown at 4.5 s and
    /// committed later (resent); both change sets (1 and 2) went up in one server transaction,
    /// which recorded `server` as the property's value.
    func history(server: String) -> SyncHistory {
        var history = SyncHistory()
        history.clients = [0: 0, 1: 0]
        history.initialTokens = ["init-f", "init-l"]
        history.operations = [
            SyncHistory.Operation(
                client: 0, machine: 0, kind: .update, object: object, property: "firstname", value: "c0.1",
                acknowledged: true, start: 1.0, end: 1.1),
            SyncHistory.Operation(
                client: 1, machine: 0, kind: .update, object: object, property: "firstname", value: "c1.1",
                acknowledged: false, error: "SkyrosError.outcomeUnknown", start: 1.5, end: 4.5),
        ]
        history.audit = [
            SyncHistory.AuditRow(
                sequence: 1, transaction: "10", operation: "I", object: object, handle: "shared", firstname: "init-f",
                lastname: "init-l"),
            SyncHistory.AuditRow(
                sequence: 2, transaction: "20", operation: "U", object: object, handle: "shared", firstname: server,
                lastname: "init-l"),
        ]
        history.serverRows = [object: "shared|\(server)|init-l"]
        history.uploads = [
            SyncHistory.Upload(machine: machine, number: 1, transaction: "20"),
            SyncHistory.Upload(machine: machine, number: 2, transaction: "20"),
        ]
        history.machines = [
            SyncHistory.Machine(id: machine, rows: [object: "shared|\(server)|init-l"], lastNumber: 2)
        ]
        return history
    }

    @Test(
        "an acknowledged update replaced in its upload batch by a later save whose outcome was unknown is not lost (seed 35, 20 s)"
    )
    func replacedByAResentSave() throws {
        let check = try #require(history(server: "c1.1").check()[.noLostWrite])
        #expect(check.passed, "\(check.violations)")
        #expect(check.detail.contains("1 replaced in their upload batch"), "\(check.detail)")
    }

    @Test("the same update, with neither value on the server, is lost")
    func lostWithoutTheResentValue() throws {
        let check = try #require(history(server: "psql-1").check()[.noLostWrite])
        #expect(!check.passed)
        #expect(check.violations.contains { $0.contains("wrote firstname = c0.1") }, "\(check.violations)")
    }
}
