import Foundation
@testable import SkyrosShared
import Skyros
import SkyrosTestModels
import SkyrosWire
import Testing

@Suite("Exactly-once saves", .timeLimit(.minutes(1)))
struct ExactlyOnceTests {
    @Test("a save whose reply is lost is sent again: applied once, its completion called once, without error")
    func lostReply() throws {
        let daemon = try RunningDaemon()
        let remote = try RemoteStore(schema: testSchema, container: daemon.container, timeout: 5, retryInterval: 0.3)
        let store = Skyros(sharedStack: remote)
        remote.droppedSaveRepliesForTesting = 2  // the first two acknowledgements of the save never arrive
        let probe = CompletionProbe()
        let started = Date()
        store.writeSync({ context in User.create(in: context).handle = "once" }, completion: probe.completion)
        #expect(probe.wait())
        #expect(probe.calls.count == 1)
        #expect(probe.calls.first! == nil)
        #expect(Date().timeIntervalSince(started) >= 0.6, "the save was not sent three times")
        #expect(remote.droppedSaveRepliesForTesting == 0)
        var count = -1
        store.read { count = try User.count(in: $0) }
        #expect(count == 1)
        // Nothing else arrives later: still one completion.
        #expect(!probe.wait(seconds: 0.5))
        #expect(probe.calls.count == 1)
        daemon.shutDown()
        #expect(daemon.server.statistics.changeSets == 1)
    }

    @Test("a call made while no daemon answers fails with daemonUnavailable after its timeout, not before")
    func unavailable() throws {
        let daemon = try RunningDaemon()
        let remote = try RemoteStore(schema: testSchema, container: daemon.container, timeout: 1, retryInterval: 0.2)
        daemon.shutDown()
        let started = Date()
        #expect {
            _ = try remote.count(StoreRequest(entityName: "User"))
        } throws: { error in
            (error as? SkyrosError)?.code == .daemonUnavailable
        }
        let elapsed = Date().timeIntervalSince(started)
        #expect(elapsed >= 0.9 && elapsed < 5, "waited \(elapsed) s")
    }
}
