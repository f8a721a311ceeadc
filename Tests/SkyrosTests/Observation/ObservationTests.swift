import Foundation
import SkyrosShared
import SkyrosTestSupport
import Testing

@testable import Skyros

/// A controller's results as identifiers, by section: what a table view shows.
struct SectionedIDs: Equatable, CustomStringConvertible {
    var sections: [(name: String, ids: [ObjectID])]

    static func == (a: SectionedIDs, b: SectionedIDs) -> Bool {
        a.sections.map(\.name) == b.sections.map(\.name) && a.sections.map(\.ids) == b.sections.map(\.ids)
    }

    var description: String {
        sections.map { "\($0.name): \($0.ids.map { String($0.uuid.uuidString.suffix(4)) })" }.joined(separator: " | ")
    }

    init<T>(_ sections: [FetchedResultsSection<T>]) {
        self.sections = sections.map { ($0.name, $0.objects.map(\.objectID)) }
    }

    /// The results a fresh fetch gives, grouped the way the controller groups them.
    init<T>(fetching descriptor: FetchDescriptor<T>, section: ((T) -> String)?, in context: ObjectContext) throws {
        sections = []
        for object in try context.performAndWait({ try context.fetch(descriptor) }) {
            let name = context.performAndWait { section?(object) ?? "" }
            if sections.last?.name != name { sections.append((name, [])) }
            sections[sections.count - 1].ids.append(object.objectID)
        }
    }

    /// Applies a controller's changes as UIKit's batch updates do: deletions (and sources of
    /// moves) against the old results, highest first; then section deletions and insertions;
    /// then insertions (and destinations of moves) against the new results, lowest first.
    /// Records every index path that is out of range.
    func applying<T>(_ changes: FetchedResultsChanges<T>, invalid: inout [String]) -> SectionedIDs {
        var result = self
        var removals: [IndexPath] = []
        var insertions: [(IndexPath, ObjectID)] = []
        func checkOld(_ path: IndexPath, _ what: String) {
            guard path.section < sections.count, path.item < sections[path.section].ids.count else {
                invalid.append("\(what) \(path) out of the old results")
                return
            }
        }
        for change in changes.objects {
            switch change {
            case .delete(let object, let path):
                checkOld(path, "delete")
                if path.section < sections.count, path.item < sections[path.section].ids.count,
                    sections[path.section].ids[path.item] != object.objectID
                {
                    invalid.append("delete \(path) names another object")
                }
                removals.append(path)
            case .update(let object, let path):
                checkOld(path, "update")
                if path.section < sections.count, path.item < sections[path.section].ids.count,
                    sections[path.section].ids[path.item] != object.objectID
                {
                    invalid.append("update \(path) names another object")
                }
            case .insert(let object, let path):
                insertions.append((path, object.objectID))
            case .move(let object, let from, let to):
                checkOld(from, "move")
                removals.append(from)
                insertions.append((to, object.objectID))
            }
        }
        for path in removals.sorted(by: >)
        where path.section < result.sections.count && path.item < result.sections[path.section].ids.count {
            result.sections[path.section].ids.remove(at: path.item)
        }
        var deletedSections: [Int] = []
        var insertedSections: [(Int, String)] = []
        for change in changes.sections {
            switch change {
            case .delete(_, let index): deletedSections.append(index)
            case .insert(let section, let index): insertedSections.append((index, section.name))
            }
        }
        for index in deletedSections.sorted(by: >) {
            if !result.sections[index].ids.isEmpty { invalid.append("section \(index) deleted with rows left") }
            result.sections.remove(at: index)
        }
        for (index, name) in insertedSections.sorted(by: { $0.0 < $1.0 }) {
            guard index <= result.sections.count else {
                invalid.append("section insert \(index) out of range")
                continue
            }
            result.sections.insert((name, []), at: index)
        }
        for (path, id) in insertions.sorted(by: { $0.0 < $1.0 }) {
            guard path.section < result.sections.count, path.item <= result.sections[path.section].ids.count else {
                invalid.append("insert \(path) out of the new results")
                continue
            }
            result.sections[path.section].ids.insert(id, at: path.item)
        }
        return result
    }
}

/// The changes a controller reported, in order.
final class ChangeRecorder<T: ManagedObject>: @unchecked Sendable {
    var calls: [FetchedResultsChanges<T>] = []

