import Foundation
import Skyros

/// Store files for the tests of the daemon's start-up check.
public enum StoreFiles {
    /// Creates a Skyros store of ``testSchema`` at `url` holding `users` users, and closes it
    /// (checkpointed: the database file holds everything).
    public static func makeStore(at url: URL, users: Int) throws {
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        let store = try SQLiteStore(schema: testSchema, url: url)
        defer { try? store.close() }
        try store.save(
            ChangeSet(
                inserted: (0..<users).map { number in
                    Snapshot(
                        id: .make(entityName: "User"),
                        values: [
                            .text("First \(number)"), .text("Last \(number)"), .integer(1), .null,
                            .text("user\(number)"), .null,
                        ])
                }))
    }

    /// Damages a closed store the way a failing disk or a stray write does: the cell count
    /// in the b-tree page header of the last page (a leaf of the users' table or of an
    /// index) is overwritten, so its cell pointers point outside the cell content. The file
    /// is still an SQLite database (page 1 is intact) and `PRAGMA quick_check` lists errors.
    public static func damage(_ url: URL) throws {
        var bytes = try Data(contentsOf: url)
        let declared = Int(bytes[16]) << 8 | Int(bytes[17])
        let pageSize = declared == 1 ? 65_536 : declared
        let pages = bytes.count / pageSize
        precondition(pages >= 3, "a store of at least 3 pages")
        let start = (pages - 1) * pageSize
        bytes.replaceSubrange((start + 3)..<(start + 5), with: [0x00, 0xFF])
        try bytes.write(to: url)
    }

    /// A text file where the store belongs.
    public static func makeTextFile(at url: URL) throws {
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        try Data("not a database: my notes, saved here by mistake\n".utf8).write(to: url)
    }

    /// An SQLite database that is not a Skyros store (no `skyros_metadata`), closed.
    public static func makeForeignDatabase(at url: URL) throws {
        try FileManager.default.createDirectory(at: url.deletingLastPathComponent(), withIntermediateDirectories: true)
        let store = try SQLiteStore(schema: testSchema, url: url)
        // The store's own tables, then its metadata removed: an ordinary SQLite database.
        try store.transaction { transaction in try transaction.execute("DROP TABLE skyros_metadata") }
        try store.close()
    }
}
