import Foundation
import Skyros
import SkyrosTestSupport
import SkyrosWire
import Testing

@testable import SkyrosShared

/// Batch operations through a group's daemon (issue 18): one change set, exactly once, its
/// event reaching the other processes.
@Suite("Batch operations through a daemon", .timeLimit(.minutes(3)))
struct BatchProcessTests {
    /// Collects the changes an entity monitor reports, and wakes up a waiter on each.
    final class MonitorLog: @unchecked Sendable {
        var changes: [EntityMonitorChange<User>] = []
        let signal = DispatchSemaphore(value: 0)
        func wait(seconds: Double = 10) -> Bool { signal.wait(timeout: .now() + seconds) == .success }
    }

    func users(_ store: Skyros, count: Int) throws {
        try store.writeAndWait { context in
            for index in 0..<count {
                let user = User.create(in: context)
                user.firstname = "u\(index)"
                user.age = index
                user.handle = "h\(index)"
            }
        }
    }

    @Test(
        "a batch saved by another process reaches this one: held objects take the new values, deleted ones read as deleted, one monitor change each"
    )
    func otherProcess() throws {
        let daemon = try RunningDaemon()
        let store = try Skyros(
            sharedStack: testSchema, container: daemon.container.url, timeout: 10, savesOnStop: false)
        try users(store, count: 20)
        let main = store.mainContext
        let held = try main.performAndWait { try User.all(in: main) }
        #expect(held.count == 20)
        let monitor = EntityMonitor<User>(context: main, frequency: .onSave)
        let log = MonitorLog()
        monitor.onChange = {
            log.changes.append($0)
            log.signal.signal()
        }

        let updater = try ChildProcess(["batch", daemon.container.url.path, "update", "10"])
        #expect(updater.waitForLine("DONE 10", seconds: 30))
        #expect(updater.wait(seconds: 30) == .exited(0))
        #expect(log.wait())
        main.performAndWait {
            #expect(log.changes.count == 1)
            #expect(log.changes.first?.updated.count == 10)
            #expect(held.filter { $0.lastname == "Batch" }.count == 10)
            #expect(held.filter { $0.lastname == "Batch" }.allSatisfy { $0.age >= 10 })
        }

        let deleter = try ChildProcess(["batch", daemon.container.url.path, "delete", "15"])
        #expect(deleter.waitForLine("DONE 5", seconds: 30))
        #expect(deleter.wait(seconds: 30) == .exited(0))
        #expect(log.wait())
        try main.performAndWait { () throws in
            #expect(log.changes.count == 2)
            #expect(log.changes.last?.deleted.count == 5)
            #expect(held.filter(\.isDeleted).count == 5)
            #expect(try User.count(in: main) == 15)
        }
        daemon.shutDown()
        #expect(daemon.server.statistics.changeSets == 3)
    }

    @Test(
        "a batch of more objects than an event names: the event has empty lists, and the other clients read again what they hold"
    )
    func unlisted() async throws {
        let daemon = try RunningDaemon()
        let author = try Skyros(
            sharedStack: testSchema, container: daemon.container.url, timeout: 20, savesOnStop: false)
        let other = try Skyros(
            sharedStack: testSchema, container: daemon.container.url, timeout: 20, savesOnStop: false)
        let total = WireProtocol.maximumBatchEventObjects + 5
        try users(author, count: total)
        let main = other.mainContext
        let held = try main.performAndWait { try User.all(in: main) }
        #expect(held.count == total)
        let reloaded = DispatchSemaphore(value: 0)
        let observation = main.addChangeObserver { changes in
            if changes.kind == .reloaded { reloaded.signal() }
        }
        let authorHeld = try author.mainContext.performAndWait {
            try User.first(where: #Predicate { $0.age == 7 }, in: author.mainContext)!
        }

        #expect(try await author.batchUpdate(User.self, .set(\.lastname, to: "All")) == total)
        author.mainContext.performAndWait { #expect(authorHeld.lastname == "All") }
        // The other client hears of it (a reload: no list of objects), and reads the new values.
        #expect(reloaded.wait(timeout: .now() + 10) == .success)
        main.performAndWait {
            #expect(held.allSatisfy { $0.lastname == "All" })
        }
        observation.cancel()
        daemon.shutDown()
    }

    @Test("a batch whose reply is lost is sent again: applied once, answered with its count")
    func lostReply() async throws {
        let daemon = try RunningDaemon()
        let remote = try RemoteStore(schema: testSchema, container: daemon.container, timeout: 5, retryInterval: 0.3)
        let store = Skyros(sharedStack: remote, savesOnStop: false)
        try users(store, count: 10)
        let held = try store.mainContext.performAndWait {
            try User.first(where: #Predicate { $0.age == 9 }, in: store.mainContext)!
        }
        remote.droppedSaveRepliesForTesting = 2
        let changed = try await store.batchUpdate(
            User.self, where: #Predicate { $0.age >= 5 }, .set(\.lastname, to: "Once"))
        #expect(changed == 5)
        #expect(remote.droppedSaveRepliesForTesting == 0)
        store.mainContext.performAndWait { #expect(held.lastname == "Once") }
        daemon.shutDown()
        #expect(daemon.server.statistics.changeSets == 2)  // the insert and the batch, once
    }

    @Test("a batch the daemon refuses changes nothing: a value of the wrong type, an attribute that is not one")
    func refused() throws {
        let daemon = try RunningDaemon()
        let remote = try RemoteStore(schema: testSchema, container: daemon.container, timeout: 5)
        let store = Skyros(sharedStack: remote, savesOnStop: false)
        try users(store, count: 3)
        let entity = try #require(testSchema.entity(named: "User"))
        let age = try #require(entity.property(named: "age"))
        let request = StoreRequest(entityName: "User")
        let wrongType = #expect(throws: SkyrosError.self) {
            try remote.batch(.update(request, assignments: [age.index: .text("old")]), naming: .all)
        }
        #expect(wrongType?.code == .typeMismatch)
        #expect(wrongType?.message.contains("User.age") == true)
        let notAttribute = #expect(throws: SkyrosError.self) {
            try remote.batch(.update(request, assignments: [999: .integer(1)]), naming: .all)
        }
        #expect(notAttribute?.code == .typeMismatch)
        let unknown = #expect(throws: SkyrosError.self) {
            try remote.batch(.delete(StoreRequest(entityName: "Nobody")), naming: .all)
        }
        #expect(unknown?.code == .unknownEntity)
        try store.mainContext.performAndWait { () throws in
            #expect(try User.count(where: #Predicate { $0.age == 0 }, in: store.mainContext) == 1)
            #expect(try User.count(in: store.mainContext) == 3)
        }
        daemon.shutDown()
        #expect(daemon.server.statistics.changeSets == 1)
    }
}
