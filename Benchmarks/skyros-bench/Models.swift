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

let benchSchema = Schema([Item.self])
