// A todo list that several terminals share through an application group:
//
//     swift run skyrosd --group com.example.todo &
//     swift run todo add "buy milk"          # in one terminal
//     swift run todo watch                   # in another: a live list, redrawn at every change
//     swift run todo done 1
//     swift run todo list
//
// SKYROS_GROUPS_DIR or --group pick the group (default com.example.todo).
//
// Version 2 of the model (a due date; `title` renamed `text`) runs beside version 1:
//
//     swift run todo --v2 add "file taxes" --due 2027-04-15   # the daemon migrates the store
//     swift run todo --v2 list                                # everyone's items, with due dates
//     swift run todo add "call mum"                           # version 1 keeps working
//
// Version 3 adds tags, a many-to-many relationship, and undo:
//
//     swift run todo --v3 tag 1 home errands      # tags item 1 (tags are made as needed)
//     swift run todo --v3 untag 1 errands
//     swift run todo --v3 list home               # the items tagged "home"
//     swift run todo --v3 retag-undo 1 work       # tags item 1 "work", undoes it, shows both
//
// Version 4 adds checklist steps, an ordered to-many relationship:
//
//     swift run todo --v4 step 1 "find the form"      # adds a step to item 1, last
//     swift run todo --v4 step 1 "sign it" --at 1     # … or at a place (1-based)
//     swift run todo --v4 move 1 2 1                  # moves step 2 of item 1 to place 1
//     swift run todo --v4 check 1 2                   # marks step 2 of item 1 done
//     swift run todo --v4 steps 1                     # item 1's steps, in order
import Foundation
import Skyros
import SkyrosShared
import TodoModel

var arguments = Array(CommandLine.arguments.dropFirst())
var group = "com.example.todo"
if let index = arguments.firstIndex(of: "--group"), index + 1 < arguments.count {
    group = arguments[index + 1]
    arguments.removeSubrange(index...(index + 1))
}
func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("todo: \(message)\n".utf8))
    exit(1)
}
let isVersion2 = arguments.contains("--v2")
arguments.removeAll { $0 == "--v2" }
let isVersion3 = arguments.contains("--v3")
arguments.removeAll { $0 == "--v3" }
let isVersion4 = arguments.contains("--v4")
arguments.removeAll { $0 == "--v4" }
var place: Int?
if let index = arguments.firstIndex(of: "--at"), index + 1 < arguments.count {
    guard let number = Int(arguments[index + 1]), number > 0 else { fail("--at takes a place, 1 or more") }
    place = number
    arguments.removeSubrange(index...(index + 1))
}
var due: Date?
if let index = arguments.firstIndex(of: "--due"), index + 1 < arguments.count {
    guard let date = try? Date(arguments[index + 1], strategy: Date.ISO8601FormatStyle().year().month().day()) else {
        fail("--due takes a date such as 2027-04-15")
    }
    due = date
    arguments.removeSubrange(index...(index + 1))
}
let usage = """
    usage: todo [--group ID] add TITLE | done N | list | watch
           todo --v2 [--group ID] add TITLE [--due DATE] | done N | list
           todo --v3 [--group ID] tag N TAG… | untag N TAG… | list [TAG] | retag-undo N TAG
           todo --v4 [--group ID] step N TEXT [--at K] | move N FROM TO | check N K | steps N
    The group's daemon must be running: skyrosd --group ID (com.example.todo by default).
    """
guard let command = arguments.first else { fail(usage) }
// Help, and a command no version has, are answered without a daemon.
if ["--help", "-h", "help"].contains(command) {
    print(usage)
    exit(0)
}
let commands: Set = ["add", "done", "list", "watch", "tag", "untag", "retag-undo", "step", "move", "check", "steps"]
guard commands.contains(command) else { fail("unknown command \(command)\n\(usage)") }

