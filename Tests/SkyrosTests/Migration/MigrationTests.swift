import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// The files of a directory, byte for byte (without SQLite's -shm index, which any reader rewrites).
private func contents(of directory: TemporaryDirectory) throws -> [String: Data] {
    var result: [String: Data] = [:]
    for name in try FileManager.default.contentsOfDirectory(atPath: directory.url.path) where !name.hasSuffix("-shm") {
        result[name] = try Data(contentsOf: directory.file(name))
    }
    return result
}

/// Opens, runs `body` on a context of the store, closes.
private func withStore(
    _ schema: Schema, at url: URL, plan: MigrationPlan = MigrationPlan(),
    _ body: (ObjectContext, SQLiteStore) throws -> Void
) throws {
    let store = try SQLiteStore(schema: schema, url: url, migrations: plan)
    defer { try? store.close() }
    let context = ObjectContext(name: "test", parent: store)
    return try context.performAndWait { try body(context, store) }
}

private func indexes(_ store: SQLiteStore) throws -> Set<String> {
    Set(
        try store.rows("SELECT name FROM sqlite_master WHERE type = 'index' AND sql IS NOT NULL").compactMap {
            if case .text(let name) = $0[0] { name } else { nil }
        })
}

private func columns(_ store: SQLiteStore, _ table: String) throws -> [String] {
    try store.rows("SELECT name FROM pragma_table_info('\(table)')").compactMap {
        if case .text(let name) = $0[0] { name } else { nil }
    }
}

private func tables(_ store: SQLiteStore) throws -> Set<String> {
    Set(
        try store.rows("SELECT name FROM sqlite_master WHERE type = 'table'").compactMap {
            if case .text(let name) = $0[0] { name } else { nil }
        })
}

private func recordedVersions(_ store: SQLiteStore) throws -> [Int64] {
    try store.rows("SELECT version FROM skyros_schema ORDER BY version").compactMap {
        if case .integer(let version) = $0[0] { version } else { nil }
    }
}

/// Expects opening `url` with `schema` to fail with `code` and a message containing each of
/// `words`, and the directory to stay byte for byte as it was.
private func expectRefusal(
    _ code: SkyrosError.Code, _ words: [String], _ schema: Schema, plan: MigrationPlan = MigrationPlan(),
    in directory: TemporaryDirectory, sourceLocation: SourceLocation = #_sourceLocation
) throws {
    let url = directory.file("store.sqlite")
    let before = try contents(of: directory)
    do {
        let store = try SQLiteStore(schema: schema, url: url, migrations: plan)
        try? store.close()
        Issue.record("the store opened", sourceLocation: sourceLocation)
    } catch let error as SkyrosError {
        #expect(error.code == code, "\(error)", sourceLocation: sourceLocation)
        for word in words {
            #expect(
                error.message.contains(word), "\(error.message) does not name \(word)", sourceLocation: sourceLocation)
        }
    }
    let after = try contents(of: directory)
    #expect(Set(after.keys) == Set(before.keys), sourceLocation: sourceLocation)
    for (name, data) in before {
        #expect(after[name] == data, "\(name) changed", sourceLocation: sourceLocation)
    }
}

@Suite("Schema evolution", .timeLimit(.minutes(3)))
struct MigrationTests {
    /// The checks of a version-3 store made from `fillV1(authors: 10)`.
    private func checkV3(_ url: URL, rating: Double?) throws {
        try withStore(MigrationModels.v3, at: url) { context, store in
            let authors = try AuthorV3.all(in: context).sorted { $0.fullName < $1.fullName }
            #expect(authors.count == 10)
            let first = try #require(authors.first)
            #expect(first.fullName == "Author 0")
            #expect(first.email == "a0@example.com")
            #expect(first.age == "20 years")
            #expect(first.rating == rating)
            #expect(first.books.map(\.title).sorted() == ["Book 0-0", "Book 0-1"])
            let books = try BookV3.all(in: context)
            #expect(books.count == 20)
            #expect(books.allSatisfy { $0.author != nil })
            #expect(Set(books.map(\.isbn)).contains("none"))
            #expect(try BookV3.all(in: context).first { $0.title == "Book 3-0" }?.isbn == "isbn-3")
            #expect(try MemberV3.all(in: context).map(\.handle) == ["pat"])
            let index = try indexes(store)
            #expect(!index.contains("Author_email"))
            #expect(!index.contains("Book_title"))
            #expect(!index.contains("Book_index0"))
            #expect(index.contains("Book_author"))
            #expect(try columns(store, "Book") == ["_id", "_version", "title", "pages", "isbn", "author"])
            #expect(try columns(store, "Author").contains("nickname") == false)
            let names = try tables(store)
            #expect(!names.contains("Note") && !names.contains("Person") && names.contains("Member"))
            #expect(try recordedVersions(store).last == 3)
            #expect(try store.rows("PRAGMA foreign_key_check").isEmpty)
        }
    }

