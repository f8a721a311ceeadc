import Foundation
import SkyrosSync
import Testing

/// The checkpoint machine's transitions, as transcripts. Snapshots are `pg_snapshot` texts
/// (`xmin:xmax:in-progress,…`).
@Suite struct CheckpointStateMachineTests {
    static let poll: Duration = .seconds(5)
    let start = ContinuousClock.now

    /// A machine connected at `start` that applied a first checkpoint at `cursor`, then waited
    /// and was woken by a signal.
    func connected(cursor: String = "20:20:", backlogLimit: Int = 1_000) -> CheckpointStateMachine {
        var machine = CheckpointStateMachine(
            cursor: nil, pollInterval: Self.poll, compactionInterval: .seconds(600), backlogLimit: backlogLimit)
        machine.connected(now: start)
        #expect(machine.uploadsDone() == .read(after: nil))
        #expect(machine.read(summary(cursor), uploadedThrough: 0, now: start) == .apply)
        #expect(machine.applied(.applied, now: start) == .wait(Self.poll))
        #expect(machine.cursor == cursor)
        machine.wokeUp(signaled: true)
        return machine
    }

    func summary(_ snapshot: String, uploadedThrough: Int64 = 0, isEmpty: Bool = false)
        -> CheckpointStateMachine.Summary
    {
        let xmin = UInt64(snapshot.split(separator: ":")[0]) ?? 0
        return .init(snapshot: snapshot, number: xmin, uploadedThrough: uploadedThrough, isEmpty: isEmpty)
    }

    @Test func theFirstRoundReadsFromTheStoresCheckpoint() {
        var machine = CheckpointStateMachine(cursor: "10:10:")
        machine.connected(now: start)
        #expect(machine.uploadsDone() == .read(after: "10:10:"))
        #expect(machine.read(summary("12:14:13", uploadedThrough: 0), uploadedThrough: 0, now: start) == .apply)
        #expect(machine.cursor == "10:10:")
        #expect(machine.applied(.applied, now: start) == .wait(.seconds(5)))
        #expect(machine.cursor == "12:14:13")
        #expect(machine.checkpointNumber == 12)
    }

    @Test func aStoreThatTookANewIdentityReadsASnapshot() {
        // A restored or copied store: its rows are not the server's as of its cursor.
        var machine = connected()
        machine.reidentified()
        #expect(machine.cursor == nil)
        #expect(machine.uploadsDone() == .read(after: nil))
    }

    @Test func aSignalWithNothingNotifiedIsALocalCommitAndReadsNothing() {
        var machine = connected()
        #expect(machine.uploadsDone() == .wait(Self.poll))
    }

    @Test func thePollIntervalPassingWithoutASignalReads() {
        var machine = connected()
        machine.wokeUp(signaled: false)
        #expect(machine.uploadsDone() == .read(after: "20:20:"))
    }

    @Test func aNotificationOfTheMachinesOwnTransactionNeedsNoRead() {
        var machine = connected()
        machine.uploaded(changeSets: 1, transactions: [25], refused: false)
        machine.notified(25)
        #expect(machine.uploadsDone() == .wait(Self.poll))
        // Another writer's transaction does.
        machine.wokeUp(signaled: true)
        machine.notified(26)
        #expect(machine.uploadsDone() == .read(after: "20:20:"))
    }

    @Test func aNotificationOfATransactionTheCheckpointHasNeedsNoRead() {
        var machine = connected(cursor: "20:25:22")
        machine.notified(19)
        machine.notified(23)
        #expect(machine.uploadsDone() == .wait(Self.poll))
    }

    @Test func twoTransactionsCommittedOutOfOrder() {
        // 22 took its id first and was running when the checkpoint was read; 23 committed before.
        var machine = connected(cursor: "20:25:22")
        machine.notified(23)
        #expect(machine.uploadsDone() == .wait(Self.poll))
        machine.wokeUp(signaled: true)
        // 22 commits after: not in the checkpoint, though its id is below one that is.
        machine.notified(22)
        #expect(machine.uploadsDone() == .read(after: "20:25:22"))
    }

    @Test func aNotificationWithoutAnIdOrTooManyReads() {
        var machine = connected()
        machine.notified(nil)
        #expect(machine.uploadsDone() == .read(after: "20:20:"))
        _ = machine.read(summary("21:21:", isEmpty: true), uploadedThrough: 0, now: start)
        machine.wokeUp(signaled: true)
        for xid in 1...UInt64(CheckpointStateMachine.notifiedLimit + 1) { machine.notified(xid) }
        #expect(machine.uploadsDone() == .read(after: "21:21:"))
    }

