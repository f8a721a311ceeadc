import Foundation
import GRDBSQLite
import Skyros

/// A many-to-many: posts and tags (the link table `_Post_tags`).
@Entity final class Post {
    var title: String = ""
    @Relationship(inverse: \Tag.posts) var tags: [Tag] = []
}

@Entity final class Tag {
    @Attribute(.indexed) var name: String = ""
    var posts: [Post] = []
}

/// An ordered to-many: a checklist's steps (the order table `_Checklist_steps`).
@Entity final class Checklist {
    var name: String = ""
    @Relationship(.ordered, deleteRule: .cascade) var steps: [Step] = []
}

@Entity final class Step {
    var title: String = ""
    var checklist: Checklist? = nil
}

let modelSchema = Schema([Post.self, Tag.self, Checklist.self, Step.self])

/// An entity hierarchy (one table, `Machine`, with `_entity`) and a flat entity of the same
/// shape as one of its subentities.
@Entity class Machine {
    @Attribute(.indexed) var rank: Int = 0
    var name: String = ""
}

@Entity final class Robot: Machine {
    var arms: Int = 2
}

@Entity final class Drone: Machine {
    var rotors: Int = 4
}

@Entity final class FlatRobot {
    @Attribute(.indexed) var rank: Int = 0
    var name: String = ""
    var arms: Int = 2
}

let inheritanceSchema = Schema([Machine.self, Robot.self, Drone.self, FlatRobot.self])

/// `skyros-bench model`: the object model's relationships against hand-written SQL on the
/// same tables (the SQLite C API, prepared statements, one transaction), in the same run.
///
/// - Link each of `posts` posts to 10 of 100 tags and save (`post.tags = […]` per post, one
///   write), against INSERTs into the link table.
/// - Fetch the posts having a given tag (1 % of the links), against the hand-written join.
/// - Move one step of an ordered to-many of 10,000 and save: the rows the save writes are
///   counted (one), and the save is timed against the save of a one-attribute update of one
///   step, made in the same way (the list read in a context over the root context, one step
///   edited, then that context saved and the root saved into the store).
struct ModelBenchmark {
    let directory: URL
    let posts: Int
    let rounds: Int
    static let tagCount = 100
    static let tagsPerPost = 10

    /// A store file of the model with `posts` posts and 100 tags, and no link.
    func populated(_ name: String) throws -> URL {
        let url = directory.appendingPathComponent(name)
        let store = try Skyros(sqliteStack: modelSchema, at: url, savesOnStop: false)
        try store.writeAndWait { context in
            for index in 0..<Self.tagCount { Tag.create(in: context).name = "tag-\(index)" }
            for index in 0..<posts { Post.create(in: context).title = "post \(index)" }
        }
        return url
    }

    /// The tags of post number `index`: 10 of the 100, spread so that each tag has 1 % of the links.
    static func tagIndexes(_ index: Int) -> [Int] { (0..<tagsPerPost).map { (index + $0 * 10) % tagCount } }

