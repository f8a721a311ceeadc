import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// Undo and redo on the main context (`UndoManager`), on every stack.
@Suite("Undo", .timeLimit(.minutes(3)))
struct UndoTests {
    /// A stack whose main context records undo steps.
    func undoableStack(_ kind: StoreKind) throws -> (TestStack, UndoManager) {
        let stack = try TestStack(kind)
        let undo = UndoManager()
        stack.store.mainContext.undoManager = undo
        return (stack, undo)
    }

    /// What the store holds, read by a new context straight over it: "firstname lastname age".
    func storedUsers(_ stack: TestStack) throws -> [String] {
        let fresh = ObjectContext(name: "fresh", parent: stack.store.store)
        return try fresh.performAndWait {
            try User.all(in: fresh).map { "\($0.firstname) \($0.lastname) \($0.age)" }.sorted()
        }
    }

    /// What the main context shows.
    func mainUsers(_ stack: TestStack) throws -> [String] {
        try stack.store.read { context in
            try User.all(in: context).map { "\($0.firstname) \($0.lastname) \($0.age)" }.sorted()
        }
    }

    @Test(
        "a write is one undo step: undone and redone in the main context, saved by saveMainContext",
        arguments: StoreKind.allCases)
    func writeUndoneAndRedone(kind: StoreKind) throws {
        let (stack, undo) = try undoableStack(kind)
        #expect(!undo.canUndo)
        try stack.store.writeAndWait { context in
            let user = User.create(in: context)
            user.firstname = "Ada"
            user.handle = "ada"
        }
        try stack.store.writeAndWait { context in
            let user = try #require(try User.first(in: context))
            user.firstname = "Grace"
            user.age = 36
        }
        #expect(undo.canUndo && !undo.canRedo)
        undo.undo()
        #expect(try mainUsers(stack) == ["Ada  0"])
        #expect(stack.store.mainContext.performAndWait { stack.store.mainContext.hasChanges })
        #expect(try storedUsers(stack) == ["Grace  36"], "an undo is a change of the main context, not saved yet")
        try stack.store.saveMainContext()
        #expect(try storedUsers(stack) == ["Ada  0"])
        #expect(undo.canRedo)
        undo.redo()
        try stack.store.saveMainContext()
        #expect(try storedUsers(stack) == ["Grace  36"])
        // Back past the insert: the user goes; redone, it comes back with the same identifier.
        let id = try stack.store.read { context in try #require(try User.first(in: context)).objectID }
        undo.undo()
        undo.undo()
        #expect(!undo.canUndo)
        #expect(try mainUsers(stack) == [])
        try stack.store.saveMainContext()
        #expect(try storedUsers(stack) == [])
        undo.redo()
        undo.redo()
        try stack.store.saveMainContext()
        #expect(try storedUsers(stack) == ["Grace  36"])
        #expect(try stack.store.read { context in try User.first(in: context)?.objectID } == id)
    }

    @Test(
        "edits made in the main context are grouped per block; undoing them all leaves no changes",
        arguments: StoreKind.allCases)
    func editsInMainGroupedPerBlock(kind: StoreKind) throws {
        let (stack, undo) = try undoableStack(kind)
        undo.disableUndoRegistration()
        try stack.store.writeAndWait { context in User.create(in: context).firstname = "Ada" }
        undo.enableUndoRegistration()
        #expect(!undo.canUndo, "a write made while registration was off is not a step")
        let main = stack.store.mainContext
        try main.performAndWait {
            let user = try #require(try User.first(in: main))
            user.firstname = "Grace"
            user.age = 36
        }
        try main.performAndWait { try #require(try User.first(in: main)).lastname = "Hopper" }
        #expect(try mainUsers(stack) == ["Grace Hopper 36"])
        undo.undo()
        #expect(try mainUsers(stack) == ["Grace  36"])
        main.performAndWait { #expect(main.hasChanges) }
        undo.undo()
        #expect(try mainUsers(stack) == ["Ada  0"])
        main.performAndWait {
            #expect(!main.hasChanges, "every edit since the save undone: nothing pending")
            #expect(main.updatedObjects.isEmpty)
        }
        // A new edit after an undo: nothing left to redo.
        undo.redo()
        #expect(try mainUsers(stack) == ["Grace  36"])
        try main.performAndWait { try #require(try User.first(in: main)).age = 40 }
        #expect(!undo.canRedo)
        try stack.store.saveMainContext()
        #expect(try storedUsers(stack) == ["Grace  40"])
    }

    @Test(
        "a deletion and what its delete rules did come back together, relationships included",
        arguments: StoreKind.allCases)
    func deleteWithCascadeUndone(kind: StoreKind) throws {
        let (stack, undo) = try undoableStack(kind)
        try stack.store.writeAndWait { context in
            let user = User.create(in: context)
            user.handle = "ada"
            for title in ["one", "two"] {
                let post = Post.create(in: context)
                post.title = title
                post.author = user
            }
            let team = Team.create(in: context)
            team.name = "red"
            Player.create(in: context).team = team
        }
        try stack.store.writeAndWait { context in
            try #require(try User.first(in: context)).delete(in: context)  // cascade: its posts
            try #require(try Team.first(in: context)).delete(in: context)  // nullify: its player
        }
        func state() throws -> String {
            try stack.store.read { context in
                let users = try User.all(in: context).map { "\($0.handle):\($0.posts.map(\.title).sorted())" }
                let posts = try Post.all(in: context).map { "\($0.title)>\($0.author?.handle ?? "-")" }.sorted()
                let players = try Player.all(in: context).map { $0.team?.name ?? "-" }
                return "\(users) \(posts) \(players)"
            }
        }
        #expect(try state() == "[] [] [\"-\"]")
        undo.undo()
        #expect(try state() == "[\"ada:[\\\"one\\\", \\\"two\\\"]\"] [\"one>ada\", \"two>ada\"] [\"red\"]")
        try stack.store.saveMainContext()
        let fresh = ObjectContext(name: "fresh", parent: stack.store.store)
        try fresh.performAndWait { () throws in
            #expect(try Post.all(in: fresh).map { $0.author?.handle ?? "-" } == ["ada", "ada"])
            #expect(try Player.first(in: fresh)?.team?.name == "red")
        }
        undo.redo()
        #expect(try state() == "[] [] [\"-\"]")
        try stack.store.saveMainContext()
        try fresh.performAndWait { () throws in
            fresh.reset()
            #expect(try User.count(in: fresh) == 0 && Post.count(in: fresh) == 0 && Team.count(in: fresh) == 0)
            #expect(try Player.first(in: fresh)?.team == nil)
        }
    }

    @Test(
        "relationship changes undo on both sides: a to-one and its to-many, a one-to-one",
        arguments: [StoreKind.inMemory, .sqlite])
    func relationshipsUndone(kind: StoreKind) throws {
        let (stack, undo) = try undoableStack(kind)
        try stack.store.writeAndWait { context in
            let (ada, grace) = (User.create(in: context), User.create(in: context))
            (ada.handle, grace.handle) = ("ada", "grace")
            let post = Post.create(in: context)
            post.title = "p"
            post.author = ada
            let person = Person.create(in: context)
            person.name = "holder"
            Passport.create(in: context).number = "A1"
        }
        let main = stack.store.mainContext
        try main.performAndWait {
            let post = try #require(try Post.first(in: main))
            post.author = try User.first(where: #Predicate { $0.handle == "grace" }, in: main)
            try #require(try Person.first(in: main)).passport = try Passport.first(in: main)
        }
        func state() throws -> String {
            try main.performAndWait {
                let users = try User.all(in: main).map { "\($0.handle)=\($0.posts.count)" }.sorted()
                let passport = try #require(try Passport.first(in: main))
                return
                    "\(users) \(passport.holder?.name ?? "-") \(try #require(try Person.first(in: main)).passport?.number ?? "-")"
            }
        }
        #expect(try state() == "[\"ada=0\", \"grace=1\"] holder A1")
        undo.undo()
        #expect(try state() == "[\"ada=1\", \"grace=0\"] - -")
        main.performAndWait { #expect(!main.hasChanges) }
        undo.redo()
        #expect(try state() == "[\"ada=0\", \"grace=1\"] holder A1")
        try stack.store.saveMainContext()
        let fresh = ObjectContext(name: "fresh", parent: stack.store.store)
        try fresh.performAndWait { () throws in
            #expect(try Post.first(in: fresh)?.author?.handle == "grace")
            #expect(try Passport.first(in: fresh)?.holder?.name == "holder")
        }
    }

    @Test(
        "a one-to-one moved off an object never read comes back whole: the unread side's old value is its stored one, not a fault's placeholder",
        arguments: [StoreKind.sqlite, .shared])
    func oneToOneOffAFault(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        try stack.store.writeAndWait { context in
            let person = Person.create(in: context)
            person.name = "holder"
            let first = Passport.create(in: context)
            first.number = "A"
            person.passport = first
            Passport.create(in: context).number = "B"
        }
        let main = stack.store.mainContext
        main.performAndWait { main.reset() }  // passport A is only ever a fault here
        let undo = UndoManager()
        main.undoManager = undo
        try main.performAndWait {
            let person = try #require(try Person.first(in: main))
            person.passport = try Passport.first(where: #Predicate { $0.number == "B" }, in: main)
        }
        try stack.store.saveMainContext()
        undo.undo()
        try stack.store.saveMainContext()
        let fresh = ObjectContext(name: "fresh", parent: stack.store.store)
        try fresh.performAndWait { () throws in
            let holders = try Passport.all(in: fresh).map { "\($0.number)=\($0.holder?.name ?? "-")" }.sorted()
            #expect(holders == ["A=holder", "B=-"])
            #expect(try Person.first(in: fresh)?.passport?.number == "A")
        }
    }

    @Test("undoing an unsaved edit shows what another process saved meanwhile, not the value from before the edit")
    func undoToSavedTakesMergedValue() async throws {
        let (stack, undo) = try undoableStack(.shared)
        let container = try #require(stack.daemon).container.url
        try stack.store.writeAndWait { context in
            let user = User.create(in: context)
            user.handle = "ada"
            user.firstname = "Ada"
        }
        let main = stack.store.mainContext
        try main.performAndWait { try #require(try User.first(in: main)).firstname = "Pending" }
        let changes = stack.store.changes
        let child = try ChildProcess(["rename-user", container.path, "ada", "Theirs"])
        #expect(await child.wait(seconds: 30) == .exited(0))
        #expect(await nextChange(changes, seconds: 10, where: { !$0.updated.isEmpty }) != nil)
        #expect(try mainUsers(stack) == ["Pending  0"], "an unsaved edit stays over a merged change")
        undo.undo()
        #expect(try mainUsers(stack) == ["Theirs  0"])
        main.performAndWait { #expect(!main.hasChanges) }
    }

    @Test("explicit groups, limits, names, and what empties the stacks")
    func groupingAndLimits() throws {
        let (stack, undo) = try undoableStack(.inMemory)
        let main = stack.store.mainContext
        undo.beginUndoGrouping()
        #expect(undo.groupingLevel == 1)
        for name in ["a", "b", "c"] {
            main.performAndWait { User.create(in: main).firstname = name }
        }
        undo.setActionName("Add Three")
        undo.endUndoGrouping()
        #expect(undo.undoActionName == "Add Three")
        undo.undo()
        #expect(try mainUsers(stack) == [], "three blocks in one explicit group: one step")
        #expect(undo.redoActionName == "Add Three")
        undo.redo()
        #expect(try mainUsers(stack).count == 3)

        undo.levelsOfUndo = 2
        for name in ["d", "e", "f"] {
            main.performAndWait { User.create(in: main).firstname = name }
        }
        undo.undo()
        undo.undo()
        #expect(!undo.canUndo, "the oldest steps beyond levelsOfUndo are dropped")
        #expect(try mainUsers(stack).map { String($0.prefix(1)) } == ["a", "b", "c", "d"])

        main.performAndWait { User.create(in: main).firstname = "g" }
        #expect(undo.canUndo)
        main.performAndWait { main.rollback() }
        #expect(!undo.canUndo && !undo.canRedo, "a rollback empties the stacks, as Core Data's does")
        // A manager serves one context; replacing it lets the old one go.
        let other = UndoManager()
        main.undoManager = other
        #expect(main.undoManager === other)
        main.performAndWait { User.create(in: main).firstname = "h" }
        #expect(other.canUndo && !undo.canUndo)
    }

    @Test("observers of the main context see an undo as a change: an insert undone is a deletion")
    func observersSeeUndo() throws {
        let (stack, undo) = try undoableStack(.sqlite)
        let main = stack.store.mainContext
        let seen = LockedChanges()
        let observation = main.addChangeObserver { seen.append($0) }
        let id = main.performAndWait { () -> ObjectID in
            let user = User.create(in: main)
            user.firstname = "new"
            return user.objectID
        }
        undo.undo()
        #expect(seen.all.last?.deleted == [id])
        undo.redo()
        #expect(seen.all.last?.inserted.map(\.objectID) == [id])
        withExtendedLifetime(observation) {}
    }

    /// The graph a context shows: each user with its posts (the derived to-many), each post
    /// with its author.
    static func graph(_ context: ObjectContext) throws -> String {
        try context.performAndWait {
            let users = try User.all(in: context).map {
                "\($0.handle):\($0.firstname):\($0.posts.map(\.title).sorted())"
            }
            let posts = try Post.all(in: context).map { "\($0.title)>\($0.author?.handle ?? "-")" }
            return "users \(users.sorted()) posts \(posts.sorted())"
        }
    }

    @Test(
        "seeded random edits, deletions with rules, undos and redos: each undo gives back the graph before the step, each save stores what the main context shows",
        arguments: StoreKind.allCases)
    func randomSequences(kind: StoreKind) throws {
        let (stack, undo) = try undoableStack(kind)
        let main = stack.store.mainContext
        // Half edits, a quarter undos, a quarter redos: runs of each. UNDO_SEED=<n> explores another sequence.
        let sequence = UndoSequence(
            edits: 8, undos: 4, redos: 4, steps: 160, seedVariable: "UNDO_SEED", seed: 0x5EED_0037)
        let counts = try sequence.run(stack, undo, graph: Self.graph) { choice, serial, generator in
            let name = "\(serial)"
            let users = try User.all(in: main).sorted { $0.handle < $1.handle }
            let posts = try Post.all(in: main).sorted { $0.title < $1.title }
            switch choice {
            case 0, 1:
                let user = User.create(in: main)
                user.handle = "u" + name
                user.firstname = "f" + name
            case 2, 3:
                let post = Post.create(in: main)
                post.title = "p" + name
                post.author = users.randomElement(using: &generator)
            case 4:
                guard let user = users.randomElement(using: &generator) else { return false }
                user.firstname = "f" + name
            case 5:
                guard let post = posts.randomElement(using: &generator) else { return false }
                post.author = Bool.random(using: &generator) ? users.randomElement(using: &generator) : nil
            case 6:
                guard let user = users.randomElement(using: &generator) else { return false }
                main.delete(user)  // cascade: its posts
            default:
                guard let post = posts.randomElement(using: &generator) else { return false }
                main.delete(post)
            }
            return true
        }
        #expect(counts.edits > 20 && counts.undos > 10 && counts.redos > 3 && counts.saves > 20, "\(counts)")
    }

    @Test("a change merged from another process is not an undo step, and an undo leaves it alone")
    func otherProcessNotReverted() async throws {
        let (stack, undo) = try undoableStack(.shared)
        let container = try #require(stack.daemon).container.url
        try stack.store.writeAndWait { context in
            let user = User.create(in: context)
            user.handle = "ada"
            user.firstname = "Ada"
            user.lastname = "Byron"
        }
        try stack.store.writeAndWait { context in
            let user = try #require(try User.first(in: context))
            user.firstname = "Mine"
            user.lastname = "Lovelace"
        }
        #expect(try mainUsers(stack) == ["Mine Lovelace 0"])
        let changes = stack.store.changes
        let child = try ChildProcess(["rename-user", container.path, "ada", "Theirs"])
        #expect(await child.wait(seconds: 30) == .exited(0))
        // Until the main context has merged the other process's change (bounded).
        #expect(await nextChange(changes, seconds: 10, where: { !$0.updated.isEmpty }) != nil)
        #expect(try mainUsers(stack) == ["Theirs Lovelace 0"])
        undo.undo()
        #expect(try mainUsers(stack) == ["Theirs Byron 0"], "their firstname stays; the rest of the step is undone")
        try stack.store.saveMainContext()
        #expect(try storedUsers(stack) == ["Theirs Byron 0"])
        undo.undo()  // the insert: the user goes, as the only step left
        #expect(!undo.canUndo)
        try stack.store.saveMainContext()
        #expect(try storedUsers(stack) == [])
    }
}

/// Changes delivered to an observer, kept for the test.
final class LockedChanges: @unchecked Sendable {
    private let lock = NSLock()
    private var changes: [ContextChanges] = []
    func append(_ change: ContextChanges) { lock.withLock { changes.append(change) } }
    var all: [ContextChanges] { lock.withLock { changes } }
}
