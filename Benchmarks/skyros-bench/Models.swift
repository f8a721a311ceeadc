import Foundation
import Skyros

/// The benchmark entity: five attributes, one of them indexed.
@Entity final class Item {
    var name: String = ""
    @Attribute(.indexed) var value: Int = 0
    var score: Double = 0
    var flag: Bool = false
    var created: Date = Date(timeIntervalSince1970: 0)
}

/// An entity with a unique attribute: its saves are checked by the store's unique index at
/// commit (through a daemon, one round trip per save).
@Entity final class Account {
    @Attribute(.unique) var handle: String = ""
}

let benchSchema = Schema([Item.self, Account.self])
