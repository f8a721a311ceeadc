import Foundation
import SkyrosTestSupport
import Testing

@testable import Skyros

/// The in-memory evaluator (what controllers, monitors and fetches with pending changes use)
/// must agree with the SQL the store runs, predicate form by predicate form.
@Suite("The in-memory predicate evaluator agrees with SQL", .timeLimit(.minutes(3)))
struct PredicateEvaluatorTests {
    /// The objects a predicate selects: by the store's SQL, and by the evaluator over every object.
    func selections<T: ManagedObject>(_ predicate: Predicate<T>, _ store: Skyros) throws -> (
        sql: Set<ObjectID>, memory: Set<ObjectID>
    ) {
        let context = ObjectContext(name: "check", parent: store.rootContext)
        return try context.performAndWait {
            let sql = Set(try context.fetch(FetchDescriptor(predicate: predicate)).map(\.objectID))
            let node = try PredicateTranslator.translate(predicate, schema: store.schema)
            var memory = Set<ObjectID>()
            for object in try context.fetch(FetchDescriptor<T>()) where try context.matches(node, object.skyrosStorage)
            {
                memory.insert(object.objectID)
            }
            return (sql, memory)
        }
    }

    static func makeStore(_ directory: TemporaryDirectory) throws -> Skyros {
        let store = try Skyros(sqliteStack: testSchema, at: directory.file("store.sqlite"))
        try store.writeAndWait { context in
            let people: [(String, String, Int, String?)] = [
                ("Ann", "Baker", 40, "ann@doe.org"), ("bob", "baker", 30, nil), ("Émile", "Zola", 62, "emile@x.fr"),
                ("emile", "Ézola", 17, ""), ("Zoë", "Doe", 30, "zoe@DOE.org"), ("", "", 0, nil),
                ("Mark", "Smith", -5, "m@s"),
                ("Eve", "Stone", 25, nil),
            ]
            for (index, (first, last, age, email)) in people.enumerated() {
                let user = User.create(in: context)
                user.firstname = first
                user.lastname = last
                user.age = age
                user.email = email
                user.handle = "h\(index)"
                for score in [0.5, 2.5, 3.0].prefix((index + 1) % 4) {  // Ann Baker (to-one paths) has posts; emile has none
                    let post = Post.create(in: context)
                    post.title = "\(first) \(score)"
                    post.score = score
                    post.author = user
                }
            }
            _ = Post.create(in: context)  // without author
            for index in 0..<8 {
                let sample = Sample.create(in: context)
                sample.int = index - 3
                sample.double = Double(index) * 1.5 - 4
                sample.date = Date(timeIntervalSince1970: Double(index * 1000))
                sample.optionalDate = index % 3 == 0 ? nil : Date(timeIntervalSince1970: Double(index))
                sample.decimal = Decimal(
                    string: ["-1.5", "0", "0.001", "11.25", "11.3", "100", "-100.75", "1e-3"][index])!
                sample.bool = index % 2 == 0
                sample.status = index % 3 == 1 ? .done : .todo
                sample.optionalStatus = index % 2 == 0 ? nil : .done
                sample.optionalInt = index % 4 == 0 ? nil : index
                sample.optionalString = index % 3 == 2 ? nil : ["a", "B", "ç", "c", "é"][index % 5]
                sample.code = index
            }
        }
        return store
    }

