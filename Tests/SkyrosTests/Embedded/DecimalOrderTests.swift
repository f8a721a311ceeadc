import Foundation
import GRDB
import Skyros
import SkyrosTestSupport
import Testing

/// Decimals are stored in a form whose text order is the numeric order (`OrderedDecimal`):
/// sorts and predicates agree with numbers in every store, pending objects included.
@Suite("Decimal order", .timeLimit(.minutes(3)))
struct DecimalOrderTests {
    static let values = ["100", "9.5", "10.25", "-3", "-100.5", "0", "0.001", "1.50"].map { Decimal(string: $0)! }
    static let ascending = ["-100.5", "-3", "0", "0.001", "1.5", "9.5", "10.25", "100"].map { Decimal(string: $0)! }

    /// Samples with `values`, `code` their position.
    static func insert(_ values: [Decimal], in context: ObjectContext) {
        for (code, value) in values.enumerated() {
            let sample = Sample.create(in: context)
            sample.code = code
            sample.decimal = value
        }
    }

    struct Results: Equatable {
        var ascending: [Decimal] = []
        var descending: [Decimal] = []
        var greaterThan10: [Decimal] = []
        var equal1_5: [Decimal] = []
        var range: [Decimal] = []
        var negative: [Decimal] = []
        var inList: [Decimal] = []
    }

