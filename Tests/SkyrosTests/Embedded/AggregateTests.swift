import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// Aggregates (issue 18): computed by SQL, checked against the same values computed in Swift.
@Suite("Aggregates and distinct", .timeLimit(.minutes(3)))
struct AggregateTests {
    static func fill(_ store: Skyros) throws {
        try store.writeAndWait { context in
            for index in 0..<40 {
                let sample = Sample.create(in: context)
                sample.int = index % 7 - 2
                sample.double = Double(index) * 0.25
                sample.decimal = Decimal(string: "\(index % 5).1\(index % 3)")!
                sample.optionalInt = index % 4 == 0 ? nil : index
                sample.optionalString = index % 3 == 0 ? nil : ["a", "b", "B", "é"][index % 4]
                sample.code = index % 6
                sample.date = Date(timeIntervalSince1970: Double(index * 100))
            }
        }
    }

    func check(_ store: Skyros, pendingOffset: Int = 0) throws {
        let predicates: [(String, Predicate<Sample>?)] = [
            ("all", nil), ("code < 3", #Predicate { $0.code < 3 }), ("none", #Predicate { $0.code > 100 }),
            ("int > 0", #Predicate { $0.int > 0 }),
        ]
        // The value form of `read` (its errors are thrown here, not handed to handleError).
        let _: Void = try store.read { context in
            for (name, predicate) in predicates {
                let objects = try context.fetch(FetchDescriptor<Sample>(predicate: predicate))
                #expect(
                    try Sample.sum(\.int, where: predicate, in: context) == objects.map(\.int).reduce(0, +), "\(name)")
                let doubles = objects.map(\.double).reduce(0, +)
                #expect(abs(try Sample.sum(\.double, where: predicate, in: context) - doubles) < 1e-9, "\(name)")
                #expect(
                    try Sample.sum(\.decimal, where: predicate, in: context) == objects.map(\.decimal).reduce(0, +),
                    "\(name)")
                #expect(
                    try Sample.sum(\.optionalInt, where: predicate, in: context)
                        == objects.compactMap(\.optionalInt).reduce(0, +), "\(name)")
                #expect(try Sample.min(\.int, where: predicate, in: context) == objects.map(\.int).min(), "\(name)")
                #expect(
                    try Sample.max(\.decimal, where: predicate, in: context) == objects.map(\.decimal).max(), "\(name)")
                #expect(try Sample.max(\.date, where: predicate, in: context) == objects.map(\.date).max(), "\(name)")
                #expect(
                    try Sample.min(\.optionalInt, where: predicate, in: context)
                        == objects.compactMap(\.optionalInt).min(), "\(name)")
                let ints = objects.map(\.int)
                let average = try Sample.average(\.int, where: predicate, in: context)
                if ints.isEmpty {
                    #expect(average == nil, "\(name)")
                } else {
                    #expect(abs(average! - Double(ints.reduce(0, +)) / Double(ints.count)) < 1e-9, "\(name)")
                }
                let decimals = objects.map(\.decimal)
                #expect(
                    try Sample.average(\.decimal, where: predicate, in: context)
                        == (decimals.isEmpty ? nil : decimals.reduce(0, +) / Decimal(decimals.count)), "\(name)")
                let optionalInts = objects.compactMap(\.optionalInt)
                let optionalAverage = try Sample.average(\.optionalInt, where: predicate, in: context)
                #expect((optionalAverage == nil) == optionalInts.isEmpty, "\(name)")
                #expect(
                    try Sample.count(groupedBy: \.code, where: predicate, in: context)
                        == Dictionary(grouping: objects, by: \.code).mapValues(\.count), "\(name)")
                #expect(
                    try Sample.count(groupedBy: \.optionalString, where: predicate, in: context)
                        == Dictionary(grouping: objects, by: \.optionalString).mapValues(\.count), "\(name)")
                // Strings in the store's order: byte by byte ("B" < "a" < "b" < "é").
                #expect(
                    try Sample.distinct(\.optionalString, where: predicate, in: context)
                        == Set(objects.compactMap(\.optionalString)).sorted {
                            Array($0.utf8).lexicographicallyPrecedes(Array($1.utf8))
                        }, "\(name)")
                #expect(
                    try Sample.distinct(\.code, where: predicate, in: context) == Set(objects.map(\.code)).sorted(),
                    "\(name)")
            }
        }
    }

    @Test(
        "sum, min, max, average, count(groupedBy:), distinct agree with Swift: predicates, empty sets, NULLs, Decimal",
        arguments: StoreKind.allCases)
    func agree(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        try Self.fill(stack.store)
        try check(stack.store)
    }

    @Test("the main context's unsaved changes count, as in fetches", arguments: [StoreKind.inMemory, .sqlite])
    func pendingChanges(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        try Self.fill(stack.store)
        let before = try stack.store.read { try Sample.sum(\.int, in: $0) }
        stack.store.read { context in
            let extra = Sample.create(in: context)
            extra.int = 1_000
            extra.code = 99
        }
        let _: Void = try stack.store.read { (context: ObjectContext) throws -> Void in
            #expect(try Sample.sum(\.int, in: context) == before + 1_000)
            #expect(try Sample.count(groupedBy: \.code, where: #Predicate { $0.code == 99 }, in: context) == [99: 1])
            #expect(try Sample.max(\.int, in: context) == 1_000)
        }
        try check(stack.store)
    }

    @Test("an attribute that is not stored is refused with a clear error")
    func notStored() throws {
        let stack = try TestStack(.inMemory)
        let error = stack.store.read { context in
            #expect(throws: SkyrosError.self) { _ = try User.distinct(\.fullName, in: context) }
        }
        #expect(error?.code == .unsupportedPredicate && error?.message.contains("stored attribute") == true)
    }
}
