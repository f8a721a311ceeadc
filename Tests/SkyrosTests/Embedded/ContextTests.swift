import Foundation
import Skyros
import SkyrosTestSupport
import Testing

@Suite("Contexts", .timeLimit(.minutes(3)))
struct ContextTests {
    func makeStack() throws -> (store: SQLiteStore, root: ObjectContext, main: ObjectContext) {
        let store = try SQLiteStore(schema: testSchema, url: nil)
        let root = ObjectContext(name: "root", parent: store)
        return (store, root, ObjectContext(name: "main", parent: root))
    }

    @Test("performAndWait is reentrant, also through a parent and back")
    func reentrancy() throws {
        let (_, root, main) = try makeStack()
        let scratch = ObjectContext(name: "scratch", parent: main)
        let depth = scratch.performAndWait {
            main.performAndWait {
                root.performAndWait {
                    scratch.performAndWait { main.performAndWait { 5 } }
                }
            }
        }
        #expect(depth == 5)
    }

    @Test("a save pushes changes exactly one level")
    func oneLevel() throws {
        let (store, root, main) = try makeStack()
        let scratch = ObjectContext(name: "scratch", parent: main)
        let request = StoreRequest(entityName: "User")
        try scratch.performAndWait {
            makeUsers([("A", "X")], in: scratch)
            try scratch.save()
        }
        #expect(try main.count(request) == 1)
        #expect(try root.count(request) == 0)
        #expect(try store.count(request) == 0)
        try main.performAndWait { try main.save() }
        #expect(try root.count(request) == 1)
        #expect(try store.count(request) == 0)
        try root.performAndWait { try root.save() }
        #expect(try store.count(request) == 1)
    }

    @Test("one instance per object per context; objects fetched with their values")
    func uniquing() throws {
        let (_, _, main) = try makeStack()
        try main.performAndWait {
            makeUsers([("A", "X")], in: main)
            try main.save()
            let first = try User.first(in: main)!
            let again = try User.all(in: main)[0]
            #expect(first === again)
            #expect(main.object(with: first.objectID) === first)
            #expect(!first.isFault)
        }
    }

