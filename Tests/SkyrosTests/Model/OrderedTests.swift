import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// Ordered to-many relationships (`orderSchema` in SkyrosTestSupport), on every stack.
@Suite("Ordered to-many", .timeLimit(.minutes(3)))
struct OrderedTests {
    func stack(_ kind: StoreKind) throws -> TestStack { try TestStack(kind, schema: orderSchema) }

    /// Every checklist with its steps in order, as a context sees them.
    static func graph(_ context: ObjectContext) throws -> String {
        try context.performAndWait {
            try Checklist.all(in: context).map { "\($0.name):\($0.steps.map(\.title).joined(separator: ","))" }.sorted()
                .joined(separator: " ")
        }
    }

    /// The graph as the store has it, read by a new context straight over it.
    static func stored(_ stack: TestStack) throws -> String { try stored(stack.store) }

    static func stored(_ store: Skyros) throws -> String {
        try graph(ObjectContext(name: "fresh", parent: store.store))
    }

    /// The position rows in the store.
    static func positionCount(_ stack: TestStack) throws -> Int { try positionCount(stack.store) }

    static func positionCount(_ store: Skyros) throws -> Int {
        try store.store.count(StoreRequest(entityName: "_Checklist_steps"))
    }

    /// The rows a save of this context would write: inserted, updated and deleted objects.
    static func pendingRows(_ context: ObjectContext) -> Int {
        context.insertedObjects.count + context.updatedObjects.count + context.deletedObjects.count
    }

    func checklist(_ name: String, in context: ObjectContext) throws -> Checklist {
        try #require(try Checklist.first(where: #Predicate { $0.name == name }, in: context))
    }

    /// A checklist `name` with steps of these titles, in this order.
    @discardableResult
    static func make(_ name: String, _ titles: [String], in context: ObjectContext) -> Checklist {
        let list = Checklist.create(in: context)
        list.name = name
        list.steps = titles.map { title in
            let step = Step.create(in: context)
            step.title = title
            return step
        }
        return list
    }