if isVersion4 {
    do {
        let store = try Skyros(sharedStack: todoSchemaV4, applicationGroup: group)
        /// Item `number` (1-based, by creation) of a context.
        func item(_ number: String, in context: ObjectContext) throws -> TodoItemV4 {
            let items = try TodoItemV4.all(sortedBy: [SortDescriptor(\.created)], in: context)
            guard let number = Int(number), number > 0, number <= items.count else {
                throw SkyrosError(.objectNotFound, "there is no item \(number)")
            }
            return items[number - 1]
        }
        /// A 1-based place in a list of `count`, as an index.
        func index(_ text: String, of count: Int) throws -> Int {
            guard let number = Int(text), number > 0, number <= count else {
                throw SkyrosError(.objectNotFound, "there is no step \(text) (the item has \(count))")
            }
            return number - 1
        }
        let rest = Array(arguments.dropFirst())
        guard let number = rest.first else { fail("\(command) needs an item number") }
        switch command {
        case "step":
            let text = rest.dropFirst().joined(separator: " ")
            guard !text.isEmpty else { fail("step needs a text") }
            let at = place
            try store.writeAndWait { context in
                let item = try item(number, in: context)
                let step = TodoStep.create(in: context)
                step.text = text
                item.steps.insert(step, at: min((at ?? Int.max) - 1, item.steps.count))  // one position written
            }
        case "move":
            guard rest.count == 3 else { fail("move needs an item number, a step and a place") }
            try store.writeAndWait { context in
                let item = try item(number, in: context)
                var steps = item.steps
                let from = try index(rest[1], of: steps.count)
                let to = try index(rest[2], of: steps.count)
                steps.insert(steps.remove(at: from), at: to)
                item.steps = steps  // the moved step's position is the one row written
            }
        case "check":
            guard rest.count == 2 else { fail("check needs an item number and a step") }
            try store.writeAndWait { context in
                let steps = try item(number, in: context).steps
                steps[try index(rest[1], of: steps.count)].isDone = true
            }
        case "steps":
            break
        default:
            fail("unknown command \(command) (version 4 has step, move, check, steps)")
        }
        let lines: [String] = try store.read { context in
            let item = try item(number, in: context)
            return ["\(item.text):"] + describeSteps(of: item)
        }
        print(lines.joined(separator: "\n"))
    } catch let error as SkyrosError {
        fail(error.message)
    }
    exit(0)
}

