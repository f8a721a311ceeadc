import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// Ordered many-to-many relationships (`orderedLinkSchema` in SkyrosTestSupport): the links of
/// the ordered side hold its positions. On every stack.
@Suite("Ordered many-to-many", .timeLimit(.minutes(3)))
struct OrderedLinkTests {
    func stack(_ kind: StoreKind) throws -> TestStack { try TestStack(kind, schema: orderedLinkSchema) }

    /// Every album with its tracks in order, every listener with its queue in order, and the
    /// other sides (sorted: they are not ordered).
    static func graph(_ context: ObjectContext) throws -> String {
        try context.performAndWait {
            let albums = try Album.all(in: context).map {
                "\($0.name):\($0.tracks.map(\.title).joined(separator: ","))"
            }.sorted()
            let tracks = try Track.all(in: context).map {
                "\($0.title):\($0.albums.map(\.name).sorted().joined(separator: ","))"
            }.sorted()
            let listeners = try Listener.all(in: context).map {
                "\($0.name):\($0.queue.map(\.title).joined(separator: ","))"
            }.sorted()
            let episodes = try Episode.all(in: context).map {
                "\($0.title):\($0.listeners.map(\.name).sorted().joined(separator: ","))"
            }.sorted()
            return "\(albums) \(tracks) \(listeners) \(episodes)"
        }
    }

    static func stored(_ stack: TestStack) throws -> String {
        try graph(ObjectContext(name: "fresh", parent: stack.store.store))
    }

    static func pendingRows(_ context: ObjectContext) -> Int {
        context.insertedObjects.count + context.updatedObjects.count + context.deletedObjects.count
    }

    func album(_ name: String, in context: ObjectContext) throws -> Album {
        try #require(try Album.first(where: #Predicate { $0.name == name }, in: context))
    }

    func track(_ title: String, in context: ObjectContext) throws -> Track {
        try #require(try Track.first(where: #Predicate { $0.title == title }, in: context))
    }