    @Test("the schema makes one order entity per ordered to-many; its description says ordered")
    func schemaShape() throws {
        try orderSchema.validate()
        let order = try #require(orderSchema.entity(named: "_Checklist_steps"))
        #expect(order.properties.map(\.name) == ["source", "target", "position"])
        #expect(order.properties.map(\.destinationName) == ["Checklist", "Step", nil])
        let description = orderSchema.schemaDescription
        let steps = try #require(description.entities[0].properties.first { $0.name == "steps" })
        #expect(steps.isOrdered == true)
        #expect(String(decoding: try description.canonicalJSON(), as: UTF8.self).contains("\"isOrdered\":true"))
        let orderJSON = String(
            decoding: try SchemaDescription(entities: [description.entities[2]]).canonicalJSON(), as: UTF8.self)
        #expect(
            orderJSON.contains(
                #"{"defaultValue":{"integer":0},"deleteRule":"nullify","isIndexed":false,"isOptional":false,"isRequired":false,"isUnique":false,"kind":"attribute","name":"position","storageType":"INTEGER","typeName":"int64"}"#
            ))
        let rebuilt = try Schema(description: description)
        #expect(rebuilt.fingerprint == orderSchema.fingerprint)
        let decoded = try JSONDecoder().decode(SchemaDescription.self, from: try description.canonicalJSON())
        #expect(try Schema(description: decoded).fingerprint == orderSchema.fingerprint)
        // Without the option, another fingerprint and no order entity.
        #expect(orderSchema.fingerprint != Schema([ChecklistV1.self, StepV1.self]).fingerprint)
        #expect(Schema([ChecklistV1.self, StepV1.self]).entities.count == 2)
    }

    @Test("a many-to-many ordered on both sides is refused with a clear error")
    func orderedManyToManyRefused() throws {
        let error = try #require(throws: SkyrosError.self) { try Schema([Shelf.self, Volume.self]).validate() }
        #expect(error.code == .invalidSchema)
        #expect(
            error.message.contains(
                "Shelf.volumes: a many-to-many relationship ordered on both sides is not supported yet"))
    }

    @Test(
        "insert, move and remove at an index keep the order, in the context, the main context and the store",
        arguments: StoreKind.allCases)
    func insertMoveRemove(kind: StoreKind) throws {
        let stack = try stack(kind)
        try stack.store.writeAndWait { context in
            let list = Self.make("l", ["a", "b", "c", "d", "e"], in: context)
            #expect(list.steps.map(\.title) == ["a", "b", "c", "d", "e"])
            // A step joining through its to-one comes last.
            let f = Step.create(in: context)
            f.title = "f"
            f.checklist = list
            #expect(list.steps.map(\.title) == ["a", "b", "c", "d", "e", "f"])
        }
        #expect(try Self.graph(stack.store.mainContext) == "l:a,b,c,d,e,f")
        #expect(try Self.stored(stack) == "l:a,b,c,d,e,f")
        #expect(try Self.positionCount(stack) == 6)

        // Move one: one row written (its position), nothing else.
        try stack.store.writeAndWait { context in
            let list = try checklist("l", in: context)
            var steps = list.steps
            steps.insert(steps.remove(at: 4), at: 1)
            list.steps = steps
            #expect(list.steps.map(\.title) == ["a", "e", "b", "c", "d", "f"])
            #expect(Self.pendingRows(context) == 1)
        }
        #expect(try Self.graph(stack.store.mainContext) == "l:a,e,b,c,d,f")
        #expect(try Self.stored(stack) == "l:a,e,b,c,d,f")

        // Insert at an index: the step and its position. Remove: its to-one and its position.
        try stack.store.writeAndWait { context in
            let list = try checklist("l", in: context)
            let g = Step.create(in: context)
            g.title = "g"
            list.steps.insert(g, at: 0)
            #expect(Self.pendingRows(context) == 2)
            list.steps.removeAll { $0.title == "c" }
            #expect(list.steps.map(\.title) == ["g", "a", "e", "b", "d", "f"])
            #expect(Self.pendingRows(context) == 4)
        }
        #expect(try Self.stored(stack) == "l:g,a,e,b,d,f")
        #expect(try Self.positionCount(stack) == 6)
        try stack.store.mainContext.performAndWait {
            let c = try Step.first(where: #Predicate { $0.title == "c" }, in: stack.store.mainContext)
            #expect(c != nil && c?.checklist == nil)
        }

        // A step moved to another list leaves the first one's order and joins the other's last.
        try stack.store.writeAndWait { context in
            let other = Self.make("m", ["x"], in: context)
            try #require(try Step.first(where: #Predicate { $0.title == "a" }, in: context)).checklist = other
            #expect(try checklist("l", in: context).steps.map(\.title) == ["g", "e", "b", "d", "f"])
            #expect(other.steps.map(\.title) == ["x", "a"])
        }
        #expect(try Self.stored(stack) == "l:g,e,b,d,f m:x,a")
        #expect(try Self.positionCount(stack) == 7)
    }

    @Test(
        "a reversed list, many inserts at one place and a list set anew keep the order the user gave",
        arguments: StoreKind.allCases)
    func reorderings(kind: StoreKind) throws {
        let stack = try stack(kind)
        let titles = (0..<50).map { "s\($0)" }
        try stack.store.writeAndWait { context in Self.make("l", titles, in: context) }
        try stack.store.writeAndWait { context in
            let list = try checklist("l", in: context)
            list.steps = list.steps.reversed()
        }
        #expect(try Self.stored(stack) == "l:" + titles.reversed().joined(separator: ","))
        // 40 inserts between the same two neighbours use up the gap: the list is spaced out again.
        var expected = Array(titles.reversed())
        try stack.store.writeAndWait { context in
            let list = try checklist("l", in: context)
            for index in 0..<40 {
                let step = Step.create(in: context)
                step.title = "n\(index)"
                list.steps.insert(step, at: 1)
                expected.insert("n\(index)", at: 1)
            }
            #expect(list.steps.map(\.title) == expected)
        }
        #expect(try Self.stored(stack) == "l:" + expected.joined(separator: ","))
        // Set anew from a shuffle: exactly that order.
        var generator = SeededGenerator(seed: 7)
        expected.shuffle(using: &generator)
        try stack.store.writeAndWait { context in
            let list = try checklist("l", in: context)
            let byTitle = Dictionary(uniqueKeysWithValues: list.steps.map { ($0.title, $0) })
            list.steps = expected.map { byTitle[$0]! }
        }
        #expect(try Self.graph(stack.store.mainContext) == "l:" + expected.joined(separator: ","))
        #expect(try Self.stored(stack) == "l:" + expected.joined(separator: ","))
    }

    @Test("deleting a step or a list deletes their positions; cascade deletes the steps", arguments: StoreKind.allCases)
    func deletes(kind: StoreKind) async throws {
        let stack = try stack(kind)
        try stack.store.writeAndWait { context in
            Self.make("l", ["a", "b", "c"], in: context)
            Self.make("m", ["x", "y"], in: context)
            // Made and deleted before any save: nothing of it is saved.
            let gone = Self.make("gone", ["g1"], in: context)
            context.delete(gone)
            let loose = Step.create(in: context)
            loose.checklist = try checklist("l", in: context)
            context.delete(loose)
        }
        #expect(try Self.stored(stack) == "l:a,b,c m:x,y")
        #expect(try Self.positionCount(stack) == 5)
        try stack.store.writeAndWait { context in
            try #require(try Step.first(where: #Predicate { $0.title == "b" }, in: context)).delete(in: context)
        }
        #expect(try Self.stored(stack) == "l:a,c m:x,y")
        #expect(try Self.positionCount(stack) == 4)
        try stack.store.writeAndWait { context in try checklist("l", in: context).delete(in: context) }
        #expect(try Self.stored(stack) == "m:x,y")
        #expect(try Self.positionCount(stack) == 2)
        #expect(try await stack.store.read { context in try Step.count(in: context) } == 2)
        // A batch delete takes the positions with the objects.
        if kind != .shared {
            _ = try await stack.store.batchDelete(Checklist.self)
            #expect(try Self.positionCount(stack) == 0)
        }
    }

    @Test("a controller of the relationship reports a move as a move", arguments: StoreKind.allCases)
    func controllerReportsMoves(kind: StoreKind) throws {
        let stack = try stack(kind)
        try stack.store.writeAndWait { context in Self.make("l", ["a", "b", "c", "d"], in: context) }
        let main = stack.store.mainContext
        let list = try main.performAndWait { try checklist("l", in: main) }
        let controller = FetchedResultsController(relationship: \Checklist.steps, of: list, context: main)
        try controller.performFetch()
        #expect(controller.fetchedObjects.map(\.title) == ["a", "b", "c", "d"])
        let reported = Reported()
        controller.onChange = { changes in reported.changes.append(changes.objects.map(Self.describe)) }
        try stack.store.writeAndWait { context in
            let list = try checklist("l", in: context)
            var steps = list.steps
            steps.append(steps.remove(at: 0))
            list.steps = steps
        }
        #expect(controller.fetchedObjects.map(\.title) == ["b", "c", "d", "a"])
        #expect(reported.changes.last == ["move a 0→3"])
        try stack.store.writeAndWait { context in
            let step = Step.create(in: context)
            step.title = "e"
            try checklist("l", in: context).steps.insert(step, at: 1)
            try #require(try Step.first(where: #Predicate { $0.title == "c" }, in: context)).done = true
        }
        #expect(controller.fetchedObjects.map(\.title) == ["b", "e", "c", "d", "a"])
        #expect(reported.changes.last == ["insert e 1", "update c 1"])
        // A step of another list changes: nothing to report. The list goes: every step leaves.
        let count = reported.changes.count
        try stack.store.writeAndWait { context in
            let other = Self.make("other", ["z"], in: context)
            other.steps[0].done = true
        }
        #expect(reported.changes.count == count)
        try stack.store.writeAndWait { context in try checklist("l", in: context).delete(in: context) }
        #expect(controller.fetchedObjects.isEmpty)
        #expect(reported.changes.last == ["delete a 4", "delete d 3", "delete c 2", "delete e 1", "delete b 0"])
    }

    final class Reported: @unchecked Sendable {
        var changes: [[String]] = []
    }

    static func describe(_ change: FetchedResultsObjectChange<Step>) -> String {
        switch change {
        case .insert(let object, let path): "insert \(object.title) \(path.item)"
        case .delete(let object, let path): "delete \(object.title) \(path.item)"
        case .update(let object, let path): "update \(object.title) \(path.item)"
        case .move(let object, let from, let to): "move \(object.title) \(from.item)→\(to.item)"
        }
    }

    @Test("undo and redo of a move and of an insert at an index")
    func undoMoves() throws {
        let stack = try stack(.sqlite)
        let main = stack.store.mainContext
        let undo = UndoManager()
        main.undoManager = undo
        try stack.store.writeAndWait { context in Self.make("l", ["a", "b", "c"], in: context) }
        try stack.store.writeAndWait { context in
            let list = try checklist("l", in: context)
            list.steps = list.steps.reversed()
        }
        #expect(try Self.graph(main) == "l:c,b,a")
        undo.undo()
        #expect(try Self.graph(main) == "l:a,b,c")
        try stack.store.saveMainContext()
        #expect(try Self.stored(stack) == "l:a,b,c")
        undo.redo()
        try stack.store.saveMainContext()
        #expect(try Self.stored(stack) == "l:c,b,a")
    }

    @Test(
        "seeded random sequences of inserts, moves, removals, deletes, undo and redo: the store always shows the main context's order",
        arguments: StoreKind.allCases)
    func randomSequences(kind: StoreKind) throws {
        let stack = try stack(kind)
        let main = stack.store.mainContext
        let undo = UndoManager()
        main.undoManager = undo
        let sequence = UndoSequence(
            edits: 10, undos: 3, redos: 3, steps: 120, seedVariable: "ORDER_SEED", seed: 0x0D_E5_ED)
        let counts = try sequence.run(stack, undo, graph: Self.graph) { choice, serial, generator in
            let lists = try Checklist.all(in: main).sorted { $0.name < $1.name }
            switch choice {
            case 0: Checklist.create(in: main).name = "l\(serial)"
            case 1, 2, 3:  // insert a new step at an index
                guard let list = lists.randomElement(using: &generator) else { return false }
                let step = Step.create(in: main)
                step.title = "s\(serial)"
                var steps = list.steps
                steps.insert(step, at: Int.random(in: 0...steps.count, using: &generator))
                list.steps = steps
            case 4, 5, 6:  // move within a list
                guard let list = lists.randomElement(using: &generator), list.steps.count > 1 else { return false }
                var steps = list.steps
                let from = Int.random(in: 0..<steps.count, using: &generator)
                let step = steps.remove(at: from)
                let to = Int.random(in: 0...steps.count, using: &generator)
                guard to != from else { return false }  // the same order: nothing to record
                steps.insert(step, at: to)
                list.steps = steps
            case 7:  // move to another list, through the to-one (last there)
                guard let from = lists.randomElement(using: &generator),
                    let step = from.steps.randomElement(using: &generator),
                    let to = lists.randomElement(using: &generator), to !== from
                else { return false }
                step.checklist = to
            case 8:  // remove from a list
                guard let list = lists.randomElement(using: &generator), !list.steps.isEmpty else { return false }
                var steps = list.steps
                steps.remove(at: Int.random(in: 0..<steps.count, using: &generator))
                list.steps = steps
            default:  // delete a step, or now and then a list (cascade)
                if Int.random(in: 0..<4, using: &generator) == 0, let list = lists.randomElement(using: &generator) {
                    main.delete(list)
                } else if let step = lists.randomElement(using: &generator)?.steps.randomElement(using: &generator) {
                    main.delete(step)
                } else {
                    return false
                }
            }
            return true
        }
        #expect(counts.edits > 40 && counts.undos > 5 && counts.saves > 20)
        try stack.store.saveMainContext()
        #expect(try Self.stored(stack) == Self.graph(main))
        #expect(try Self.graph(main).contains(","), "some list has several steps at the end")
    }

    @Test(
        "turning a to-many into an ordered to-many on a populated store is inferred: the steps keep their creation order, then move"
    )
    func migrationToOrdered() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        do {
            let store = try Skyros(sqliteStack: Schema([ChecklistV1.self, StepV1.self]), at: url, savesOnStop: false)
            try store.writeAndWait { context in
                let list = ChecklistV1.create(in: context)
                list.name = "l"
                for title in ["a", "b", "c"] {
                    let step = StepV1.create(in: context)
                    step.title = title
                    step.checklist = list
                }
            }
        }
        let store = try Skyros(
            sqliteStack: Schema([Checklist.self, Step.self], version: 2), at: url, savesOnStop: false)
        #expect(try Self.graph(store.mainContext) == "l:a,b,c")
        #expect(try Self.positionCount(store) == 0)
        // The first move places every step (they had no position); later ones write one row.
        try store.writeAndWait { context in
            let list = try checklist("l", in: context)
            list.steps = [list.steps[2]] + list.steps.dropLast()
        }
        #expect(try Self.stored(store) == "l:c,a,b")
        try store.writeAndWait { context in
            let list = try checklist("l", in: context)
            list.steps = [list.steps[1], list.steps[0], list.steps[2]]
            #expect(Self.pendingRows(context) == 1)
        }
        #expect(try Self.stored(store) == "l:a,c,b")
    }

    @Test("turning an ordered to-many back into an unordered one is inferred: the order table goes, the steps stay")
    func migrationFromOrdered() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        do {
            let store = try Skyros(sqliteStack: orderSchema, at: url, savesOnStop: false)
            try store.writeAndWait { context in Self.make("l", ["b", "a"], in: context) }
        }
        let store = try Skyros(
            sqliteStack: Schema([ChecklistV1.self, StepV1.self], version: 2), at: url, savesOnStop: false)
        let steps = try store.read { context in try ChecklistV1.first(in: context)?.steps.map(\.title).sorted() }
        #expect(steps == ["a", "b"])
        let sqlite = try #require(store.store as? SQLiteStore)
        let tables = try sqlite.rows("SELECT name FROM sqlite_master WHERE type = 'table'").map { "\($0[0])" }
        #expect(
            tables.contains { $0.contains("Step") } && !tables.contains { $0.contains("_Checklist_steps") }, "\(tables)"
        )
    }

    @Test("skyros dump lists positions as rows of the order entity, and skyros import brings the order back")
    func dumpAndImport() throws {
        let directory = try TemporaryDirectory()
        let source = directory.file("source.sqlite")
        do {
            let store = try Skyros(sqliteStack: orderSchema, at: source, savesOnStop: false)
            try store.writeAndWait { context in Self.make("l", ["z", "y", "x"], in: context) }
        }
        let dump = try OperatingToolTests.run(["dump", "--store", source.path])
        #expect(dump.status == 0, "\(dump.stderr)")
        #expect(dump.jsonLines.filter { $0["entity"] as? String == "_Checklist_steps" }.count == 3)
        let file = directory.file("dump.jsonl").path
        try dump.stdout.write(toFile: file, atomically: true, encoding: .utf8)
        let copy = directory.file("copy.sqlite")
        try SQLiteStore(schema: orderSchema, url: copy).close()
        let imported = try OperatingToolTests.run(["import", file, "--store", copy.path])
        #expect(imported.status == 0, "\(imported.stderr)")
        let store = try Skyros(sqliteStack: orderSchema, at: copy, savesOnStop: false)
        #expect(try Self.graph(store.mainContext) == "l:z,y,x")
    }

    @Test(
        "two client processes through skyrosd: a move in one is a move in the other's controller; moves of two steps are both kept"
    )
    func movesAcrossProcesses() async throws {
        let stack = try stack(.shared)
        let container = try #require(stack.daemon).container.url
        try stack.store.writeAndWait { context in Self.make("l", ["a", "b", "c", "d"], in: context) }
        let main = stack.store.mainContext
        let list = try main.performAndWait { try checklist("l", in: main) }
        let controller = FetchedResultsController(relationship: \Checklist.steps, of: list, context: main)
        try controller.performFetch()
        let reported = Reported()
        controller.onChange = { changes in reported.changes.append(changes.objects.map(Self.describe)) }
        let changes = stack.store.changes
        // The other process moves d to the front.
        let child = try ChildProcess(["move-step", container.path, "l", "d", "0"])
        #expect(await child.wait(seconds: 30) == .exited(0), "\(child.readAll())")
        #expect(await nextChange(changes, seconds: 10) != nil)
        #expect(controller.fetchedObjects.map(\.title) == ["d", "a", "b", "c"])
        #expect(reported.changes.last == ["move d 3→0"])
        // This process, which has not seen the next move yet, moves a to the end while the
        // other moves b to the front: both moves are kept.
        let second = try ChildProcess(["move-step", container.path, "l", "b", "0"])
        #expect(await second.wait(seconds: 30) == .exited(0), "\(second.readAll())")
        try stack.store.writeAndWait { context in
            let list = try checklist("l", in: context)
            var steps = list.steps
            let a = steps.remove(at: steps.firstIndex { $0.title == "a" }!)
            list.steps = steps + [a]
        }
        let fresh = try Self.stored(stack)
        #expect(fresh == "l:b,d,c,a")
        let deadline = Date().addingTimeInterval(10)
        while try Self.graph(main) != fresh && Date() < deadline { _ = await nextChange(changes, seconds: 1) }
        #expect(try Self.graph(main) == fresh)
        #expect(controller.fetchedObjects.map(\.title) == ["b", "d", "c", "a"])
    }

    // MARK: - Edge cases found in review

    static func titles(_ list: Checklist) -> String { list.steps.map(\.title).joined(separator: ",") }

    func step(_ title: String, in context: ObjectContext) throws -> Step {
        try #require(try Step.first(where: #Predicate { $0.title == title }, in: context))
    }

    @Test("moved, removed and put back at the same place in one context: the store has that place")
    func moveLeaveAndBack() throws {
        let stack = try stack(.sqlite)
        try stack.store.writeAndWait { context in Self.make("l", ["a", "b", "s"], in: context) }
        try stack.store.writeAndWait { context in
            let list = try checklist("l", in: context)
            let s = try step("s", in: context)
            list.steps = [s] + list.steps.filter { $0 !== s }
            s.checklist = nil
            list.steps = [s] + list.steps
            #expect(Self.titles(list) == "s,a,b")
        }
        #expect(try Self.stored(stack) == "l:s,a,b")
    }

    @Test("a child places a step whose removal its parent has not saved: the child's place wins")
    func childPutsBackARemovedStep() throws {
        let stack = try stack(.sqlite)
        try stack.store.writeAndWait { context in Self.make("l", ["a", "b", "c"], in: context) }
        let main = stack.store.mainContext
        try main.performAndWait { try step("a", in: main).checklist = nil }
        let child = ObjectContext(name: "child", parent: main)
        try child.performAndWait {
            let list = try checklist("l", in: child)
            list.steps = [list.steps[0], try step("a", in: child), list.steps[1]]
            try child.save()
        }
        #expect(try main.performAndWait { Self.titles(try checklist("l", in: main)) } == "b,a,c")
        try stack.store.saveMainContext()
        #expect(try Self.stored(stack) == "l:b,a,c")
    }

    @Test("a move saved after another saver took the step to another list is moot, not an error")
    func moveOfAStepThatLeft() throws {
        let stack = try stack(.sqlite)
        try stack.store.writeAndWait { context in
            Self.make("l", ["a", "b", "s"], in: context)
            Self.make("m", ["x"], in: context)
        }
        let (a, b) = (
            ObjectContext(name: "A", parent: stack.store.store), ObjectContext(name: "B", parent: stack.store.store)
        )
        try a.performAndWait {
            let list = try checklist("l", in: a)
            list.steps = [try step("s", in: a)] + list.steps.filter { $0.title != "s" }
        }
        try b.performAndWait {
            try step("s", in: b).checklist = try checklist("m", in: b)
            try b.save()
        }
        try a.performAndWait { try a.save() }
        #expect(try Self.stored(stack) == "l:a,b m:x,s")
    }

    @Test("two savers place the same step in a list: the last saver's place is stored")
    func samePlacementTwice() throws {
        let stack = try stack(.sqlite)
        try stack.store.writeAndWait { context in
            Self.make("l", ["a", "b"], in: context)
            Self.make("m", ["s"], in: context)
        }
        let (a, b) = (
            ObjectContext(name: "A", parent: stack.store.store), ObjectContext(name: "B", parent: stack.store.store)
        )
        try a.performAndWait {
            let list = try checklist("l", in: a)
            list.steps = [try step("s", in: a)] + list.steps
        }
        try b.performAndWait {
            let list = try checklist("l", in: b)
            list.steps = [list.steps[0], try step("s", in: b), list.steps[1]]
        }
        try a.performAndWait { try a.save() }
        try b.performAndWait { try b.save() }
        #expect(try Self.stored(stack) == "l:a,s,b m:")
    }

    @Test("joining through the to-one comes last after a child's appends and after an undo")
    func appendsAfterChildSaveAndUndo() throws {
        let stack = try stack(.sqlite)
        try stack.store.writeAndWait { context in
            Self.make("m", ["first", "old"], in: context)  // made first: they sort first among equal positions
            Self.make("l", ["a", "b", "c"], in: context)
        }
        let main = stack.store.mainContext
        try main.performAndWait {
            let d = Step.create(in: main)
            d.title = "d"
            d.checklist = try checklist("l", in: main)
        }
        let child = ObjectContext(name: "child", parent: main)
        try child.performAndWait {
            let list = try checklist("l", in: child)
            for title in ["e1", "e2"] {
                let step = Step.create(in: child)
                step.title = title
                step.checklist = list
            }
            try child.save()
        }
        try main.performAndWait {
            try step("old", in: main).checklist = try checklist("l", in: main)
            #expect(Self.titles(try checklist("l", in: main)) == "a,b,c,d,e1,e2,old")
        }
        try stack.store.saveMainContext()
        let undo = UndoManager()
        main.undoManager = undo
        try main.performAndWait {
            let list = try checklist("l", in: main)
            list.steps = [list.steps[6]] + list.steps.dropLast()  // the last to the front…
        }
        undo.undo()  // …and back
        try main.performAndWait {
            try step("first", in: main).checklist = try checklist("l", in: main)
            #expect(Self.titles(try checklist("l", in: main)) == "a,b,c,d,e1,e2,old,first")
        }
        try stack.store.saveMainContext()
        #expect(try Self.stored(stack) == "l:a,b,c,d,e1,e2,old,first m:")
    }
}
