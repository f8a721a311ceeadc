import Foundation
import Skyros
import SkyrosShared
import SkyrosTestSupport
import SkyrosWire
import Testing

/// Two savers of one store that do not see each other's changes until they fetch: two
/// stacks on one SQLite file, or two clients of one daemon.
final class TwoSavers: @unchecked Sendable {
    enum Kind: String, CaseIterable, Sendable { case embedded, shared }

    let a: Skyros
    let b: Skyros
    let makeReader: () throws -> Skyros
    private let daemon: RunningDaemon?
    private let directory: URL?

    init(_ kind: Kind) throws {
        switch kind {
        case .embedded:
            let directory = FileManager.default.temporaryDirectory.appendingPathComponent("skm-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            let url = directory.appendingPathComponent("store.sqlite")
            a = try Skyros(sqliteStack: testSchema, at: url)
            b = try Skyros(sqliteStack: testSchema, at: url)
            makeReader = { try Skyros(sqliteStack: testSchema, at: url) }
            self.directory = directory
            daemon = nil
        case .shared:
            let daemon = try RunningDaemon()
            a = try Skyros(sharedStack: testSchema, container: daemon.container.url)
            b = try Skyros(sharedStack: testSchema, container: daemon.container.url)
            makeReader = { try Skyros(sharedStack: testSchema, container: daemon.container.url) }
            self.daemon = daemon
            directory = nil
        }
    }

    deinit {
        _ = a.flush()
        _ = b.flush()
        if let directory { try? FileManager.default.removeItem(at: directory) }
    }
}

@Suite("Merge policies", .timeLimit(.minutes(3)))
struct MergePolicyTests {
    static let cases = TwoSavers.Kind.allCases.flatMap { kind in MergePolicy.allCases.map { (kind, $0) } }

    /// The names of the user with handle "ada", read by a stack that has cached nothing.
    func storedNames(_ savers: TwoSavers) throws -> (String, String) {
        var names = ("?", "?")
        try savers.makeReader().read { context in
            let user = try #require(try User.first(where: #Predicate { $0.handle == "ada" }, in: context))
            names = (user.firstname, user.lastname)
        }
        return names
    }

    @Test(
        "A and B update one object from the same version: each merge policy gives its documented result",
        arguments: cases)
    func sameVersion(kind: TwoSavers.Kind, policy: MergePolicy) throws {
        let savers = try TwoSavers(kind)
        let (a, b) = (savers.a, savers.b)
        b.mergePolicy = policy
        let created = CompletionProbe()
        a.writeSync(
            { context in
                let user = User.create(in: context)
                (user.firstname, user.lastname, user.handle) = ("Ada", "Lovelace", "ada")
            }, completion: created.completion)
        #expect(created.wait() && created.calls.count == 1 && created.calls[0] == nil)

        // B reads the user (version 1) and changes its last name; before B's save reaches
        // the store, A changes its first name (version 2).
        let first = CompletionProbe()
        let second = CompletionProbe()
        var id: ObjectID?
        b.writeSync(
            { context in
                let user = try #require(try User.first(where: #Predicate { $0.handle == "ada" }, in: context))
                id = user.objectID
                user.lastname = "King"
                a.writeSync(
                    { context in
                        try User.first(where: #Predicate { $0.handle == "ada" }, in: context)?.firstname = "Augusta"
                    }, completion: first.completion)
                #expect(first.wait() && first.calls.count == 1 && first.calls[0] == nil)
            }, completion: second.completion)
        #expect(second.wait())
        let error = second.calls.first ?? nil
        let userID = try #require(id)

        switch policy {
        case .saverWins:
            // B's changed property wins; the one it did not touch keeps A's value.
            #expect(error == nil)
            #expect(try storedNames(savers) == ("Augusta", "King"))
        case .storeWins:
            #expect(error == nil)
            #expect(try storedNames(savers) == ("Augusta", "Lovelace"))
        case .error:
            #expect(error?.code == .mergeConflict)
            #expect(
                error?.conflicts == [
                    MergeConflict(objectID: userID, properties: ["lastname"], baseVersion: 1, storeVersion: 2)
                ])
            #expect(try storedNames(savers) == ("Augusta", "Lovelace"))
        }
        // B's main context shows the store's values.
        var seen = ("?", "?")
        b.read { context in
            let user = try #require(try User.first(where: #Predicate { $0.handle == "ada" }, in: context))
            seen = (user.firstname, user.lastname)
        }
        #expect(seen == (try storedNames(savers)))

        // B goes on: its next saves of the object are not conflicts with itself.
        for name in ["Byron", "Noel"] {
            let next = CompletionProbe()
            b.writeSync(
                { context in
                    try User.first(where: #Predicate { $0.handle == "ada" }, in: context)?.lastname = name
                }, completion: next.completion)
            #expect(
                next.wait() && next.calls.count == 1 && next.calls[0] == nil,
                "\(name): \(String(describing: next.calls))")
        }
        #expect(try storedNames(savers).1 == "Noel")
    }
}
