import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// The model's own validation rules (`ValidatingObject`), on every stack: `Player`'s rules in
/// SkyrosTestSupport.
@Suite("Validation rules", .timeLimit(.minutes(3)))
struct ValidationTests {
    /// The error of a write expected to fail validation.
    func validationError(_ stack: TestStack, _ changes: (ObjectContext) throws -> Void) throws -> SkyrosError {
        do {
            try stack.store.writeAndWait(changes)
        } catch let error as SkyrosError {
            return error
        }
        Issue.record("the write was saved")
        return SkyrosError(.blockFailed, "saved")
    }

    func names(_ stack: TestStack) throws -> [String] {
        try stack.store.read { context in try Player.all(in: context).map(\.name).sorted() }
    }

    @Test(
        "every failing rule of a save is reported, by object and property, and nothing of the save is stored",
        arguments: StoreKind.allCases)
    func insertRefused(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var ids: [String: ObjectID] = [:]
        let error = try validationError(stack) { context in
            for name in ["INVALID one", "INVALID two", "REFUSED", "fine"] {
                let player = Player.create(in: context)
                player.name = name
                ids[name] = player.objectID
            }
        }
        #expect(error.code == .validationFailed)
        let failures = error.validationFailures.map {
            "\($0.objectID == ids["INVALID one"] ? "one" : $0.objectID == ids["INVALID two"] ? "two" : $0.objectID == ids["REFUSED"] ? "refused" : "?") \($0.property ?? "-")"
        }
        #expect(failures.sorted() == ["one name", "refused -", "two name"])
        #expect(error.validationFailures.contains { ($0.error as? Player.Rule) == .refused })
        #expect(error.message.contains("3 validation rule(s)"))
        #expect(try names(stack) == [])
        // The same objects, valid: saved.
        try stack.store.writeAndWait { context in Player.create(in: context).name = "fine" }
        #expect(try names(stack) == ["fine"])
    }

    @Test(
        "an update is checked on the properties it changed, then as a whole; a refused one leaves the store as it was",
        arguments: StoreKind.allCases)
    func updateRefused(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        try stack.store.writeAndWait { context in Player.create(in: context).name = "before" }
        for refused in ["INVALID now", "FROZEN"] {
            let error = try validationError(stack) { context in
                try #require(try Player.first(in: context)).name = refused
            }
            #expect(error.code == .validationFailed)
            #expect(error.validationFailures.count == 1)
            #expect(error.validationFailures.first?.property == (refused == "FROZEN" ? nil : "name"))
            #expect(try names(stack) == ["before"])
        }
        try stack.store.writeAndWait { context in try #require(try Player.first(in: context)).name = "after" }
        #expect(try names(stack) == ["after"])
    }

    @Test("a deletion refused by validateForDelete keeps the object; other deletions go", arguments: StoreKind.allCases)
    func deleteRefused(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        try stack.store.writeAndWait { context in
            Player.create(in: context).name = "UNDELETABLE"
            Player.create(in: context).name = "gone"
        }
        let error = try validationError(stack) { context in try Player.deleteAll(in: context) }
        #expect(error.code == .validationFailed)
        #expect(error.validationFailures.map { $0.error as? Player.Rule } == [.undeletable])
        #expect(try names(stack) == ["UNDELETABLE", "gone"])
        try stack.store.writeAndWait { context in
            for player in try Player.all(in: context) where player.name == "gone" { player.delete(in: context) }
        }
        #expect(try names(stack) == ["UNDELETABLE"])
    }

    @Test("a change validated in a child context is not validated again by its parent; a change made in the parent is")
    func validatedWhereMade() throws {
        let store = try SQLiteStore(schema: testSchema, url: nil)
        let root = ObjectContext(name: "root", parent: store)
        let main = ObjectContext(name: "main", parent: root)
        let scratch = ObjectContext(name: "scratch", parent: main)
        try scratch.performAndWait {
            Player.create(in: scratch).name = "fine"
            try scratch.save()
        }
        // In the main context the player is an inserted row turned into an object: its
        // rules ran in the scratch context. A change made here runs them again.
        try main.performAndWait {
            let player = try #require(try Player.first(in: main))
            #expect(player.isInserted)
            player.name = "INVALID in main"
            #expect(throws: SkyrosError.self) { try main.save() }
            player.name = "fine again"
            try main.save()
        }
        try root.performAndWait { try root.save() }
        #expect(try store.count(StoreRequest(entityName: "Player")) == 1)
    }
}
