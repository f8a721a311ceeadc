import Foundation
import Skyros

@Entity final class User {
    var firstname: String = ""
    var lastname: String = ""
    var age: Int = 0
    var email: String? = nil
    @Attribute(.unique) var handle: String = ""
    @Relationship(deleteRule: .cascade, inverse: \Post.author) var posts: [Post] = []
    @Transient var scratchNote: String = "not stored"
    var fullName: String { "\(firstname) \(lastname)" }
}

@Entity final class Post {
    var title: String = ""
    var score: Double = 0
    var author: User? = nil
}

/// Nullify (the default) and deny rules, and a required relationship.
@Entity final class Team {
    var name: String = ""
    @Relationship(inverse: \Player.team) var players: [Player] = []
    @Relationship(deleteRule: .deny, inverse: \Badge.team) var badges: [Badge] = []
}

@Entity final class Player {
    var name: String = ""
    var team: Team? = nil
}

@Entity final class Badge {
    var label: String = ""
    @Relationship(.required) var team: Team? = nil
}

enum Status: String, Codable, Sendable {
    case todo, done
}

enum Priority: Int, Sendable {
    case low = 1, high = 2
}

struct Location: Codable, Equatable, Sendable {
    var latitude: Double
    var longitude: Double
}

@Entity(indexes: ["int32", "int16"], ["code"]) final class Sample {
    var string: String = "s"
    var int: Int = 1
    var int64: Int64 = 2
    var int32: Int32 = 3
    var int16: Int16 = 4
    var double: Double = 5.5
    var float: Float = 6.5
    var bool: Bool = true
    var date: Date = Date(timeIntervalSince1970: 7)
    var data: Data = Data([8])
    var uuid: UUID = UUID(uuidString: "00000000-0000-0000-0000-000000000009")!
    var url: URL = URL(string: "https://example.com/10")!
    var decimal: Decimal = Decimal(string: "11.25")!
    var status: Status = .todo
    var priority: Priority = .low
    var location: Location = Location(latitude: 1, longitude: 2)
    var optionalString: String? = nil
    var optionalInt: Int? = nil
    var optionalDate: Date? = nil
    var optionalStatus: Status? = nil
    var optionalLocation: Location? = nil
    @Attribute(.indexed) var code: Int = 0
}

/// An entity written by hand, without the macro: proves the macro uses public API only.
final class Tag: ManagedObject {
    static let entityDescription = EntityDescription(
        Tag.self,
        properties: [
            .attribute("label", \Tag.label, default: { "" }, options: [.unique]),
            .attribute("uses", \Tag.uses, default: { 0 }),
        ])
    let skyrosStorage: ObjectStorage
    init(skyrosStorage: ObjectStorage) { self.skyrosStorage = skyrosStorage }

    var label: String {
        get { skyrosStorage.value(at: 0) }
        set { skyrosStorage.setValue(newValue, at: 0) }
    }
    var uses: Int {
        get { skyrosStorage.value(at: 1) }
        set { skyrosStorage.setValue(newValue, at: 1) }
    }
}

let testSchema = Schema([User.self, Post.self, Team.self, Player.self, Badge.self, Sample.self, Tag.self])
