import Foundation
import GRDB
import Skyros
import SkyrosTestSupport
import Testing

@Suite("Schema type names")
struct SchemaTypeNameTests {
    @Test("type names are platform-neutral: no runtime module names in the description")
    func neutralNames() throws {
        let names = testSchema.schemaDescription.entities.flatMap { $0.properties.map(\.typeName) }
        #expect(!names.isEmpty && names.allSatisfy { !$0.contains(".") && !$0.contains("<") })
        let user = try #require(testSchema.schemaDescription.entities.first { $0.name == "User" })
        #expect(user.properties.first { $0.name == "firstname" }?.typeName == "string")
        #expect(user.properties.first { $0.name == "age" }?.typeName == "int")
        #expect(
            user.properties.first { $0.name == "email" }.map { ($0.typeName, $0.isOptional) } ?? ("", false) == (
                "string", true
            ))
    }

    @Test("a store recorded with runtime type names opens with the same schema, its record brought up to date")
    func legacyStoreOpens() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("legacy.sqlite")
        do {
            let store = try SQLiteStore(schema: testSchema, url: url)
            try store.save(
                ChangeSet(inserted: [
                    Snapshot(
                        id: .make(entityName: "User"),
                        values: [.text("Ada"), .text("L"), .integer(36), .null, .text("ada"), .null])
                ]))
            try store.close()
        }
        // What a store made before neutral names recorded: runtime names and their fingerprint.
        var legacy = testSchema.schemaDescription
        for entity in legacy.entities.indices {
            for property in legacy.entities[entity].properties.indices {
                let name = legacy.entities[entity].properties[property].typeName
                let runtime =
                    [
                        "string": "Swift.String", "int": "Swift.Int", "uuid": "Foundation.UUID",
                        "date": "Foundation.Date",
                    ][name] ?? name
                legacy.entities[entity].properties[property].typeName =
                    legacy.entities[entity].properties[property].isOptional ? "Swift.Optional<\(runtime)>" : runtime
            }
        }
        let queue = try DatabaseQueue(path: url.path)
        try queue.write { db in
            try db.execute(
                sql: "UPDATE skyros_metadata SET value = '0123456789abcdef0123456789abcdef' WHERE key = 'fingerprint'")
            try db.execute(
                sql: "UPDATE skyros_metadata SET value = ? WHERE key = 'schema'",
                arguments: [String(decoding: try legacy.canonicalJSON(), as: UTF8.self)])
        }
        try queue.close()
        #expect(
            try SQLiteStore.storedSchemaDescription(at: url).map { try Schema(description: $0).fingerprint }
                == testSchema.fingerprint)
        let store = try SQLiteStore(schema: testSchema, url: url)
        #expect(try store.count(StoreRequest(entityName: "User")) == 1)
        #expect(
            try store.rows("SELECT value FROM skyros_metadata WHERE key = 'fingerprint'") == [
                [.text(testSchema.fingerprint)]
            ])
        // Another schema is still refused.
        #expect(throws: SkyrosError.self) { try SQLiteStore(schema: Schema([Tag.self]), url: url) }
    }
}
