import Foundation
import Skyros
import SkyrosTestSupport
import Testing

@Suite("SQLite store and schema", .timeLimit(.minutes(3)))
struct StoreTests {
    @Test("every attribute type round-trips through the SQLite file")
    func attributeTypes() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        let store = try Skyros(sqliteStack: testSchema, at: url)
        let probe = CompletionProbe()
        store.writeSync(
            { context in
                _ = Sample.create(in: context)  // defaults
                let sample = Sample.create(in: context)
                sample.string = "héllo"
                sample.int = -42
                sample.int64 = .max
                sample.int32 = .min
                sample.int16 = 16
                sample.double = 0.1
                sample.float = 1.5
                sample.bool = false
                sample.date = Date(timeIntervalSince1970: 1_700_000_000.5)
                sample.data = Data([0, 1, 2, 255])
                sample.uuid = UUID(uuidString: "12345678-1234-1234-1234-123456789ABC")!
                sample.url = URL(string: "file:///tmp/a%20b")!
                sample.decimal = Decimal(string: "12345678901234567890.123")!
                sample.status = .done
                sample.priority = .high
                sample.location = Location(latitude: 48.85, longitude: 2.35)
                sample.optionalString = "present"
                sample.optionalInt = 7
                sample.optionalDate = Date(timeIntervalSince1970: 1)
                sample.optionalStatus = .todo
                sample.optionalLocation = Location(latitude: -1, longitude: -2)
                sample.code = 1
            }, completion: probe.completion)
        #expect(probe.wait())
        #expect(probe.calls.first! == nil)

