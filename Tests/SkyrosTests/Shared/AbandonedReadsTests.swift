import Foundation
import Skyros
import SkyrosTestSupport
import SkyrosWire
import Testing
import ZeroMQReference

/// A daemon does not answer reads nobody waits for: a client whose attempt timed out sends
/// the request again on a new connection and closes the old one, whose reads the daemon
/// drops. Without it, a reader slower than the clients' retry interval answered every
/// abandoned copy in turn (the kill storm's eight clients, each fetching 4,000 users again
/// every second, kept it busy past their timeout and past SIGTERM's).
@Suite("Abandoned reads", .timeLimit(.minutes(2)))
struct AbandonedReadsTests {
    @Test("the reads a connection asked and that were not answered when it closed are dropped; the daemon goes on")
    func droppedWithTheirConnection() async throws {
        let daemon = try RunningDaemon()
        let store = try Skyros(sharedStack: testSchema, container: daemon.container.url)
        try store.writeAndWait { context in
            for index in 0..<1_000 { User.create(in: context).handle = "u\(index)" }
        }
        // A raw client asks 100 fetches of the 1,000 users at once, then leaves before the
        // replies: the reader takes milliseconds over each, and the connection closes meanwhile.
        // (Kept small: in the full suite, this daemon's reader shares the processor with the
        // other tests, and answering all of them would cost it seconds.)
        let context = try ZeroMQContext()
        let dealer = try ZeroMQSocket(context: context, kind: .dealer)
        try dealer.setReceiveTimeout(milliseconds: 5_000)
        try dealer.connect(daemon.container.requestsEndpoint)
        let hello = WireMessage(
            requestID: 1, body: .hello(try WireMessage.Hello(schema: testSchema, clientName: "leaving")))
        try dealer.send([Data(hello.encoded())])
        let welcome = try WireMessage.decodeReply([UInt8](try dealer.receive().last ?? Data()))
        guard case .welcome = welcome.body else {
            Issue.record("no welcome: \(welcome.body.kind)")
            return
        }
        let fetches = 100
        for id in 0..<fetches {
            let fetch = WireMessage(requestID: UInt64(2 + id), body: .fetch(StoreRequest(entityName: "User")))
            try dealer.send([Data(fetch.encoded())])
        }
        // The serve loop answers `changesSince` itself, in order: once it has, it has taken
        // every fetch before it (and handed them to the reader).
        let marker: UInt64 = 10_000
        try dealer.send([Data(WireMessage(requestID: marker, body: .changesSince(0, limit: 1)).encoded())])
        var answered = 0
        while true {
            let reply = try WireMessage.decodeReply([UInt8](try dealer.receive().last ?? Data()))
            if reply.requestID == marker { break }
            answered += 1
        }
        dealer.close()
        // The daemon notices the close and drops what it had not started: most of them (the
        // close is seen at once).
        let deadline = Date().addingTimeInterval(30)
        while daemon.server.statistics.readsDropped < fetches / 2 && Date() < deadline {
            try await Task.sleep(for: .milliseconds(20))
        }
        #expect(daemon.server.statistics.readsDropped >= fetches / 2)
        #expect(daemon.server.statistics.readsDropped <= fetches - answered)
        // Still serving: another client's read is answered, and saves go on.
        let count = try await store.read { try User.count(in: $0) }
        #expect(count == 1_000)
        try store.writeAndWait { context in User.create(in: context).handle = "after" }
        let after = try await store.read { try User.count(in: $0) }
        #expect(after == 1_001)
    }
}