    @Test("users: comparisons, nil, strings with case and diacritics, IN, to-many")
    func users() throws {
        let directory = try TemporaryDirectory()
        let store = try Self.makeStore(directory)
        let predicates: [(String, Predicate<User>)] = [
            ("gt", #Predicate { $0.age > 30 }), ("range", #Predicate { $0.age >= 17 && $0.age < 40 }),
            ("not", #Predicate { !($0.age == 30) }), ("or", #Predicate { $0.age < 0 || $0.lastname == "Zola" }),
            ("nil", #Predicate { $0.email == nil }), ("not nil", #Predicate { $0.email != nil }),
            ("optional equal", #Predicate { $0.email == "" }),
            ("optional chain", #Predicate { $0.email?.contains("doe") == true }),
            ("contains", #Predicate { $0.lastname.contains("ak") }),
            ("contains diacritic", #Predicate { $0.lastname.contains("É") }),
            ("case-insensitive", #Predicate { $0.lastname.localizedStandardContains("BAK") }),
            ("case-insensitive non-ASCII", #Predicate { $0.firstname.localizedStandardContains("ÉMI") }),
            ("prefix", #Predicate { $0.firstname.starts(with: "E") }),
            ("prefix diacritic", #Predicate { $0.firstname.starts(with: "É") }),
            ("lowercased", #Predicate { $0.lastname.localizedLowercase == "baker" }),
            ("string order", #Predicate { $0.firstname > "Zo" }),
            ("string order diacritic", #Predicate { $0.lastname >= "Z" }),
            ("empty string", #Predicate { $0.firstname == "" }),
            ("IN", #Predicate { ["Ann", "bob", "Zoë"].contains($0.firstname) }),
            ("any post", #Predicate { $0.posts.contains { $0.score > 2 } }),
            ("no posts", #Predicate { $0.posts.isEmpty }),
            ("post count", #Predicate { $0.posts.count >= 2 }),
        ]
        for (name, predicate) in predicates {
            let (sql, memory) = try selections(predicate, store)
            // An empty selection agrees with anything: every form must select some object.
            #expect(!sql.isEmpty, "\(name): selects nothing, so the comparison proves nothing")
            #expect(sql == memory, "\(name): SQL selects \(sql.count), the evaluator \(memory.count)")
        }
    }

    @Test("posts: to-one paths and nil relationships")
    func posts() throws {
        let directory = try TemporaryDirectory()
        let store = try Self.makeStore(directory)
        let predicates: [(String, Predicate<Post>)] = [
            ("to-one", #Predicate { $0.author?.lastname == "Baker" }),
            ("to-one nil", #Predicate { $0.author?.handle == nil }),
            ("to-one optional chain", #Predicate { $0.author?.email?.contains("doe") == true }),
            ("double", #Predicate { $0.score >= 2.5 }),
        ]
        for (name, predicate) in predicates {
            let (sql, memory) = try selections(predicate, store)
            // An empty selection agrees with anything: every form must select some object.
            #expect(!sql.isEmpty, "\(name): selects nothing, so the comparison proves nothing")
            #expect(sql == memory, "\(name): SQL selects \(sql.count), the evaluator \(memory.count)")
        }
    }

    @Test("every attribute type: integers, doubles, dates, optionals, Decimal, enums, booleans")
    func samples() throws {
        let directory = try TemporaryDirectory()
        let store = try Self.makeStore(directory)
        let date = Date(timeIntervalSince1970: 3000)
        let small = Decimal(string: "0.001")!
        let eleven = Decimal(string: "11.3")!
        let done = Status.done
        let predicates: [(String, Predicate<Sample>)] = [
            ("int", #Predicate { $0.int >= 0 }), ("double", #Predicate { $0.double < 0.5 }),
            ("int vs double", #Predicate { $0.double == 2 }),
            ("date", #Predicate { $0.date > date }), ("optional date nil", #Predicate { $0.optionalDate == nil }),
            ("optional date", #Predicate { $0.optionalDate != nil && $0.optionalDate! < date }),
            ("decimal equal", #Predicate { $0.decimal == small }),
            ("decimal order", #Predicate { $0.decimal < eleven }),
            ("decimal negative", #Predicate { $0.decimal > small }),
            ("bool", #Predicate { $0.bool }), ("not bool", #Predicate { !$0.bool }),
            ("enum", #Predicate { $0.status == done }), ("optional enum", #Predicate { $0.optionalStatus == done }),
            ("optional int", #Predicate { $0.optionalInt != nil && $0.optionalInt! > 2 }),
            ("optional int nil", #Predicate { $0.optionalInt == nil }),
            ("optional string", #Predicate { $0.optionalString?.contains("c") == true }),
            ("IN ints", #Predicate { [1, 3, 5].contains($0.code) }),
        ]
        for (name, predicate) in predicates {
            let (sql, memory) = try selections(predicate, store)
            // An empty selection agrees with anything: every form must select some object.
            #expect(!sql.isEmpty, "\(name): selects nothing, so the comparison proves nothing")
            #expect(sql == memory, "\(name): SQL selects \(sql.count), the evaluator \(memory.count)")
            #expect(!sql.isEmpty || name.contains("nil"), "\(name) selects nothing: a weak check")
        }
    }
}