        let reopened = try Skyros(sqliteStack: testSchema, at: url)
        // The throwing form: an error fails the test instead of going to `handleError`.
        let checked: Bool = try reopened.read { context in
            let samples = try Sample.all(sortedBy: [SortDescriptor(\.code)], in: context)
            try #require(samples.count == 2)
            let defaults = samples[0]
            #expect(defaults.string == "s" && defaults.int == 1 && defaults.int64 == 2 && defaults.int32 == 3)
            #expect(defaults.int16 == 4 && defaults.double == 5.5 && defaults.float == 6.5 && defaults.bool)
            #expect(defaults.date == Date(timeIntervalSince1970: 7) && defaults.data == Data([8]))
            #expect(defaults.uuid == UUID(uuidString: "00000000-0000-0000-0000-000000000009"))
            #expect(
                defaults.url == URL(string: "https://example.com/10") && defaults.decimal == Decimal(string: "11.25"))
            #expect(defaults.status == .todo && defaults.priority == .low)
            #expect(defaults.location == Location(latitude: 1, longitude: 2))
            #expect(defaults.optionalString == nil && defaults.optionalInt == nil && defaults.optionalDate == nil)
            #expect(defaults.optionalStatus == nil && defaults.optionalLocation == nil)
            let sample = samples[1]
            #expect(sample.string == "héllo" && sample.int == -42 && sample.int64 == .max && sample.int32 == .min)
            #expect(sample.int16 == 16 && sample.double == 0.1 && sample.float == 1.5 && !sample.bool)
            #expect(sample.date == Date(timeIntervalSince1970: 1_700_000_000.5))
            #expect(sample.data == Data([0, 1, 2, 255]))
            #expect(sample.uuid == UUID(uuidString: "12345678-1234-1234-1234-123456789ABC"))
            #expect(sample.url == URL(string: "file:///tmp/a%20b"))
            #expect(sample.decimal == Decimal(string: "12345678901234567890.123"))
            #expect(sample.status == .done && sample.priority == .high)
            #expect(sample.location == Location(latitude: 48.85, longitude: 2.35))
            #expect(sample.optionalString == "present" && sample.optionalInt == 7)
            #expect(sample.optionalDate == Date(timeIntervalSince1970: 1) && sample.optionalStatus == .todo)
            #expect(sample.optionalLocation == Location(latitude: -1, longitude: -2))
            // Predicates on enums, UUIDs and dates use the stored forms.
            let done = Status.done
            #expect(try Sample.count(where: #Predicate { $0.status == done }, in: context) == 1)
            let date = Date(timeIntervalSince1970: 100)
            #expect(try Sample.count(where: #Predicate { $0.date > date }, in: context) == 1)
            return true
        }
        #expect(checked)
    }

    @Test("a value the column cannot hold fails the save with a typed error and stores nothing")
    func valueNotStorable() throws {
        let stack = try TestStack(.sqlite)
        let probe = CompletionProbe()
        stack.store.writeSync { context in Sample.create(in: context).code = 1 }
        stack.store.writeSync(
            { context in
                try Sample.first(in: context)!.double = .nan
                Sample.create(in: context).code = 2
            }, completion: probe.completion)
        #expect(probe.wait())
        #expect(probe.calls.first??.code == .valueNotStorable)
        var state: [Double] = []
        stack.store.read { context in state = try Sample.all(in: context).map(\.double) }
        #expect(state == [5.5])
    }

    @Test("opening a file made with another schema fails and leaves the file as it was")
    func schemaMismatch() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        do {
            let store = try Skyros(sqliteStack: testSchema, at: url)
            let probe = CompletionProbe()
            store.writeSync({ context in makeUsers([("A", "B")], in: context) }, completion: probe.completion)
            #expect(probe.wait())
            try (store.store as! SQLiteStore).close()
        }
        let files = try FileManager.default.contentsOfDirectory(atPath: directory.url.path).sorted()
        let before = try files.map { try Data(contentsOf: directory.file($0)) }
        #expect(throws: SkyrosError.self) {
            do {
                _ = try Skyros(sqliteStack: Schema([User.self, Post.self]), at: url)
            } catch let error as SkyrosError {
                #expect(error.code == .schemaMismatch)
                throw error
            }
        }
        let filesAfter = try FileManager.default.contentsOfDirectory(atPath: directory.url.path).sorted()
        #expect(filesAfter == files)
        // The database and its WAL are byte for byte the same (the -shm file is SQLite's
        // shared-memory index, rewritten by any reader).
        for (name, data) in zip(filesAfter, before) where !name.hasSuffix("-shm") {
            #expect(try Data(contentsOf: directory.file(name)) == data, "\(name) changed")
        }
        // The right schema still opens it.
        let again = try Skyros(sqliteStack: testSchema, at: url)
        var count = -1
        again.read { count = try User.count(in: $0) }
        #expect(count == 1)
    }

    @Test("the fingerprint is stable for the same declarations and differs for others")
    func fingerprint() {
        let a = Schema([User.self, Post.self])
        let b = Schema([Post.self, User.self])
        #expect(a.fingerprint == b.fingerprint)
        #expect(a.fingerprint != testSchema.fingerprint)
        #expect(Schema([Tag.self]).fingerprint != Schema([Sample.self]).fingerprint)
    }

    @Test("an invalid schema is refused with a clear error")
    func invalidSchema() throws {
        let schema = Schema([Post.self])  // Post.author points to User, which is missing
        #expect(schema.validationErrors.count == 1)
        #expect(schema.validationErrors.first?.contains("Post.author") == true)
        #expect(schema.validationErrors.first?.contains("User") == true)
        #expect(throws: SkyrosError.self) { try Skyros(inMemoryStack: schema) }
        let duplicate = Schema([Tag.self, Tag.self])
        #expect(duplicate.validationErrors == ["entity Tag is declared twice"])
    }

    @Test("the default durability is synchronous=FULL, and NORMAL when asked")
    func durabilityPragma() throws {
        let directory = try TemporaryDirectory()
        let full = try SQLiteStore(schema: testSchema, url: directory.file("full.sqlite"))
        #expect(try full.effectiveDurability() == .full)
        let normal = try SQLiteStore(schema: testSchema, url: directory.file("normal.sqlite"), durability: .normal)
        #expect(try normal.effectiveDurability() == .normal)
    }

    @Test(
        "a transaction committed with weaker durability (the daemon's sync checkpoints) commits, and leaves the store at FULL"
    )
    func weakerDurabilityForOneTransaction() throws {
        let directory = try TemporaryDirectory()
        let store = try SQLiteStore(schema: testSchema, url: directory.file("store.sqlite"))
        let seen = try store.transaction(durability: .normal) { transaction in
            try transaction.execute("INSERT OR REPLACE INTO skyros_metadata (key, value) VALUES ('probe', 'x')")
            return try transaction.rows("PRAGMA synchronous").first?.first
        }
        #expect(seen == .integer(1))  // NORMAL while it ran
        #expect(try store.effectiveDurability() == .full)
        #expect(try store.rows("SELECT value FROM skyros_metadata WHERE key = 'probe'") == [[.text("x")]])
        // A body that throws leaves nothing, and FULL too.
        #expect(throws: SkyrosError.self) {
            try store.transaction(durability: .normal) { transaction in
                try transaction.execute("INSERT OR REPLACE INTO skyros_metadata (key, value) VALUES ('probe', 'y')")
                throw SkyrosError(.storeFailure, "no")
            }
        }
        #expect(try store.effectiveDurability() == .full)
        #expect(try store.rows("SELECT value FROM skyros_metadata WHERE key = 'probe'") == [[.text("x")]])
    }

    @Test("a store with serial access reads on its writer connection what every save committed")
    func serialAccessReads() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        let serial = try SQLiteStore(schema: testSchema, url: url, serialAccess: true)
        let stack = Skyros(store: serial)
        let users = StoreRequest(entityName: "User")
        for round in 1...3 {
            let probe = CompletionProbe()
            stack.writeSync({ makeUsers([("First \(round)", "Last")], in: $0) }, completion: probe.completion)
            #expect(probe.wait())
            // Each read sees the commit just made, through the connection that made it.
            #expect(try serial.count(users) == round)
            #expect(try serial.fetchIdentifiers(users).count == round)
        }
        // The same rows as a store reading through the pool of another connection.
        let pooled = try SQLiteStore(schema: testSchema, url: url)
        let serialRows = try serial.fetchSnapshots(users)
        #expect(serialRows.count == 3)
        #expect(Set(serialRows) == Set(try pooled.fetchSnapshots(users)))
        #expect(try serial.rows("SELECT count(*) FROM \"User\"") == [[.integer(3)]])
    }

    @Test("the normal durability option opens and saves")
    func durabilityNormal() throws {
        let directory = try TemporaryDirectory()
        let store = try Skyros(sqliteStack: testSchema, at: directory.file("store.sqlite"), durability: .normal)
        let probe = CompletionProbe()
        store.writeSync({ makeUsers([("A", "B")], in: $0) }, completion: probe.completion)
        #expect(probe.wait())
        #expect(probe.calls.first! == nil)
    }
}

