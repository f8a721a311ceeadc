import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// The predicate translator: the SQL it produces, and the same results from stored rows
/// (SQL) and from pending objects (evaluated in memory).
@Suite("Predicate translation", .timeLimit(.minutes(3)))
struct PredicateTranslationTests {
    static let select =
        "SELECT t0.\"_id\", t0.\"_version\", t0.\"firstname\", t0.\"lastname\", t0.\"age\", t0.\"email\", t0.\"handle\" FROM \"User\" t0"
    static let postSelect =
        "SELECT t0.\"_id\", t0.\"_version\", t0.\"title\", t0.\"score\", t0.\"author\" FROM \"Post\" t0"
    static let order = " ORDER BY t0.\"_id\" ASC"

    /// A case: a user predicate, its expected WHERE clause, arguments, and matching handles.
    struct UserCase: Sendable, CustomTestStringConvertible {
        let name: String
        let predicate: Predicate<User>
        let whereClause: String
        let arguments: [StoredValue]
        let handles: Set<String>
        var testDescription: String { name }
    }

    static let userCases: [UserCase] = [
        UserCase(
            name: "comparison", predicate: #Predicate { $0.age > 30 }, whereClause: "(t0.\"age\" > ?)",
            arguments: [.integer(30)], handles: ["mark", "anna"]),
        UserCase(
            name: "equality", predicate: #Predicate { $0.lastname == "Doe" }, whereClause: "(t0.\"lastname\" IS ?)",
            arguments: [.text("Doe")], handles: ["john", "jane"]),
        UserCase(
            name: "inequality", predicate: #Predicate { $0.lastname != "Doe" },
            whereClause: "(t0.\"lastname\" IS NOT ?)",
            arguments: [.text("Doe")], handles: ["mark", "anna"]),
        UserCase(
            name: "and, or, not", predicate: #Predicate { ($0.age >= 20 && $0.age < 40) || !($0.lastname != "Smith") },
            whereClause: "(((t0.\"age\" >= ?) AND (t0.\"age\" < ?)) OR (NOT (t0.\"lastname\" IS NOT ?)))",
            arguments: [.integer(20), .integer(40), .text("Smith")], handles: ["john", "jane", "mark"]),
        UserCase(
            name: "nil check", predicate: #Predicate { $0.email == nil }, whereClause: "(t0.\"email\" IS NULL)",
            arguments: [], handles: ["jane", "anna"]),
        UserCase(
            name: "not nil", predicate: #Predicate { $0.email != nil }, whereClause: "(t0.\"email\" IS NOT NULL)",
            arguments: [], handles: ["john", "mark"]),
        UserCase(
            name: "optional chaining", predicate: #Predicate { $0.email?.contains("@doe") == true },
            whereClause: "((instr(t0.\"email\", ?) > 0) IS ?)", arguments: [.text("@doe"), .integer(1)],
            handles: ["john"]),
        UserCase(
            name: "contains", predicate: #Predicate { $0.firstname.contains("an") },
            whereClause: "(instr(t0.\"firstname\", ?) > 0)", arguments: [.text("an")], handles: ["jane"]),
        UserCase(
            name: "prefix", predicate: #Predicate { $0.firstname.starts(with: "J") },
            whereClause: "(substr(t0.\"firstname\", 1, length(?)) = ?)", arguments: [.text("J"), .text("J")],
            handles: ["john", "jane"]),
        UserCase(
            name: "case-insensitive contains", predicate: #Predicate { $0.firstname.localizedStandardContains("AN") },
            whereClause: "(instr(lower(t0.\"firstname\"), lower(?)) > 0)", arguments: [.text("AN")],
            handles: ["jane", "anna"]),
        UserCase(
            name: "lowercased", predicate: #Predicate { $0.lastname.localizedLowercase == "doe" },
            whereClause: "(lower(t0.\"lastname\") IS ?)", arguments: [.text("doe")], handles: ["john", "jane"]),
        UserCase(
            name: "IN", predicate: #Predicate { ["John", "Mark"].contains($0.firstname) },
            whereClause: "(t0.\"firstname\" IN (?,?))", arguments: [.text("John"), .text("Mark")],
            handles: ["john", "mark"]),
        UserCase(
            name: "to-many contains(where:)", predicate: #Predicate { $0.posts.contains { $0.score > 2 } },
            whereClause:
                "EXISTS (SELECT 1 FROM \"Post\" t1 WHERE t1.\"author\" = t0.\"_id\" AND (t1.\"score\" > ?))",
            arguments: [.real(2)], handles: ["jane"]),
        UserCase(
            name: "to-many isEmpty", predicate: #Predicate { $0.posts.isEmpty },
            whereClause: "((SELECT COUNT(*) FROM \"Post\" t1 WHERE t1.\"author\" = t0.\"_id\") IS ?)",
            arguments: [.integer(0)], handles: ["mark", "anna"]),
        UserCase(
            name: "to-many count", predicate: #Predicate { $0.posts.count > 1 },
            whereClause: "((SELECT COUNT(*) FROM \"Post\" t1 WHERE t1.\"author\" = t0.\"_id\") > ?)",
            arguments: [.integer(1)], handles: ["john"]),
    ]

