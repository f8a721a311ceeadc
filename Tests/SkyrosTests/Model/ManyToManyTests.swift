import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// Many-to-many relationships (`linkSchema` in SkyrosTestSupport), on every stack.
@Suite("Many-to-many", .timeLimit(.minutes(3)))
struct ManyToManyTests {
    func stack(_ kind: StoreKind) throws -> TestStack { try TestStack(kind, schema: linkSchema) }

    /// Every article with its keywords and every keyword with its articles, as a context sees them.
    static func graph(_ context: ObjectContext) throws -> String {
        try context.performAndWait {
            let articles = try Article.all(in: context).map {
                "\($0.title):\($0.keywords.map(\.name).joined(separator: ","))"
            }
            let keywords = try Keyword.all(in: context).map {
                "\($0.name):\($0.articles.map(\.title).sorted().joined(separator: ","))"
            }
            return "\(articles.sorted()) \(keywords.sorted())"
        }
    }

    /// The graph as the store has it, read by a new context straight over it.
    static func stored(_ stack: TestStack) throws -> String {
        try graph(ObjectContext(name: "fresh", parent: stack.store.store))
    }

    /// The links in the store's link table.
    static func linkCount(_ stack: TestStack) throws -> Int {
        try stack.store.store.count(StoreRequest(entityName: "_Article_keywords"))
    }

    func keyword(_ name: String, in context: ObjectContext) throws -> Keyword {
        try #require(try Keyword.first(where: #Predicate { $0.name == name }, in: context))
    }

    func article(_ title: String, in context: ObjectContext) throws -> Article {
        try #require(try Article.first(where: #Predicate { $0.title == title }, in: context))
    }

    @Test("the schema makes one link entity per many-to-many, named after its first side")
    func schemaShape() throws {
        try linkSchema.validate()
        let link = try #require(linkSchema.entity(named: "_Article_keywords"))
        #expect(link.properties.map(\.name) == ["source", "target"])
        #expect(link.properties.map(\.destinationName) == ["Article", "Keyword"])
        #expect(linkSchema.entity(named: "_Playlist_songs") != nil)
        #expect(linkSchema.entities.count == 6)
        // The description round trip (what the daemon rebuilds) finds the same links.
        let rebuilt = try Schema(description: linkSchema.schemaDescription)
        #expect(rebuilt.fingerprint == linkSchema.fingerprint)
        #expect(rebuilt.entities.count == 6)
    }

    @Test(
        "linking from either side shows on both sides at once, and in the store after the save",
        arguments: StoreKind.allCases)
    func linkAndUnlink(kind: StoreKind) throws {
        let stack = try stack(kind)
        try stack.store.writeAndWait { context in
            let keywords = ["swift", "linux", "sqlite"].map { name -> Keyword in
                let keyword = Keyword.create(in: context)
                keyword.name = name
                return keyword
            }
            let (first, second) = (Article.create(in: context), Article.create(in: context))
            (first.title, second.title) = ("first", "second")
            first.keywords = [keywords[0], keywords[1]]
            second.keywords = [keywords[0]]
            // The other side, in this context, before any save.
            #expect(keywords[0].articles.map(\.title).sorted() == ["first", "second"])
            #expect(keywords[1].articles.map(\.title) == ["first"])
            #expect(keywords[2].articles.isEmpty)
        }
        let expected =
            "[\"first:swift,linux\", \"second:swift\"] [\"linux:first\", \"sqlite:\", \"swift:first,second\"]"
        #expect(try Self.graph(stack.store.mainContext) == expected)
        #expect(try Self.stored(stack) == expected)
        #expect(try Self.linkCount(stack) == 3)

        try stack.store.writeAndWait { context in
            let first = try article("first", in: context)
            first.keywords = try [keyword("linux", in: context)]  // swift unlinked
            try keyword("sqlite", in: context).articles = [first, try article("second", in: context)]  // from the other side
            first.keywords = first.keywords + [try keyword("linux", in: context)]  // linking twice is one link
        }
        let after =
            "[\"first:linux,sqlite\", \"second:swift,sqlite\"] [\"linux:first\", \"sqlite:first,second\", \"swift:second\"]"
        #expect(try Self.graph(stack.store.mainContext) == after)
        #expect(try Self.stored(stack) == after)
        #expect(try Self.linkCount(stack) == 4)

        // Unlinked and linked again in one write: one link, as before.
        try stack.store.writeAndWait { context in
            let second = try article("second", in: context)
            second.keywords = []
            second.keywords = try [keyword("swift", in: context), keyword("sqlite", in: context)]
        }
        #expect(try Self.stored(stack) == after)
        #expect(try Self.linkCount(stack) == 4)
    }