    /// The changes an entity monitor reported, in order.
    final class Monitor: @unchecked Sendable {
        var calls: [EntityMonitorChange<T>] = []
    }
}

func user(_ context: ObjectContext, _ first: String, _ last: String, age: Int) -> User {
    let user = User.create(in: context)
    user.firstname = first
    user.lastname = last
    user.age = age
    user.handle = "\(first)-\(last)-\(UUID().uuidString.prefix(6))"
    return user
}

@Suite("Observation: fetched-results controller, entity monitor, observe", .timeLimit(.minutes(3)))
struct ObservationTests {
    static let kinds: [StoreKind] = StoreKind.allCases

    /// Users older than 30 by last name then first name, in sections by initial.
    static var descriptor: FetchDescriptor<User> {
        FetchDescriptor(
            predicate: #Predicate { $0.age > 30 }, sortBy: [SortDescriptor(\.lastname), SortDescriptor(\.firstname)])
    }

    func controller(_ stack: TestStack, sections: Bool = true) throws -> (
        FetchedResultsController<User>, ChangeRecorder<User>
    ) {
        let controller = FetchedResultsController<User>(
            fetch: Self.descriptor, sectionKeyPath: sections ? \.lastnameInitial : nil, context: stack.store.mainContext
        )
        let recorder = ChangeRecorder<User>()
        controller.onChange = { recorder.calls.append($0) }
        try controller.performFetch()
        return (controller, recorder)
    }

    /// A stack of this kind holding Ann Baker (40), and a controller over it.
    func controllerOverAnn(_ kind: StoreKind) throws -> (
        TestStack, FetchedResultsController<User>, ChangeRecorder<User>
    ) {
        let stack = try TestStack(kind)
        try stack.store.writeAndWait { context in _ = user(context, "Ann", "Baker", age: 40) }
        let (controller, recorder) = try controller(stack)
        return (stack, controller, recorder)
    }

    /// Checks that the last change, applied to `before`, gives the controller's results and a fresh fetch's.
    func expectConsistent(
        _ controller: FetchedResultsController<User>, _ recorder: ChangeRecorder<User>, before: SectionedIDs,
        sections: Bool = true, sourceLocation: SourceLocation = #_sourceLocation
    ) throws {
        let fresh = try SectionedIDs(
            fetching: controller.fetchDescriptor, section: sections ? { $0.lastnameInitial } : nil,
            in: controller.context)
        let current = SectionedIDs(controller.sections)
        #expect(current == fresh, "controller \(current) vs fetch \(fresh)", sourceLocation: sourceLocation)
        if let last = recorder.calls.last {
            var invalid: [String] = []
            let applied = before.applying(last, invalid: &invalid)
            #expect(
                invalid.isEmpty, "\(invalid) before \(before) changes \(last.objects.map { "\($0)" })",
                sourceLocation: sourceLocation)
            #expect(applied == fresh, "applied \(applied) vs fetch \(fresh)", sourceLocation: sourceLocation)
        }
    }

    @Test("performFetch: sections by a computed key, objects in sort order, index paths both ways", arguments: kinds)
    func performFetch(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        try stack.store.writeAndWait { context in
            _ = user(context, "Ann", "Baker", age: 40)
            _ = user(context, "Bob", "Adams", age: 35)
            _ = user(context, "Cid", "Brown", age: 50)
            _ = user(context, "Dan", "Young", age: 20)  // not matching
        }
        let (controller, recorder) = try controller(stack)
        #expect(controller.sections.map(\.name) == ["A", "B"])
        #expect(controller.sections.map { $0.objects.map(\.firstname) } == [["Bob"], ["Ann", "Cid"]])
        #expect(controller.fetchedObjects.map(\.firstname) == ["Bob", "Ann", "Cid"])
        let cid = controller.object(at: IndexPath(item: 1, section: 1))
        #expect(cid.firstname == "Cid")
        #expect(controller.indexPath(for: cid) == IndexPath(item: 1, section: 1))
        #expect(recorder.calls.isEmpty)
    }