    /// John Doe (40, email), Jane Doe (25), Mark Smith (35, email), Anna Berg (50);
    /// John has posts scored 1 and 2, Jane one scored 3.
    static func makeDataset(in context: ObjectContext) {
        let people: [(String, String, Int, String?)] = [
            ("John", "Doe", 40 - 15, "john@doe.com"), ("Jane", "Doe", 25, nil), ("Mark", "Smith", 35, "mark@smith.com"),
            ("Anna", "Berg", 50, nil),
        ]
        var users: [String: User] = [:]
        for (first, last, age, email) in people {
            let user = User.create(in: context)
            user.firstname = first
            user.lastname = last
            user.age = age
            user.email = email
            user.handle = first.lowercased()
            users[user.handle] = user
        }
        for (title, score, author) in [("a", 1.0, "john"), ("b", 2.0, "john"), ("c", 3.0, "jane")] {
            let post = Post.create(in: context)
            post.title = title
            post.score = score
            post.author = users[author]
        }
    }

    @Test("translates to the expected SQL", arguments: userCases)
    func sql(_ testCase: UserCase) throws {
        let store = try SQLiteStore(schema: testSchema, url: nil)
        let request = try FetchDescriptor(predicate: testCase.predicate).storeRequest(schema: testSchema)
        let (sql, arguments) = try store.sql(for: request)
        #expect(sql == Self.select + " WHERE " + testCase.whereClause + Self.order)
        #expect(arguments == testCase.arguments)
    }

    @Test("stored rows and pending objects give the same results", arguments: userCases)
    func sameResults(_ testCase: UserCase) throws {
        let saved = try TestStack(.inMemory)
        var stored: Set<String> = []
        var pending: Set<String> = []
        saved.store.writeSync { Self.makeDataset(in: $0) }
            .read { stored = Set(try User.all(where: testCase.predicate, in: $0).map(\.handle)) }
        let unsaved = try TestStack(.inMemory)
        unsaved.store.writeSync { context in
            Self.makeDataset(in: context)
            pending = Set(try User.all(where: testCase.predicate, in: context).map(\.handle))
        }
        #expect(stored == testCase.handles)
        #expect(pending == testCase.handles)
    }

    @Test("to-one key paths become scalar subqueries")
    func toOneKeyPath() throws {
        let store = try SQLiteStore(schema: testSchema, url: nil)
        let request = try FetchDescriptor<Post>(predicate: #Predicate { $0.author?.lastname == "Doe" })
            .storeRequest(schema: testSchema)
        let (sql, arguments) = try store.sql(for: request)
        #expect(
            sql == Self.postSelect
                + " WHERE ((SELECT t1.\"lastname\" FROM \"User\" t1 WHERE t1.\"_id\" = t0.\"author\") IS ?)"
                + Self.order)
        #expect(arguments == [.text("Doe")])
        let stack = try TestStack(.sqlite)
        var stored: [String] = []
        var pending: [String] = []
        stack.store.writeSync { context in
            Self.makeDataset(in: context)
            pending = try Post.all(
                where: #Predicate { $0.author?.lastname == "Doe" }, sortedBy: [SortDescriptor(\.title)], in: context
            ).map(\.title)
        }.read { context in
            stored = try Post.all(
                where: #Predicate { $0.author?.lastname == "Doe" }, sortedBy: [SortDescriptor(\.title)], in: context
            ).map(\.title)
        }
        #expect(stored == ["a", "b", "c"])
        #expect(pending == ["a", "b", "c"])
    }

