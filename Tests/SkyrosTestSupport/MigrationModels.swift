// Three versions of one model, for the migration tests and the test child: each version's
// classes keep the entity names with `@Entity(name:)`.
import Foundation
import Skyros

// MARK: - Version 1

@Entity(name: "Author") public final class AuthorV1 {
    public var name: String = ""
    public var email: String? = nil
    public var nickname: String = ""
    public var age: Int = 0
    @Relationship(inverse: \BookV1.author) public var books: [BookV1] = []
}

@Entity(name: "Book") public final class BookV1 {
    public var title: String = ""
    public var pages: Int = 0
    public var isbn: String? = nil
    public var author: AuthorV1? = nil
}

@Entity(name: "Note") public final class NoteV1 {
    public var text: String = ""
}

@Entity(name: "Person") public final class PersonV1 {
    public var handle: String = ""
}

// MARK: - Version 2

/// A renamed attribute, a removed one, two added (with a default, optional), an added index.
@Entity(name: "Author") public final class AuthorV2 {
    @Attribute(originalName: "name") public var fullName: String = ""
    @Attribute(.indexed) public var email: String? = nil
    public var age: Int = 0
    public var rating: Double = 5
    public var bio: String? = nil
    @Relationship(inverse: \BookV2.author) public var books: [BookV2] = []
}

/// A new unique constraint, optional → non-optional with a default, a new to-one (and its
/// to-many inverse in Member), a declared two-column index.
@Entity(name: "Book", indexes: ["pages", "title"]) public final class BookV2 {
    @Attribute(.unique) public var title: String = ""
    public var pages: Int = 0
    public var isbn: String = "none"
    public var author: AuthorV2? = nil
    public var editor: MemberV2? = nil
}

/// A renamed entity (Person), with a new to-many.
@Entity(name: "Member", originalName: "Person") public final class MemberV2 {
    public var handle: String = ""
    @Relationship(inverse: \BookV2.editor) public var edited: [BookV2] = []
}

/// A new entity.
@Entity(name: "Tag") public final class TagV2 {
    public var label: String = ""
}

// MARK: - Version 3

/// A type change (age: Int → String, set by a stage), non-optional → optional (rating), an
/// index removed (email).
@Entity(name: "Author") public final class AuthorV3 {
    @Attribute(originalName: "name") public var fullName: String = ""
    public var email: String? = nil
    public var age: String = ""
    public var rating: Double? = nil
    public var bio: String? = nil
    @Relationship(inverse: \BookV3.author) public var books: [BookV3] = []
}

/// The unique constraint, the declared index and the to-one (editor) removed.
@Entity(name: "Book") public final class BookV3 {
    public var title: String = ""
    public var pages: Int = 0
    public var isbn: String = "none"
    public var author: AuthorV3? = nil
}

@Entity(name: "Member", originalName: "Person") public final class MemberV3 {
    public var handle: String = ""
}

/// A new attribute a stage fills in.
@Entity(name: "Tag") public final class TagV3 {
    public var label: String = ""
    public var slug: String = ""
}

public enum MigrationModels {
    public static var v1: Schema { Schema([AuthorV1.self, BookV1.self, NoteV1.self, PersonV1.self], version: 1) }
    public static var v2: Schema { Schema([AuthorV2.self, BookV2.self, MemberV2.self, TagV2.self], version: 2) }
    public static var v3: Schema { Schema([AuthorV3.self, BookV3.self, MemberV3.self, TagV3.self], version: 3) }

    /// The stage to version 3: ages from integers to text, tags' slugs from their labels.
    public static let stage3 = MigrationPlan().stage(to: 3) { context in
        for author in try AuthorV3.all(in: context) {
            author.age = (try context.previousValue("age", of: author, as: Int.self)).map { "\($0) years" } ?? "?"
        }
        for tag in try TagV3.all(in: context) { tag.slug = tag.label.lowercased() }
    }

    /// Fills a version-1 store: `authors` authors with two books each, notes and persons.
    public static func fillV1(at url: URL, authors: Int) throws {
        let store = try SQLiteStore(schema: v1, url: url)
        defer { try? store.close() }
        let context = ObjectContext(name: "fill", parent: store)
        try context.performAndWait {
            for number in 0..<authors {
                let author = AuthorV1.create(in: context)
                author.name = "Author \(number)"
                author.email = number.isMultiple(of: 2) ? "a\(number)@example.com" : nil
                author.nickname = "nick\(number)"
                author.age = 20 + number % 50
                for side in 0..<2 {
                    let book = BookV1.create(in: context)
                    book.title = "Book \(number)-\(side)"
                    book.pages = 100 + number
                    book.isbn = side == 0 ? "isbn-\(number)" : nil
                    book.author = author
                }
            }
            NoteV1.create(in: context).text = "a note"
            PersonV1.create(in: context).handle = "pat"
            try context.save()
        }
    }
}

// MARK: - Before a many-to-many

/// `Article` and `Keyword` of `linkSchema`, before their many-to-many relationship.
@Entity(name: "Article") public final class ArticleV1 {
    public var title: String = ""
}

@Entity(name: "Keyword") public final class KeywordV1 {
    @Attribute(.unique) public var name: String = ""
}

/// `linkSchema`'s entities at version 1: no relationship yet.
public let unlinkedSchema = Schema([ArticleV1.self, KeywordV1.self, Playlist.self, Song.self], version: 1)

/// `Article` of `linkSchema` renamed `Bulletin` (still the owner of the many-to-many: "Bulletin"
/// comes before "Keyword"), with `Keyword` pointing to it.
@Entity(name: "Bulletin", originalName: "Article") public final class Bulletin {
    public var title: String = ""
    @Relationship(inverse: \KeywordOfBulletins.articles) public var keywords: [KeywordOfBulletins] = []
}

@Entity(name: "Keyword") public final class KeywordOfBulletins {
    @Attribute(.unique) public var name: String = ""
    public var articles: [Bulletin] = []
}

/// `Checklist` and `Step` of `orderSchema`, before their to-many was ordered.
@Entity(name: "Checklist") public final class ChecklistV1 {
    public var name: String = ""
    @Relationship(deleteRule: .cascade) public var steps: [StepV1] = []
}

@Entity(name: "Step") public final class StepV1 {
    public var title: String = ""
    public var done: Bool = false
    public var checklist: ChecklistV1? = nil
}

/// `Album` and `Track` of `orderedLinkSchema`, before their many-to-many was ordered.
@Entity(name: "Album") public final class AlbumV1 {
    public var name: String = ""
    @Relationship(inverse: \TrackV1.albums) public var tracks: [TrackV1] = []
}

@Entity(name: "Track") public final class TrackV1 {
    public var title: String = ""
    public var albums: [AlbumV1] = []
}