    @Test(
        "insert, update in place, move across the sort and sections, start and stop matching, delete: one onChange per save, consistent index paths",
        arguments: kinds)
    func scenarios(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var ids: [String: ObjectID] = [:]
        try stack.store.writeAndWait { context in
            for (first, last, age) in [
                ("Ann", "Baker", 40), ("Bob", "Adams", 35), ("Cid", "Brown", 50), ("Dan", "Young", 20),
            ] {
                ids[first] = user(context, first, last, age: age).objectID
            }
        }
        let (controller, recorder) = try controller(stack)
        func step(_ expectCall: Bool, _ body: @escaping (ObjectContext) throws -> Void) throws {
            let before = SectionedIDs(controller.sections)
            let calls = recorder.calls.count
            try stack.store.writeAndWait { context in try body(context) }
            #expect(recorder.calls.count == calls + (expectCall ? 1 : 0))
            if expectCall {
                try expectConsistent(controller, recorder, before: before)
            } else {
                #expect(SectionedIDs(controller.sections) == before)
            }
        }
        func object(_ name: String, _ context: ObjectContext) -> User { context.object(with: ids[name]!) as! User }

        // An insert into an existing section.
        try step(true) { ids["Eve"] = user($0, "Eve", "Bell", age: 33).objectID }
        guard case .insert(let inserted, let path)? = recorder.calls.last?.objects.first else {
            Issue.record("expected an insert")
            return
        }
        #expect(inserted.firstname == "Eve" && path == IndexPath(item: 1, section: 1))
        // An insert that makes a new section.
        try step(true) { ids["Fay"] = user($0, "Fay", "Clark", age: 60).objectID }
        #expect(recorder.calls.last?.sections.count == 1)
        // An update in place (a property the sort does not read).
        try step(true) { object("Ann", $0).email = "ann@example.com" }
        guard case .update(let updated, let updatePath)? = recorder.calls.last?.objects.first else {
            Issue.record("expected an update")
            return
        }
        #expect(updated.firstname == "Ann" && updatePath == IndexPath(item: 0, section: 1))
        // A move across the sort order within a section.
        try step(true) { object("Ann", $0).firstname = "Zoe" }
        #expect(recorder.calls.last?.objects.contains { if case .move = $0 { true } else { false } } == true)
        // A move to another section, emptying one (a section deletion) and making another (an insertion).
        try step(true) { object("Bob", $0).lastname = "Drake" }
        #expect(recorder.calls.last?.sections.count == 2)
        // Stops matching: a deletion; starts matching: an insertion.
        try step(true) { object("Cid", $0).age = 10 }
        try step(true) { object("Dan", $0).age = 70 }
        // A deletion.
        try step(true) { $0.delete(object("Eve", $0)) }
        // Unrelated changes: a post, a user that does not match, nothing at all for the controller.
        try step(false) { Post.create(in: $0).title = "unrelated" }
        try step(false) { object("Cid", $0).firstname = "Still under 30" }
        // Several changes in one save: one call.
        try step(true) { context in
            _ = user(context, "Gus", "Adams", age: 31)
            _ = user(context, "Hal", "Young", age: 32)
            object("Fay", context).lastname = "Able"
            context.delete(object("Dan", context))
        }
    }

    @Test(
        "the main context's own edits reach the controller, once (not again at their save); a reset reloads it",
        arguments: kinds)
    func mainContextEdits(kind: StoreKind) throws {
        let (stack, controller, recorder) = try controllerOverAnn(kind)
        let main = stack.store.mainContext
        var before = SectionedIDs(controller.sections)
        // An edit in a read block: processed at the end of the block.
        stack.store.read { context in _ = user(context, "Bob", "Adams", age: 45) }
        #expect(recorder.calls.count == 1)
        try expectConsistent(controller, recorder, before: before)
        before = SectionedIDs(controller.sections)
        try main.performAndWait { try main.save() }
        #expect(controller.fetchedObjects.count == 2)
        // The save of an edit already reported is not reported again.
        #expect(recorder.calls.count == 1)
        #expect(SectionedIDs(controller.sections) == before)
        // nuke: the same main context, emptied; the controller follows.
        before = SectionedIDs(controller.sections)
        try stack.store.nuke()
        #expect(controller.fetchedObjects.isEmpty)
        try expectConsistent(controller, recorder, before: before)
        try stack.store.writeAndWait { context in _ = user(context, "Cid", "Clark", age: 41) }
        #expect(controller.fetchedObjects.map(\.firstname) == ["Cid"])
    }