    @Test("v1 → v2 → v3 on one file: every inferred step, a stage, data and relationships kept")
    func v1ToV2ToV3() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        try MigrationModels.fillV1(at: url, authors: 10)
        try withStore(MigrationModels.v2, at: url) { context, store in
            let authors = try AuthorV2.all(in: context)
            #expect(authors.count == 10)
            let first = try #require(authors.first { $0.fullName == "Author 0" })
            #expect(first.rating == 5)
            #expect(first.bio == nil)
            #expect(first.age == 20)
            #expect(first.books.count == 2)
            let books = try BookV2.all(in: context)
            #expect(books.filter { $0.isbn == "none" }.count == 10)
            #expect(books.allSatisfy { $0.editor == nil && $0.author != nil })
            let members = try MemberV2.all(in: context)
            #expect(members.map(\.handle) == ["pat"])
            #expect(try TagV2.count(in: context) == 0)
            // The new relationship and entity work.
            books[0].editor = members[0]
            TagV2.create(in: context).label = "Swift"
            try context.save()
            #expect(members[0].edited.count == 1)
            let index = try indexes(store)
            #expect(index.isSuperset(of: ["Author_email", "Book_title", "Book_index0", "Book_editor", "Book_author"]))
            #expect(!(try tables(store)).contains("Note"))
            #expect(try columns(store, "Author").contains("nickname") == false)
            #expect(try recordedVersions(store) == [1, 2])
            // Each version's date is ISO 8601 in UTC, and the migration's is now.
            let dates = try store.rows("SELECT date FROM skyros_schema ORDER BY version").compactMap {
                if case .text(let text) = $0[0] { ISO8601DateFormatter().date(from: text) } else { nil }
            }
            #expect(dates.count == 2)
            #expect(abs(try #require(dates.last).timeIntervalSinceNow) < 60)
            // The new unique constraint holds.
            BookV2.create(in: context).title = "Book 0-0"
            #expect(throws: SkyrosError.self) { try context.save() }
        }
        try withStore(MigrationModels.v3, at: url, plan: MigrationModels.stage3) { context, _ throws in
            #expect(try TagV3.all(in: context).map(\.slug) == ["swift"])
        }
        try checkV3(url, rating: 5)
        // Reopening changes nothing and needs no plan.
        try withStore(MigrationModels.v3, at: url) { _, store throws in
            #expect(try recordedVersions(store) == [1, 2, 3])
        }
    }

    @Test("v1 → v3 straight")
    func v1ToV3() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        try MigrationModels.fillV1(at: url, authors: 10)
        try withStore(MigrationModels.v3, at: url, plan: MigrationModels.stage3) { _, _ in }
        try checkV3(url, rating: nil)
        try withStore(MigrationModels.v3, at: url) { _, store throws in #expect(try recordedVersions(store) == [1, 3]) }
    }

    @Test("stages chain: a stage of version 2 runs in version 2's schema, then the stage of version 3")
    func chainedStages() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        try MigrationModels.fillV1(at: url, authors: 10)
        let plan = MigrationPlan()
            .stage(to: 2, schema: MigrationModels.v2) { context in
                for author in try AuthorV2.all(in: context) { author.rating = Double(author.age) }
                // A removed attribute's value, from version 1.
                let first = try #require(try AuthorV2.all(in: context).first { $0.fullName == "Author 1" })
                #expect(try context.previousValue("nickname", of: first, as: String.self) == "nick1")
                #expect(try context.previousObjects(ofEntity: "Note").map { $0.values["text"] } == [.text("a note")])
            }
            .stage(to: 3, MigrationModels.stage3.stages[0].body)
        try withStore(MigrationModels.v3, at: url, plan: plan) { _, _ in }
        try checkV3(url, rating: 20)
        try withStore(MigrationModels.v3, at: url) { _, store throws in
            #expect(try recordedVersions(store) == [1, 2, 3])
        }
    }

    @Test("a type change without a stage is refused, naming entity and property; the file is untouched")
    func refusedTypeChange() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        try MigrationModels.fillV1(at: url, authors: 3)
        try withStore(MigrationModels.v2, at: url) { _, _ in }
        try expectRefusal(
            .migrationFailed, ["Author.age", "int", "string", "stage"], MigrationModels.v3, in: directory)
        try withStore(MigrationModels.v2, at: url) { context, _ throws in #expect(try AuthorV2.count(in: context) == 3)
        }
    }

    @Test("a new unique constraint that existing objects violate is refused; the file is untouched")
    func refusedUniqueConstraint() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        try MigrationModels.fillV1(at: url, authors: 3)  // two books of each author have the same pages
        var description = MigrationModels.v1.schemaDescription
        let book = try #require(description.entities.firstIndex { $0.name == "Book" })
        let pages = try #require(description.entities[book].properties.firstIndex { $0.name == "pages" })
        description.entities[book].properties[pages].isUnique = true
        try expectRefusal(
            .migrationFailed, ["Book.pages", "unique", "100"], try Schema(description: description, version: 2),
            in: directory)
        try withStore(MigrationModels.v1, at: url) { context, _ throws in #expect(try BookV1.count(in: context) == 6) }
    }

    @Test("a new non-optional attribute without a default is refused")
    func refusedMissingDefault() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        try MigrationModels.fillV1(at: url, authors: 3)
        var description = MigrationModels.v1.schemaDescription
        let author = try #require(description.entities.firstIndex { $0.name == "Author" })
        description.entities[author].properties.append(
            SchemaDescription.Property(
                name: "rank", kind: "attribute", storageType: .integer, isOptional: false, typeName: "int"))
        try expectRefusal(
            .migrationFailed, ["Author.rank", "default"], try Schema(description: description, version: 2),
            in: directory)
    }

    @Test("a stage that throws fails the migration, and nothing of it is stored")
    func failingStage() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        try MigrationModels.fillV1(at: url, authors: 3)
        let plan = MigrationPlan().stage(to: 2) { context in
            for author in try AuthorV2.all(in: context) { author.fullName = "changed" }
            try context.save()
            throw TestFailure(reason: "stage failed on purpose")
        }
        try expectRefusal(
            .migrationFailed, ["stage for version 2", "on purpose"], MigrationModels.v2, plan: plan, in: directory)
        try withStore(MigrationModels.v1, at: url) { context, _ throws in
            let authors = try AuthorV1.all(in: context)
            #expect(authors.count == 3 && authors.allSatisfy { $0.name.hasPrefix("Author") })
        }
    }

    @Test("opening a store with an older schema version is .schemaTooNew; the file is untouched")
    func schemaTooNew() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        try MigrationModels.fillV1(at: url, authors: 2)
        try withStore(MigrationModels.v2, at: url) { _, _ in }
        try expectRefusal(.schemaTooNew, ["version 2", "version 1"], MigrationModels.v1, in: directory)
        // A changed model at the same version is not migrated either.
        var description = MigrationModels.v2.schemaDescription
        description.entities.removeAll { $0.name == "Tag" }
        try expectRefusal(.schemaMismatch, ["version"], try Schema(description: description, version: 2), in: directory)
    }

    @Test("the version is raised without a model change: the stage runs, the version is recorded")
    func versionOnly() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        try MigrationModels.fillV1(at: url, authors: 2)
        let v1again = Schema([AuthorV1.self, BookV1.self, NoteV1.self, PersonV1.self], version: 2)
        let plan = MigrationPlan().stage(to: 2) { context in
            for author in try AuthorV1.all(in: context) { author.nickname = author.nickname.uppercased() }
        }
        try withStore(v1again, at: url, plan: plan) { context, store throws in
            let authors = try AuthorV1.all(in: context)
            #expect(authors.count == 2 && authors.allSatisfy { $0.nickname.hasPrefix("NICK") })
            #expect(try recordedVersions(store) == [1, 2])
        }
    }

    @Test("the Skyros stack migrates with a plan")
    func stack() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        try MigrationModels.fillV1(at: url, authors: 10)
        let stack = try Skyros(
            sqliteStack: MigrationModels.v3, at: url, savesOnStop: false, migrations: MigrationModels.stage3)
        let ages = try stack.read { context in try AuthorV3.all(in: context).map(\.age) }
        #expect(ages.count == 10 && ages.allSatisfy { $0.hasSuffix("years") })
        try (stack.store as! SQLiteStore).close()
    }

    @Test("a process killed in the middle of a migration leaves the old schema, which migrates later")
    func killedDuringMigration() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        try MigrationModels.fillV1(at: url, authors: 5_000)
        let child = try ChildProcess(["migrate-and-hang", url.path])
        #expect(child.waitForLine("MIGRATING", seconds: 60))
        kill(child.pid, SIGKILL)
        #expect(child.wait() == .signalled(SIGKILL))
        // The old schema, whole.
        try withStore(MigrationModels.v1, at: url) { context, store throws in
            #expect(try AuthorV1.count(in: context) == 5_000)
            #expect(try BookV1.count(in: context) == 10_000)
            #expect(try NoteV1.count(in: context) == 1)
            #expect(try recordedVersions(store) == [1])
            #expect(try columns(store, "Author").contains("nickname"))
        }
        // Then the migration, done this time.
        try withStore(MigrationModels.v2, at: url) { context, store throws in
            #expect(try AuthorV2.count(in: context) == 5_000)
            #expect(try BookV2.count(in: context) == 10_000)
            #expect(try recordedVersions(store) == [1, 2])
        }
    }

    @Test("after a migration every index is as a new store of the schema makes it: renamed, kept, composite, unique")
    func indexesAsDeclared() throws {
        let directory = try TemporaryDirectory()
        func definitions(_ schema: Schema, at url: URL) throws -> Set<String> {
            let store = try SQLiteStore(schema: schema, url: url)
            defer { try? store.close() }
            return Set(
                try store.rows("SELECT name, sql FROM sqlite_master WHERE type = 'index' ORDER BY name").map { "\($0)" }
            )
        }
        let v1 = Schema([IndexedV1.self])
        let v2 = Schema([IndexedV2.self], version: 2)
        let v3 = Schema([IndexedV3.self], version: 3)
        for (name, path) in [("step by step", [v2, v3]), ("straight", [v3])] {
            let url = directory.file("\(name).sqlite")
            try withStore(v1, at: url) { context, _ in
                for number in 0..<5 {
                    let object = IndexedV1.create(in: context)
                    object.a = "a\(number)"
                    object.name = "n\(number)"
                    object.kept = number
                    object.code = "c\(number)"
                }
                try context.save()
            }
            for schema in path {
                // The migration's own commit is not synced; the store still runs at full durability.
                let opened = try SQLiteStore(schema: schema, url: url, durability: .full)
                #expect(try opened.effectiveDurability() == .full)
                try opened.close()
                let migrated = try definitions(schema, at: url)
                let fresh = try definitions(schema, at: directory.file("fresh-\(name)-\(schema.version).sqlite"))
                #expect(migrated == fresh, "\(name), version \(schema.version)")
            }
            try withStore(v3, at: url) { context, _ in
                let objects = try IndexedV3.all(in: context).sorted { $0.level < $1.level }
                #expect(objects.map(\.title) == (0..<5).map { "n\($0)" })
                #expect(objects.map(\.code) == (0..<5).map { "c\($0)" })
                #expect(objects.allSatisfy { $0.added == 1.5 })
            }
        }
    }
}

@Entity(name: "Indexed", indexes: ["a", "kept"]) final class IndexedV1 {
    @Attribute(.indexed) var a: String = ""
    @Attribute(.indexed) var name: String = ""
    @Attribute(.indexed) var kept: Int = 0
    @Attribute(.unique) var code: String = ""
}

/// `name` renamed (its index follows), a composite index replaced, an attribute added.
@Entity(name: "Indexed", indexes: ["title", "kept"]) final class IndexedV2 {
    @Attribute(.indexed) var a: String = ""
    @Attribute(.indexed, originalName: "name") var title: String = ""
    @Attribute(.indexed) var kept: Int = 0
    @Attribute(.unique) var code: String = ""
    var added: Double = 1.5
}

/// `a` no longer indexed, `kept` renamed while in a composite index (`title` keeps its
/// original name, for a migration straight from version 1).
@Entity(name: "Indexed", indexes: ["title", "level"]) final class IndexedV3 {
    var a: String = ""
    @Attribute(.indexed, originalName: "name") var title: String = ""
    @Attribute(.indexed, originalName: "kept") var level: Int = 0
    @Attribute(.unique) var code: String = ""
    var added: Double = 1.5
}