if isVersion3 {
    do {
        let store = try Skyros(sharedStack: todoSchemaV3, applicationGroup: group)
        /// Item `number` (1-based, by creation) of a context.
        func item(_ number: String, in context: ObjectContext) throws -> TodoItemV3 {
            let items = try TodoItemV3.all(sortedBy: [SortDescriptor(\.created)], in: context)
            guard let number = Int(number), number > 0, number <= items.count else {
                throw SkyrosError(.objectNotFound, "there is no item \(number)")
            }
            return items[number - 1]
        }
        /// The tag with this name, made when there is none.
        func tag(_ name: String, in context: ObjectContext) throws -> TodoTag {
            if let tag = try TodoTag.first(where: #Predicate { $0.name == name }, in: context) { return tag }
            let tag = TodoTag.create(in: context)
            tag.name = name
            return tag
        }
        let rest = Array(arguments.dropFirst())
        switch command {
        case "tag", "untag":
            guard rest.count > 1 else { fail("\(command) needs an item number and tags") }
            try store.writeAndWait { context in
                let item = try item(rest[0], in: context)
                let names = Set(rest.dropFirst())
                if command == "tag" {
                    item.tags = item.tags + (try names.map { try tag($0, in: context) })  // a tag already there stays one
                } else {
                    item.tags = item.tags.filter { !names.contains($0.name) }
                }
            }
        case "list":
            let tagged = rest.first
            let lines: [String] = try store.read { try describeTodosV3(in: $0, tagged: tagged) }
            for (index, line) in lines.enumerated() { print("\(index + 1). \(line)") }
        case "retag-undo":
            // Undo on the main context: the write is one step; undone, then saved.
            guard rest.count > 1 else { fail("retag-undo needs an item number and a tag") }
            store.mainContext.undoManager = UndoManager()
            try store.writeAndWait { context in
                let item = try item(rest[0], in: context)
                item.tags = item.tags + [try tag(rest[1], in: context)]
            }
            print("tagged:   " + (try store.read { try describeTodosV3(in: $0) }).joined(separator: "; "))
            store.mainContext.undoManager?.undo()
            try store.saveMainContext()
            print("undone:   " + (try store.read { try describeTodosV3(in: $0) }).joined(separator: "; "))
        default:
            fail("unknown command \(command) (version 3 has tag, untag, list [TAG], retag-undo)")
        }
    } catch let error as SkyrosError {
        fail(error.message)
    }
    exit(0)
}

if isVersion2 {
    do {
        let store = try Skyros(sharedStack: todoSchemaV2, applicationGroup: group)
        let name = getpwuid(getuid()).map { String(cString: $0.pointee.pw_name) } ?? "uid \(getuid())"
        switch command {
        case "add":
            let text = arguments.dropFirst().joined(separator: " ")
            guard !text.isEmpty else { fail("add needs a title") }
            let dueDate = due
            try await store.write { context in
                let item = TodoItemV2.create(in: context)
                item.text = text
                item.author = name
                item.dueDate = dueDate
            }
        case "done":
            guard arguments.count > 1, let number = Int(arguments[1]), number > 0 else {
                fail("done needs an item number")
            }
            try await store.write { context in
                let items = try TodoItemV2.all(sortedBy: [SortDescriptor(\.created)], in: context)
                guard number <= items.count else { throw SkyrosError(.objectNotFound, "there is no item \(number)") }
                items[number - 1].isDone = true
            }
        case "list":
            let lines: [String] = try store.read { try describeTodosV2(in: $0) }
            for (index, line) in lines.enumerated() { print("\(index + 1). \(line)") }
        default:
            fail("unknown command \(command) (version 2 has add, done, list)")
        }
    } catch let error as SkyrosError {
        fail(error.message)
    }
    exit(0)
}

do {
    let store = try Skyros(sharedStack: todoSchema, applicationGroup: group)
    let name = getpwuid(getuid()).map { String(cString: $0.pointee.pw_name) } ?? "uid \(getuid())"
    switch command {
    case "add":
        let title = arguments.dropFirst().joined(separator: " ")
        guard !title.isEmpty else { fail("add needs a title") }
        try await store.write { context in
            let item = TodoItem.create(in: context)
            item.title = title
            item.author = name
        }
    case "done":
        guard arguments.count > 1, let number = Int(arguments[1]), number > 0 else { fail("done needs an item number") }
        try await store.write { context in
            let items = try TodoItem.all(sortedBy: [SortDescriptor(\.created)], in: context)
            guard number <= items.count else { throw SkyrosError(.objectNotFound, "there is no item \(number)") }
            items[number - 1].isDone = true
        }
    case "list":
        let lines: [String] = try store.read { try describeTodos(in: $0) }
        for (index, line) in lines.enumerated() { print("\(index + 1). \(line)") }
    case "watch":
        // Two fetched-results controllers keep the list in step with the group, one per
        // section (open, done): every change another process saves reaches them as inserts,
        // deletes, updates and moves, and the list is redrawn.
        let controllers = [false, true].map { done in
            FetchedResultsController<TodoItem>(
                fetch: FetchDescriptor(
                    predicate: #Predicate { $0.isDone == done }, sortBy: [SortDescriptor(\.created)]),
                context: store.mainContext)
        }
        let isTerminal = isatty(STDOUT_FILENO) == 1
        let title = "watching \(group) (Ctrl-C to stop)"
        // Called from the controllers' callbacks, on the main context's queue: @Sendable.
        let draw: @Sendable (String) -> Void = { summary in
            if isTerminal { print("\u{1B}[2J\u{1B}[H", terminator: "") }
            print(title)
            for (name, controller) in zip(["open", "done"], controllers) {
                print("\(name) (\(controller.fetchedObjects.count))")
                for item in controller.fetchedObjects {
                    print("  [\(item.isDone ? "x" : " ")] \(item.title) (\(item.author))")
                }
            }
            if !summary.isEmpty { print("-- \(summary)") }
            fflush(nil)
        }
        for (name, controller) in zip(["open", "done"], controllers) {
            // @Sendable: this is top-level (main-actor) code, and the controller calls back on
            // the main context's queue.
            controller.onChange = { @Sendable changes in
                var counts: [String: Int] = [:]
                for change in changes.objects {
                    switch change {
                    case .insert: counts["added", default: 0] += 1
                    case .delete: counts["removed", default: 0] += 1
                    case .update: counts["changed", default: 0] += 1
                    case .move: counts["moved", default: 0] += 1
                    }
                }
                draw(
                    "\(name): "
                        + counts.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", "))
            }
            try controller.performFetch()
        }
        store.mainContext.performAndWait { draw("") }
        while true { try await Task.sleep(for: .seconds(3_600)) }
    default:
        fail("unknown command \(command)")
    }
} catch let error as SkyrosError {
    fail(error.message)
}
