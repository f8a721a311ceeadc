import Foundation
import SkyrosTestSupport
import Testing

@testable import Skyros

/// A child's save that updates objects its parent context does not hold: the parent keeps them
/// as faults carrying the changes (Core Data's parent does the same) instead of reading their
/// rows, and reads them only if it is asked for them; the changes and the version they were
/// made on reach the store either way. Real SQLite store, contexts by hand.
@Suite("Updates passing through a context that does not hold their objects", .timeLimit(.minutes(3)))
struct PassThroughUpdateTests {
    let directory: TemporaryDirectory
    let store: SQLiteStore
    let root: ObjectContext
    let main: ObjectContext

    init() throws {
        directory = try TemporaryDirectory()
        store = try SQLiteStore(schema: testSchema, url: directory.url.appendingPathComponent("store.sqlite"))
        root = ObjectContext(name: "root", parent: store)
        main = ObjectContext(name: "main", parent: root)
        let writer = ObjectContext(name: "writer", parent: store)
        try writer.performAndWait {
            makeUsers([("Ada", "Lovelace"), ("Alan", "Turing"), ("Grace", "Hopper")], in: writer)
            try writer.save()
        }
    }

    /// A scratch context of `main` that renames Ada and saves into `main`.
    func renameAdaInScratch(to firstname: String) throws -> ObjectID {
        let scratch = ObjectContext(name: "scratch", parent: main)
        return try scratch.performAndWait {
            let ada = try #require(try User.first(where: #Predicate { $0.handle == "ada-lovelace" }, in: scratch))
            ada.firstname = firstname
            try scratch.save()
            return ada.objectID
        }
    }

    func stored(_ id: ObjectID) throws -> Snapshot {
        try #require(try store.snapshots(for: [id]).first)
    }

    /// A scratch context of `main` sets Ada's and Alan's ages and saves into `main`; then Ada
    /// is deleted from the store behind the contexts' backs.
    func ageAdaAndAlanThenDeleteAdaInStore() throws -> (ada: ObjectID, alan: ObjectID) {
        let scratch = ObjectContext(name: "scratch", parent: main)
        let ids = try scratch.performAndWait {
            let ada = try #require(try User.first(where: #Predicate { $0.handle == "ada-lovelace" }, in: scratch))
            let alan = try #require(try User.first(where: #Predicate { $0.handle == "alan-turing" }, in: scratch))
            ada.age = 36
            alan.age = 41
            try scratch.save()
            return (ada: ada.objectID, alan: alan.objectID)
        }
        var deletion = ChangeSet()
        deletion.deleted = [ids.ada]
        try store.save(deletion)
        return ids
    }

