import Foundation
import SkyrosZeroMQ
import Testing
import ZeroMQReference

#if canImport(Glibc)
    import Glibc
#endif

/// The client's own ZMTP 3.0 sockets against libzmq's `ROUTER` and `PUB` (the daemon's), in one
/// process over real socket files: handshake, frames of every size, reconnection, subscriptions,
/// and the peer errors that close a connection. Every wait is bounded.
@Suite("ZMTP client socket against libzmq", .timeLimit(.minutes(1)))
struct ZMTPSocketTests {
    /// A directory for one socket file and a libzmq context (`remove()` the directory).
    final class Fixture {
        let directory: String
        let context: ZeroMQContext

        init() throws {
            var template = Array("/tmp/skz-XXXXXX".utf8CString)
            directory = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)) }
            context = try ZeroMQContext()
        }

        func remove() { try? FileManager.default.removeItem(atPath: directory) }

        var path: String { "\(directory)/s.ipc" }
        var endpoint: String { "ipc://\(path)" }

        /// A libzmq socket of `kind` bound to the endpoint.
        func bound(_ kind: ZeroMQSocket.Kind) throws -> ZeroMQSocket {
            let socket = try ZeroMQSocket(context: context, kind: kind)
            try socket.bind(endpoint)
            return socket
        }

        /// A ZMTP socket of `kind` for the endpoint.
        func client(_ kind: ZMTPSocket.Kind, maximumMessageSize: Int = 1 << 20) throws -> ZMTPSocket {
            try ZMTPSocket(kind: kind, endpoint: endpoint, maximumMessageSize: maximumMessageSize)
        }
    }

    /// Runs `pump` (the ZMTP socket's side) until the libzmq socket has a message, for at most
    /// 5 s; returns it.
    static func receive(_ socket: ZeroMQSocket, pumping pump: () -> Void) throws -> [Data]? {
        let deadline = Date().addingTimeInterval(5)
        while Date() < deadline {
            pump()
            if try socket.waitForInput(milliseconds: 5) { return try socket.receive(dontWait: true) }
        }
        return nil
    }

    /// The last frame of the next message `dealer` sends to `router`, within 5 s.
    static func request(to router: ZeroMQSocket, from dealer: ZMTPSocket) throws -> Data? {
        try receive(router) { _ = dealer.waitForInput(milliseconds: 5) }?.last
    }

    /// Waits at most 5 s for the ZMTP socket's next message.
    static func receive(_ socket: ZMTPSocket) -> [Data]? {
        socket.waitForInput(milliseconds: 5_000) ? socket.receive() : nil
    }

    @Test(
        "a DEALER's message reaches a ROUTER and the reply comes back: empty, short, 255, 256 and 300 KiB frames, several per message"
    )
    func requestAndReply() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let router = try fixture.bound(.router)
        defer { router.close() }
        let dealer = try fixture.client(.dealer)
        let frames = [
            Data(), Data("hello".utf8), Data(repeating: 7, count: 255), Data(repeating: 8, count: 256),
            Data((0..<300_000).map { UInt8(truncatingIfNeeded: $0) }),
        ]
        dealer.send(frames)
        let request = try #require(try Self.receive(router) { _ = dealer.waitForInput(milliseconds: 0) })
        #expect(request.count == frames.count + 1)  // the ROUTER adds the connection's identity
        #expect(Array(request.dropFirst()) == frames)
        try router.send([request[0]] + frames.reversed())
        #expect(Self.receive(dealer) == frames.reversed())
        #expect(dealer.receive() == nil)
        #expect(dealer.connectionsMade == 1)
    }

    @Test("a message sent before anyone listens waits, and goes out once the server binds")
    func sentBeforeBind() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let dealer = try fixture.client(.dealer)
        dealer.send([Data("early".utf8)])
        #expect(!dealer.waitForInput(milliseconds: 20))  // nothing to connect to: the timeout, not a hang
        #expect(!dealer.isConnected)
        let router = try fixture.bound(.router)
        defer { router.close() }
        #expect(try Self.request(to: router, from: dealer) == Data("early".utf8))
    }

    @Test("the server goes away and comes back: the DEALER reconnects, and a message sent meanwhile is delivered once")
    func reconnects() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        var router = try fixture.bound(.router)
        let dealer = try fixture.client(.dealer)
        dealer.send([Data("one".utf8)])
        #expect(try Self.request(to: router, from: dealer) == Data("one".utf8))
        router.close()
        // The closed connection is seen (end of file), and no connection can be made meanwhile.
        #expect(!dealer.waitForInput(milliseconds: 200))
        #expect(!dealer.isConnected)
        dealer.send([Data("two".utf8)])
        router = try fixture.bound(.router)
        defer { router.close() }
        #expect(try Self.request(to: router, from: dealer) == Data("two".utf8))
        #expect(dealer.connectionsMade == 2)
        _ = dealer.waitForInput(milliseconds: 50)
        #expect(try !router.waitForInput(milliseconds: 50))  // not sent twice
    }

    @Test("close() forgets what was not sent and connects anew")
    func closeStartsOver() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let dealer = try fixture.client(.dealer)
        dealer.send([Data("dropped".utf8)])
        dealer.close()
        let router = try fixture.bound(.router)
        defer { router.close() }
        dealer.send([Data("kept".utf8)])
        #expect(try Self.request(to: router, from: dealer) == Data("kept".utf8))
        _ = dealer.waitForInput(milliseconds: 50)
        #expect(try !router.waitForInput(milliseconds: 50))
    }

    @Test("a SUB gets the topics it subscribed to and no other, and subscribes again on a new connection")
    func subscriptions() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let subscriber = try fixture.client(.subscriber)
        subscriber.subscribe()
        subscriber.subscribe(Data([1]))
        subscriber.unsubscribe()  // only topic 1 is left
        for round in 1...2 {
            let publisher = try fixture.bound(.publisher)
            // A PUB drops what it publishes before the subscription arrived: publish until heard.
            var heard: [Data]?
            let deadline = Date().addingTimeInterval(5)
            while heard == nil && Date() < deadline {
                try publisher.send([Data([2]), Data("other".utf8)])
                try publisher.send([Data([1]), Data("round \(round)".utf8)])
                if subscriber.waitForInput(milliseconds: 10) { heard = subscriber.receive() }
            }
            #expect(heard == [Data([1]), Data("round \(round)".utf8)])
            while subscriber.waitForInput(milliseconds: 20) {
                #expect(subscriber.receive()?.first == Data([1]))  // never topic 2
            }
            publisher.close()
            #expect(!subscriber.waitForInput(milliseconds: 150))  // sees the end of the connection
        }
        #expect(subscriber.connectionsMade == 2)
    }

    @Test(
        "a frame over the maximum message size closes the connection and is never handed out; the next message goes on a new one"
    )
    func oversizeFrame() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let router = try fixture.bound(.router)
        defer { router.close() }
        let dealer = try fixture.client(.dealer, maximumMessageSize: 1_000)
        dealer.send([Data("ask".utf8)])
        let request = try #require(try Self.receive(router) { _ = dealer.waitForInput(milliseconds: 0) })
        try router.send([request[0], Data(repeating: 1, count: 1_001)])
        #expect(!dealer.waitForInput(milliseconds: 200))
        #expect(dealer.receive() == nil)
        dealer.send([Data("again".utf8)])
        #expect(try Self.request(to: router, from: dealer) == Data("again".utf8))
        #expect(dealer.connectionsMade == 2)
    }

    @Test("a listener that does not speak ZMTP is dropped without a trap, a hang or a message")
    func notZMTP() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let listener = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(listener) }
        #expect(withUnixSocketAddress(fixture.path, { bind(listener, $0, $1) }) == 0)
        #expect(listen(listener, 4) == 0)
        let dealer = try fixture.client(.dealer)
        dealer.send([Data("ask".utf8)])
        let connection = accept(listener, nil, nil)
        #expect(connection >= 0)
        defer { close(connection) }
        let garbage = Array("HTTP/1.1 400 Bad Request\r\n\r\n".utf8)
        #expect(write(connection, garbage, garbage.count) == garbage.count)
        #expect(!dealer.waitForInput(milliseconds: 200))
        #expect(!dealer.isReady)
        // It closed the connection: the listener's end reads end of file after the handshake.
        var timeout = timeval(tv_sec: 2, tv_usec: 0)
        _ = setsockopt(connection, SOL_SOCKET, SO_RCVTIMEO, &timeout, socklen_t(MemoryLayout<timeval>.size))
        var bytes = [UInt8](repeating: 0, count: 4_096)
        var total = 0
        while true {
            let count = read(connection, &bytes, bytes.count)
            guard count > 0 else { break }
            total += count
        }
        #expect(total == 64 + 30)  // greeting, READY (DEALER); the message was never sent
    }

    @Test("an endpoint that is not ipc://, or too long for a socket address, is refused when made")
    func badEndpoints() {
        #expect(throws: ZMTPError.self) {
            try ZMTPSocket(kind: .dealer, endpoint: "tcp://127.0.0.1:5555", maximumMessageSize: 10)
        }
        let long = "ipc:///tmp/" + String(repeating: "x", count: 200)
        #expect(throws: ZMTPError.self) { try ZMTPSocket(kind: .dealer, endpoint: long, maximumMessageSize: 10) }
    }

    @Test("the send queue is bounded in messages and in bytes: past it, send drops the message and says so")
    func boundedSendQueue() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let counted = try ZMTPSocket(
            kind: .dealer, endpoint: fixture.endpoint, maximumMessageSize: 1 << 20, sendQueueLimit: 5)
        // Nobody listens: every message waits.
        for index in 0..<5 { #expect(counted.send([Data([UInt8(index)])])) }
        #expect(!counted.send([Data([5])]))
        let sized = try ZMTPSocket(
            kind: .dealer, endpoint: fixture.endpoint, maximumMessageSize: 1 << 20, sendQueueBytes: 100)
        #expect(sized.send([Data(repeating: 1, count: 60)]))
        #expect(sized.send([Data(repeating: 2, count: 60)]))  // 62 bytes waited: less than 100
        #expect(!sized.send([Data(repeating: 3, count: 60)]))
        // What waited goes out once a server listens, in order; what was dropped never does.
        let router = try fixture.bound(.router)
        defer { router.close() }
        for index in 0..<5 { #expect(try Self.request(to: router, from: counted) == Data([UInt8(index)])) }
        _ = counted.waitForInput(milliseconds: 50)
        #expect(try !router.waitForInput(milliseconds: 50))
    }

    @Test(
        "a receive queue bounded in bytes stops reading at the bound and loses nothing: every message comes, in order")
    func receiveQueueBytes() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        let router = try fixture.bound(.router)
        defer { router.close() }
        let dealer = try ZMTPSocket(
            kind: .dealer, endpoint: fixture.endpoint, maximumMessageSize: 1 << 20, receiveQueueBytes: 150_000)
        dealer.send([Data("ask".utf8)])
        let request = try #require(try Self.receive(router) { _ = dealer.waitForInput(milliseconds: 0) })
        for index in 0..<20 {
            try router.send([request[0], Data([UInt8(index)] + [UInt8](repeating: 0, count: 99_999))])
        }
        var received: [UInt8] = []
        while received.count < 20, let message = Self.receive(dealer) { received.append(message[0][0]) }
        #expect(received == (0..<20).map { UInt8($0) })
    }
}
