import Foundation
import Skyros

/// A todo item shared by the processes of a group (used by examples/Todo and `skyros demo`).
@Entity public final class TodoItem {
    public var title: String = ""
    public var isDone: Bool = false
    public var author: String = ""
    public var created: Date = Date()
}

public let todoSchema = Schema([TodoItem.self])

/// One line per item: "[x] title (author)".
public func describeTodos(in context: ObjectContext) throws -> [String] {
    try TodoItem.all(sortedBy: [SortDescriptor(\.created)], in: context).map {
        "[\($0.isDone ? "x" : " ")] \($0.title) (\($0.author))"
    }
}
