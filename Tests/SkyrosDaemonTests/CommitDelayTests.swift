import Testing

@testable import SkyrosDaemon

/// When a turn waits for more saves before its group commit, as transcripts.
@Suite struct CommitDelayTests {
    let start = ContinuousClock.now
    static let maximum: Duration = .microseconds(150)

    @Test func aClientSavingAloneNeverWaits() {
        var delay = CommitDelay(maximum: Self.maximum, now: start)
        #expect(delay.wait(connections: 1, now: start) == nil)
        delay.collected(connections: 1)
        delay.committed(at: start)
        #expect(delay.wait(connections: 1, now: start + .milliseconds(1)) == nil)
        #expect(!delay.savingInTurn)
    }

    @Test func clientsThatSavedTogetherAreWaitedForUntilTheyAllSavedOrTheDeadline() throws {
        var delay = CommitDelay(maximum: Self.maximum, now: start)
        #expect(delay.wait(connections: 3, now: start) == nil)
        delay.collected(connections: 3)
        delay.committed(at: start)
        let now = start + .milliseconds(1)
        let planned = delay.wait(connections: 1, now: now)
        let wait = try #require(planned)
        #expect(wait == CommitDelay.Wait(deadline: now + Self.maximum, expected: 3))
        #expect(delay.savingInTurn)
        #expect(wait.goesOn(connections: 2, now: now))
        #expect(!wait.goesOn(connections: 3, now: now))
        #expect(!wait.goesOn(connections: 1, now: wait.deadline))
        // As many as the widest of the last 16 commits: no wait.
        #expect(delay.wait(connections: 3, now: now) == nil)
    }

    @Test func theWidthsAreForgottenWhenNoCommitCameFor100Milliseconds() {
        var delay = CommitDelay(maximum: Self.maximum, now: start)
        _ = delay.wait(connections: 4, now: start)
        delay.collected(connections: 4)
        delay.committed(at: start)
        #expect(delay.wait(connections: 1, now: start + .milliseconds(99)) != nil)
        #expect(delay.wait(connections: 1, now: start + .milliseconds(101)) == nil)
        #expect(!delay.savingInTurn)
    }

    @Test func theWidestOfTheLastSixteenCommitsCounts() {
        var delay = CommitDelay(maximum: Self.maximum, now: start)
        delay.collected(connections: 5)
        for _ in 0..<15 { delay.collected(connections: 1) }
        #expect(delay.wait(connections: 1, now: start)?.expected == 5)
        delay.collected(connections: 1)  // the 5 is the 17th commit back now
        #expect(delay.wait(connections: 1, now: start) == nil)
    }

    @Test func aZeroDelayNeverWaits() {
        var delay = CommitDelay(maximum: .zero, now: start)
        delay.collected(connections: 8)
        #expect(delay.wait(connections: 1, now: start) == nil)
    }
}
