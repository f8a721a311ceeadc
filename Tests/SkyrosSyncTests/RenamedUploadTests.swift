import Foundation
import Skyros
import SkyrosSync
import Testing

/// Version 2 of a model: the entity `Box` renamed `Folder`, its property `title` renamed `label`.
@Entity(name: "Folder", originalName: "Box") final class RenamedFolder {
    @Attribute(originalName: "title") var label: String = ""
    var size: Int = 0
}

/// A change set queued before the migration that renamed an entity or a property names them as
/// they were: the upload takes them under the current names (issue 57, a rename rolled out).
@Suite struct RenamedUploadTests {
    let schema = ServerSchema(Schema([RenamedFolder.self], version: 2), name: "g")

    @Test func aChangeSetQueuedBeforeARenameIsUploadedUnderTheCurrentNames() {
        let id = UUID()
        var queued = QueuedChangeSet()
        queued.inserted = [.init(entity: "Box", id: id, values: ["title": .text("old"), "size": .integer(2)])]
        queued.updated = [.init(entity: "Folder", id: UUID(), values: ["title": .text("older")])]
        queued.deleted = [.init(entity: "Box", id: UUID())]
        let current = schema.current(queued)
        #expect(
            current.inserted == [.init(entity: "Folder", id: id, values: ["label": .text("old"), "size": .integer(2)])])
        #expect(current.updated.map(\.entity) == ["Folder"])
        #expect(current.updated.first?.values == ["label": .text("older")])
        #expect(current.deleted.map(\.entity) == ["Folder"])
    }

    @Test func aChangeSetInTheCurrentNamesIsLeftAsItIs() {
        var queued = QueuedChangeSet()
        queued.inserted = [.init(entity: "Folder", id: UUID(), values: ["label": .text("new")])]
        #expect(schema.current(queued) == queued)
    }

    @Test func anUnknownEntityOrPropertyIsLeftForTheUploadToIgnore() {
        var queued = QueuedChangeSet()
        queued.inserted = [.init(entity: "Gone", id: UUID(), values: ["x": .integer(1)])]
        queued.updated = [.init(entity: "Folder", id: UUID(), values: ["gone": .integer(1)])]
        #expect(schema.current(queued) == queued)
    }
}