    @Test("a fetch limit holds: an insert at the top pushes the last one out", arguments: kinds)
    func fetchLimit(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        try stack.store.writeAndWait { context in
            for age in [31, 32, 33, 34] { _ = user(context, "U\(age)", "Same", age: age) }
        }
        var descriptor = FetchDescriptor<User>(
            predicate: #Predicate { $0.age > 30 }, sortBy: [SortDescriptor(\.age, order: .reverse)])
        descriptor.fetchLimit = 3
        let controller = FetchedResultsController<User>(fetch: descriptor, context: stack.store.mainContext)
        let recorder = ChangeRecorder<User>()
        controller.onChange = { recorder.calls.append($0) }
        try controller.performFetch()
        #expect(controller.fetchedObjects.map(\.age) == [34, 33, 32])
        var before = SectionedIDs(controller.sections)
        try stack.store.writeAndWait { context in _ = user(context, "Top", "Same", age: 99) }
        #expect(controller.fetchedObjects.map(\.age) == [99, 34, 33])
        #expect(recorder.calls.count == 1)
        var invalid: [String] = []
        #expect(before.applying(recorder.calls[0], invalid: &invalid) == SectionedIDs(controller.sections))
        #expect(invalid.isEmpty)
        // A deletion inside the window pulls the next one in.
        before = SectionedIDs(controller.sections)
        try stack.store.writeAndWait { context in
            try User.all(where: #Predicate { $0.age == 34 }, in: context).forEach { context.delete($0) }
        }
        #expect(controller.fetchedObjects.map(\.age) == [99, 33, 32])
        #expect(before.applying(recorder.calls[1], invalid: &invalid) == SectionedIDs(controller.sections))
        #expect(invalid.isEmpty)
    }

    /// A delegate in BNR's style, recording the calls in order.
    final class Delegate: FetchedResultsControllerDelegate {
        typealias Object = User
        var log: [String] = []
        func fetchedResultsControllerDidPerformFetch(_ controller: FetchedResultsController<User>) {
            log.append("fetch")
        }
        func fetchedResultsControllerWillChangeContent(_ controller: FetchedResultsController<User>) {
            log.append("will")
        }
        func fetchedResultsControllerDidChangeContent(_ controller: FetchedResultsController<User>) {
            log.append("did")
        }
        func fetchedResultsController(
            _ controller: FetchedResultsController<User>, didChangeObject change: FetchedResultsObjectChange<User>
        ) {
            if case .insert(let object, _) = change { log.append("insert \(object.firstname)") }
        }
        func fetchedResultsController(
            _ controller: FetchedResultsController<User>, didChangeSection change: FetchedResultsSectionChange<User>
        ) {
            if case .insert(let section, _) = change { log.append("section \(section.name)") }
        }
    }

    @Test("the delegate form: did-perform-fetch, then will / section / object / did for each change")
    func delegate() throws {
        let stack = try TestStack(.inMemory)
        let controller = FetchedResultsController<User>(
            fetch: Self.descriptor, sectionKeyPath: \.lastnameInitial, context: stack.store.mainContext)
        let delegate = Delegate()
        controller.setDelegate(delegate)
        try controller.performFetch()
        try stack.store.writeAndWait { context in _ = user(context, "Ann", "Baker", age: 40) }
        #expect(delegate.log == ["fetch", "will", "section B", "insert Ann", "did"])
    }

    @Test("a sort that splits a section is refused with a clear error")
    func splitSections() throws {
        let stack = try TestStack(.inMemory)
        try stack.store.writeAndWait { context in
            _ = user(context, "Ann", "Baker", age: 40)
            _ = user(context, "Bob", "Adams", age: 41)
            _ = user(context, "Cid", "Brown", age: 42)
        }
        let controller = FetchedResultsController<User>(
            fetch: FetchDescriptor(sortBy: [SortDescriptor(\.age)]), sectionKeyPath: \.lastnameInitial,
            context: stack.store.mainContext)
        let error = #expect(throws: SkyrosError.self) { try controller.performFetch() }
        #expect(
            error?.code == .unsupportedPredicate && error?.message.contains("sort by the section key first") == true)
    }

    @Test(
        "random inserts, updates and deletes: each reported change turns the old results into a fresh fetch's",
        arguments: [1, 2, 3, 4] as [UInt64])
    func randomSequences(seed: UInt64) throws {
        let stack = try TestStack(seed % 2 == 0 ? .inMemory : .sqlite)
        let (controller, recorder) = try controller(stack)
        var limited = FetchDescriptor<User>(sortBy: [SortDescriptor(\.age), SortDescriptor(\.lastname)])
        limited.fetchLimit = 5
        let window = FetchedResultsController<User>(fetch: limited, context: stack.store.mainContext)
        let windowRecorder = ChangeRecorder<User>()
        window.onChange = { windowRecorder.calls.append($0) }
        try window.performFetch()
        var random = SplitMix64(seed: seed)
        let lastnames = ["Adams", "Baker", "Clark", "Doe", "Evans", "Baxter", "Aaron"]
        var alive: [ObjectID] = []
        for _ in 0..<300 {
            let before = SectionedIDs(controller.sections)
            let windowBefore = SectionedIDs(window.sections)
            let calls = recorder.calls.count
            let windowCalls = windowRecorder.calls.count
            var created: [ObjectID] = []
            var removed: Set<ObjectID> = []
            let operations = Int.random(in: 1...3, using: &random)
            let plan = (0..<operations).map { _ in
                (
                    Int.random(in: 0..<10, using: &random), Int.random(in: 0..<1_000, using: &random),
                    Int.random(in: 0..<70, using: &random),
                    lastnames[Int.random(in: 0..<lastnames.count, using: &random)]
                )
            }
            let targets = alive
            try stack.store.writeAndWait { context in
                for (kind, pick, age, lastname) in plan {
                    let target = targets.isEmpty ? nil : targets[pick % targets.count]
                    if kind <= 3 || target == nil || removed.contains(target!) {
                        created.append(user(context, "F\(pick)", lastname, age: age).objectID)
                        continue
                    }
                    switch kind {
                    case 4...5:
                        (context.object(with: target!) as? User)?.age = age
                    case 6...7:
                        (context.object(with: target!) as? User)?.lastname = lastname
                    case 8:
                        (context.object(with: target!) as? User)?.firstname = "F\(pick)"
                    default:
                        if let object = context.object(with: target!) { context.delete(object) }
                        removed.insert(target!)
                    }
                }
            }
            alive = alive.filter { !removed.contains($0) } + created
            #expect(recorder.calls.count <= calls + 1)
            if recorder.calls.count == calls + 1 { try expectConsistent(controller, recorder, before: before) }
            #expect(
                SectionedIDs(controller.sections)
                    == (try SectionedIDs(
                        fetching: Self.descriptor, section: { $0.lastnameInitial }, in: stack.store.mainContext)))
            #expect(windowRecorder.calls.count <= windowCalls + 1)
            if windowRecorder.calls.count == windowCalls + 1 {
                try expectConsistent(window, windowRecorder, before: windowBefore, sections: false)
            } else {
                #expect(SectionedIDs(window.sections) == windowBefore)
            }
        }
        #expect(recorder.calls.count > 100)
    }

