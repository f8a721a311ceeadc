import Foundation
import Skyros
import SkyrosTestSupport
import SkyrosWire
import Testing

@testable import SkyrosDaemon

/// A store with the daemon's journal in a temporary directory, and a group commit on it.
final class JournaledStore {
    let directory: URL
    let store: SQLiteStore
    var commit: GroupCommit

    init(retentionCount: Int = 100_000) throws {
        directory = URL(fileURLWithPath: NSTemporaryDirectory()).appendingPathComponent("gc-\(UUID().uuidString)")
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        store = try SQLiteStore(schema: testSchema, url: directory.appendingPathComponent("store.sqlite"))
        let opened = try Journal.open(store)
        commit = GroupCommit(
            sequence: opened.sequence, retention: .init(count: retentionCount, age: 7 * 86_400), saves: opened.saves)
    }

    /// A group commit as a restarted daemon makes it: nothing in memory, what the store's
    /// journal records (its history's saves, then `skyros_saves`) decides.
    func restarted() throws -> GroupCommit {
        let opened = try Journal.open(store)
        return GroupCommit(sequence: opened.sequence, retention: commit.retention, saves: opened.saves)
    }

    deinit {
        try? store.close()
        try? FileManager.default.removeItem(at: directory)
    }

    /// Commits the saves of one turn.
    func run(_ saves: [GroupCommit.Save], resetting: Int? = nil) -> GroupCommit.Outcome {
        commit.commit(saves, resetting: resetting, in: store)
    }

    /// Sequences of the history rows, in order.
    func history() throws -> [Int64] {
        try store.rows("SELECT sequence FROM skyros_history ORDER BY sequence").compactMap {
            if case .integer(let value) = $0[0] { value } else { nil }
        }
    }

    /// The number of users stored.
    func users() throws -> Int64 {
        guard case .integer(let count)? = try store.rows("SELECT count(*) FROM \"User\"").first?.first else {
            return -1
        }
        return count
    }
}

/// A save of a user with a handle, as `client` with save number `number`.
func userSave(_ client: String, _ number: UInt64, handle: String) -> GroupCommit.Save {
    GroupCommit.Save(
        identity: Data(client.utf8), requestID: number, clientID: .named(client), saveNumber: number,
        changes: ChangeSet(inserted: [userSnapshot(handle)]), author: client, topic: 1)
}

/// What each save of a commit was answered: the sequence, or the error's code.
func answers(_ outcome: GroupCommit.Outcome) -> [String] {
    outcome.results.map { result in
        switch result {
        case .success(.saved(let sequence)): "saved \(sequence)"
        case .success(.batch(let affected, let event)): "batch \(affected) at \(event.sequence)"
        case .failure(let error): error.code.rawValue
        }
    }
}

/// The group commit against a store alone: one transaction per turn, savepoints when a save
/// fails, exactly once across retries and restarts, retention in the same transaction.
@Suite("Group commit")
struct GroupCommitTests {
    @Test("the saves of a turn commit in one transaction, each with the next sequence, in order")
    func together() throws {
        let journaled = try JournaledStore()
        let outcome = journaled.run([
            userSave("a", 1, handle: "a1"), userSave("b", 1, handle: "b1"), userSave("a", 2, handle: "a2"),
        ])
        #expect(outcome.committed)
        #expect(answers(outcome) == ["saved 1", "saved 2", "saved 3"])
        #expect(outcome.events.map(\.event.sequence) == [1, 2, 3])
        #expect(outcome.events.map(\.event.author) == ["a", "b", "a"])
        #expect(outcome.events.allSatisfy { $0.topic == 1 && $0.event.inserted.count == 1 })
        #expect(journaled.commit.sequence == 3)
        #expect(try journaled.history() == [1, 2, 3])
        #expect(try journaled.users() == 3)
    }

    @Test("one bad change set fails alone: the turn is applied again, each save in its own savepoint")
    func failsAlone() throws {
        let journaled = try JournaledStore()
        let outcome = journaled.run([
            userSave("a", 1, handle: "same"), userSave("b", 1, handle: "same"), userSave("c", 1, handle: "c1"),
        ])
        #expect(outcome.committed)
        #expect(answers(outcome) == ["saved 1", "uniqueConstraintViolation", "saved 2"])
        #expect(outcome.events.map(\.event.sequence) == [1, 2])
        #expect(try journaled.history() == [1, 2])
        #expect(try journaled.users() == 2)
        // The failed save took no sequence and is not known as applied: sent again, fixed, it is.
        let retried = journaled.run([userSave("b", 1, handle: "b1")])
        #expect(answers(retried) == ["saved 3"])
    }