    static func query(_ context: ObjectContext) throws -> Results {
        let ten = Decimal(10)
        let oneAndAHalf = Decimal(string: "1.500")!
        let zero = Decimal.zero
        let list = [Decimal(string: "9.50")!, Decimal(string: "-3.0")!]
        let byDecimal = [SortDescriptor(\Sample.decimal)]
        var results = Results()
        results.ascending = try Sample.all(sortedBy: byDecimal, in: context).map(\.decimal)
        results.descending = try Sample.all(sortedBy: [SortDescriptor(\.decimal, order: .reverse)], in: context).map(
            \.decimal)
        results.greaterThan10 = try Sample.all(where: #Predicate { $0.decimal > ten }, sortedBy: byDecimal, in: context)
            .map(\.decimal)
        results.equal1_5 = try Sample.all(where: #Predicate { $0.decimal == oneAndAHalf }, in: context).map(\.decimal)
        results.range = try Sample.all(
            where: #Predicate { $0.decimal >= zero && $0.decimal < ten }, sortedBy: byDecimal, in: context
        ).map(\.decimal)
        results.negative = try Sample.all(where: #Predicate { $0.decimal < 0 }, sortedBy: byDecimal, in: context)
            .map(\.decimal)
        results.inList = try Sample.all(
            where: #Predicate { list.contains($0.decimal) }, sortedBy: byDecimal, in: context
        )
        .map(\.decimal)
        return results
    }

    static let expected = Results(
        ascending: ascending, descending: ascending.reversed(),
        greaterThan10: ["10.25", "100"].map { Decimal(string: $0)! }, equal1_5: [Decimal(string: "1.5")!],
        range: ["0", "0.001", "1.5", "9.5"].map { Decimal(string: $0)! },
        negative: ["-100.5", "-3"].map { Decimal(string: $0)! }, inList: ["-3", "9.5"].map { Decimal(string: $0)! })

    @Test("sorts and predicates on a decimal follow numeric order, saved and pending", arguments: StoreKind.allCases)
    func numericOrder(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        var pending = Results()
        var saved = Results()
        var mixed = Results()
        stack.store.writeSync { context in
            Self.insert(Self.values, in: context)
            // Not saved yet: the context sorts and filters them in memory.
            pending = try Self.query(context)
        }
        .read { context in saved = try Self.query(context) }
        .writeSync { context in
            // Half saved, half pending: the store's rows and the context's merged.
            try Sample.deleteAll(in: context)
        }
        .writeSync { context in Self.insert(Array(Self.values.prefix(4)), in: context) }
        .writeSync { context in
            Self.insert(Array(Self.values.dropFirst(4)), in: context)
            mixed = try Self.query(context)
        }
        #expect(pending == Self.expected)
        #expect(saved == Self.expected)
        #expect(mixed == Self.expected)
    }

    @Test("large, small and 38-digit decimals round-trip exactly", arguments: StoreKind.allCases)
    func roundTrip(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        let values: [Decimal] = [
            Decimal(string: "12345678901234567890.123456789")!, Decimal(string: "-0.000000000000000001")!,
            Decimal(string: "0.1")! + Decimal(string: "0.2")!,
            Decimal(string: "12345678901234567890123456789012345678")!,
            Decimal(string: "-0.12345678901234567890123456789012345678")!,
            Decimal(string: "1" + String(repeating: "0", count: 128))!,
            Decimal(string: "-25" + String(repeating: "0", count: 127))!,
            Decimal(sign: .minus, exponent: -128, significand: 7),
            Decimal.greatestFiniteMagnitude, Decimal.leastNonzeroMagnitude,
        ]
        var read: [Decimal] = []
        stack.store.writeSync { Self.insert(values, in: $0) }
            .read { context in read = try Sample.all(sortedBy: [SortDescriptor(\.code)], in: context).map(\.decimal) }
        #expect(read == values)
        #expect(read.count == values.count && read[2] == Decimal(string: "0.3"))
    }

    @Test("NaN is refused", arguments: [StoreKind.inMemory])
    func nanRefused(kind: StoreKind) throws {
        let stack = try TestStack(kind)
        let probe = CompletionProbe()
        stack.store.writeSync(
            { context in
                Sample.create(in: context).decimal = .nan
            }, completion: probe.completion)
        #expect(probe.wait())
        #expect(probe.calls.first??.code == .valueNotStorable)
    }

    @Test("a store written with decimals in POSIX notation is converted when it is opened")
    func legacyStoreConverted() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("legacy.sqlite")
        do {
            let store = try Skyros(sqliteStack: testSchema, at: url)
            let probe = CompletionProbe()
            store.writeSync({ Self.insert(Self.values, in: $0) }, completion: probe.completion)
            #expect(probe.wait())
            #expect(probe.calls.first! == nil)
        }
        // What a store made before the ordered form held: POSIX notation, no `decimals` record.
        do {
            // The stack above may still be closing its connections (its last one checkpoints
            // and removes the WAL under a lock): wait for it, as the store's own connections do.
            var configuration = Configuration()
            configuration.busyMode = .timeout(5)
            let queue = try DatabaseQueue(path: url.path, configuration: configuration)
            try queue.write { db in
                for (code, value) in Self.values.enumerated() {
                    var copy = value
                    try db.execute(
                        sql: "UPDATE \"Sample\" SET \"decimal\" = ? WHERE \"code\" = ?",
                        arguments: [NSDecimalString(&copy, Locale(identifier: "en_US_POSIX")), code])
                }
                try db.execute(sql: "DELETE FROM skyros_metadata WHERE key = 'decimals'")
                let texts = try String.fetchAll(db, sql: "SELECT \"decimal\" FROM \"Sample\" ORDER BY \"decimal\"")
                #expect(texts == ["-100.5", "-3", "0", "0.001", "1.5", "10.25", "100", "9.5"])
            }
            try queue.close()
        }
        let store = try SQLiteStore(schema: testSchema, url: url)
        #expect(try store.rows("SELECT value FROM skyros_metadata WHERE key = 'decimals'") == [[.text("ordered")]])
        let texts = try store.rows("SELECT \"decimal\" FROM \"Sample\" ORDER BY \"decimal\"").map(\.first)
        #expect(texts == Self.ascending.map { .text(OrderedDecimal.encode($0)!) })
        try store.close()
        let stack = try Skyros(sqliteStack: testSchema, at: url)
        var results = Results()
        stack.read { results = try Self.query($0) }
        #expect(results == Self.expected)
    }

    @Test("a decimal value in another form than the ordered one is refused by the store (typeMismatch)")
    func plainNotationRefused() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        do {
            let stack = try Skyros(sqliteStack: testSchema, at: url)
            let probe = CompletionProbe()
            stack.writeSync({ _ = Sample.create(in: $0) }, completion: probe.completion)
            #expect(probe.wait())
            #expect(probe.calls.first! == nil)
        }
        let store = try SQLiteStore(schema: testSchema, url: url)
        defer { try? store.close() }
        let index = try #require(testSchema.entity(named: "Sample")?.property(named: "decimal")).index
        let saved = try #require(try store.fetchSnapshots(StoreRequest(entityName: "Sample")).first)
        #expect(saved.values[index] == .text("p5021125"))  // 11.25, the default
        var values = saved.values
        values[index] = .text("12.5")
        let insert = ChangeSet(inserted: [Snapshot(id: .make(entityName: "Sample"), values: values)])
        let update = ChangeSet(updated: [.init(id: saved.id, changes: [index: .text("-1")])])
        for changes in [insert, update] {
            do {
                try store.save(changes)
                Issue.record("a decimal in POSIX notation was stored")
            } catch let error as SkyrosError {
                #expect(error.code == .typeMismatch)
            }
        }
        try store.save(ChangeSet(updated: [.init(id: saved.id, changes: [index: .text("p503125")])]))
        let read = try #require(try store.fetchSnapshots(StoreRequest(entityName: "Sample")).first)
        #expect(read.values[index] == .text("p503125"))
    }
}

@Suite("OrderedDecimal")
struct OrderedDecimalTests {
    @Test("the documented examples")
    func examples() {
        let cases: [(String, String)] = [
            ("0", "o"), ("9.5", "p50195"), ("10.25", "p5021025"), ("100", "p5031"), ("0.001", "p4981"),
            ("-9.5", "n49804~"), ("-100.5", "n4968994~"), ("1.50", "p50115"), ("-0.001", "n5018~"),
        ]
        for (plain, encoded) in cases {
            #expect(OrderedDecimal.encode(Decimal(string: plain)!) == encoded, "\(plain)")
            #expect(OrderedDecimal.encode(plain: plain) == encoded, "\(plain)")
            #expect(OrderedDecimal.decode(encoded) == Decimal(string: plain), "\(encoded)")
        }
        #expect(OrderedDecimal.encode(plain: "1e3") == "p5041" && OrderedDecimal.encode(plain: "-.50") == "n4994~")
        #expect(OrderedDecimal.encode(plain: "-0.00") == "o" && OrderedDecimal.encode(.nan) == nil)
        for bad in ["", "-", ".", "1.2.3", "12a", "NaN", "1e", "1e99999", "1e-9223372036854775808"] {
            #expect(OrderedDecimal.encode(plain: bad) == nil, "\(bad)")
        }
        for bad in ["", "o0", "p501", "p5010", "p50a1", "n5011", "n5019~", "p5011~", "q5011", "12.5", "-1"] {
            #expect(!OrderedDecimal.isWellFormed(bad) && OrderedDecimal.decode(bad) == nil, "\(bad)")
        }
    }