@Suite("Schema descriptions", .timeLimit(.minutes(3)))
struct SchemaDescriptionTests {
    @Test("a schema rebuilt from its description has the same fingerprint")
    func sameFingerprint() throws {
        let description = testSchema.schemaDescription
        let rebuilt = try Schema(description: description)
        #expect(rebuilt.fingerprint == testSchema.fingerprint)
        #expect(rebuilt.schemaDescription == description)
        let json = try JSONEncoder().encode(description)
        #expect(try JSONDecoder().decode(SchemaDescription.self, from: json) == description)
    }

    @Test("a store made by the typed schema is read and written through the rebuilt one")
    func rebuiltSchemaOpensTheStore() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        do {
            let stack = try Skyros(sqliteStack: testSchema, at: url)
            let probe = CompletionProbe()
            stack.writeSync({ makeUsers([("John", "Doe"), ("Jane", "Doe")], in: $0) }, completion: probe.completion)
            #expect(probe.wait())
            try (stack.store as! SQLiteStore).close()
        }
        let stored = try #require(try SQLiteStore.storedSchemaDescription(at: url))
        #expect(stored == testSchema.schemaDescription)
        let dynamic = try SQLiteStore(schema: try Schema(description: stored), url: url)
        let request = StoreRequest(
            entityName: "User", predicate: .equals("lastname", .text("Doe")),
            sortKeys: [SortKey(property: "firstname", ascending: true)])
        #expect(try dynamic.fetchSnapshots(request).map { $0.values[0] } == [.text("Jane"), .text("John")])
        let root = ObjectContext(name: "root", parent: dynamic)
        try root.performAndWait {
            try root.save(
                ChangeSet(inserted: [
                    Snapshot(
                        id: .make(entityName: "User"),
                        values: [.text("Mark"), .text("Smith"), .integer(30), .null, .text("mark"), .null])
                ]))
            try root.save()
        }
        #expect(try dynamic.count(StoreRequest(entityName: "User")) == 3)
    }

    @Test("an unknown property kind is refused")
    func invalidDescription() {
        var description = testSchema.schemaDescription
        description.entities[0].properties[0].kind = "sideways"
        #expect(throws: SkyrosError.self) { try Schema(description: description) }
    }
}

