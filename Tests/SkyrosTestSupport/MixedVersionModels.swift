// Two versions of one model served side by side by a group's daemon (mixed schema versions),
// and a third that the daemon cannot migrate to.
import Foundation
import Skyros

/// Version 1: a title and a flag.
@Entity(name: "Task") public final class TaskV1 {
    public var title: String = ""
    public var done: Bool = false
}

/// Version 2: `title` renamed `name`, an optional due date and a priority with a default added.
@Entity(name: "Task") public final class TaskV2 {
    @Attribute(originalName: "title") public var name: String = ""
    public var done: Bool = false
    public var dueDate: Date? = nil
    public var priority: Int = 3
}

/// Version 3, not inferable: `done` changes type (Bool → String) without a migration stage.
@Entity(name: "Task") public final class TaskBadV3 {
    @Attribute(originalName: "title") public var name: String = ""
    public var done: String = ""
    public var dueDate: Date? = nil
    public var priority: Int = 3
}

public enum MixedVersionModels {
    public static let v1 = Schema([TaskV1.self], version: 1)
    public static let v2 = Schema([TaskV2.self], version: 2)
    public static let badV3 = Schema([TaskBadV3.self], version: 3)
}