    @Test func notificationsAreForgottenOnceLookedAt() {
        var machine = connected()
        machine.notified(5)
        #expect(machine.uploadsDone() == .wait(Self.poll))
        machine.wokeUp(signaled: true)
        #expect(machine.uploadsDone() == .wait(Self.poll))
    }

    @Test func aRefusalIsReadAtOnce() {
        var machine = connected()
        machine.uploaded(changeSets: 2, transactions: [30], refused: true)
        #expect(machine.uploadsDone() == .read(after: "20:20:"))
    }

    @Test func uploadsWhoseTransactionsAreNotKnownAreReadAtOnce() {
        var machine = connected()
        machine.uploaded(changeSets: 2, transactions: nil, refused: false)
        #expect(machine.uploadsDone() == .read(after: "20:20:"))
    }

    @Test func uploadsNotReadBackPastABatchAreRead() {
        var machine = connected(backlogLimit: 3)
        machine.uploaded(changeSets: 2, transactions: [30], refused: false)
        #expect(machine.uploadsDone() == .wait(Self.poll))
        machine.wokeUp(signaled: true)
        machine.uploaded(changeSets: 1, transactions: [31], refused: false)
        #expect(machine.ownChangeSets == 3)
        #expect(machine.uploadsDone() == .read(after: "20:20:"))
        // The checkpoint that brings them back forgets them.
        #expect(machine.read(summary("32:32:", uploadedThrough: 3), uploadedThrough: 3, now: start) == .apply)
        #expect(machine.applied(.applied, now: start) == .wait(Self.poll))
        #expect(machine.ownTransactions.isEmpty)
        #expect(machine.ownChangeSets == 0)
    }

    @Test func uploadsACheckpointDoesNotHaveYetAreKept() {
        var machine = connected()
        machine.uploaded(changeSets: 1, transactions: [30, 34], refused: false)
        _ = machine.uploadsDone()
        machine.wokeUp(signaled: false)
        #expect(machine.uploadsDone() == .read(after: "20:20:"))
        #expect(machine.read(summary("32:35:34", uploadedThrough: 0), uploadedThrough: 0, now: start) == .apply)
        _ = machine.applied(.applied, now: start)
        #expect(machine.ownTransactions == [34])
        #expect(machine.ownChangeSets == 1)
    }

    @Test func theWriteCheckpointRuleSendsTheQueueFirst() {
        var machine = connected()
        machine.wokeUp(signaled: false)
        #expect(machine.uploadsDone() == .read(after: "20:20:"))
        // This machine has uploaded through 5; the checkpoint has its uploads through 4 only.
        #expect(machine.read(summary("30:30:", uploadedThrough: 4), uploadedThrough: 5, now: start) == .uploadFirst)
        #expect(machine.cursor == "20:20:")
        // Back from the uploads, it reads again whatever was notified.
        #expect(machine.uploadsDone() == .read(after: "20:20:"))
        #expect(machine.read(summary("31:31:", uploadedThrough: 5), uploadedThrough: 5, now: start) == .apply)
        #expect(Checkpoint.isWriteCheckpoint(5, for: 5))
        #expect(!Checkpoint.isWriteCheckpoint(4, for: 5))
    }

    @Test func anEmptyCheckpointMovesTheCursorWithoutTheDaemon() {
        var machine = connected()
        machine.notified(nil)
        #expect(machine.uploadsDone() == .read(after: "20:20:"))
        #expect(machine.read(summary("22:22:", isEmpty: true), uploadedThrough: 0, now: start) == .wait(Self.poll))
        #expect(machine.cursor == "22:22:")
    }

    @Test func aChangeSetQueuedWhileTheCheckpointWasReadSendsTheQueueFirst() {
        var machine = connected()
        machine.notified(nil)
        _ = machine.uploadsDone()
        #expect(machine.read(summary("22:22:"), uploadedThrough: 0, now: start) == .apply)
        #expect(machine.applied(.pendingUploads, now: start) == .uploadFirst)
        #expect(machine.cursor == "20:20:")
        #expect(machine.uploadsDone() == .read(after: "20:20:"))
    }

