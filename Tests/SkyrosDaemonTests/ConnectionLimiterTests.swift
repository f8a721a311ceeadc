import Foundation
import Testing

@testable import SkyrosDaemon

/// The connection limit as transcripts: monitor events and welcomes in, the connections to
/// close out. No socket, no sleep (time is passed in).
@Suite("Connection limiter")
struct ConnectionLimiterTests {
    /// The descriptors of a list of closings.
    func descriptors(_ closings: [(Int32, ConnectionLimiter.Reason)]) -> [Int32] { closings.map(\.0) }

    @Test("under the limit every connection is kept; past it the oldest without a hello makes room")
    func evictsOldestWaiting() {
        var limiter = ConnectionLimiter(maximum: 3, helloTimeout: 5)
        #expect(limiter.accepted(10, at: 0).isEmpty)
        #expect(limiter.accepted(11, at: 1).isEmpty)
        #expect(limiter.accepted(12, at: 2).isEmpty)
        limiter.welcomed(10)
        let closed = limiter.accepted(13, at: 3)
        #expect(descriptors(closed) == [11])
        #expect(closed.first?.1 == .evicted)
        #expect(limiter.open == 3)
        #expect(limiter.descriptors == 4)  // 11 holds its descriptor until libzmq reports it gone
        limiter.disconnected(11)
        #expect(limiter.descriptors == 3)
        #expect(limiter.connections[10] == .welcomed)
    }

    @Test("when every open connection said hello, a new one is refused")
    func refusesWhenAllWelcomed() {
        var limiter = ConnectionLimiter(maximum: 2, helloTimeout: 5)
        _ = limiter.accepted(10, at: 0)
        _ = limiter.accepted(11, at: 0)
        limiter.welcomed(10)
        limiter.welcomed(11)
        let closed = limiter.accepted(12, at: 1)
        #expect(descriptors(closed) == [12])
        #expect(closed.first?.1 == .refused)
        #expect(limiter.open == 2)
        limiter.disconnected(12)
        limiter.disconnected(10)
        #expect(limiter.accepted(13, at: 2).isEmpty)
        #expect(limiter.open == 2)
    }

    @Test("a connection without a hello is closed at its timeout, a welcomed one never")
    func helloTimeout() {
        var limiter = ConnectionLimiter(maximum: 10, helloTimeout: 2)
        _ = limiter.accepted(10, at: 0)
        _ = limiter.accepted(11, at: 1)
        limiter.welcomed(10)
        #expect(limiter.nextDeadline == 3)
        #expect(limiter.expired(at: 2.9).isEmpty)
        #expect(limiter.expired(at: 3) == [11])
        #expect(limiter.expired(at: 100).isEmpty)
        #expect(limiter.nextDeadline == nil)
        #expect(limiter.connections[11] == .closing)
        // A welcome that comes after the close does not revive the connection.
        limiter.welcomed(11)
        #expect(limiter.connections[11] == .closing)
    }

    @Test("a reused descriptor is a new connection: the old one's end and timeout are forgotten")
    func reusedDescriptor() {
        var limiter = ConnectionLimiter(maximum: 10, helloTimeout: 2)
        _ = limiter.accepted(10, at: 0)
        limiter.disconnected(10)
        _ = limiter.accepted(10, at: 5)
        #expect(limiter.expired(at: 3).isEmpty)
        #expect(limiter.expired(at: 7) == [10])
        // Accepted again before its end was reported (events crossing): counted once.
        _ = limiter.accepted(10, at: 8)
        #expect(limiter.descriptors == 1)
        #expect(limiter.open == 1)
    }

    @Test("connections that never say hello (events) are kept, and refused past the limit")
    func eventsSocket() {
        var limiter = ConnectionLimiter(maximum: 2, helloTimeout: nil)
        #expect(limiter.accepted(10, at: 0).isEmpty)
        #expect(limiter.accepted(11, at: 0).isEmpty)
        #expect(limiter.expired(at: 1_000).isEmpty)
        #expect(limiter.nextDeadline == nil)
        let closed = limiter.accepted(12, at: 1)
        #expect(descriptors(closed) == [12] && closed.first?.1 == .refused)
    }

    @Test("a flood of 100,000 idle connections keeps at most the limit open, and bounded state")
    func flood() {
        var limiter = ConnectionLimiter(maximum: 100, helloTimeout: 5)
        var closedCount = 0
        var mostOpen = 0
        for index in 0..<100_000 {
            let descriptor = Int32(100 + index % 1_000)
            let closed = limiter.accepted(descriptor, at: Double(index) / 1_000)
            closedCount += closed.count
            // libzmq reports the closed connections gone soon after.
            for (gone, _) in closed { limiter.disconnected(gone) }
            closedCount += limiter.expired(at: Double(index) / 1_000).count
            mostOpen = max(mostOpen, limiter.open)
        }
        #expect(mostOpen == 100)
        #expect(closedCount >= 100_000 - 100 - limiter.descriptors)
        #expect(limiter.descriptors <= 1_000)
    }

    @Test("the default limit leaves a reserve of descriptors: 320 clients for 1,024, 64 for 256, at most 10,000")
    func defaultLimit() {
        #expect(DescriptorLimit.maximumClients(forLimit: 1_024) == 320)
        #expect(DescriptorLimit.maximumClients(forLimit: 256) == 64)
        #expect(DescriptorLimit.maximumClients(forLimit: 4_096) == 1_536)
        #expect(DescriptorLimit.maximumClients(forLimit: 524_288) == 10_000)
        #expect(DescriptorLimit.maximumClients(forLimit: 8) == 2)
        #expect(DescriptorLimit.maximumClients(forLimit: 1) == 1)
    }

    @Test("a welcome of a descriptor not open is ignored: a later connection on that number still waits for its hello")
    func staleWelcome() {
        var limiter = ConnectionLimiter(maximum: 4, helloTimeout: 5)
        limiter.welcomed(10)
        _ = limiter.accepted(10, at: 0)
        #expect(limiter.connections[10] == .waitingForHello(since: 0))
        #expect(limiter.expired(at: 5) == [10])
    }
}
