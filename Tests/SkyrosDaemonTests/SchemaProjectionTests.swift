import Foundation
import Skyros
import SkyrosWire
import Testing

@testable import SkyrosDaemon

/// The daemon's translation for clients of an earlier schema version, as a value: no socket,
/// no store.
@Suite("Schema projection")
struct SchemaProjectionTests {
    typealias Property = SchemaDescription.Property

    static func attribute(
        _ name: String, _ type: String = "string", storage: StorageType = .text, optional: Bool = false,
        original: String? = nil, default value: StoredValue? = nil
    ) -> Property {
        Property(
            name: name, kind: "attribute", storageType: storage, isOptional: optional, typeName: type,
            originalName: original, defaultValue: value)
    }

    /// v1: Task(title, done, note?); v2: Task(name ← title, done, due?, priority = 3) — note removed.
    static let v1 = SchemaDescription(entities: [
        .init(
            name: "Task",
            properties: [
                attribute("title", default: .text("")),
                attribute("done", "bool", storage: .integer, default: .integer(0)),
                attribute("note", optional: true),
            ])
    ])
    static let v2 = SchemaDescription(entities: [
        .init(
            name: "Task",
            properties: [
                attribute("name", original: "title", default: .text("")),
                attribute("done", "bool", storage: .integer, default: .integer(0)),
                attribute("due", "date", storage: .real, optional: true),
                attribute("priority", "int", storage: .integer, default: .integer(3)),
            ])
    ])
    /// v3 renames Task to Todo and name to label (through v2's names).
    static let v3 = SchemaDescription(entities: [
        .init(
            name: "Todo",
            properties: [
                attribute("label", original: "name", default: .text("")),
                attribute("done", "bool", storage: .integer, default: .integer(0)),
                attribute("due", "date", storage: .real, optional: true),
                attribute("priority", "int", storage: .integer, default: .integer(3)),
            ], originalName: "Task")
    ])

    let id = ObjectID(entityName: "Task", uuid: UUID())

    @Test("an inserted v1 object takes the defaults of the attributes it lacks; its renamed values move")
    func insert() throws {
        let projection = try SchemaProjection(chain: [(1, Self.v1), (2, Self.v2)])
        let changes = ChangeSet(inserted: [Snapshot(id: id, values: [.text("milk"), .integer(1), .text("2 l")])])
        let current = try projection.current(changes)
        #expect(current.inserted == [Snapshot(id: id, values: [.text("milk"), .integer(1), .null, .integer(3)])])
    }