    @Test("the links of an ordered many-to-many hold positions, whichever side owns them")
    func schemaShape() throws {
        try orderedLinkSchema.validate()
        for name in ["_Album_tracks", "_Episode_listeners"] {
            let link = try #require(orderedLinkSchema.entity(named: name))
            #expect(link.properties.map(\.name) == ["source", "target", "position"])
        }
        #expect(
            try Schema(description: orderedLinkSchema.schemaDescription).fingerprint == orderedLinkSchema.fingerprint)
    }

    @Test("order set, moved, shared between lists, and joined from the unordered side", arguments: StoreKind.allCases)
    func orderAndMoves(kind: StoreKind) throws {
        let stack = try stack(kind)
        try stack.store.writeAndWait { context in
            let tracks = ["t1", "t2", "t3", "t4"].map { title -> Track in
                let track = Track.create(in: context)
                track.title = title
                return track
            }
            let (a, b) = (Album.create(in: context), Album.create(in: context))
            (a.name, b.name) = ("a", "b")
            a.tracks = [tracks[2], tracks[0], tracks[1]]
            b.tracks = [tracks[1], tracks[2]]  // t2 and t3 in both, in other orders
            tracks[3].albums = [a]  // from the other side: last in a
            #expect(a.tracks.map(\.title) == ["t3", "t1", "t2", "t4"])
            let listener = Listener.create(in: context)
            listener.name = "l"
            let episodes = ["e1", "e2", "e3"].map { title -> Episode in
                let episode = Episode.create(in: context)
                episode.title = title
                return episode
            }
            listener.queue = [episodes[1], episodes[2]]
            episodes[0].listeners = [listener]  // last in the queue
        }
        let expected =
            #"["a:t3,t1,t2,t4", "b:t2,t3"] ["t1:a", "t2:a,b", "t3:a,b", "t4:a"] ["l:e2,e3,e1"] ["e1:l", "e2:l", "e3:l"]"#
        #expect(try Self.graph(stack.store.mainContext) == expected)
        #expect(try Self.stored(stack) == expected)

        // A move: one link's position written; b's order untouched; a controller of a's tracks
        // reports a move.
        let main = stack.store.mainContext
        let controller = FetchedResultsController(
            relationship: \Album.tracks, of: try main.performAndWait { try album("a", in: main) }, context: main)
        try controller.performFetch()
        let reported = OrderedTests.Reported()
        controller.onChange = { changes in
            reported.changes.append(
                changes.objects.map { change in
                    if case .move(let track, let from, let to) = change {
                        return "move \(track.title) \(from.item)→\(to.item)"
                    }
                    return "\(change)"
                })
        }
        try stack.store.writeAndWait { context in
            let a = try album("a", in: context)
            var tracks = a.tracks
            tracks.insert(tracks.removeLast(), at: 0)
            a.tracks = tracks
            #expect(Self.pendingRows(context) == 1)
            let listener = try #require(try Listener.first(in: context))
            listener.queue = listener.queue.reversed()
        }
        let moved =
            #"["a:t4,t3,t1,t2", "b:t2,t3"] ["t1:a", "t2:a,b", "t3:a,b", "t4:a"] ["l:e1,e3,e2"] ["e1:l", "e2:l", "e3:l"]"#
        #expect(try Self.stored(stack) == moved)
        #expect(reported.changes.last == ["move t4 3→0"])

        // Unlinked from either side, linked again at a place, a track deleted.
        try stack.store.writeAndWait { context in
            let a = try album("a", in: context)
            try track("t3", in: context).albums = [try album("b", in: context)]  // leaves a
            a.tracks.insert(try track("t3", in: context), at: 1)  // back, second
            try track("t1", in: context).delete(in: context)
            #expect(a.tracks.map(\.title) == ["t4", "t3", "t2"])
        }
        #expect(
            try Self.stored(stack)
                == #"["a:t4,t3,t2", "b:t2,t3"] ["t2:a,b", "t3:a,b", "t4:a"] ["l:e1,e3,e2"] ["e1:l", "e2:l", "e3:l"]"#)
    }

    @Test(
        "seeded random placements, moves, unlinks from either side, deletions, undo and redo",
        arguments: StoreKind.allCases)
    func randomSequences(kind: StoreKind) throws {
        let stack = try stack(kind)
        let main = stack.store.mainContext
        let undo = UndoManager()
        main.undoManager = undo
        var sequence = UndoSequence(
            edits: 10, undos: 3, redos: 3, steps: 120, seedVariable: "ORDERED_LINK_SEED", seed: 0x11_0D_E5)
        sequence.unchangedIsNoStep = true
        let counts = try sequence.run(stack, undo, graph: Self.graph) { choice, serial, generator in
            let albums = try Album.all(in: main).sorted { $0.name < $1.name }
            let tracks = try Track.all(in: main).sorted { $0.title < $1.title }
            switch choice {
            case 0: Album.create(in: main).name = "a\(serial)"
            case 1: Track.create(in: main).title = "t\(serial)"
            case 2, 3:  // place a track at an index of an album
                guard let album = albums.randomElement(using: &generator),
                    let track = tracks.randomElement(using: &generator)
                else { return false }
                var list = album.tracks.filter { $0 !== track }
                list.insert(track, at: Int.random(in: 0...list.count, using: &generator))
                guard list.map(\.objectID) != album.tracks.map(\.objectID) else { return false }
                album.tracks = list
            case 4, 5:  // move within an album
                guard let album = albums.randomElement(using: &generator), album.tracks.count > 1 else { return false }
                var list = album.tracks
                let from = Int.random(in: 0..<list.count, using: &generator)
                let to = Int.random(in: 0..<list.count, using: &generator)
                guard from != to else { return false }
                list.insert(list.remove(at: from), at: to)
                album.tracks = list
            case 6:  // link from the unordered side (last in the album)
                guard let album = albums.randomElement(using: &generator),
                    let track = tracks.randomElement(using: &generator),
                    !track.albums.contains(where: { $0 === album })
                else { return false }
                track.albums = track.albums + [album]
            case 7:  // unlink from either side
                guard let album = albums.randomElement(using: &generator),
                    let track = album.tracks.randomElement(using: &generator)
                else { return false }
                if Bool.random(using: &generator) {
                    album.tracks = album.tracks.filter { $0 !== track }
                } else {
                    track.albums = track.albums.filter { $0 !== album }
                }
            case 8:
                guard let track = tracks.randomElement(using: &generator) else { return false }
                main.delete(track)
            default:
                guard let album = albums.randomElement(using: &generator) else { return false }
                main.delete(album)
            }
            return true
        }
        #expect(counts.edits > 40 && counts.undos > 5 && counts.saves > 20)
        try stack.store.saveMainContext()
        #expect(try Self.stored(stack) == Self.graph(main))
    }

    @Test("ordering a many-to-many of a populated store is inferred: links kept, by creation until first set")
    func migrationToOrderedLinks() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        do {
            let store = try Skyros(sqliteStack: Schema([AlbumV1.self, TrackV1.self]), at: url, savesOnStop: false)
            try store.writeAndWait { context in
                let album = AlbumV1.create(in: context)
                album.name = "a"
                album.tracks = ["t1", "t2", "t3"].map { title in
                    let track = TrackV1.create(in: context)
                    track.title = title
                    return track
                }
            }
        }
        let store = try Skyros(
            sqliteStack: Schema([Album.self, Track.self, Listener.self, Episode.self], version: 2), at: url,
            savesOnStop: false)
        func titles(_ context: ObjectContext) throws -> [String] {
            try context.performAndWait { try #require(try Album.first(in: context)).tracks.map(\.title) }
        }
        #expect(try titles(store.mainContext) == ["t1", "t2", "t3"])
        try store.writeAndWait { context in
            let album = try #require(try Album.first(in: context))
            album.tracks = album.tracks.reversed()
        }
        #expect(try titles(ObjectContext(name: "fresh", parent: store.store)) == ["t3", "t2", "t1"])
    }
}
