import Foundation
import SkyrosSync
import Testing

/// The upload machine's transitions, as transcripts: each event, then the action it must return.
@Suite struct UploadStateMachineTests {
    /// `count` change sets numbered from `first`, each inserting one object.
    static func entries(_ numbers: ClosedRange<Int64>) -> [QueuedEntry] {
        numbers.map { number in
            var changes = QueuedChangeSet()
            changes.inserted = [QueuedChangeSet.Row(entity: "Item", id: UUID(), values: ["n": .integer(number)])]
            return (number, changes)
        }
    }

    @Test func nothingIsUploadedBeforeTheConnectionComesUp() {
        var machine = UploadStateMachine(queuedThrough: 3)
        #expect(machine.nextBatch() == .idle)
        machine.localCommitted(Self.entries(4...4), through: 4)
        #expect(machine.nextBatch() == .idle)
    }

    @Test func aMachineThatDoesNotKnowWhatIsQueuedReadsTheQueueAfterTheServersLast() {
        var machine = UploadStateMachine(queuedThrough: nil, maximumBatch: 1_000, maximumBytes: 4_096)
        machine.connected(uploadedThrough: 2)
        #expect(machine.nextBatch() == .markUploaded(through: 2, refusals: []))  // the queue drops what the server has
        #expect(machine.nextBatch() == .readQueue(after: 2, limit: 1_000, bytes: 4_096))
        #expect(machine.queueRead(Self.entries(3...5)) == .upload(numbers: 3...5))
        #expect(machine.batch.map(\.number) == [3, 4, 5])
        #expect(
            machine.uploaded(outcomes: [.applied, .alreadyApplied, .applied]) == .markUploaded(through: 5, refusals: [])
        )
        #expect(machine.uploadedThrough == 5)
        #expect(machine.nextBatch() == .readQueue(after: 5, limit: 1_000, bytes: 4_096))
        #expect(machine.queueRead([]) == .idle)
    }

    @Test func aBatchCommittedWhoseReplyWasLostIsDroppedFromTheQueueAtTheNextConnection() {
        var machine = UploadStateMachine(queuedThrough: 6)
        machine.connected(uploadedThrough: 3)
        #expect(machine.nextBatch() == .markUploaded(through: 3, refusals: []))
        #expect(machine.nextBatch() == .readQueue(after: 3, limit: 1_000, bytes: 8 << 20))
        #expect(machine.queueRead(Self.entries(4...6)) == .upload(numbers: 4...6))
        machine.disconnected()  // the server committed 4...6; its reply was lost
        machine.connected(uploadedThrough: 6)
        #expect(machine.nextBatch() == .markUploaded(through: 6, refusals: []))
        #expect(machine.nextBatch() == .idle)
    }

    @Test func changeSetsHandedOverAreUploadedFromMemoryWhenTheyFollowTheLastUpload() {
        var machine = UploadStateMachine(queuedThrough: 5)
        machine.connected(uploadedThrough: 5)
        #expect(machine.nextBatch() == .markUploaded(through: 5, refusals: []))  // the queue drops what the server has
        #expect(machine.nextBatch() == .idle)
        machine.localCommitted(Self.entries(6...7), through: 7)
        #expect(machine.nextBatch() == .upload(numbers: 6...7))
        #expect(machine.uploaded(outcomes: [.applied, .applied]) == .markUploaded(through: 7, refusals: []))
        #expect(machine.nextBatch() == .idle)
    }

    @Test func aGapBetweenTheServersLastAndTheHandedChangeSetsReadsTheQueue() {
        var machine = UploadStateMachine(queuedThrough: 5, maximumBatch: 100, maximumBytes: 1)
        machine.connected(uploadedThrough: 3)
        #expect(machine.nextBatch() == .markUploaded(through: 3, refusals: []))  // the queue drops what the server has
        machine.localCommitted(Self.entries(6...6), through: 6)
        #expect(machine.nextBatch() == .readQueue(after: 3, limit: 100, bytes: 1))
        #expect(machine.queueRead(Self.entries(4...6)) == .upload(numbers: 4...6))
    }

    @Test func handedChangeSetsPastTheLimitAreDroppedAndReadFromTheQueue() {
        var machine = UploadStateMachine(queuedThrough: 0, maximumBatch: 1_000)
        machine.connected(uploadedThrough: 0)
        let many = Int64(UploadStateMachine.handedLimit + 1)
        machine.localCommitted(Self.entries(1...many), through: many)
        #expect(machine.nextBatch() == .readQueue(after: 0, limit: 1_000, bytes: 8 << 20))
    }

    @Test func moreHandedChangeSetsThanABatchReadTheQueue() {
        var machine = UploadStateMachine(queuedThrough: 0, maximumBatch: 2, maximumBytes: 10)
        machine.connected(uploadedThrough: 0)
        machine.localCommitted(Self.entries(1...3), through: 3)
        #expect(machine.nextBatch() == .readQueue(after: 0, limit: 2, bytes: 10))
    }

    @Test func refusalsShrinkTheBatchToAQuarterDownToSixteenAndBatchesWithoutThemGrowItBack() {
        var machine = UploadStateMachine(queuedThrough: nil, maximumBatch: 1_000, maximumBytes: 1)
        machine.connected(uploadedThrough: 0)
        var next: Int64 = 1
        func refuse(_ refused: Bool) -> UploadStateMachine.Action {
            _ = machine.nextBatch()
            _ = machine.queueRead(Self.entries(next...next))
            defer { next += 1 }
            return machine.uploaded(outcomes: [refused ? .rejected("duplicate handle") : .applied])
        }
        #expect(refuse(true) == .markUploaded(through: 1, refusals: [.init(number: 1, reason: "duplicate handle")]))
        #expect(machine.batchLimit == 250)
        _ = refuse(true)
        #expect(machine.batchLimit == 62)
        _ = refuse(true)
        #expect(machine.batchLimit == 16)
        _ = refuse(true)
        #expect(machine.batchLimit == UploadStateMachine.minimumBatch)
        #expect(machine.nextBatch() == .readQueue(after: 4, limit: 16, bytes: 1))
        _ = refuse(false)
        #expect(machine.batchLimit == 32)
        for _ in 0..<10 { _ = refuse(false) }
        #expect(machine.batchLimit == 1_000)
    }

    @Test func eachConnectionStartsWithAFullBatchAtTheServersNumber() {
        var machine = UploadStateMachine(queuedThrough: nil, maximumBatch: 1_000, maximumBytes: 1)
        machine.connected(uploadedThrough: 0)
        _ = machine.nextBatch()
        _ = machine.queueRead(Self.entries(1...2))
        _ = machine.uploaded(outcomes: [.rejected("no"), .applied])
        #expect(machine.batchLimit == 250)
        machine.disconnected()
        #expect(machine.nextBatch() == .idle)
        // The server had more than this machine knew (a reply lost with the connection).
        machine.connected(uploadedThrough: 9)
        #expect(machine.nextBatch() == .markUploaded(through: 9, refusals: []))  // the queue drops what the server has
        #expect(machine.nextBatch() == .readQueue(after: 9, limit: 1_000, bytes: 1))
    }

    @Test func anUploadLostWithItsConnectionIsNotMarked() {
        var machine = UploadStateMachine(queuedThrough: 2)
        machine.connected(uploadedThrough: 0)
        machine.localCommitted(Self.entries(1...2), through: 2)
        #expect(machine.nextBatch() == .upload(numbers: 1...2))
        machine.disconnected()
        #expect(machine.uploadedThrough == 0)
        #expect(machine.uploaded(outcomes: []) == .idle)
    }
}