    func run(report: (Row) -> Void) throws {
        let skyrosURL = try populated("model-skyros.sqlite")
        let rawURL = try populated("model-raw.sqlite")
        let links = posts * Self.tagsPerPost

        // Link: the Skyros write, then the same links inserted by hand.
        let store = try Skyros(sqliteStack: modelSchema, at: skyrosURL, savesOnStop: false)
        let skyrosLink = try Clock.seconds {
            try store.writeAndWait { context in
                let tags = try Tag.all(sortedBy: [SortDescriptor(\.name)], in: context)
                let byName = Dictionary(uniqueKeysWithValues: tags.map { ($0.name, $0) })
                for (index, post) in try Post.all(in: context).enumerated() {
                    post.tags = Self.tagIndexes(index).map { byName["tag-\($0)"]! }
                }
            }
        }
        let raw = RawSQLite(path: rawURL.path)
        let rawLink = Clock.seconds {
            raw.execute("BEGIN IMMEDIATE")
            var tags: [String: Data] = [:]
            let selectTags = raw.prepare("SELECT \"_id\", \"name\" FROM \"Tag\"")
            while sqlite3_step(selectTags) == SQLITE_ROW {
                tags[String(cString: sqlite3_column_text(selectTags, 1))] = Data(
                    bytes: sqlite3_column_blob(selectTags, 0), count: Int(sqlite3_column_bytes(selectTags, 0)))
            }
            sqlite3_finalize(selectTags)
            let tagIDs = (0..<Self.tagCount).map { tags["tag-\($0)"]! }
            let selectPosts = raw.prepare("SELECT \"_id\" FROM \"Post\"")
            let insert = raw.prepare("INSERT INTO \"_Post_tags\" (\"_id\", \"source\", \"target\") VALUES (?, ?, ?)")
            var index = 0
            while sqlite3_step(selectPosts) == SQLITE_ROW {
                let post = sqlite3_column_blob(selectPosts, 0)
                let length = sqlite3_column_bytes(selectPosts, 0)
                for tag in Self.tagIndexes(index) {
                    sqlite3_reset(insert)
                    var id = UUID().uuid
                    withUnsafeBytes(of: &id) { _ = sqlite3_bind_blob(insert, 1, $0.baseAddress, 16, SQLITE_TRANSIENT) }
                    sqlite3_bind_blob(insert, 2, post, length, SQLITE_TRANSIENT)
                    tagIDs[tag].withUnsafeBytes {
                        _ = sqlite3_bind_blob(insert, 3, $0.baseAddress, 16, SQLITE_TRANSIENT)
                    }
                    raw.step(insert)
                }
                index += 1
            }
            sqlite3_finalize(selectPosts)
            sqlite3_finalize(insert)
            raw.execute("COMMIT")
        }
        let linked = try store.store.count(StoreRequest(entityName: "_Post_tags"))
        precondition(linked == links, "Skyros stored \(linked) links of \(links)")
        report(
            Row(
                name: "link \(posts / 1_000)k posts to 10 tags each, one save (vs SQL)", unit: "links/s",
                skyros: Double(links) / skyrosLink, baseline: Double(links) / rawLink))

        // Fetch the posts of one tag: 1 % of the links, a different tag each round.
        var skyrosFetch: [Double] = []
        var rawFetch: [Double] = []
        let join = raw.prepare(
            "SELECT p.\"_id\", p.\"_version\", p.\"title\" FROM \"Post\" p JOIN \"_Post_tags\" l ON l.\"source\" = p.\"_id\" JOIN \"Tag\" t ON t.\"_id\" = l.\"target\" WHERE t.\"name\" = ?"
        )
        defer { sqlite3_finalize(join) }
        for round in 0..<rounds {
            let name = "tag-\(round * 7 % Self.tagCount)"
            let reader = ObjectContext(name: "reader", parent: store.rootContext)
            var found = 0
            skyrosFetch.append(
                try Clock.seconds {
                    found = try reader.performAndWait {
                        try reader.fetch(
                            FetchDescriptor<Post>(predicate: #Predicate { $0.tags.contains { $0.name == name } })
                        )
                        .reduce(0) { count, post in count + (post.title.isEmpty ? 0 : 1) }
                    }
                })
            precondition(found == links / Self.tagCount, "Skyros found \(found) posts")
            found = 0
            rawFetch.append(
                Clock.seconds {
                    sqlite3_reset(join)
                    sqlite3_bind_text(join, 1, name, -1, SQLITE_TRANSIENT)
                    while sqlite3_step(join) == SQLITE_ROW {
                        _ = Data(bytes: sqlite3_column_blob(join, 0), count: Int(sqlite3_column_bytes(join, 0)))
                        _ = sqlite3_column_int64(join, 1)
                        if !String(cString: sqlite3_column_text(join, 2)).isEmpty { found += 1 }
                    }
                })
            precondition(found == links / Self.tagCount, "SQL found \(found) posts")
        }
        report(
            Row(
                name:
                    "fetch the posts of a tag, \(links / Self.tagCount / 1_000)k of \(links / 1_000)k links (vs SQL join)",
                unit: "objects/s",
                skyros: Double(links / Self.tagCount) / BatchBenchmark.median(skyrosFetch),
                baseline: Double(links / Self.tagCount) / BatchBenchmark.median(rawFetch)))

        try orderedMove(store, report: report)
        try inheritance(report: report)
    }

    /// Fetches 1 % of the robots (a subentity of `Machine`, whose table also holds one drone
    /// per ten robots) by a range of an indexed inherited attribute, against the same fetch of
    /// a flat entity of the same shape and row count, in the same store. Each object's own
    /// attribute is read. Rows: 10 × `posts` robots (1 M at full size). Two rows: the drones'
    /// ranks among the robots' (every range holds one drone per ten robots, the worst case),
    /// and apart (a range holds robots only).
    func inheritance(report: (Row) -> Void) throws {
        try inheritance(interleaved: true, report: report)
        try inheritance(interleaved: false, report: report)
    }

    private func inheritance(interleaved: Bool, report: (Row) -> Void) throws {
        let count = posts * 10
        let store = try Skyros(
            sqliteStack: inheritanceSchema,
            at: directory.appendingPathComponent("inheritance-\(interleaved).sqlite"), savesOnStop: false)
        for start in stride(from: 0, to: count, by: 100_000) {
            try store.writeAndWait { context in
                for index in start..<min(start + 100_000, count) {
                    let robot = Robot.create(in: context)
                    robot.rank = index
                    robot.name = "robot \(index)"
                    let flat = FlatRobot.create(in: context)
                    flat.rank = index
                    flat.name = "robot \(index)"
                    if index % 10 == 0 {
                        let drone = Drone.create(in: context)
                        drone.rank = interleaved ? index : count + index
                        drone.name = "drone \(index)"
                    }
                }
            }
        }
        let width = count / 100
        var subentity: [Double] = []
        var flat: [Double] = []
        /// The seconds a fetch takes, each object's `arms` read.
        func fetch<T: ManagedObject>(_ descriptor: FetchDescriptor<T>, arms: KeyPath<T, Int>) throws -> Double {
            let reader = ObjectContext(name: "reader", parent: store.rootContext)
            var found = 0
            let seconds = try Clock.seconds {
                found = try reader.performAndWait {
                    try reader.fetch(descriptor).reduce(0) { $0 + $1[keyPath: arms] / 2 }
                }
            }
            precondition(found == width, "Skyros found \(found) \(T.self) of \(width)")
            return seconds
        }
        // Nine ranges, in turn the subentity's fetch first and the flat entity's first.
        for round in 0..<max(rounds, 9) {
            let low = (round * 37 % 90) * width
            let high = low + width
            let robots = FetchDescriptor<Robot>(predicate: #Predicate { $0.rank >= low && $0.rank < high })
            let flatRobots = FetchDescriptor<FlatRobot>(predicate: #Predicate { $0.rank >= low && $0.rank < high })
            if round.isMultiple(of: 2) {
                subentity.append(try fetch(robots, arms: \.arms))
                flat.append(try fetch(flatRobots, arms: \.arms))
            } else {
                flat.append(try fetch(flatRobots, arms: \.arms))
                subentity.append(try fetch(robots, arms: \.arms))
            }
        }
        report(
            Row(
                name:
                    "fetch 1 % of \(count / 1_000)k objects of a subentity, \(interleaved ? "1 in 11 rows another's" : "its rows alone") (vs flat)",
                unit: "objects/s",
                skyros: Double(width) / BatchBenchmark.median(subentity),
                baseline: Double(width) / BatchBenchmark.median(flat)))
    }

    /// Moves one step of a checklist of 10,000 per round, and updates one step's title per
    /// round, timing the saves alone (the edits are made before the clock starts). Both edits
    /// read the list first: the first save after reading 10,000 objects takes about twice as
    /// long as one after reading one, whatever it writes (caches cold), and that is not the
    /// move's cost.
    func orderedMove(_ store: Skyros, report: (Row) -> Void) throws {
        let count = 10_000
        try store.writeAndWait { context in
            let list = Checklist.create(in: context)
            list.name = "big"
            list.steps = (0..<count).map { index in
                let step = Step.create(in: context)
                step.title = "step \(index)"
                return step
            }
        }
        let root = store.rootContext
        var moves: [Double] = []
        var updates: [Double] = []
        var written: [Int] = []
        var generator = SystemRandomNumberGenerator()
        for _ in 0..<max(rounds, 5) {
            let mover = ObjectContext(name: "mover", parent: root)
            let rows = try mover.performAndWait {
                let list = try Checklist.first(in: mover)!
                var steps = list.steps
                let from = Int.random(in: 0..<count, using: &generator)
                var to = Int.random(in: 0..<(count - 1), using: &generator)
                if to >= from { to += 1 }
                steps.insert(steps.remove(at: from), at: min(to, steps.count))
                list.steps = steps
                return mover.insertedObjects.count + mover.updatedObjects.count + mover.deletedObjects.count
            }
            written.append(rows)
            moves.append(
                try Clock.seconds {
                    try mover.performAndWait { try mover.save() }
                    try root.performAndWait { try root.save() }
                })
            let editor = ObjectContext(name: "editor", parent: root)
            try editor.performAndWait {
                // The same situation as the move's: the list read, then one step edited.
                let steps = try Checklist.first(in: editor)!.steps
                steps[Int.random(in: 0..<count, using: &generator)].title += "'"
                precondition(editor.updatedObjects.count == 1)
            }
            updates.append(
                try Clock.seconds {
                    try editor.performAndWait { try editor.save() }
                    try root.performAndWait { try root.save() }
                })
        }
        precondition(written.allSatisfy { $0 == 1 }, "a move wrote \(written) rows")
        let check = ObjectContext(name: "check", parent: store.store)
        let order = try check.performAndWait { try Checklist.first(in: check)!.steps.count }
        precondition(order == count, "the list has \(order) steps")
        report(
            Row(
                name: "move 1 of 10k ordered steps, save (\(written.max()!) row written; vs a 1-attribute update)",
                unit: "saves/s", skyros: 1 / BatchBenchmark.median(moves), baseline: 1 / BatchBenchmark.median(updates))
        )
    }
}

private let SQLITE_TRANSIENT = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