/// An entity whose second property has a default no column can hold.
@Entity final class UnstorableDefault {
    var label: String = "fine"
    var ratio: Double = .nan
}

@Suite("Defaults", .timeLimit(.minutes(3)))
struct DefaultValueTests {
    @Test("a default that cannot be stored fails the save with an error naming its property")
    func unstorableDefault() throws {
        let store = try Skyros(inMemoryStack: Schema([UnstorableDefault.self]))
        let probe = CompletionProbe()
        store.writeSync({ context in _ = UnstorableDefault.create(in: context) }, completion: probe.completion)
        #expect(probe.wait())
        let error = try #require(probe.calls.first ?? nil)
        #expect(error.code == .valueNotStorable)
        #expect(error.message.contains("UnstorableDefault.ratio"), "\(error.message)")
        var count = -1
        store.read { context in count = try UnstorableDefault.count(in: context) }
        #expect(count == 0)
    }
}

@Suite("StoredValues")
struct StoredValuesTests {
    @Test("copies are independent (copy on write); equality, hashing and coding are those of an array of values")
    func valueSemantics() throws {
        let values: StoredValues = [.text("Ada"), .integer(36), .null, .real(1.5), .blob(Data([1, 2]))]
        var copy = values
        copy[1] = .integer(37)
        #expect(values[1] == .integer(36))
        #expect(copy[1] == .integer(37))
        #expect(values != copy)
        copy[1] = .integer(36)
        #expect(values == copy)
        #expect(Set([values, copy]).count == 1)
        #expect(StoredValues() == [])
        #expect(StoredValues().isEmpty)
        #expect(StoredValues(repeating: .null, count: 3) == [.null, .null, .null])
        let encoded = try JSONEncoder().encode(values)
        #expect(encoded == (try JSONEncoder().encode(Array(values))))
        #expect(try JSONDecoder().decode(StoredValues.self, from: encoded) == values)
        #expect(values.description == Array(values).description)
    }

    @Test("rows made in one arena share buffers but behave as values of their own")
    func arenaRows() {
        var arena = StoredValues.Arena()
        var rows = (0..<3000).map { row in
            arena.make(count: 3) { $0.initialize(repeating: .integer(Int64(row)), count: 3) }
        }
        #expect(rows[1234] == [.integer(1234), .integer(1234), .integer(1234)])
        #expect(rows[1234].hashValue == StoredValues([.integer(1234), .integer(1234), .integer(1234)]).hashValue)
        let before = rows[11]
        rows[11][2] = .text("changed")  // shared buffer: copied first
        #expect(rows[11] == [.integer(11), .integer(11), .text("changed")])
        #expect(before == [.integer(11), .integer(11), .integer(11)])
        #expect(rows[10] == [.integer(10), .integer(10), .integer(10)])
        #expect(rows[12] == [.integer(12), .integer(12), .integer(12)])
        // Once the other rows are gone, a row alone in its buffer is written in place.
        var last = rows[2999]
        rows = []
        last[0] = .null
        #expect(last == [.null, .integer(2999), .integer(2999)])
        // More values than a shared buffer takes get a buffer of their own.
        let wide = arena.make(count: 5000) { $0.initialize(repeating: .null, count: 5000) }
        #expect(wide.count == 5000 && wide.allSatisfy { $0 == .null })
    }
}
