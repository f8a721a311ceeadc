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

/// Version 2 of the model (`todo --v2`): `title` is renamed `text`, and an item may have a due
/// date. Processes of both versions share a group: the first `todo --v2` makes the daemon
/// migrate the store; `todo` (version 1) processes beside it keep reading and writing, and
/// see the items version 2 adds (docs/GUIDE.md, "Changing your model").
@Entity(name: "TodoItem") public final class TodoItemV2 {
    @Attribute(originalName: "title") public var text: String = ""
    public var isDone: Bool = false
    public var author: String = ""
    public var created: Date = Date()
    public var dueDate: Date? = nil
}

public let todoSchemaV2 = Schema([TodoItemV2.self], version: 2)

/// One line per item of version 2: "[x] text (author), due YYYY-MM-DD".
public func describeTodosV2(in context: ObjectContext) throws -> [String] {
    let format = Date.ISO8601FormatStyle().year().month().day()
    return try TodoItemV2.all(sortedBy: [SortDescriptor(\.created)], in: context).map {
        "[\($0.isDone ? "x" : " ")] \($0.text) (\($0.author))"
            + ($0.dueDate.map { ", due \($0.formatted(format))" } ?? "")
    }
}

/// Version 3 (`todo --v3`): items have tags, a many-to-many (an item has any number of tags, a
/// tag any number of items). Its links are the rows of the link table `_TodoItem_tags`; the
/// daemon adds it (and the `TodoTag` table) when the first version-3 process connects.
@Entity(name: "TodoItem") public final class TodoItemV3 {
    @Attribute(originalName: "title") public var text: String = ""
    public var isDone: Bool = false
    public var author: String = ""
    public var created: Date = Date()
    public var dueDate: Date? = nil
    @Relationship(inverse: \TodoTag.items) public var tags: [TodoTag] = []
}

/// A tag of version 3: deleting one unlinks it from its items (nullify).
@Entity public final class TodoTag {
    @Attribute(.unique) public var name: String = ""
    public var items: [TodoItemV3] = []
}

public let todoSchemaV3 = Schema([TodoItemV3.self, TodoTag.self], version: 3)

/// One line per item of version 3: "[x] text (author) #tag #tag".
public func describeTodosV3(in context: ObjectContext, tagged tag: String? = nil) throws -> [String] {
    let items: [TodoItemV3]
    if let tag {
        items = try TodoItemV3.all(
            where: #Predicate { $0.tags.contains { $0.name == tag } }, sortedBy: [SortDescriptor(\.created)],
            in: context)
    } else {
        items = try TodoItemV3.all(sortedBy: [SortDescriptor(\.created)], in: context)
    }
    return items.map { item in
        "[\(item.isDone ? "x" : " ")] \(item.text) (\(item.author))"
            + item.tags.map { " #\($0.name)" }.sorted().joined()
    }
}

/// Version 4 (`todo --v4`): items have checklist steps, an ordered to-many (the steps keep the
/// order they are given; moving one writes one row). The daemon adds the `TodoStep` table and
/// the order table `_TodoItem_steps` when the first version-4 process connects.
@Entity(name: "TodoItem") public final class TodoItemV4 {
    @Attribute(originalName: "title") public var text: String = ""
    public var isDone: Bool = false
    public var author: String = ""
    public var created: Date = Date()
    public var dueDate: Date? = nil
    @Relationship(inverse: \TodoTagV4.items) public var tags: [TodoTagV4] = []
    @Relationship(.ordered, deleteRule: .cascade) public var steps: [TodoStep] = []
}

/// `TodoTag` of version 4 (its items are version 4's).
@Entity(name: "TodoTag") public final class TodoTagV4 {
    @Attribute(.unique) public var name: String = ""
    public var items: [TodoItemV4] = []
}

/// A checklist step of an item (version 4).
@Entity public final class TodoStep {
    public var text: String = ""
    public var isDone: Bool = false
    public var item: TodoItemV4? = nil
}

public let todoSchemaV4 = Schema([TodoItemV4.self, TodoTagV4.self, TodoStep.self], version: 4)

/// An item's steps in their order, one line each: `  1. [ ] text`.
public func describeSteps(of item: TodoItemV4) -> [String] {
    item.steps.enumerated().map { index, step in "  \(index + 1). [\(step.isDone ? "x" : " ")] \(step.text)" }
}