    @Test("a turn of one save that fails is rolled back whole: nothing stored, no sequence given")
    func oneFails() throws {
        let journaled = try JournaledStore()
        _ = journaled.run([userSave("a", 1, handle: "taken")])
        let outcome = journaled.run([userSave("b", 1, handle: "taken")])
        #expect(!outcome.committed)
        #expect(answers(outcome) == ["uniqueConstraintViolation"])
        #expect(outcome.events.isEmpty)
        #expect(journaled.commit.sequence == 1)
        #expect(try journaled.history() == [1])
    }

    @Test("a save is applied exactly once: resent in the same turn, in a later turn, and after a restart")
    func exactlyOnce() throws {
        let journaled = try JournaledStore()
        let first = journaled.run([userSave("a", 1, handle: "a1"), userSave("a", 1, handle: "a1")])
        #expect(answers(first) == ["saved 1", "saved 1"])
        #expect(first.events.count == 1)
        let later = journaled.run([userSave("a", 2, handle: "a2"), userSave("a", 1, handle: "a1")])
        #expect(answers(later) == ["saved 2", "saved 1"])  // an older save: answered from the history
        // A restarted daemon knows nothing in memory: the store's records decide.
        var restarted = try journaled.restarted()
        let again = restarted.commit(
            [userSave("a", 2, handle: "a2"), userSave("a", 1, handle: "a1"), userSave("a", 3, handle: "a3")],
            in: journaled.store)
        #expect(answers(again) == ["saved 2", "saved 1", "saved 3"])
        #expect(try journaled.history() == [1, 2, 3])
        #expect(try journaled.users() == 3)
    }

    @Test("a retry in the same turn as a failing save is still answered once, from its first application")
    func retryBesideAFailure() throws {
        let journaled = try JournaledStore()
        let outcome = journaled.run([
            userSave("a", 1, handle: "x"), userSave("b", 1, handle: "x"), userSave("a", 1, handle: "x"),
        ])
        // The second attempt (savepoints) starts from what the ledger knew before the turn.
        #expect(answers(outcome) == ["saved 1", "uniqueConstraintViolation", "saved 1"])
        #expect(try journaled.history() == [1])
    }

