// Entities shared by the tests and the test child process; public, to prove entities
// work across modules.
import Foundation
import Skyros

@Entity public final class User {
    public var firstname: String = ""
    public var lastname: String = ""
    public var age: Int = 0
    public var email: String? = nil
    @Attribute(.unique) public var handle: String = ""
    @Relationship(deleteRule: .cascade, inverse: \Post.author) public var posts: [Post] = []
    @Transient public var scratchNote: String = "not stored"
    public var fullName: String { "\(firstname) \(lastname)" }
    /// A computed section key: the first letter of the last name.
    public var lastnameInitial: String { String(lastname.prefix(1)) }
}

@Entity public final class Post {
    public var title: String = ""
    public var score: Double = 0
    public var author: User? = nil
}

/// Nullify (the default) and deny rules, and a required relationship.
@Entity public final class Team {
    public var name: String = ""
    @Relationship(inverse: \Player.team) public var players: [Player] = []
    @Relationship(deleteRule: .deny, inverse: \Badge.team) public var badges: [Badge] = []
}

@Entity public final class Player {
    public var name: String = ""
    public var team: Team? = nil
}

@Entity public final class Badge {
    public var label: String = ""
    @Relationship(.required) public var team: Team? = nil
}

/// One-to-one: both sides are to-ones, each the other's inverse.
@Entity public final class Person {
    public var name: String = ""
    @Relationship(inverse: \Passport.holder) public var passport: Passport? = nil
}

@Entity public final class Passport {
    public var number: String = ""
    public var holder: Person? = nil
}

public enum Status: String, Codable, Sendable {
    case todo, done
}

public enum Priority: Int, Sendable {
    case low = 1
    case high = 2
}

public struct Location: Codable, Equatable, Sendable {
    public var latitude: Double
    public var longitude: Double
    public init(latitude: Double, longitude: Double) {
        self.latitude = latitude
        self.longitude = longitude
    }
}

@Entity(indexes: ["int32", "int16"], ["code"]) public final class Sample {
    public var string: String = "s"
    public var int: Int = 1
    public var int64: Int64 = 2
    public var int32: Int32 = 3
    public var int16: Int16 = 4
    public var double: Double = 5.5
    public var float: Float = 6.5
    public var bool: Bool = true
    public var date: Date = Date(timeIntervalSince1970: 7)
    public var data: Data = Data([8])
    public var uuid: UUID = UUID(uuidString: "00000000-0000-0000-0000-000000000009")!
    public var url: URL = URL(string: "https://example.com/10")!
    public var decimal: Decimal = Decimal(string: "11.25")!
    public var status: Status = .todo
    public var priority: Priority = .low
    public var location: Location = Location(latitude: 1, longitude: 2)
    public var optionalString: String? = nil
    public var optionalInt: Int? = nil
    public var optionalDate: Date? = nil
    public var optionalStatus: Status? = nil
    public var optionalLocation: Location? = nil
    @Attribute(.indexed) public var code: Int = 0
}

/// An entity written by hand, without the macro: proves the macro uses public API only.
public final class Tag: ManagedObject {
    public static let entityDescription = EntityDescription(
        Tag.self,
        properties: [
            .attribute("label", \Tag.label, default: { "" }, options: [.unique]),
            .attribute("uses", \Tag.uses, default: { 0 }),
        ])
    public let skyrosStorage: ObjectStorage
    public init(skyrosStorage: ObjectStorage) { self.skyrosStorage = skyrosStorage }

    public var label: String {
        get { skyrosStorage.value(at: 0) }
        set { skyrosStorage.setValue(newValue, at: 0) }
    }
    public var uses: Int {
        get { skyrosStorage.value(at: 1) }
        set { skyrosStorage.setValue(newValue, at: 1) }
    }
}

public let testSchema = Schema([
    User.self, Post.self, Team.self, Player.self, Badge.self, Sample.self, Tag.self, Person.self, Passport.self,
])

/// Validation rules, keyed on names no other test uses: a name starting with "INVALID" is
/// refused (a property rule), "REFUSED" cannot be inserted, "FROZEN" cannot be updated into,
/// "UNDELETABLE" cannot be deleted (object rules).
extension Player: ValidatingObject {
    public enum Rule: Error, Equatable {
        case invalidName(String)
        case refused, frozen, undeletable
    }

    public func validateValue(forKey key: String) throws {
        if key == "name" && name.hasPrefix("INVALID") { throw Rule.invalidName(name) }
    }

    public func validateForInsert() throws {
        if name == "REFUSED" { throw Rule.refused }
    }

    public func validateForUpdate() throws {
        if name == "FROZEN" { throw Rule.frozen }
    }

    public func validateForDelete() throws {
        if name == "UNDELETABLE" { throw Rule.undeletable }
    }
}

// MARK: - Many-to-many

/// A many-to-many with nullify on both sides; the inverse named on one side (SwiftData's way).
@Entity public final class Article {
    public var title: String = ""
    @Relationship(inverse: \Keyword.articles) public var keywords: [Keyword] = []
}

@Entity public final class Keyword {
    @Attribute(.unique) public var name: String = ""
    public var articles: [Article] = []
}

/// A many-to-many with cascade on one side and deny on the other.
@Entity public final class Playlist {
    public var name: String = ""
    @Relationship(deleteRule: .cascade, inverse: \Song.playlists) public var songs: [Song] = []
}

@Entity public final class Song {
    public var title: String = ""
    @Relationship(deleteRule: .deny) public var playlists: [Playlist] = []
}

/// The schema of the many-to-many tests.
public let linkSchema = Schema([Article.self, Keyword.self, Playlist.self, Song.self])

/// A many-to-many between two properties of one entity: who follows whom.
@Entity public final class Follower {
    public var name: String = ""
    @Relationship(inverse: \Follower.followers) public var following: [Follower] = []
    public var followers: [Follower] = []
}

/// The schema of the self-referencing many-to-many test.
public let followSchema = Schema([Follower.self])

// MARK: - Ordered to-many

/// A checklist whose steps keep their order; deleting it deletes them.
@Entity public final class Checklist {
    public var name: String = ""
    @Relationship(.ordered, deleteRule: .cascade) public var steps: [Step] = []
}

@Entity public final class Step {
    public var title: String = ""
    public var done: Bool = false
    public var checklist: Checklist? = nil
}

/// The schema of the ordered to-many tests.
public let orderSchema = Schema([Checklist.self, Step.self])

/// A many-to-many ordered on both sides: refused (not supported yet).
@Entity public final class Shelf {
    @Relationship(.ordered, inverse: \Volume.shelves) public var volumes: [Volume] = []
}

@Entity public final class Volume {
    @Relationship(.ordered) public var shelves: [Shelf] = []
}

/// An ordered many-to-many whose ordered side owns the links (`_Album_tracks`).
@Entity public final class Album {
    public var name: String = ""
    @Relationship(.ordered, inverse: \Track.albums) public var tracks: [Track] = []
}

@Entity public final class Track {
    public var title: String = ""
    public var albums: [Album] = []
}

/// An ordered many-to-many whose other side owns the links (`_Episode_listeners`).
@Entity public final class Listener {
    public var name: String = ""
    @Relationship(.ordered, inverse: \Episode.listeners) public var queue: [Episode] = []
}

@Entity public final class Episode {
    public var title: String = ""
    public var listeners: [Listener] = []
}

/// The schema of the ordered many-to-many tests.
public let orderedLinkSchema = Schema([Album.self, Track.self, Listener.self, Episode.self])