    @Test("a v1 change set of the wrong shape is refused with the codes a current client gets")
    func wrongShape() throws {
        let projection = try SchemaProjection(chain: [(1, Self.v1), (2, Self.v2)])
        let short = #expect(throws: SkyrosError.self) {
            try projection.current(ChangeSet(inserted: [Snapshot(id: id, values: [.text("milk")])]))
        }
        #expect(short?.code == .valueNotStorable)
        let noSuchProperty = #expect(throws: SkyrosError.self) {
            try projection.current(
                ChangeSet(updated: [ChangeSet.Update(id: id, changes: [7: .integer(1)], baseVersion: 1)]))
        }
        #expect(noSuchProperty?.code == .valueNotStorable && noSuchProperty?.message.contains("version 1") == true)
    }

    @Test("updates are mapped by index; a removed attribute's change is left out; deletes pass")
    func update() throws {
        let projection = try SchemaProjection(chain: [(1, Self.v1), (2, Self.v2)])
        let changes = ChangeSet(
            updated: [ChangeSet.Update(id: id, changes: [0: .text("eggs"), 2: .text("gone")], baseVersion: 4)],
            deleted: [id])
        let current = try projection.current(changes)
        #expect(current.updated == [ChangeSet.Update(id: id, changes: [0: .text("eggs")], baseVersion: 4)])
        #expect(current.deleted == [id])
    }

    @Test("objects go back in the client's order; what it lacks is not sent, what it has lost is filled in")
    func snapshots() throws {
        let projection = try SchemaProjection(chain: [(1, Self.v1), (2, Self.v2)])
        let stored = Snapshot(id: id, values: [.text("milk"), .integer(1), .real(86_400), .integer(5)], version: 2)
        #expect(projection.old(stored) == Snapshot(id: id, values: [.text("milk"), .integer(1), .null], version: 2))
        let event = ChangeEvent(
            sequence: 9, inserted: [stored],
            updated: [.init(id: id, version: 3, values: [0: .text("x"), 3: .integer(1)])],
            deleted: [id])
        let old = projection.old(event)
        #expect(old.inserted == [Snapshot(id: id, values: [.text("milk"), .integer(1), .null], version: 2)])
        #expect(old.updated == [.init(id: id, version: 3, values: [0: .text("x")])])
        #expect(old.deleted == [id])
    }

    @Test("predicates and sorts are renamed; a removed attribute cannot be fetched by")
    func requests() throws {
        let projection = try SchemaProjection(chain: [(1, Self.v1), (2, Self.v2)])
        let request = StoreRequest(
            entityName: "Task", predicate: .and(.equals("title", .text("milk")), .equals("done", .integer(0))),
            sortKeys: [SortKey(property: "title", ascending: false)])
        let current = try projection.current(request)
        #expect(current.predicate == .and(.equals("name", .text("milk")), .equals("done", .integer(0))))
        #expect(current.sortKeys == [SortKey(property: "name", ascending: false)])
        #expect(throws: SkyrosError.self) {
            try projection.current(StoreRequest(entityName: "Task", predicate: .equals("note", .null)))
        }
        #expect(throws: SkyrosError.self) { try projection.current(StoreRequest(entityName: "Nope")) }
    }

    @Test("renames chain through every recorded version, entities included")
    func chain() throws {
        let projection = try SchemaProjection(chain: [(1, Self.v1), (2, Self.v2), (3, Self.v3)])
        let current = try projection.current(StoreRequest(entityName: "Task", predicate: .equals("title", .text("a"))))
        #expect(current.entityName == "Todo")
        #expect(current.predicate == .equals("label", .text("a")))
        let todo = ObjectID(entityName: "Todo", uuid: id.uuid)
        #expect(projection.old(todo) == id)
        #expect(try projection.current(id) == todo)
        let inserted = try projection.current(
            ChangeSet(inserted: [Snapshot(id: id, values: [.text("a"), .integer(0), .null])]))
        #expect(inserted.inserted.first?.id == todo)
    }

    @Test("what cannot be projected is refused with schemaMismatch, naming the entity and property")
    func refusals() throws {
        var changedType = Self.v2
        changedType.entities[0].properties[1] = Self.attribute("done", "string", default: .text("no"))
        let error = try #require(throws: SkyrosError.self) {
            try SchemaProjection(chain: [(1, Self.v1), (2, changedType)])
        }
        #expect(error.code == .schemaMismatch)
        #expect(error.message.contains("Task.done"))
        let removed = SchemaDescription(entities: [.init(name: "Other", properties: [Self.attribute("x")])])
        let gone = try #require(throws: SkyrosError.self) { try SchemaProjection(chain: [(1, Self.v1), (2, removed)]) }
        #expect(gone.code == .schemaMismatch)
        #expect(gone.message.contains("Task"))
        // A new non-optional attribute without a known default: the v1 client reads, but cannot insert.
        var noDefault = Self.v2
        noDefault.entities[0].properties[3] = Self.attribute("priority", "int", storage: .integer)
        let projection = try SchemaProjection(chain: [(1, Self.v1), (2, noDefault)])
        let insert = try #require(throws: SkyrosError.self) {
            try projection.current(ChangeSet(inserted: [Snapshot(id: id, values: [.text("a"), .integer(0), .null])]))
        }
        #expect(insert.code == .schemaMismatch)
        #expect(insert.message.contains("priority"))
    }

    @Test("the schema description carries constant defaults, and a rebuilt schema keeps them")
    func defaults() throws {
        let json = try Self.v2.canonicalJSON()
        #expect(String(decoding: json, as: UTF8.self).contains(#""defaultValue":{"integer":3}"#))
        let decoded = try JSONDecoder().decode(SchemaDescription.self, from: json)
        #expect(decoded == Self.v2)
        #expect(try Schema(description: decoded, version: 2).schemaDescription == Self.v2)
    }
}