    @Test("sorts, limit and offset")
    func sortLimitOffset() throws {
        let store = try SQLiteStore(schema: testSchema, url: nil)
        var descriptor = FetchDescriptor<User>(sortBy: [
            SortDescriptor(\.lastname), SortDescriptor(\.age, order: .reverse),
        ])
        descriptor.fetchLimit = 2
        descriptor.fetchOffset = 1
        let (sql, _) = try store.sql(for: try descriptor.storeRequest(schema: testSchema))
        #expect(
            sql == Self.select
                + " ORDER BY t0.\"lastname\" ASC, t0.\"age\" DESC, t0.\"_id\" ASC LIMIT 2 OFFSET 1")
        let stack = try TestStack(.sqlite)
        var stored: [String] = []
        var pending: [String] = []
        stack.store.writeSync { context in
            Self.makeDataset(in: context)
            pending = try context.fetch(descriptor).map(\.handle)
        }.read { stored = try $0.fetch(descriptor).map(\.handle) }
        #expect(stored == ["john", "jane"])
        #expect(pending == ["john", "jane"])
    }

    @Test("constants of each attribute type are bound as their columns store them; NaN is refused")
    func constants() throws {
        let store = try SQLiteStore(schema: testSchema, url: nil)
        let id = UUID(uuidString: "12345678-1234-1234-1234-123456789ABC")!
        let (int, int64, text, flag, ratio) = (3, Int64(5), "x", true, 1.5)
        let date = Date(timeIntervalSince1970: 7)
        let request = try FetchDescriptor<Sample>(
            predicate: #Predicate {
                $0.int == int && $0.int64 == int64 && $0.string == text && $0.bool == flag && $0.uuid == id
                    && $0.double == ratio && $0.date == date && $0.optionalInt == nil
            }
        ).storeRequest(schema: testSchema)
        let (_, arguments) = try store.sql(for: request)
        #expect(
            arguments == [
                .integer(3), .integer(5), .text("x"), .integer(1), .blob(withUnsafeBytes(of: id.uuid) { Data($0) }),
                .real(1.5), .real(7),
            ])
        let notANumber = Double("nan")!  // a run-time value: the compiler warns of a literal NaN
        #expect {
            _ = try FetchDescriptor<Sample>(predicate: #Predicate { $0.double == notANumber }).storeRequest(
                schema: testSchema)
        } throws: { error in
            (error as? SkyrosError)?.code == .valueNotStorable
        }
    }

    @Test("an untranslatable predicate is refused with a typed error naming it")
    func untranslatable() throws {
        let stack = try TestStack(.inMemory)
        var errors: [SkyrosError] = []
        stack.store.read { context in
            do {
                _ = try User.all(where: #Predicate { $0.fullName == "John Doe" }, in: context)
            } catch let error as SkyrosError { errors.append(error) }
            do {
                _ = try User.count(where: #Predicate { $0.scratchNote == "x" }, in: context)
            } catch let error as SkyrosError { errors.append(error) }
            do {
                _ = try User.all(where: #Predicate { $0.firstname.count > 3 }, in: context)
            } catch let error as SkyrosError { errors.append(error) }
        }
        #expect(errors.map(\.code) == [.unsupportedPredicate, .unsupportedPredicate, .unsupportedPredicate])
        // Computed properties have no readable name at run time: the message names the entity and types.
        #expect(errors[0].message.contains("User") && errors[0].message.contains("computed"))
        #expect(errors[1].message.contains("scratchNote"))
        #expect(errors[2].message.contains("String → Int"))
    }
}