    @Test(
        "entity monitors: .onSave sees saves and merges, .onChange also the main context's own edits; a filter applies; one call per change",
        arguments: kinds)
    func entityMonitor(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        let main = stack.store.mainContext
        let onSave = EntityMonitor<User>(context: main, frequency: .onSave, filter: #Predicate<User> { $0.age > 30 })
        let onChange = EntityMonitor<User>(context: main, frequency: .onChange)
        let savesLog = ChangeRecorder<User>.Monitor()
        let changesLog = ChangeRecorder<User>.Monitor()
        onSave.onChange = { savesLog.calls.append($0) }
        onChange.onChange = { changesLog.calls.append($0) }
        var saves: [EntityMonitorChange<User>] { savesLog.calls }
        var changes: [EntityMonitorChange<User>] { changesLog.calls }
        var ann: ObjectID?
        try stack.store.writeAndWait { context in
            ann = user(context, "Ann", "Baker", age: 40).objectID
            _ = user(context, "Kid", "Baker", age: 10)
            Post.create(in: context).title = "not a user"
        }
        #expect(saves.count == 1 && saves[0].inserted.map(\.firstname) == ["Ann"])
        #expect(changes.count == 1 && Set(changes[0].inserted.map(\.firstname)) == ["Ann", "Kid"])
        // An edit in the main context: .onChange only, at the end of the block.
        stack.store.read { context in (context.object(with: ann!) as! User).email = "a@example.com" }
        #expect(saves.count == 1)
        #expect(changes.count == 2 && changes[1].updated.map(\.firstname) == ["Ann"])
        try main.performAndWait { try main.save() }
        #expect(saves.count == 2 && saves[1].updated.map(\.firstname) == ["Ann"])
        // A deletion: the deleted object reads as its last values.
        try stack.store.writeAndWait { context in context.delete(context.object(with: ann!)!) }
        #expect(saves.count == 3 && saves[2].deleted.map(\.firstname) == ["Ann"])
        // Nothing for another entity.
        let counts = (saves.count, changes.count)
        try stack.store.writeAndWait { context in Post.create(in: context).title = "again" }
        #expect((saves.count, changes.count) == counts)
    }

    @Test(
        "an .onChange monitor reports a main-context insert, update and delete once, when the block ends, and not again at the save; .onSave reports the save",
        arguments: kinds)
    func onChangeMonitorReportsOnce(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        let main = stack.store.mainContext
        let onSave = EntityMonitor<User>(context: main, frequency: .onSave)
        let onChange = EntityMonitor<User>(context: main, frequency: .onChange)
        let savesLog = ChangeRecorder<User>.Monitor()
        let changesLog = ChangeRecorder<User>.Monitor()
        onSave.onChange = { savesLog.calls.append($0) }
        onChange.onChange = { changesLog.calls.append($0) }
        var ann: ObjectID?
        // Insert, then save in another block.
        main.performAndWait { ann = user(main, "Ann", "Baker", age: 40).objectID }
        #expect(changesLog.calls.count == 1 && changesLog.calls[0].inserted.map(\.firstname) == ["Ann"])
        #expect(savesLog.calls.isEmpty)
        try main.performAndWait { try main.save() }
        #expect(changesLog.calls.count == 1)
        #expect(savesLog.calls.count == 1 && savesLog.calls[0].inserted.map(\.firstname) == ["Ann"])
        // Update, then save.
        main.performAndWait { (main.object(with: ann!) as! User).age = 41 }
        #expect(changesLog.calls.count == 2 && changesLog.calls[1].updated.map(\.firstname) == ["Ann"])
        try main.performAndWait { try main.save() }
        #expect(changesLog.calls.count == 2)
        #expect(savesLog.calls.count == 2 && savesLog.calls[1].updated.map(\.firstname) == ["Ann"])
        // Delete, then save.
        main.performAndWait { main.delete(main.object(with: ann!)!) }
        #expect(changesLog.calls.count == 3 && changesLog.calls[2].deleted.map(\.firstname) == ["Ann"])
        try main.performAndWait { try main.save() }
        #expect(changesLog.calls.count == 3)
        #expect(savesLog.calls.count == 3 && savesLog.calls[2].deleted.map(\.firstname) == ["Ann"])
        // An insert saved in the block that made it: reported once to each.
        try main.performAndWait {
            _ = user(main, "Bob", "Adams", age: 45)
            try main.save()
        }
        #expect(changesLog.calls.count == 4 && changesLog.calls[3].inserted.map(\.firstname) == ["Bob"])
        #expect(savesLog.calls.count == 4 && savesLog.calls[3].inserted.map(\.firstname) == ["Bob"])
        // A child context's save merged into the main context, never seen before: reported to both.
        try stack.store.writeAndWait { context in _ = user(context, "Cid", "Clark", age: 41) }
        #expect(changesLog.calls.count == 5 && changesLog.calls[4].inserted.map(\.firstname) == ["Cid"])
        #expect(savesLog.calls.count == 5 && savesLog.calls[4].inserted.map(\.firstname) == ["Cid"])
    }

    @Test(
        "a controller reports a main-context edit once: at the end of the block, not again at the save",
        arguments: kinds)
    func controllerReportsMainEditOnce(kind: StoreKind) throws {
        let (stack, controller, recorder) = try controllerOverAnn(kind)
        let main = stack.store.mainContext
        let ann = try #require(controller.fetchedObjects.first).objectID
        var before = SectionedIDs(controller.sections)
        main.performAndWait { _ = user(main, "Bob", "Adams", age: 45) }
        #expect(recorder.calls.count == 1)
        try expectConsistent(controller, recorder, before: before)
        try main.performAndWait { try main.save() }
        #expect(recorder.calls.count == 1)
        before = SectionedIDs(controller.sections)
        main.performAndWait { (main.object(with: ann) as! User).age = 50 }
        #expect(recorder.calls.count == 2)
        try main.performAndWait { try main.save() }
        #expect(recorder.calls.count == 2)
        try expectConsistent(controller, recorder, before: before)
        before = SectionedIDs(controller.sections)
        main.performAndWait { main.delete(main.object(with: ann)!) }
        try main.performAndWait { try main.save() }
        #expect(recorder.calls.count == 3)
        try expectConsistent(controller, recorder, before: before)
    }

    @Test("observe gives one value for a main-context edit, none for its save", arguments: kinds)
    func observeMainEditOnce(kind: StoreKind) async throws {
        let stack = try TestStack(kind)
        let store = stack.store
        let main = store.mainContext
        var iterator = store.observe { context in
            AgeTotal(total: try User.all(in: context).reduce(0) { $0 + $1.age })
        }.makeAsyncIterator()
        #expect(try await iterator.next()?.total == 0)
        let id = main.performAndWait {
            let user = User.create(in: main)
            (user.handle, user.age) = ("one", 7)
            return user.objectID
        }
        #expect(try await iterator.next()?.total == 7)
        try main.performAndWait { try main.save() }
        // Had the save given a value, this would read a second 7.
        main.performAndWait { (main.object(with: id) as! User).age = 9 }
        #expect(try await iterator.next()?.total == 9)
    }

    @Test(
        "observe: the first value at once, a new value after a change to what the block read, duplicates dropped, nothing for other entities; ending the loop frees it",
        arguments: kinds)
    func observe(kind: StoreKind) async throws {
        let stack = try TestStack(kind)
        let store = stack.store
        let values = store.observe { context in try User.count(in: context) }
        var iterator = values.makeAsyncIterator()
        #expect(try await iterator.next() == 0)
        _ = try await insertUser(handle: "one", into: store)
        #expect(try await iterator.next() == 1)
        // A change to another entity, and a user change that leaves the count as it was, give
        // no value (the second is a duplicate, dropped); the next user change that counts does.
        try await store.write { context in Post.create(in: context).title = "p" }
        try await store.write { context in try #require(try User.first(in: context)).firstname = "renamed" }
        _ = try await insertUser(handle: "two", into: store)
        #expect(try await iterator.next() == 2)
        // Ending the stream removes the observer.
        let main = store.mainContext
        let observersBefore = main.performAndWait { main.changeObservers.count }
        #expect(observersBefore == 1)
        iterator = store.observe { context in try User.count(in: context) }.makeAsyncIterator()
        _ = try await iterator.next()
        do {
            let task = Task {
                for try await _ in store.observe({ context in try Post.count(in: context) }) { break }
            }
            try await task.value
        }
        var remaining = 10
        while main.performAndWait({ main.changeObservers.count }) > 2 && remaining > 0 {
            try await Task.sleep(for: .milliseconds(20))  // the removal is queued on the main context
            remaining -= 1
        }
        #expect(main.performAndWait { main.changeObservers.count } == 2)
    }

    /// A value that is not `Equatable`: `observe` keeps every value, equal or not.
    struct AgeTotal: Sendable {
        var total: Int
    }

    @Test(
        "observe of a value that is not Equatable keeps equal values, and gives nothing for another entity's change",
        arguments: kinds)
    func observeKeepsDuplicates(kind: StoreKind) async throws {
        let stack = try TestStack(kind)
        let store = stack.store
        var iterator = store.observe { context in
            AgeTotal(total: try User.all(in: context).reduce(0) { $0 + $1.age })
        }.makeAsyncIterator()
        #expect(try await iterator.next()?.total == 0)
        let id = try await store.write { context in
            let user = User.create(in: context)
            (user.handle, user.age) = ("one", 1)
            return user.objectID
        }
        #expect(try await iterator.next()?.total == 1)
        // A Post gives no value; a rename gives one equal to the last, which this overload keeps.
        try await store.write { context in Post.create(in: context).title = "p" }
        try await store.write { context in try #require(context.object(with: id, as: User.self)).firstname = "renamed" }
        #expect(try await iterator.next()?.total == 1)
        // Had the Post given a value, this would read a second 1.
        try await store.write { context in try #require(context.object(with: id, as: User.self)).age = 5 }
        #expect(try await iterator.next()?.total == 5)
    }

    @Test("observe ends with the block's error")
    func observeError() async throws {
        let stack = try TestStack(.inMemory)
        let values = stack.store.observe { _ -> Int in throw TestFailure(reason: "boom") }
        await #expect(throws: TestFailure(reason: "boom")) {
            for try await _ in values {}
        }
    }
}