    @Test(
        "delete rules on both sides: nullify removes the links, cascade the objects too, deny refuses while linked",
        arguments: StoreKind.allCases)
    func deleteRules(kind: StoreKind) throws {
        let stack = try stack(kind)
        try stack.store.writeAndWait { context in
            let keywords = ["a", "b"].map { name -> Keyword in
                let keyword = Keyword.create(in: context)
                keyword.name = name
                return keyword
            }
            let article = Article.create(in: context)
            article.title = "x"
            article.keywords = keywords
            let playlist = Playlist.create(in: context)
            playlist.name = "mix"
            let songs = ["one", "two", "three"].map { title -> Song in
                let song = Song.create(in: context)
                song.title = title
                return song
            }
            playlist.songs = [songs[0], songs[1]]
            let other = Playlist.create(in: context)
            other.name = "other"
            other.songs = [songs[2]]
        }
        // Nullify: the keyword goes, the article stays with the other one.
        try stack.store.writeAndWait { context in try keyword("a", in: context).delete(in: context) }
        #expect(try Self.stored(stack) == "[\"x:b\"] [\"b:x\"]")
        #expect(try Self.linkCount(stack) == 1)
        // Deny: a song in a playlist cannot be deleted.
        #expect(throws: SkyrosError.self) {
            try stack.store.writeAndWait { context in
                try #require(try Song.first(where: #Predicate { $0.title == "one" }, in: context)).delete(in: context)
            }
        }
        // Cascade: deleting a playlist deletes its songs (and every link of theirs)…
        try stack.store.writeAndWait { context in
            try #require(try Playlist.first(where: #Predicate { $0.name == "mix" }, in: context)).delete(in: context)
        }
        let fresh = ObjectContext(name: "fresh", parent: stack.store.store)
        try fresh.performAndWait { () throws in
            #expect(try Song.all(in: fresh).map(\.title) == ["three"])
            #expect(try Playlist.all(in: fresh).map { "\($0.name):\($0.songs.count)" } == ["other:1"])
        }
        #expect(try stack.store.store.count(StoreRequest(entityName: "_Playlist_songs")) == 1)
        // …unless one of them is still in another playlist: its deny rule refuses the whole delete.
        try stack.store.writeAndWait { context in
            let song = Song.create(in: context)
            song.title = "shared"
            let other = try #require(try Playlist.first(in: context))
            let more = Playlist.create(in: context)
            more.name = "more"
            other.songs = other.songs + [song]
            more.songs = [song]
        }
        #expect(throws: SkyrosError.self) {
            try stack.store.writeAndWait { context in
                try #require(try Playlist.first(where: #Predicate { $0.name == "more" }, in: context)).delete(
                    in: context)
            }
        }
        try fresh.performAndWait { () throws in
            fresh.reset()
            #expect(try Song.count(in: fresh) == 2 && Playlist.count(in: fresh) == 2)
        }
        // Deleting the article removes its last link.
        try stack.store.writeAndWait { context in try article("x", in: context).delete(in: context) }
        #expect(try Self.stored(stack) == "[] [\"b:\"]")
        #expect(try Self.linkCount(stack) == 0)
    }

    @Test(
        "batch deletes apply the many-to-many rules: nullify drops the links, cascade the other ends, deny refuses",
        arguments: [StoreKind.sqlite, .shared])
    func batchDeleteRules(kind: StoreKind) async throws {
        let stack = try stack(kind)
        try stack.store.writeAndWait { context in
            let keyword = Keyword.create(in: context)
            keyword.name = "k"
            let article = Article.create(in: context)
            article.title = "a"
            article.keywords = [keyword]
            let (mix, other) = (Playlist.create(in: context), Playlist.create(in: context))
            (mix.name, other.name) = ("mix", "other")
            let songs = ["one", "two", "kept"].map { title -> Song in
                let song = Song.create(in: context)
                song.title = title
                return song
            }
            mix.songs = [songs[0], songs[1]]
            other.songs = [songs[2]]
        }
        await #expect(throws: SkyrosError.self) {
            try await stack.store.batchDelete(Song.self, where: #Predicate { $0.title == "kept" })
        }
        #expect(try await stack.store.batchDelete(Playlist.self, where: #Predicate { $0.name == "mix" }) == 1)
        #expect(try await stack.store.batchDelete(Keyword.self) == 1)
        let fresh = ObjectContext(name: "fresh", parent: stack.store.store)
        try fresh.performAndWait { () throws in
            #expect(try Song.all(in: fresh).map(\.title) == ["kept"], "mix's songs went with it")
            #expect(try Article.all(in: fresh).map { "\($0.title):\($0.keywords.count)" } == ["a:0"])
        }
        #expect(try stack.store.store.count(StoreRequest(entityName: "_Playlist_songs")) == 1)
        #expect(try Self.linkCount(stack) == 0)
        #expect(try Self.graph(stack.store.mainContext) == "[\"a:\"] []", "the main context forgot the links")
    }

    @Test("renaming an entity of a many-to-many keeps its links (the link table is renamed)")
    func renameKeepsLinks() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        do {
            let store = try Skyros(sqliteStack: linkSchema, at: url, savesOnStop: false)
            try store.writeAndWait { context in
                let keyword = Keyword.create(in: context)
                keyword.name = "k"
                let article = Article.create(in: context)
                article.title = "a"
                article.keywords = [keyword]
            }
        }
        let renamed = Schema([Bulletin.self, KeywordOfBulletins.self, Playlist.self, Song.self], version: 2)
        try renamed.validate()
        #expect(renamed.entity(named: "_Bulletin_keywords")?.originalName == "_Article_keywords")
        let store = try Skyros(sqliteStack: renamed, at: url, savesOnStop: false)
        try store.writeAndWait { context in
            let bulletin = try #require(try Bulletin.first(in: context))
            #expect(bulletin.keywords.map(\.name) == ["k"])
            // Linking again what is linked is still one link: the identifiers did not change.
            bulletin.keywords = bulletin.keywords + [try #require(try KeywordOfBulletins.first(in: context))]
        }
        #expect(try store.store.count(StoreRequest(entityName: "_Bulletin_keywords")) == 1)
    }

    @Test(
        "predicates over a many-to-many: contains, isEmpty, count, in SQL and over unsaved links",
        arguments: [StoreKind.sqlite, .shared])
    func predicates(kind: StoreKind) throws {
        let stack = try stack(kind)
        try stack.store.writeAndWait { context in
            let swift = Keyword.create(in: context)
            swift.name = "swift"
            let linux = Keyword.create(in: context)
            linux.name = "linux"
            for (title, keywords) in [("both", [swift, linux]), ("swift", [swift]), ("none", [])] {
                let article = Article.create(in: context)
                article.title = title
                article.keywords = keywords
            }
        }
        func titles(_ predicate: Predicate<Article>, in context: ObjectContext) throws -> [String] {
            try Article.all(where: predicate, in: context).map(\.title).sorted()
        }
        let tagged = #Predicate<Article> { $0.keywords.contains { $0.name == "swift" } }
        let untagged = #Predicate<Article> { $0.keywords.isEmpty }
        let several = #Predicate<Article> { $0.keywords.count > 1 }
        let found = try stack.store.read { context in
            [
                try titles(tagged, in: context), try titles(untagged, in: context), try titles(several, in: context),
                try Keyword.all(where: #Predicate { $0.articles.contains { $0.title == "swift" } }, in: context).map(
                    \.name),
            ]
        }
        #expect(found == [["both", "swift"], ["none"], ["both"], ["swift"]])
        // Unsaved links, in the context that made them.
        try stack.store.writeAndWait { context in
            try article("none", in: context).keywords = [try keyword("swift", in: context)]
            #expect(try titles(tagged, in: context) == ["both", "none", "swift"])
            #expect(try titles(untagged, in: context) == [])
        }
    }

    @Test(
        "adding a many-to-many between entities of a populated store is inferred: the link table is made, the data kept"
    )
    func migrationAddsLinks() throws {
        let directory = try TemporaryDirectory()
        let url = directory.file("store.sqlite")
        do {
            let store = try Skyros(sqliteStack: unlinkedSchema, at: url, savesOnStop: false)
            try store.writeAndWait { context in
                ArticleV1.create(in: context).title = "kept"
                KeywordV1.create(in: context).name = "old"
            }
        }
        let linked = Schema([Article.self, Keyword.self, Playlist.self, Song.self], version: 2)
        let store = try Skyros(sqliteStack: linked, at: url, savesOnStop: false)
        #expect(
            try store.read { context in try Article.all(in: context).map { "\($0.title):\($0.keywords.count)" } } == [
                "kept:0"
            ])
        try store.writeAndWait { context in
            try article("kept", in: context).keywords = [try keyword("old", in: context)]
        }
        let fresh = ObjectContext(name: "fresh", parent: store.store)
        #expect(try Self.graph(fresh) == "[\"kept:old\"] [\"old:kept\"]")
    }

    @Test(
        "a controller whose predicate goes through a many-to-many follows the links; observers see them as updates of both sides",
        arguments: StoreKind.allCases)
    func controllerFollowsLinks(kind: StoreKind) throws {
        let stack = try stack(kind)
        try stack.store.writeAndWait { context in
            Keyword.create(in: context).name = "swift"
            for title in ["a", "b"] { Article.create(in: context).title = title }
        }
        let main = stack.store.mainContext
        let controller = FetchedResultsController<Article>(
            fetch: FetchDescriptor(
                predicate: #Predicate { $0.keywords.contains { $0.name == "swift" } }, sortBy: [SortDescriptor(\.title)]
            ),
            context: main)
        try controller.performFetch()
        let seen = LockedChanges()
        let observation = main.addChangeObserver { seen.append($0) }
        func titles() -> [String] { main.performAndWait { controller.fetchedObjects.map(\.title) } }
        #expect(titles() == [])
        try stack.store.writeAndWait { context in
            try article("b", in: context).keywords = [try keyword("swift", in: context)]
        }
        #expect(titles() == ["b"])
        let change = try #require(seen.all.last)
        #expect(change.inserted.isEmpty && change.deleted.isEmpty, "links are not objects for observers")
        let names = change.updatedProperties.values.map { $0.sorted() }.sorted { $0.description < $1.description }
        #expect(names == [["articles"], ["keywords"]])
        try stack.store.writeAndWait { context in
            try keyword("swift", in: context).articles = [try article("a", in: context)]
        }
        #expect(titles() == ["a"])
        withExtendedLifetime(observation) {}
    }

    @Test("skyros dump lists links as rows of the link entity, and skyros import brings them back")
    func dumpAndImport() throws {
        let directory = try TemporaryDirectory()
        let source = directory.file("source.sqlite")
        do {
            let store = try Skyros(sqliteStack: linkSchema, at: source, savesOnStop: false)
            try store.writeAndWait { context in
                let keywords = ["x", "y"].map { name -> Keyword in
                    let keyword = Keyword.create(in: context)
                    keyword.name = name
                    return keyword
                }
                let article = Article.create(in: context)
                article.title = "a"
                article.keywords = keywords
            }
        }
        let dump = try OperatingToolTests.run(["dump", "--store", source.path])
        #expect(dump.status == 0, "\(dump.stderr)")
        let links = dump.jsonLines.filter { $0["entity"] as? String == "_Article_keywords" }
        #expect(links.count == 2)
        #expect(
            links.allSatisfy { (($0["values"] as? [String: Any])?["source"] as? String)?.hasPrefix("Article/") == true }
        )
        let file = directory.file("dump.jsonl").path
        try dump.stdout.write(toFile: file, atomically: true, encoding: .utf8)
        let copy = directory.file("copy.sqlite")
        try SQLiteStore(schema: linkSchema, url: copy).close()
        let imported = try OperatingToolTests.run(["import", file, "--store", copy.path])
        #expect(imported.status == 0, "\(imported.stderr)")
        let store = try Skyros(sqliteStack: linkSchema, at: copy, savesOnStop: false)
        #expect(try Self.graph(store.mainContext) == "[\"a:x,y\"] [\"x:a\", \"y:a\"]")
    }

    /// Both many-to-manys of `linkSchema`, from both sides.
    static func fullGraph(_ context: ObjectContext) throws -> String {
        let playlists = try context.performAndWait {
            let playlists = try Playlist.all(in: context).map { "\($0.name):\($0.songs.map(\.title).sorted())" }
            let songs = try Song.all(in: context).map { "\($0.title):\($0.playlists.map(\.name).sorted())" }
            return "\(playlists.sorted()) \(songs.sorted())"
        }
        return try graph(context) + " " + playlists
    }

    @Test(
        "seeded random links, unlinks, deletions under each rule, undos and redos: each undo gives back the graph before the step, each save stores what the main context shows",
        arguments: StoreKind.allCases)
    func randomSequences(kind: StoreKind) throws {
        let stack = try stack(kind)
        let main = stack.store.mainContext
        let undo = UndoManager()
        main.undoManager = undo
        // LINK_SEED=<n> explores another sequence.
        var sequence = UndoSequence(
            edits: 12, undos: 4, redos: 8, steps: 150, seedVariable: "LINK_SEED", seed: 0x11_4C_1A_37)
        sequence.unchangedIsNoStep = true  // linking what is linked already records nothing
        let counts = try sequence.run(stack, undo, graph: Self.fullGraph) { choice, serial, generator in
            let name = "\(serial)"
            let articles = try Article.all(in: main).sorted { $0.title < $1.title }
            let keywords = try Keyword.all(in: main).sorted { $0.name < $1.name }
            let playlists = try Playlist.all(in: main).sorted { $0.name < $1.name }
            let songs = try Song.all(in: main).sorted { $0.title < $1.title }
            switch choice {
            case 0: Article.create(in: main).title = "a" + name
            case 1: Keyword.create(in: main).name = "k" + name
            case 2, 3:  // link, from either side
                guard let article = articles.randomElement(using: &generator),
                    let keyword = keywords.randomElement(using: &generator)
                else { return false }
                if Bool.random(using: &generator) {
                    article.keywords = article.keywords + [keyword]
                } else {
                    keyword.articles = keyword.articles + [article]
                }
            case 4:  // unlink one
                guard let article = articles.randomElement(using: &generator), !article.keywords.isEmpty else {
                    return false
                }
                var keywords = article.keywords
                keywords.remove(at: Int.random(in: 0..<keywords.count, using: &generator))
                article.keywords = keywords
            case 5:  // nullify
                guard let article = articles.randomElement(using: &generator) else { return false }
                main.delete(article)
            case 6:
                guard let keyword = keywords.randomElement(using: &generator) else { return false }
                main.delete(keyword)
            case 7: Playlist.create(in: main).name = "p" + name
            case 8: Song.create(in: main).title = "s" + name
            case 9, 10:
                guard let playlist = playlists.randomElement(using: &generator),
                    let song = songs.randomElement(using: &generator)
                else { return false }
                playlist.songs = playlist.songs + [song]
            default:
                // Cascade, when no song of it is in another playlist (deny); or a song in none.
                if Bool.random(using: &generator),
                    let playlist = playlists.first(where: { $0.songs.allSatisfy { $0.playlists.count == 1 } })
                {
                    main.delete(playlist)
                } else if let song = songs.first(where: { $0.playlists.isEmpty }) {
                    main.delete(song)
                } else {
                    return false
                }
            }
            return true
        }
        #expect(counts.edits > 40 && counts.undos > 10 && counts.redos > 3 && counts.saves > 40, "\(counts)")
    }

    @Test("a many-to-many between two properties of one entity: following and followers", arguments: StoreKind.allCases)
    func followersAndFollowing(kind: StoreKind) throws {
        let stack = try TestStack(kind, schema: followSchema)
        #expect(followSchema.entity(named: "_Follower_followers") != nil)
        try stack.store.writeAndWait { context in
            let people = ["ann", "bob", "cy"].map { name -> Follower in
                let person = Follower.create(in: context)
                person.name = name
                return person
            }
            people[0].following = [people[1], people[2]]
            people[2].following = [people[1]]
            #expect(people[1].followers.map(\.name) == ["ann", "cy"])
        }
        func graph(_ context: ObjectContext) throws -> [String] {
            try context.performAndWait {
                try Follower.all(sortedBy: [SortDescriptor(\.name)], in: context).map {
                    "\($0.name) follows \($0.following.map(\.name)) followed by \($0.followers.map(\.name))"
                }
            }
        }
        let expected = [
            "ann follows [\"bob\", \"cy\"] followed by []", "bob follows [] followed by [\"ann\", \"cy\"]",
            "cy follows [\"bob\"] followed by [\"ann\"]",
        ]
        #expect(try graph(stack.store.mainContext) == expected)
        #expect(try graph(ObjectContext(name: "fresh", parent: stack.store.store)) == expected)
        let followed = try stack.store.read { context in
            try Follower.all(where: #Predicate { $0.followers.contains { $0.name == "cy" } }, in: context).map(\.name)
        }
        #expect(followed == ["bob"])
        try stack.store.writeAndWait { context in
            try #require(try Follower.first(where: #Predicate { $0.name == "cy" }, in: context)).delete(in: context)
        }
        #expect(
            try graph(ObjectContext(name: "fresh", parent: stack.store.store)) == [
                "ann follows [\"bob\"] followed by []", "bob follows [] followed by [\"ann\"]",
            ])
    }

    @Test("links undo and redo on both sides")
    func undoLinks() throws {
        let stack = try stack(.sqlite)
        let undo = UndoManager()
        stack.store.mainContext.undoManager = undo
        try stack.store.writeAndWait { context in
            let keyword = Keyword.create(in: context)
            keyword.name = "k"
            Article.create(in: context).title = "a"
        }
        try stack.store.writeAndWait { context in
            try article("a", in: context).keywords = [try keyword("k", in: context)]
        }
        #expect(try Self.graph(stack.store.mainContext) == "[\"a:k\"] [\"k:a\"]")
        undo.undo()
        #expect(try Self.graph(stack.store.mainContext) == "[\"a:\"] [\"k:\"]")
        try stack.store.saveMainContext()
        #expect(try Self.linkCount(stack) == 0)
        undo.redo()
        try stack.store.saveMainContext()
        #expect(try Self.stored(stack) == "[\"a:k\"] [\"k:a\"]")
    }

    @Test("two client processes edit the links of one object: both edits are kept, each process sees the other's")
    func concurrentLinkEdits() async throws {
        let stack = try stack(.shared)
        let container = try #require(stack.daemon).container.url
        try stack.store.writeAndWait { context in
            for name in ["k1", "k2", "k3"] { Keyword.create(in: context).name = name }
            let article = Article.create(in: context)
            article.title = "a"
            article.keywords = [try keyword("k1", in: context)]
        }
        let main = stack.store.mainContext
        let controller = FetchedResultsController<Article>(
            fetch: FetchDescriptor(predicate: #Predicate { $0.keywords.contains { $0.name == "k2" } }), context: main)
        try controller.performFetch()
        #expect(main.performAndWait { controller.fetchedObjects.isEmpty })
        let changes = stack.store.changes
        // The other process adds k2 and removes k1, on its own view of the article.
        let child = try ChildProcess(["link-keywords", container.path, "a", "+k2", "-k1"])
        #expect(await child.wait(seconds: 30) == .exited(0), "\(child.readAll())")
        #expect(await nextChange(changes, seconds: 10, where: { !$0.inserted.isEmpty }) != nil)
        #expect(try Self.graph(stack.store.mainContext) == "[\"a:k2\"] [\"k1:\", \"k2:a\", \"k3:\"]")
        #expect(
            main.performAndWait { controller.fetchedObjects.map(\.title) } == ["a"],
            "the other process's link, in this one's controller")
        // This process, which read k1 linked and k2 not, adds k3: the other's edits stay.
        try stack.store.writeAndWait { context in
            let article = try article("a", in: context)
            article.keywords = article.keywords + [try keyword("k3", in: context)]
        }
        #expect(try Self.stored(stack) == "[\"a:k2,k3\"] [\"k1:\", \"k2:a\", \"k3:a\"]")
    }
}