    @Test func aCheckpointTheStoreRefusesIsAnErrorAndReadAgain() {
        var machine = connected()
        machine.notified(nil)
        _ = machine.uploadsDone()
        _ = machine.read(summary("22:22:"), uploadedThrough: 0, now: start)
        #expect(
            machine.applied(.failed("disk full"), now: start)
                == .fail("the checkpoint cannot be applied to the store: disk full", retryAfter: Self.poll))
        #expect(machine.cursor == "20:20:")
        #expect(machine.uploadsDone() == .read(after: "20:20:"))
        #expect(
            machine.stagingFailed("no room")
                == .fail("the checkpoint cannot be applied to the store: no room", retryAfter: Self.poll))
        #expect(machine.uploadsDone() == .read(after: "20:20:"))
    }

    @Test func theLogIsCompactedThirtySecondsAfterConnectingThenEveryInterval() {
        var machine = connected()
        func applyOne(at seconds: Int) -> CheckpointStateMachine.Action {
            machine.notified(nil)
            _ = machine.uploadsDone()
            _ = machine.read(
                summary("\(40 + seconds):\(40 + seconds):"), uploadedThrough: 0, now: start + .seconds(seconds))
            let action = machine.applied(.applied, now: start + .seconds(seconds))
            machine.wokeUp(signaled: true)
            return action
        }
        #expect(applyOne(at: 29) == .wait(Self.poll))
        #expect(applyOne(at: 31) == .compact)
        #expect(machine.compacted() == .wait(Self.poll))
        #expect(applyOne(at: 40) == .wait(Self.poll))
        #expect(applyOne(at: 630) == .wait(Self.poll))
        #expect(applyOne(at: 632) == .compact)
    }

    @Test func aMigrationReadsAtOnce() {
        var machine = connected()
        machine.schemaChanged()
        #expect(machine.uploadsDone() == .read(after: "20:20:"))
    }

    @Test func aNewConnectionReadsAtOnce() {
        var machine = connected()
        machine.connected(now: start + .seconds(1))
        #expect(machine.uploadsDone() == .read(after: "20:20:"))
    }

    @Test func aStagedSnapshotIsPatchedByTheChangesSinceItsStartEvenWhileTheMachineSaves() {
        var machine = CheckpointStateMachine(cursor: nil, pollInterval: Self.poll)
        machine.connected(now: start)
        #expect(machine.uploadsDone() == .read(after: nil))
        // The snapshot's pages are staged: its start is read after at once, whatever the queue.
        let snapshot = CheckpointStateMachine.Summary(
            snapshot: "30:30:", number: 30, uploadedThrough: 0, isEmpty: false, isSnapshot: true)
        #expect(machine.read(snapshot, uploadedThrough: 4, now: start) == .read(after: "30:30:"))
        #expect(machine.staged == "30:30:")
        // A patch that lacks the machine's uploads: upload first, then the changes since the
        // snapshot's start again (not the snapshot).
        #expect(machine.read(summary("33:33:", uploadedThrough: 2), uploadedThrough: 4, now: start) == .uploadFirst)
        #expect(machine.uploadsDone() == .read(after: "30:30:"))
        // One that has them, empty or not, is applied (patching the stage).
        #expect(
            machine.read(summary("35:35:", uploadedThrough: 4, isEmpty: true), uploadedThrough: 4, now: start) == .apply
        )
        // The daemon saw a change set queued since: the same again.
        #expect(machine.applied(.pendingUploads, now: start) == .uploadFirst)
        #expect(machine.uploadsDone() == .read(after: "30:30:"))
        #expect(machine.read(summary("36:36:", uploadedThrough: 5), uploadedThrough: 5, now: start) == .apply)
        #expect(machine.applied(.applied, now: start) == .wait(Self.poll))
        #expect(machine.staged == nil)
        #expect(machine.cursor == "36:36:")
    }

    @Test func aStageTheDaemonCannotPatchIsReadAgainFromTheSnapshot() {
        var machine = CheckpointStateMachine(cursor: "10:10:", pollInterval: Self.poll)
        machine.connected(now: start)
        #expect(machine.uploadsDone() == .read(after: "10:10:"))
        let snapshot = CheckpointStateMachine.Summary(
            snapshot: "40:40:", number: 40, uploadedThrough: 0, isEmpty: false, isSnapshot: true)
        #expect(machine.read(snapshot, uploadedThrough: 0, now: start) == .read(after: "40:40:"))
        #expect(machine.read(summary("41:41:"), uploadedThrough: 0, now: start) == .apply)
        #expect(
            machine.applied(.failed("the stage is gone"), now: start)
                == .fail(
                    "the checkpoint cannot be applied to the store: the stage is gone", retryAfter: Self.poll))
        #expect(machine.staged == nil)
        #expect(machine.uploadsDone() == .read(after: "10:10:"))
    }
}