    @Test("a reset empties the store in a change set of its own, after the saves before it")
    func reset() throws {
        let journaled = try JournaledStore()
        var reset = GroupCommit.Save(
            identity: Data("r".utf8), requestID: 9, clientID: .named("r"), saveNumber: 1, changes: ChangeSet(),
            author: "resetter")
        reset.topic = 2
        let outcome = journaled.run(
            [
                userSave("a", 1, handle: "a1"), userSave("b", 1, handle: "b1"), reset,
            ], resetting: 2)
        #expect(answers(outcome) == ["saved 1", "saved 2", "saved 3"])
        #expect(outcome.events.map(\.event.kind) == [.changes, .changes, .reset])
        #expect(
            outcome.log.count == 1 && outcome.log[0].contains("deleted 2 objects")
                && outcome.log[0].contains("'resetter'"))
        #expect(try journaled.users() == 0)
    }

    @Test("the history keeps its retention count, pruned in the commit's transaction")
    func retention() throws {
        let journaled = try JournaledStore(retentionCount: 2)
        var pruned = 0
        for number in UInt64(1)...4 {
            let outcome = journaled.run([userSave("a", number, handle: "a\(number)")])
            pruned += outcome.pruned.changeSets
        }
        #expect(try journaled.history() == [3, 4])
        #expect(pruned == 2)
    }

    @Test(
        "a record is its history row; when the retention prunes a client's last row it moves to skyros_saves, and a restart still answers its retry once"
    )
    func recordLeavesTheHistory() throws {
        let journaled = try JournaledStore(retentionCount: 2)
        #expect(answers(journaled.run([userSave("a", 1, handle: "a1")])) == ["saved 1"])
        // No separate record while the history keeps the row.
        #expect(try journaled.store.rows("SELECT count(*) FROM skyros_saves") == [[.integer(0)]])
        #expect(
            answers(journaled.run([userSave("b", 1, handle: "b1"), userSave("b", 2, handle: "b2")])) == [
                "saved 2", "saved 3",
            ])
        // Rows 1 and 2 are pruned: a's last save and b's first; a's record is kept, b's is row 3.
        #expect(try journaled.history() == [2, 3] || journaled.history() == [3])
        #expect(
            try journaled.store.rows("SELECT client, save, sequence FROM skyros_saves")
                == [[.text(UUID.named("a").uuidString), .integer(1), .integer(1)]])
        // In memory, and after a restart, a's retry is answered once and its next save follows it.
        #expect(answers(journaled.run([userSave("a", 1, handle: "a1")])) == ["saved 1"])
        var restarted = try journaled.restarted()
        #expect(
            answers(
                restarted.commit([userSave("a", 1, handle: "a1"), userSave("b", 2, handle: "b2")], in: journaled.store))
                == ["saved 1", "saved 3"])
        #expect(
            answers(restarted.commit([userSave("a", 3, handle: "a3")], in: journaled.store)) == ["saveNumberSkipped"])
        #expect(
            answers(
                restarted.commit([userSave("a", 2, handle: "a2"), userSave("b", 3, handle: "b3")], in: journaled.store))
                == ["saved 4", "saved 5"])
        #expect(try journaled.users() == 5)
    }

    @Test("a history dropped for a new schema version keeps each client's last save as its record")
    func recordsSurviveTheHistoryReset() throws {
        let journaled = try JournaledStore()
        _ = journaled.run([userSave("a", 1, handle: "a1"), userSave("b", 1, handle: "b1")])
        _ = journaled.run([userSave("a", 2, handle: "a2")])
        // As after a migration: the history's schema version is not the store's.
        try journaled.store.transaction { transaction in
            try transaction.execute("UPDATE skyros_metadata SET value = '0' WHERE key = 'historySchemaVersion'")
        }
        var restarted = try journaled.restarted()
        #expect(try journaled.history() == [4])  // the schemaChanged event alone
        #expect(
            answers(
                restarted.commit(
                    [userSave("a", 2, handle: "a2"), userSave("b", 1, handle: "b1"), userSave("b", 3, handle: "b3")],
                    in: journaled.store))
                == ["saved 3", "saved 2", "saveNumberSkipped"])
        #expect(try journaled.users() == 3)
    }

    @Test(
        "a save number that skips ahead is refused and not applied: no save is answered 'saved' without being applied")
    func skippedSaveNumber() throws {
        let journaled = try JournaledStore()
        #expect(answers(journaled.run([userSave("a", 1, handle: "a1")])) == ["saved 1"])
        let skipped = journaled.run([userSave("a", 5, handle: "a5")])
        #expect(answers(skipped) == ["saveNumberSkipped"])
        #expect(skipped.events.isEmpty)
        if case .failure(let error) = skipped.results.first {
            #expect(error.message.contains("save 5") && error.message.contains("the next one is 2"))
        }
        // Save 3, never sent before, is refused too (it was answered "saved" with sequence 0 and dropped).
        #expect(answers(journaled.run([userSave("a", 3, handle: "a3")])) == ["saveNumberSkipped"])
        // In one turn, in order: 2 then 3 are applied, 5 still skips.
        let inOrder = journaled.run([
            userSave("a", 2, handle: "a2"), userSave("a", 3, handle: "a3"), userSave("a", 5, handle: "a5"),
        ])
        #expect(answers(inOrder) == ["saved 2", "saved 3", "saveNumberSkipped"])
        // After a restart, the store's record decides the same way.
        var restarted = try journaled.restarted()
        #expect(
            answers(restarted.commit([userSave("a", 5, handle: "a5")], in: journaled.store)) == ["saveNumberSkipped"])
        #expect(answers(restarted.commit([userSave("a", 4, handle: "a4")], in: journaled.store)) == ["saved 4"])
        #expect(try journaled.users() == 4)
        // A client without a record (new, or silent past the history age) starts at any number.
        let fresh = restarted.commit([userSave("b", 7, handle: "b7")], in: journaled.store)
        #expect(answers(fresh) == ["saved 5"], "\(fresh.results)")
    }
}

/// The journal's own formatting of client IDs and the activity's latency sample.
@Suite("Journal text and activity sampling")
struct JournalTextTests {
    @Test("a UUID's text is Foundation's uuidString, and sorts as the bytes do")
    func uuidText() {
        var ids = (0..<200).map { _ in UUID() }
        ids += [
            UUID(uuid: (0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0)),
            UUID(uuid: (255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255, 255)),
            UUID(uuidString: "0A1B2C3D-4E5F-6A7B-8C9D-AEBFC0D1E2F3")!,
        ]
        for id in ids { #expect(id.text == id.uuidString) }
        let byText = ids.sorted { $0.text < $1.text }
        func bytes(_ id: UUID) -> [UInt8] { withUnsafeBytes(of: id.uuid) { Array($0) } }
        let byBytes = ids.sorted { bytes($0).lexicographicallyPrecedes(bytes($1)) }
        #expect(byText == byBytes)
    }

    @Test("past the latencies kept per second, later saves still enter the sample, and the count stays exact")
    func latencySample() {
        var activity = ClientActivity()
        let identity = Data([1, 2, 3])
        let now = Date()
        let saves = ClientActivity.latenciesPerSecond * 3
        // The first half fast, the second slow: a sample that kept only the first would say 1 µs.
        for index in 0..<saves { activity.saved(identity, latency: index < saves / 2 ? 1e-6 : 1e-3, now: now) }
        let minute = activity.lastMinute(since: now.addingTimeInterval(-1), now: now)
        #expect(minute.perSecond == Double(saves))
        #expect(minute.p99 == 1000)
        #expect(minute.p50 != nil)
    }
}
