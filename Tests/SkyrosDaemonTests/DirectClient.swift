import Foundation
import Skyros
import SkyrosTestSupport
import SkyrosWire
import SkyrosZeroMQ
import Testing

/// A raw protocol client on SkyrosZeroMQ's own sockets, whose `send` writes to the
/// daemon's socket before it returns once the connection is ready (libzmq's sends go out
/// later, from its I/O thread): what it sent while the daemon is paused
/// (``RunningDaemon/pause()``) is all waiting when the daemon's next turn starts.
final class DirectClient {
    let dealer: ZMTPSocket
    let subscriber: ZMTPSocket
    private var nextID: UInt64 = 1

    /// Connects both sockets, subscribes to every event, and waits (5 s at most) until both
    /// connections are ready (the daemon must be serving).
    init(_ daemon: RunningDaemon) throws {
        dealer = try ZMTPSocket(
            kind: .dealer, endpoint: daemon.container.requestsEndpoint,
            maximumMessageSize: WireProtocol.maximumMessageSize)
        subscriber = try ZMTPSocket(
            kind: .subscriber, endpoint: daemon.container.eventsEndpoint,
            maximumMessageSize: WireProtocol.maximumMessageSize)
        subscriber.subscribe()
        dealer.open()
        subscriber.open()
        #expect(dealer.waitUntilReady(milliseconds: 5_000))
        #expect(subscriber.waitUntilReady(milliseconds: 5_000))
    }

    /// Sends a request; returns its ID.
    func send(_ body: WireMessage.Body) -> UInt64 {
        let id = nextID
        nextID += 1
        dealer.send([WireMessage(requestID: id, body: body).encoded()])
        return id
    }

    /// The next `count` replies (5 s at most each), by request ID.
    func replies(_ count: Int) throws -> [UInt64: WireMessage.Body] {
        var result: [UInt64: WireMessage.Body] = [:]
        while result.count < count {
            guard dealer.waitForInput(milliseconds: 5_000), let frames = dealer.receive(), let last = frames.last else {
                Issue.record("no reply within 5 s")
                return result
            }
            let reply = try WireMessage.decode([UInt8](last))
            result[reply.requestID] = reply.body
        }
        return result
    }

    /// Sends a request and returns its reply.
    func call(_ body: WireMessage.Body) throws -> WireMessage.Body? {
        let id = send(body)
        return try replies(1)[id]
    }

    /// The next message on the event socket (5 s at most), with its topic.
    func event() throws -> (topic: UInt8, message: WireMessage)? {
        guard subscriber.waitForInput(milliseconds: 5_000), let frames = subscriber.receive(), frames.count == 2 else {
            return nil
        }
        return (frames[0].first ?? 0, try WireMessage.decode([UInt8](frames[1])))
    }
}
