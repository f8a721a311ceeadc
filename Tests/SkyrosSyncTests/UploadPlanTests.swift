import SkyrosSync
import Testing

/// How an upload is split when the server refuses it, as transcripts.
@Suite struct UploadPlanTests {
    @Test func aBatchWithoutRefusalGoesTogether() {
        var plan = UploadPlan(resets: [false, false, false, false])
        #expect(plan.next() == .together(0..<4))
        plan.appliedTogether(0..<4, transaction: 7)
        #expect(plan.next() == .done)
        #expect(plan.outcomes == Array(repeating: .applied, count: 4))
        #expect(plan.transactions == [7])
    }

    @Test func aRefusalNobodyNamedIsFoundByHalving() {
        var plan = UploadPlan(resets: [false, false, false, false])
        #expect(plan.next() == .together(0..<4))
        plan.refusedTogether(0..<4, culprit: nil)
        #expect(plan.next() == .together(0..<2))
        plan.appliedTogether(0..<2, transaction: 8)
        #expect(plan.next() == .together(2..<4))
        plan.refusedTogether(2..<4, culprit: nil)
        #expect(plan.next() == .together(2..<3))
        plan.appliedTogether(2..<3, transaction: 9)
        #expect(plan.next() == .together(3..<4))
        plan.refusedTogether(3..<4, culprit: nil)
        #expect(plan.next() == .oneByOne(3..<4))
        plan.uploadedOneByOne(3..<4, outcomes: [.rejected("value too long for type character varying(4)")])
        #expect(plan.next() == .done)
        #expect(
            plan.outcomes == [.applied, .applied, .applied, .rejected("value too long for type character varying(4)")])
        // A part went one by one: its transaction is not known, so neither is the batch's.
        #expect(plan.transactions == nil)
    }

    @Test func aUniqueViolationTheServerPinnedGoesAloneWithoutHalving() {
        var plan = UploadPlan(resets: Array(repeating: false, count: 5))
        #expect(plan.next() == .together(0..<5))
        plan.refusedTogether(0..<5, culprit: 2)
        #expect(plan.next() == .together(0..<2))
        plan.appliedTogether(0..<2, transaction: 1)
        #expect(plan.next() == .oneByOne(2..<3))
        plan.uploadedOneByOne(2..<3, outcomes: [.rejected("duplicate key value violates unique constraint")])
        #expect(plan.next() == .together(3..<5))
        plan.appliedTogether(3..<5, transaction: 2)
        #expect(plan.next() == .done)
        #expect(plan.outcomes.count == 5)
        #expect(plan.outcomes[2] == .rejected("duplicate key value violates unique constraint"))
    }

    @Test func aCulpritAtTheEdgeLeavesNoEmptyPart() {
        var plan = UploadPlan(resets: [false, false, false])
        _ = plan.next()
        plan.refusedTogether(0..<3, culprit: 0)
        #expect(plan.next() == .oneByOne(0..<1))
        plan.uploadedOneByOne(0..<1, outcomes: [.alreadyApplied])
        #expect(plan.next() == .together(1..<3))
        plan.appliedTogether(1..<3, transaction: nil)
        #expect(plan.next() == .done)
        #expect(plan.outcomes == [.alreadyApplied, .applied, .applied])
    }

    @Test func aCulpritOutsideThePartHalvesIt() {
        var plan = UploadPlan(resets: [false, false])
        _ = plan.next()
        plan.refusedTogether(0..<2, culprit: 7)
        #expect(plan.next() == .together(0..<1))
    }

    @Test func aResetNeverGoesTogether() {
        var plan = UploadPlan(resets: [false, true, false])
        #expect(plan.next() == .together(0..<1))
        plan.appliedTogether(0..<1, transaction: 3)
        #expect(plan.next() == .oneByOne(1..<2))
        plan.uploadedOneByOne(1..<2, outcomes: [.applied])
        #expect(plan.next() == .together(2..<3))
        plan.appliedTogether(2..<3, transaction: 4)
        #expect(plan.next() == .done)
        #expect(plan.outcomes == [.applied, .applied, .applied])
    }

    @Test func anEmptyBatchIsDone() {
        var plan = UploadPlan(resets: [])
        #expect(plan.next() == .done)
        #expect(plan.outcomes.isEmpty)
    }

    /// A batch statement counts as applied only on its answer: one row, verdict `1`, and the
    /// transaction; no row (a connection that ended without the answer) is not an upload.
    @Test func aBatchIsAppliedOnlyOnTheServersAnswer() throws {
        #expect(try ServerSession.confirmedTogether([["1", "812"]]) == 812)
        #expect(try ServerSession.confirmedTogether([["1", nil]]) == nil)
        for answer: [[String?]] in [[], [["0", "812"]], [["1", "812"], ["1", "813"]], [["1"]]] {
            #expect(throws: ServerSession.UnconfirmedUpload.self) { try ServerSession.confirmedTogether(answer) }
        }
    }
}