    @Test(
        "a fresh context's first fetch registers its objects: later fetches and lookups give the same instances, and a fetch fills a registered fault"
    )
    func firstFetchRegisters() throws {
        let (_, root, main) = try makeStack()
        try main.performAndWait {
            makeUsers([("A", "X"), ("B", "Y"), ("C", "Z")], in: main)
            let post = Post.create(in: main)
            post.title = "p"
            post.author = try User.first(where: #Predicate { $0.firstname == "B" }, in: main)
            try main.save()
        }
        try root.performAndWait { try root.save() }
        let reader = ObjectContext(name: "reader", parent: root)
        try reader.performAndWait {
            let users = try User.all(sortedBy: [SortDescriptor(\User.firstname)], in: reader)
            #expect(users.map(\.firstname) == ["A", "B", "C"])
            let again = try User.all(sortedBy: [SortDescriptor(\User.firstname)], in: reader)
            #expect(zip(users, again).allSatisfy { $0 === $1 })
            #expect(users.allSatisfy { reader.object(with: $0.objectID) === $0 })
        }
        // A relationship makes a fault; the fetch that then meets its row fills that instance.
        let other = ObjectContext(name: "other", parent: root)
        try other.performAndWait {
            let author = try #require(try Post.first(in: other)?.author)
            #expect(author.isFault)
            let fetched = try User.all(in: other)
            #expect(fetched.contains { $0 === author })
            #expect(!author.isFault)
            #expect(author.firstname == "B")
        }
    }

    @Test("rows passing through a context keep their order, and stay findable, updatable and deletable there")
    func rowsPassingThrough() throws {
        let (store, root, main) = try makeStack()
        func write(_ body: (ObjectContext) throws -> Void) throws {
            let scratch = ObjectContext(name: "scratch", parent: main)
            try scratch.performAndWait {
                try body(scratch)
                try scratch.save()
            }
        }
        try write { makeUsers([("A", "1"), ("B", "2")], in: $0) }
        try write { makeUsers([("C", "3"), ("D", "4")], in: $0) }  // into rows already pending
        // Found by a fetch merging pending changes, updated and deleted from another child.
        try write { scratch in
            let users = try User.all(sortedBy: [SortDescriptor(\.firstname)], in: scratch)
            #expect(users.map(\.firstname) == ["A", "B", "C", "D"])
            users[1].age = 42
            scratch.delete(users[2])
        }
        try main.performAndWait {
            #expect(main.insertedObjects.count == 3)
            try main.save()
        }
        try root.performAndWait { try root.save() }
        let rows = try store.fetchSnapshots(StoreRequest(entityName: "User"))
        let entity = try #require(testSchema.entity(named: "User"))
        let first = try #require(entity.property(named: "firstname")).index
        let age = try #require(entity.property(named: "age")).index
        // The store orders ties by object ID, that is by creation: the order of the inserts.
        #expect(rows.map { $0.values[first] } == [.text("A"), .text("B"), .text("D")])
        #expect(rows.map { $0.values[age] } == [.integer(0), .integer(42), .integer(0)])
    }

    @Test("a save validating an object whose required to-one is still a pending row turns that row into an object")
    func validationPromotesRows() throws {
        let (store, root, main) = try makeStack()
        let scratch = ObjectContext(name: "scratch", parent: main)
        try scratch.performAndWait {
            for index in 0..<50 {
                let team = Team.create(in: scratch)
                team.name = "team \(index)"
                let badge = Badge.create(in: scratch)
                badge.label = "badge \(index)"
                badge.team = team
            }
            try scratch.save()
        }
        try main.performAndWait {
            // Fetching badges turns their rows into objects; their teams stay rows until asked for.
            #expect(try Badge.all(in: main).count == 50)
            try main.save()
        }
        try root.performAndWait { try root.save() }
        #expect(try store.count(StoreRequest(entityName: "Team")) == 50)
        #expect(try store.count(StoreRequest(entityName: "Badge")) == 50)
    }

    @Test("object(with:) is nil and existingObject throws for an unknown or deleted object")
    func objectLookups() throws {
        let (_, _, main) = try makeStack()
        try main.performAndWait {
            let unknown = ObjectID.make(entityName: "User")
            #expect(main.object(with: unknown) == nil)
            #expect(throws: SkyrosError.self) { try main.existingObject(with: unknown) }
            makeUsers([("A", "X")], in: main)
            try main.save()
            let user = try User.first(in: main)!
            main.delete(user)
            #expect(main.object(with: user.objectID) == nil)
        }
    }

    @Test("objects from another context's relationships are faults until used")
    func faulting() throws {
        let (_, root, main) = try makeStack()
        try main.performAndWait {
            let user = User.create(in: main)
            user.handle = "author"
            let post = Post.create(in: main)
            post.author = user
            try main.save()
        }
        try root.performAndWait { try root.save() }
        let other = ObjectContext(name: "other", parent: root)
        try other.performAndWait {
            let post = try Post.first(in: other)!
            let author = try #require(post.author)
            #expect(author.isFault)
            #expect(author.handle == "author")
            #expect(!author.isFault)
        }
    }

    @Test("change tracking, rollback, refresh and reset")
    func changeTracking() throws {
        let (_, _, main) = try makeStack()
        try main.performAndWait {
            #expect(!main.hasChanges)
            makeUsers([("A", "X"), ("B", "Y")], in: main)
            #expect(main.insertedObjects.count == 2)
            try main.save()
            #expect(!main.hasChanges)
            let users = try User.all(in: main)
            users[0].firstname = "Changed"
            main.delete(users[1])
            #expect(main.updatedObjects.map(\.objectID) == [users[0].objectID])
            #expect(main.deletedObjects.map(\.objectID) == [users[1].objectID])
            #expect(users[0].changedPropertyNames == ["firstname"])
            main.rollback()
            #expect(!main.hasChanges)
            #expect(users[0].firstname == "A")
            #expect(try User.count(in: main) == 2)
            users[0].firstname = "Again"
            main.refresh(users[0], mergeChanges: false)
            #expect(users[0].firstname == "A")
            main.reset()
            #expect(main.registeredObjects.isEmpty)
            #expect(try User.count(in: main) == 2)
        }
    }

    @Test("identifiers and batches: a large fetch never holds every object")
    func batches() throws {
        let (_, root, main) = try makeStack()
        let scratch = ObjectContext(name: "scratch", parent: main)
        try scratch.performAndWait {
            for index in 0..<5_000 { User.create(in: scratch).handle = String(format: "h%05d", index) }
            try scratch.save()
        }
        try main.performAndWait { try main.save() }
        try root.performAndWait { try root.save() }
        try main.performAndWait {
            let descriptor = FetchDescriptor<User>(sortBy: [SortDescriptor(\.handle)])
            let ids = try main.fetchIdentifiers(descriptor)
            #expect(ids.count == 5_000)
            #expect(main.registeredObjects.count == 0)
            let batched = try main.fetch(descriptor, batchSize: 500)
            var seen = 0
            var maxRegistered = 0
            var ordered = true
            var previous = ""
            for user in batched {
                if user.handle <= previous { ordered = false }
                previous = user.handle
                seen += 1
                if seen % 250 == 0 { maxRegistered = max(maxRegistered, main.registeredObjects.count) }
            }
            #expect(seen == 5_000)
            #expect(ordered)
            #expect(maxRegistered <= 1_000)
        }
    }

    /// Many small fetches on one context whose app lets go of each fetch's objects (reads on
    /// the main context): each fetch prunes the objects nothing holds before it makes its
    /// own, so it meets an empty registry and looks nothing up (the registry used to grow to
    /// 4,096 objects first, and every fetch in between indexed the earlier ones and looked
    /// each row up). Objects the app holds stay registered, the same instances, changes kept.
    @Test("small fetches whose objects are let go meet an empty registry; held objects stay, the same instances")
    func smallFetchesPruneWhatIsLetGo() throws {
        let (_, root, main) = try makeStack()
        let scratch = ObjectContext(name: "scratch", parent: main)
        try scratch.performAndWait {
            for index in 0..<2_000 {
                let user = User.create(in: scratch)
                user.handle = "h\(index)"
                user.age = index % 10
            }
            try scratch.save()
        }
        try main.performAndWait { try main.save() }
        try root.performAndWait { try root.save() }
        try main.performAndWait {
            for age in 0..<10 {
                let users = try User.all(where: #Predicate { $0.age == age }, in: main)
                #expect(users.count == 200)
                #expect(main.registeredObjects.count == 200, "fetch \(age)")
            }
            // Held across fetches: still registered, the same instances.
            var held = try User.all(where: #Predicate { $0.age == 3 }, in: main)
            for age in 0..<10 where age != 3 {
                _ = try User.all(where: #Predicate { $0.age == age }, in: main)
                #expect(main.registeredObjects.count == 400, "fetch \(age) beside the held ones")
            }
            var again = try User.all(where: #Predicate { $0.age == 3 }, in: main)
            #expect(zip(held, again).allSatisfy { $0 === $1 })
            #expect(!again.isEmpty)
            // Let go, they leave at the first fetch that finds the registry doubled since the
            // last prune (which kept them): the second one from here.
            held = []
            again = []
            #expect(try User.all(where: #Predicate { $0.age == 5 }, in: main).count == 200)
            #expect(main.registeredObjects.count == 400)
            #expect(try User.all(where: #Predicate { $0.age == 6 }, in: main).count == 200)
            #expect(main.registeredObjects.count == 200)
        }
    }

    /// Small fetches inside a batched iteration's loop prune the registry under the iteration:
    /// the iteration still gives every object once, in order, and its batches are still let go.
    @Test(
        "small fetches inside a batched iteration prune under it: every object once, in order, batches still released")
    func pruningUnderABatchedIteration() throws {
        let (_, root, main) = try makeStack()
        let scratch = ObjectContext(name: "scratch", parent: main)
        try scratch.performAndWait {
            for index in 0..<2_000 {
                let user = User.create(in: scratch)
                user.handle = String(format: "h%05d", index)
                user.age = index % 10
            }
            try scratch.save()
        }
        try main.performAndWait { try main.save() }
        try root.performAndWait { try root.save() }
        try main.performAndWait {
            let batched = try main.fetch(FetchDescriptor<User>(sortBy: [SortDescriptor(\.handle)]), batchSize: 100)
            var seen = 0
            var previous = ""
            var ordered = true
            var maxRegistered = 0
            for user in batched {
                if user.handle <= previous { ordered = false }
                previous = user.handle
                seen += 1
                if seen % 150 == 0 {
                    let age = seen / 150 % 10
                    #expect(try User.all(where: #Predicate { $0.age == age }, in: main).count == 200)
                    maxRegistered = max(maxRegistered, main.registeredObjects.count)
                }
            }
            #expect(seen == 2_000)
            #expect(ordered)
            #expect(maxRegistered <= 600, "\(maxRegistered)")
        }
    }

    @Test("a to-one to an object deleted in the same context is cleared by nullify at once")
    func nullifyImmediately() throws {
        let (_, _, main) = try makeStack()
        main.performAndWait {
            let team = Team.create(in: main)
            let player = Player.create(in: main)
            player.team = team
            #expect(team.players.count == 1)
            main.delete(team)
            #expect(player.team == nil)
        }
    }

    @Test("a root context takes its child's values of the objects a save updates, never a fault's placeholders")
    func rootTakesChildValues() throws {
        let (store, root, main) = try makeStack()
        let (personID, passportID) = try main.performAndWait {
            let person = Person.create(in: main)
            person.name = "P"
            let passport = Passport.create(in: main)
            passport.number = "Q1"
            person.passport = passport
            try main.save()
            return (person.objectID, passport.objectID)
        }
        try root.performAndWait { try root.save() }
        // A fresh child of the root reads the person only: deleting it nullifies the holder
        // of its passport, a fault here, which so has a pending change and no values.
        let child = ObjectContext(name: "child", parent: root)
        try child.performAndWait {
            let person = try #require(child.object(with: personID, as: Person.self))
            child.delete(person)
            try child.save()
        }
        // The root holds the passport, read from the store: the child faults it from there.
        #expect(root.performAndWait { root.updatedObjects.map(\.objectID) } == [passportID])
        #expect(child.performAndWait { child.object(with: passportID, as: Passport.self)?.number } == "Q1")
        try root.performAndWait { try root.save() }
        let stored = try #require(try store.snapshots(for: [passportID]).first)
        let number = try #require(testSchema.entity(named: "Passport")?.property(named: "number")?.index)
        #expect(stored.values[number] == .text("Q1"))
        #expect(try store.snapshots(for: [personID]).isEmpty)
    }

    @Test(
        "an update of an object the store no longer has is dropped at the root's save, and the rest of the save is stored"
    )
    func updateOfObjectGoneFromStore() throws {
        let (store, root, main) = try makeStack()
        let (gone, kept) = try main.performAndWait {
            makeUsers([("A", "X"), ("B", "Y")], in: main)
            try main.save()
            let users = try User.all(in: main).sorted { $0.firstname < $1.firstname }
            return (users[0].objectID, users[1].objectID)
        }
        try root.performAndWait { try root.save() }
        // Another writer deletes one of them from the store; the main context still holds it.
        var deletion = ChangeSet()
        deletion.deleted = [gone]
        try store.save(deletion)
        try main.performAndWait {
            try #require(main.object(with: gone, as: User.self)).age = 5
            try #require(main.object(with: kept, as: User.self)).age = 6
            makeUsers([("C", "Z")], in: main)
            try main.save()
        }
        try root.performAndWait { try root.save() }
        let age = try #require(testSchema.entity(named: "User")?.property(named: "age")?.index)
        #expect(try store.snapshots(for: [kept]).first?.values[age] == .integer(6))
        #expect(try store.snapshots(for: [gone]).isEmpty)
        #expect(try store.count(StoreRequest(entityName: "User")) == 2)
        #expect(root.performAndWait { root.hasChanges } == false)
    }

    @Test(
        "a root's uniqueness check does not take the values its child handed it for properties the save did not change as pending"
    )
    func rootUniquenessIgnoresChildViews() throws {
        let (store, root, main) = try makeStack()
        let id = try main.performAndWait {
            let user = User.create(in: main)
            user.handle = "a"
            try main.save()
            return user.objectID
        }
        try root.performAndWait { try root.save() }
        try main.performAndWait { _ = try #require(try User.first(in: main)).age }  // held, read at version 1
        // Another writer moves the handle on in the store; the main context has not seen it.
        let handle = try #require(testSchema.entity(named: "User")?.property(named: "handle")?.index)
        var moved = ChangeSet()
        moved.updated = [ChangeSet.Update(id: id, changes: [handle: .text("b")], baseVersion: 1)]
        try store.save(moved)
        try main.performAndWait {
            try #require(main.object(with: id, as: User.self)).age = 3
            try main.save()
            // The root holds the user with the main context's (old) handle; "a" is free in the store.
            User.create(in: main).handle = "a"
            try main.save()
        }
        try root.performAndWait { try root.save() }
        #expect(try store.count(StoreRequest(entityName: "User")) == 2)
        #expect(try store.snapshots(for: [id]).first?.values[handle] == .text("b"))
    }

    @Test(
        "a fault with a pending change keeps it when it is read: a one-to-one taken from a person the context never read stays taken"
    )
    func faultKeepsPendingChange() throws {
        let (store, root, main) = try makeStack()
        let (first, second, passportID) = try main.performAndWait {
            let first = Person.create(in: main)
            first.name = "first"
            let second = Person.create(in: main)
            second.name = "second"
            let passport = Passport.create(in: main)
            passport.number = "A"
            first.passport = passport
            try main.save()
            return (first.objectID, second.objectID, passport.objectID)
        }
        try root.performAndWait { try root.save() }
        let child = ObjectContext(name: "child", parent: root)
        try child.performAndWait {
            let passport = try #require(child.object(with: passportID, as: Passport.self))
            let taker = try #require(child.object(with: second, as: Person.self))
            // The first person, never read here, is a fault: its passport is cleared on the fault.
            taker.passport = passport
            let previous = try #require(child.object(with: first, as: Person.self))
            #expect(previous.name == "first")  // reading it fills the fault
            #expect(previous.passport == nil)
            try child.save()
        }
        try root.performAndWait { try root.save() }
        let column = try #require(testSchema.entity(named: "Person")?.property(named: "passport")?.index)
        #expect(try store.snapshots(for: [first]).first?.values[column] == .null)
        #expect(try store.snapshots(for: [second]).first?.values[column] == passportID.uuid.storedValue)
    }
}
