import Foundation
import Skyros
import SkyrosTestSupport
import Testing

@testable import SkyrosDaemon

/// A sync checkpoint's change set whose objects exchange unique values (issue 57, item 6),
/// committed by the group commit against a store alone: applied in one transaction with
/// the final values only, unless it ends with a genuine duplicate.
@Suite("Unique values permuted in a checkpoint")
struct UniquePermutationTests {
    /// `User.handle`'s property index.
    static let handle = 4

    /// A checkpoint's change set as the daemon commits it (authored `sync`).
    static func checkpointSave(_ changes: ChangeSet, number: UInt64) -> GroupCommit.Save {
        GroupCommit.Save(
            identity: Data(), requestID: 0, clientID: DaemonTurn.syncAuthorID, saveNumber: number,
            changes: changes, author: "sync", fromSync: true)
    }

    static func rename(_ id: ObjectID, _ handle: String) -> ChangeSet.Update {
        ChangeSet.Update(id: id, changes: [Self.handle: .text(handle)])
    }

    /// The stored users' handles by id, and their versions.
    static func stored(_ store: SQLiteStore) throws -> [UUID: (handle: String, version: Int64)] {
        var result: [UUID: (handle: String, version: Int64)] = [:]
        for row in try store.rows("SELECT \"_id\", handle, \"_version\" FROM \"User\"") {
            guard let id = UUID(storedValue: row[0]), case .text(let handle) = row[1],
                case .integer(let version) = row[2]
            else { continue }
            result[id] = (handle, version)
        }
        return result
    }

    /// A store with users `ann`, `bob`, `cy`, `dee`; their ids in that order.
    static func fourUsers(_ journaled: JournaledStore) throws -> [ObjectID] {
        let snapshots = ["ann", "bob", "cy", "dee"].map(userSnapshot)
        let outcome = journaled.run([
            GroupCommit.Save(
                identity: Data("a".utf8), requestID: 1, clientID: .named("a"), saveNumber: 1,
                changes: ChangeSet(inserted: snapshots), author: "a", topic: 1)
        ])
        #expect(answers(outcome) == ["saved 1"])
        return snapshots.map(\.id)
    }

    @Test(
        "a swap and a rotation of handles in one checkpoint are applied, each object's version raised once, the event carrying the final values only"
    )
    func permutations() throws {
        let journaled = try JournaledStore()
        let ids = try Self.fourUsers(journaled)
        let (ann, bob, cy, dee) = (ids[0], ids[1], ids[2], ids[3])
        let outcome = journaled.run([
            Self.checkpointSave(
                ChangeSet(updated: [
                    Self.rename(ann, "bob"), Self.rename(bob, "ann"),  // a swap
                    Self.rename(cy, "dee"), Self.rename(dee, "eve"),  // a chain
                ]), number: 1)
        ])
        #expect(answers(outcome) == ["saved 2"])
        var stored = try Self.stored(journaled.store)
        #expect(stored[ann.uuid]?.handle == "bob")
        #expect(stored[bob.uuid]?.handle == "ann")
        #expect(stored[cy.uuid]?.handle == "dee")
        #expect(stored[dee.uuid]?.handle == "eve")
        #expect(stored.values.allSatisfy { $0.version == 2 }, "one version per update, none for the placeholders")
        let event = try #require(outcome.events.first?.event)
        #expect(
            Set(event.updated.map { "\($0.id.uuid):\($0.values[Self.handle].map { "\($0)" } ?? "-")" })
                == Set(
                    [(ann, "bob"), (bob, "ann"), (cy, "dee"), (dee, "eve")].map {
                        "\($0.0.uuid):\(StoredValue.text($0.1))"
                    }))

        // A rotation of three (ann takes bob's value, bob cy's, cy ann's), and an insert
        // taking the value an update frees.
        let newcomer = userSnapshot("eve")
        let rotated = journaled.run([
            Self.checkpointSave(
                ChangeSet(
                    inserted: [newcomer],
                    updated: [
                        Self.rename(ann, "ann"), Self.rename(bob, "dee"), Self.rename(cy, "bob"),
                        Self.rename(dee, "eve2"),
                    ]),
                number: 2)
        ])
        #expect(answers(rotated) == ["saved 3"])
        stored = try Self.stored(journaled.store)
        #expect(stored[ann.uuid]?.handle == "ann")
        #expect(stored[bob.uuid]?.handle == "dee")
        #expect(stored[cy.uuid]?.handle == "bob")
        #expect(stored[dee.uuid]?.handle == "eve2")
        #expect(stored[newcomer.id.uuid]?.handle == "eve")
        #expect(
            try journaled.store.rows("SELECT count(*) FROM \"User\" WHERE handle LIKE 'skyros-placeholder-%'") == [
                [.integer(0)]
            ])
    }

    @Test(
        "a checkpoint that ends with two objects holding one value is refused as before, naming both; nothing of it is stored"
    )
    func genuineDuplicateRefused() throws {
        let journaled = try JournaledStore()
        let ids = try Self.fourUsers(journaled)
        let (ann, bob, cy) = (ids[0], ids[1], ids[2])
        let before = try Self.stored(journaled.store)
        // ann and bob swap, and cy takes `ann` too: bob's new value is held by two at the end.
        let outcome = journaled.run([
            Self.checkpointSave(
                ChangeSet(updated: [Self.rename(ann, "bob"), Self.rename(bob, "ann"), Self.rename(cy, "ann")]),
                number: 1)
        ])
        #expect(!outcome.committed)
        guard case .failure(let error)? = outcome.results.first else {
            Issue.record("the checkpoint was applied: \(answers(outcome))")
            return
        }
        #expect(error.code == .uniqueConstraintViolation)
        #expect(error.message.contains("User.handle must be unique"), "\(error.message)")
        #expect(error.message.contains("both hold 'ann'"), "\(error.message)")
        // An update to a value an object keeps (dee is not in the checkpoint).
        let kept = journaled.run([Self.checkpointSave(ChangeSet(updated: [Self.rename(ann, "dee")]), number: 2)])
        #expect(answers(kept) == ["uniqueConstraintViolation"])
        let after = try Self.stored(journaled.store)
        #expect(after.mapValues(\.handle) == before.mapValues(\.handle))
        #expect(after.mapValues(\.version) == before.mapValues(\.version))
    }

    @Test("a client's change set is not relaxed: a swap without a temporary value is refused")
    func clientSwapRefused() throws {
        let journaled = try JournaledStore()
        let ids = try Self.fourUsers(journaled)
        let outcome = journaled.run([
            GroupCommit.Save(
                identity: Data("a".utf8), requestID: 2, clientID: .named("a"), saveNumber: 2,
                changes: ChangeSet(updated: [Self.rename(ids[0], "bob"), Self.rename(ids[1], "ann")]), author: "a",
                topic: 1)
        ])
        #expect(answers(outcome) == ["uniqueConstraintViolation"])
    }
}
