// A todo list that several terminals share through an application group:
//
//     swift run skyrosd --group com.example.todo &
//     swift run todo add "buy milk"          # in one terminal
//     swift run todo watch                   # in another: prints the list at every change
//     swift run todo done 1
//     swift run todo list
//
// SKYROS_GROUPS_DIR or --group pick the group (default com.example.todo).
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
guard let command = arguments.first else { fail("usage: todo [--group ID] add TITLE | done N | list | watch") }

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
        print("watching \(group) (Ctrl-C to stop)")
        for await _ in store.changes {
            let lines: [String] = try store.read { try describeTodos(in: $0) }
            print("--")
            for (index, line) in lines.enumerated() { print("\(index + 1). \(line)") }
        }
    default:
        fail("unknown command \(command)")
    }
} catch let error as SkyrosError {
    fail(error.message)
}