    @Test("the parent holds a fault with the change, and saves it on without reading the row")
    func faultCarriesTheChange() throws {
        let id = try renameAdaInScratch(to: "Augusta")
        main.performAndWait {
            let storage = main.updated[id]?.skyrosStorage
            #expect(storage?.isFault == true)
            #expect(storage?.changed == [User.schemaIndex("firstname")])
            #expect(storage?.version == 1)  // the version the change was made on
        }
        try main.performAndWait { try main.save() }
        root.performAndWait { #expect(root.updated[id]?.skyrosStorage.isFault == true) }
        try root.performAndWait { try root.save() }
        let row = try stored(id)
        #expect(row.values[User.schemaIndex("firstname")] == .text("Augusta"))
        #expect(row.values[User.schemaIndex("lastname")] == .text("Lovelace"))
        #expect(row.version == 2)
    }

    @Test("asked for it, the parent reads the row once, under the pending change: fetches, counts, a child's read")
    func readWhenAsked() throws {
        let id = try renameAdaInScratch(to: "Augusta")
        try main.performAndWait {
            // A fetch that merges pending changes sees the change and the row's other values.
            let found = try User.all(where: #Predicate { $0.firstname == "Augusta" }, in: main)
            #expect(found.map(\.objectID) == [id])
            #expect(found.first?.lastname == "Lovelace")
            #expect(try User.count(where: #Predicate { $0.firstname == "Ada" }, in: main) == 0)
            #expect(try User.count(in: main) == 3)
            let storage = try #require(main.updated[id]?.skyrosStorage)
            #expect(!storage.isFault)
            #expect(storage.version == 1)  // still the version the change was made on
        }
        // Another child reads it through main: the pending change, over the row.
        let other = ObjectContext(name: "other", parent: main)
        try other.performAndWait {
            let ada = try #require(other.object(with: id) as? User)
            #expect(ada.firstname == "Augusta" && ada.lastname == "Lovelace")
        }
    }

    @Test("a child's read of the fault itself gets the change over the row")
    func childReadsTheFault() throws {
        let id = try renameAdaInScratch(to: "Augusta")
        let rows = try main.snapshots(for: [id])
        #expect(rows.count == 1)
        #expect(rows.first?.values[User.schemaIndex("firstname")] == .text("Augusta"))
        #expect(rows.first?.values[User.schemaIndex("lastname")] == .text("Lovelace"))
    }

    /// How the parent comes to read the row of the fault.
    enum Reading: String, CaseIterable, Sendable {
        case fetch, existingObject, property
    }

    @Test(
        "the store checks the version the change was made on, however the parent read the row",
        arguments: Reading.allCases)
    func conflictStillSeen(reading: Reading) throws {
        root.mergePolicy = .error
        let id = try renameAdaInScratch(to: "Augusta")
        // Someone else changes Ada in the store meanwhile (version 2).
        let writer = ObjectContext(name: "writer", parent: store)
        try writer.performAndWait {
            let ada = try #require(try User.first(where: #Predicate { $0.handle == "ada-lovelace" }, in: writer))
            ada.lastname = "King"
            try writer.save()
        }
        // main reads the row (version 2); the change was made on version 1.
        try main.performAndWait {
            switch reading {
            case .fetch: _ = try User.all(in: main)
            case .existingObject: #expect((try main.existingObject(with: id) as? User)?.lastname == "King")
            case .property: #expect((main.object(with: id) as? User)?.lastname == "King")
            }
            #expect(main.updated[id]?.skyrosStorage.version == 1)
        }
        try main.performAndWait { try main.save() }
        let error = #expect(throws: SkyrosError.self) { try root.performAndWait { try root.save() } }
        #expect(error?.code == .mergeConflict)
        #expect(error?.conflicts.first?.baseVersion == 1)
        #expect(error?.conflicts.first?.storeVersion == 2)
        #expect(try stored(id).values[User.schemaIndex("firstname")] == .text("Ada"))
    }

    @Test("an object deleted in the store meanwhile: its update is dropped, the rest of the save stands")
    func deletedMeanwhile() throws {
        let (adaID, alanID) = try ageAdaAndAlanThenDeleteAdaInStore()
        try main.performAndWait { try main.save() }
        try root.performAndWait { try root.save() }
        #expect(try store.snapshots(for: [adaID]).isEmpty)
        #expect(try stored(alanID).values[User.schemaIndex("age")] == .integer(41))
    }

    @Test("a fault whose row is gone when the parent reads it: its update is dropped, the fetch and the saves go on")
    func rowGoneWhenRead() throws {
        let (adaID, alanID) = try ageAdaAndAlanThenDeleteAdaInStore()
        try main.performAndWait {
            let users = try User.all(in: main)
            #expect(Set(users.map(\.objectID)) == Set([alanID, users.first { $0.lastname == "Hopper" }!.objectID]))
            #expect(users.first { $0.objectID == alanID }?.age == 41)
            #expect(main.updated[adaID] == nil)
            #expect(try User.count(where: #Predicate { $0.age == 36 }, in: main) == 0)
            try main.save()
        }
        try root.performAndWait { try root.save() }
        #expect(try store.snapshots(for: [adaID]).isEmpty)
        #expect(try stored(alanID).values[User.schemaIndex("age")] == .integer(41))
    }

    @Test("two child saves updating the same object: the parent's fault carries both, and is not read")
    func twoChildSaves() throws {
        root.mergePolicy = .error
        // A second child holds Ada from before the first one's save.
        let second = ObjectContext(name: "second", parent: main)
        let ada = try second.performAndWait {
            try #require(try User.first(where: #Predicate { $0.handle == "ada-lovelace" }, in: second))
        }
        let id = try renameAdaInScratch(to: "Augusta")
        try second.performAndWait {
            ada.age = 36
            try second.save()
        }
        main.performAndWait {
            let storage = main.updated[id]?.skyrosStorage
            #expect(storage?.isFault == true)
            #expect(storage?.changed == [User.schemaIndex("firstname"), User.schemaIndex("age")])
            #expect(storage?.version == 1)
        }
        try main.performAndWait { try main.save() }
        try root.performAndWait { try root.save() }
        let row = try stored(id)
        #expect(row.values[User.schemaIndex("firstname")] == .text("Augusta"))
        #expect(row.values[User.schemaIndex("age")] == .integer(36))
        #expect(row.values[User.schemaIndex("lastname")] == .text("Lovelace"))
        #expect(row.version == 2)
    }

    @Test(
        "an observed parent, or one recording undo, reads the rows at the child's save (its observers and undo need them)"
    )
    func observedOrUndoReads() throws {
        main.undoManager = UndoManager()
        let id = try renameAdaInScratch(to: "Augusta")
        main.performAndWait {
            let storage = main.updated[id]?.skyrosStorage
            #expect(storage?.isFault == false)
            #expect(storage?.values[User.schemaIndex("lastname")] == .text("Lovelace"))
        }
    }
}

extension User {
    /// The index of a property in the schema (tests reading stored values).
    static func schemaIndex(_ name: String) -> Int {
        testSchema.entity(named: "User")!.property(named: name)!.index
    }
}
