import Foundation
import Skyros
import SkyrosTestSupport
import SkyrosWire
import Testing

@testable import SkyrosDaemon

/// The values of a `Sample` (every attribute type), as its property order has them.
private func sampleValues() -> StoredValues {
    StoredValues([
        .text("s"), .integer(1), .integer(2), .integer(3), .integer(4), .real(5.5), .real(6.5), .integer(1), .real(7),
        .blob(Data([8])), .blob(Data(repeating: 9, count: 16)), .text("https://example.com/10"), .text("p5021125"),
        .text("todo"), .integer(1), .blob(Data("{}".utf8)), .null, .null, .null, .null, .null, .integer(0),
    ])
}

/// Indexes of `Sample`'s properties used below.
private enum SampleIndex {
    static let int32 = 3, int16 = 4, double = 5, bool = 7, date = 8, uuid = 10, optionalDate = 18
}

private func sampleSave(_ client: String, _ number: UInt64, _ changes: ChangeSet) -> GroupCommit.Save {
    GroupCommit.Save(
        identity: Data(client.utf8), requestID: number, clientID: .named(client), saveNumber: number,
        changes: changes, author: client, topic: 1)
}

/// What is stored is what is published: every value is checked against its property's type
/// before it is stored, converted where the protocol allows it, and the event, the history and
/// a fetch afterwards hold the same values.
@Suite("Stored values are published values")
struct StoredValueTests {
    @Test("an integer for a real, a real for an integer: stored, published and recorded converted")
    func converted() throws {
        let journaled = try JournaledStore()
        var values = sampleValues()
        values[SampleIndex.date] = .integer(7)
        values[SampleIndex.int32] = .real(3)
        let id = ObjectID.make(entityName: "Sample")
        let inserted = journaled.run([sampleSave("a", 1, ChangeSet(inserted: [Snapshot(id: id, values: values)]))])
        #expect(answers(inserted) == ["saved 1"])
        let stored = try #require(try journaled.store.snapshots(for: [id]).first)
        #expect(stored.values[SampleIndex.date] == .real(7))
        #expect(stored.values[SampleIndex.int32] == .integer(3))
        #expect(inserted.events.first?.event.inserted.first?.values == stored.values)

        let update = ChangeSet(updated: [
            .init(id: id, changes: [SampleIndex.date: .integer(9), SampleIndex.double: .integer(2)])
        ])
        let updated = journaled.run([sampleSave("a", 2, update)])
        #expect(answers(updated) == ["saved 2"])
        let after = try #require(try journaled.store.snapshots(for: [id]).first)
        #expect(after.values[SampleIndex.date] == .real(9) && after.values[SampleIndex.double] == .real(2))
        let published = try #require(updated.events.first?.event.updated.first)
        #expect(published.values == [SampleIndex.date: .real(9), SampleIndex.double: .real(2)])
        // The history holds the event as published.
        let page = try Journal.changes(since: 0, current: journaled.commit.sequence, limit: 10, in: journaled.store)
        #expect(page.events.map(\.updated.first?.values) == [nil, published.values])

        let batch = BatchOperation.update(
            StoreRequest(entityName: "Sample"), assignments: [SampleIndex.date: .integer(11)])
        var save = sampleSave("a", 3, ChangeSet())
        save.batch = batch
        let batched = journaled.run([save])
        guard case .success(.batch(_, let event))? = batched.results.first else {
            Issue.record("batch: \(answers(batched))")
            return
        }
        #expect(event.updated.first?.values == [SampleIndex.date: .real(11)])
        #expect(try journaled.store.snapshots(for: [id]).first?.values[SampleIndex.date] == .real(11))
    }

    @Test("values their type cannot hold are refused with typeMismatch naming the property, nothing stored")
    func refused() throws {
        let journaled = try JournaledStore()
        let cases: [(Int, StoredValue, String)] = [
            (SampleIndex.optionalDate, .real(.nan), "Sample.optionalDate"),
            (SampleIndex.double, .real(.nan), "Sample.double"),
            (SampleIndex.bool, .integer(2), "Sample.bool"),
            (SampleIndex.uuid, .blob(Data(repeating: 1, count: 15)), "Sample.uuid"),
            (SampleIndex.int16, .integer(70_000), "Sample.int16"),
            (SampleIndex.int32, .integer(Int64(Int32.max) + 1), "Sample.int32"),
            (SampleIndex.date, .null, "Sample.date"),
            (SampleIndex.date, .integer((1 << 62) + 1), "Sample.date"),
        ]
        for (index, value, name) in cases {
            var values = sampleValues()
            values[index] = value
            let id = ObjectID.make(entityName: "Sample")
            let insert = journaled.run([sampleSave("i", 1, ChangeSet(inserted: [Snapshot(id: id, values: values)]))])
            #expect(answers(insert) == ["typeMismatch"], "insert \(name) \(value)")
            if case .failure(let error)? = insert.results.first {
                #expect(error.message.hasPrefix(name + " is "), Comment(rawValue: error.message))
                #expect(!error.message.contains("constraint failed"))
            }
        }
        let id = ObjectID.make(entityName: "Sample")
        #expect(
            answers(
                journaled.run([sampleSave("u", 1, ChangeSet(inserted: [Snapshot(id: id, values: sampleValues())]))]))
                == ["saved 1"])
        for (index, value, name) in cases {
            let update = journaled.run([
                sampleSave("u", 2, ChangeSet(updated: [.init(id: id, changes: [index: value])]))
            ])
            #expect(answers(update) == ["typeMismatch"], "update \(name) \(value)")
            var save = sampleSave("u", 2, ChangeSet())
            save.batch = .update(StoreRequest(entityName: "Sample"), assignments: [index: value])
            let batch = journaled.run([save])
            #expect(answers(batch) == ["typeMismatch"], "batch \(name) \(value)")
            if case .failure(let error)? = batch.results.first {
                #expect(error.message.hasPrefix(name + " is "), Comment(rawValue: error.message))
            }
        }
        #expect(try journaled.history() == [1])
        #expect(try journaled.store.snapshots(for: [id]).first?.values == sampleValues())
    }
}