    @Test("the byte order of encoded decimals is their numeric order; decoding gives them back")
    func randomOrder() throws {
        var generator = SplitMix64(seed: 15)
        var values: [Decimal] = []
        for _ in 0..<3000 {
            // Up to 12 digits and exponents of ±12: their comparison by Decimal is exact.
            let digits = Int.random(in: 1...12, using: &generator)
            var mantissa = UInt64.random(in: 0..<10, using: &generator)
            for _ in 1..<digits { mantissa = mantissa * 10 + UInt64.random(in: 0..<10, using: &generator) }
            let exponent = Int.random(in: -12...12, using: &generator)
            let sign: FloatingPointSign = Bool.random(using: &generator) ? .minus : .plus
            values.append(Decimal(sign: sign, exponent: exponent, significand: Decimal(mantissa)))
            // Neighbours: the same value written with trailing zeros, and one unit more.
            if values.count % 10 == 0 {
                values.append(Decimal(sign: sign, exponent: exponent - 2, significand: Decimal(mantissa) * 100))
                values.append(values[values.count - 2] + Decimal(sign: .plus, exponent: exponent, significand: 1))
            }
        }
        // Wide values (up to 38 digits, exponents of ±100) round-trip; their order is not
        // checked (Decimal's own comparison rounds when it aligns such exponents).
        for _ in 0..<500 {
            let high = Decimal(UInt64.random(in: 0..<10_000_000_000_000_000_000, using: &generator))
            let low = Decimal(UInt64.random(in: 0..<10_000_000_000_000_000_000, using: &generator))
            let mantissa = high * Decimal(sign: .plus, exponent: 19, significand: 1) + low
            let sign: FloatingPointSign = Bool.random(using: &generator) ? .minus : .plus
            let value = Decimal(
                sign: sign, exponent: Int.random(in: -100...100, using: &generator), significand: mantissa)
            let text = try #require(OrderedDecimal.encode(value), "\(value)")
            #expect(OrderedDecimal.decode(text) == value, "\(value): \(text)")
        }
        let encoded = values.map { OrderedDecimal.encode($0)! }
        for (value, text) in zip(values, encoded) {
            #expect(OrderedDecimal.isWellFormed(text), "\(value): \(text)")
            #expect(OrderedDecimal.decode(text) == value, "\(value): \(text)")
        }
        let byNumber = values.indices.sorted { values[$0] < values[$1] || (values[$0] == values[$1] && $0 < $1) }
        let byText = values.indices.sorted {
            let (a, b) = (Array(encoded[$0].utf8), Array(encoded[$1].utf8))
            return a.lexicographicallyPrecedes(b) || (a == b && $0 < $1)
        }
        #expect(byNumber == byText)
        // Equal numbers, and only they, have equal texts.
        for index in values.indices.dropFirst() {
            let (a, b) = (byNumber[index - 1], byNumber[index])
            #expect((values[a] == values[b]) == (encoded[a] == encoded[b]))
        }
    }
}
