import Foundation
import Skyros
import SkyrosShared
import SkyrosSync
import SkyrosTestSupport
import Testing

/// Refusals (issue 57, item 1): every change set the server refuses is told to the apps,
/// whichever kind of checkpoint comes next, and kept in the store's rejected log until an app
/// acknowledges it; an app that connects later learns of the outstanding ones.
@Suite("Sync refusals", .serialized, .timeLimit(.minutes(3)))
struct SyncRefusalTests {
    let sync = SyncTests()

    @Test(
        "a refusal before the machine's first checkpoint (its first sync is a snapshot) is recorded, told, listed to a later app, and gone once acknowledged"
    )
    func refusalBeforeFirstCheckpoint() async throws {
        // The server has `taken` before the machine ever syncs; the machine saves its own
        // `taken` while the server is down, so that its first connection uploads it (refused)
        // and only then reads its first checkpoint: a snapshot, which used to carry no refusal.
        let postgres = try await PostgresServer.started()
        let server = try SyncTests.Server(postgres)
        try await SyncSetup.run(server.configuration, schema: testSchema, log: { _ in })
        let theirs = UUID()
        try server.psql(
            #"INSERT INTO g_sync."User" ("_id", firstname, handle) VALUES ('\#(theirs.uuidString)', 'server', 'taken')"#
        )
        try postgres.stop(mode: .fast)

        let machine = try RunningDaemon(sync: server.configuration)
        let told = ErrorRecorder()
        let app = try Skyros(sharedStack: testSchema, container: machine.container.url)
        app.errorHandler = { told.record($0) }
        let mine = try await sync.insert("taken", into: app)
        #expect(await sync.eventually { try sync.syncStatus(machine)["uploadQueue"] as? Int == 1 })
        #expect(try sync.syncStatus(machine)["checkpoint"] as? Int == 0, "no checkpoint before the server is up")

        try postgres.start()
        // Told to the running app, with the change set's number.
        #expect(await sync.eventually(seconds: 45) { told.errors.contains { $0.code == .syncRejected } })
        let error = try #require(told.errors.first { $0.code == .syncRejected })
        #expect(error.rejectionNumber == 1, "\(error)")
        #expect(error.objectIDs == [mine], "\(error)")
        #expect(error.message.contains("duplicate key"), "\(error.message)")
        // The store took the server's values: its `taken` is the server's object, not ours.
        #expect(
            await sync.eventually {
                try await app.read { context in try User.all(in: context).map { $0.objectID.uuid } } == [theirs]
            })
        // Recorded: listed, counted by the status.
        let listed = try app.syncRejections()
        #expect(listed.map(\.number) == [1])
        #expect(listed.first?.objectIDs == [mine])
        #expect(try sync.syncStatus(machine)["rejected"] as? Int == 1)

        // An app that connects later is told the outstanding refusal too.
        let laterTold = ErrorRecorder()
        let later = try Skyros(sharedStack: testSchema, container: machine.container.url)
        later.errorHandler = { laterTold.record($0) }
        _ = try await sync.handles(later)
        #expect(await sync.eventually(seconds: 10) { laterTold.errors.contains { $0.rejectionNumber == 1 } })

        // Acknowledged: gone from the log, the status and the next apps.
        #expect(try later.acknowledgeSyncRejections([1, 99]) == 1)
        #expect(try app.syncRejections().isEmpty)
        #expect(try sync.syncStatus(machine)["rejected"] as? Int == 0)
        #expect(try later.acknowledgeSyncRejections([1]) == 0, "acknowledging twice removes nothing")
    }

    @Test("a refusal is told once: the checkpoints after it, and a restart of the daemon, do not tell it again")
    func refusalToldOnce() async throws {
        let postgres = try await PostgresServer.started()
        let server = try SyncTests.Server(postgres)
        try await SyncSetup.run(server.configuration, schema: testSchema, log: { _ in })
        try server.psql(#"INSERT INTO g_sync."User" ("_id", handle) VALUES (gen_random_uuid(), 'taken')"#)
        try postgres.stop(mode: .fast)
        let directory = "/tmp/skr-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let machine = try RunningDaemon(directory: directory, sync: server.configuration)
        defer { withExtendedLifetime(machine) {} }  // released, it would remove the directory and the store
        let told = ErrorRecorder()
        var app: Skyros? = try Skyros(sharedStack: testSchema, container: machine.container.url)
        app!.errorHandler = { told.record($0) }
        try await sync.insert("taken", into: app!)
        try postgres.start()
        #expect(await sync.eventually(seconds: 45) { try app!.syncRejections().map(\.number) == [1] })
        // More checkpoints (a psql insert, our own save coming back) carry it no more.
        try server.psql(#"INSERT INTO g_sync."User" ("_id", handle) VALUES (gen_random_uuid(), 'other')"#)
        try await sync.insert("mine", into: app!)
        #expect(await sync.eventually { try await sync.handles(app!) == ["mine", "other", "taken"] })
        #expect(await sync.eventually { try server.psql(#"SELECT count(*) FROM g_sync."User""#) == "3" })
        #expect(told.errors.filter { $0.code == .syncRejected }.count == 1, "\(told.errors)")
        #expect(try app!.acknowledgeSyncRejections([1]) == 1)
        try server.psql(#"INSERT INTO g_sync."User" ("_id", handle) VALUES (gen_random_uuid(), 'third')"#)
        #expect(await sync.eventually { try await sync.handles(app!) == ["mine", "other", "taken", "third"] })
        #expect(try app!.syncRejections().isEmpty, "an acknowledged refusal came back with a later checkpoint")
        #expect(told.errors.filter { $0.code == .syncRejected }.count == 1, "\(told.errors)")

        // After a restart the engine reads on from the number the store recorded.
        app = nil
        machine.shutDown()
        let restarted = try RunningDaemon(directory: directory, sync: server.configuration)
        let again = try Skyros(sharedStack: testSchema, container: restarted.container.url)
        try server.psql(#"INSERT INTO g_sync."User" ("_id", handle) VALUES (gen_random_uuid(), 'fourth')"#)
        #expect(await sync.eventually { try await sync.handles(again).contains("fourth") })
        #expect(try again.syncRejections().isEmpty, "a restart told an acknowledged refusal again")
    }
}
