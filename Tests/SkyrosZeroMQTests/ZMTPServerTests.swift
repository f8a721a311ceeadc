import Foundation
import Testing
import ZeroMQReference

@testable import SkyrosZeroMQ

#if canImport(Glibc)
    import Glibc
#endif

/// The daemon's own ZMTP 3.0 `ROUTER` and `PUB` listeners (``ZMTPServer``) against libzmq's
/// `DEALER`, `REQ` and `SUB`, in one process over real socket files. The server is driven on
/// the test's thread; libzmq's peers have their own I/O threads. Every wait is bounded.
@Suite("ZMTP server against libzmq peers", .timeLimit(.minutes(1)))
struct ZMTPServerTests {
    /// libzmq's `ZMQ_ROUTING_ID` (`ZMQ_IDENTITY`), from zmq.h.
    static let routingIDOption: Int32 = 5

    /// What the server's monitor callbacks reported.
    final class Events {
        var accepted: [(Int32, ZMTPServer.Role)] = []
        var closing: [(Int32, ZMTPServer.Role)] = []
    }

    /// A short temporary directory for the socket files, a libzmq context and a server whose
    /// callbacks are recorded (`remove()` it).
    final class Fixture {
        let directory: String
        let context: ZeroMQContext
        let server: ZMTPServer
        let events = Events()

        init(
            maximumMessageSize: Int = 1 << 20, highWaterMark: Int = 1_000,
            highWaterMarkBytes: Int = ZMTPServer.defaultHighWaterMarkBytes, handshakeTimeout: TimeInterval = 30
        ) throws {
            var template = Array("/tmp/zs-XXXXXX".utf8CString)
            directory = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)) }
            context = try ZeroMQContext()
            server = try ZMTPServer(
                maximumMessageSize: maximumMessageSize, highWaterMark: highWaterMark,
                highWaterMarkBytes: highWaterMarkBytes,
                handshakeTimeout: handshakeTimeout)
            let events = events
            server.acceptedConnection = { events.accepted.append(($0, $1)) }
            server.closingConnection = { events.closing.append(($0, $1)) }
        }

        func remove() {
            server.close()
            try? FileManager.default.removeItem(atPath: directory)
        }

        var routerEndpoint: String { "ipc://\(directory)/r.ipc" }
        var publisherEndpoint: String { "ipc://\(directory)/p.ipc" }

        /// A libzmq socket of `kind` connected to `endpoint` (after `configure`).
        func connected(
            _ kind: ZeroMQSocket.Kind, to endpoint: String, configure: (ZeroMQSocket) throws -> Void = { _ in }
        )
            throws -> ZeroMQSocket
        {
            let socket = try ZeroMQSocket(context: context, kind: kind)
            try configure(socket)
            try socket.connect(endpoint)
            return socket
        }

        /// Pumps the server until `condition` holds, for at most 5 s; returns whether it held.
        func pump(until condition: () -> Bool) -> Bool {
            let deadline = Date().addingTimeInterval(5)
            while Date() < deadline {
                if condition() { return true }
                _ = server.wait(orDescriptor: -1, milliseconds: 10)
            }
            return condition()
        }

        /// The server's next message, within 5 s.
        func serverReceive() -> ZMTPServer.Message? {
            let deadline = Date().addingTimeInterval(5)
            while Date() < deadline {
                if server.wait(orDescriptor: -1, milliseconds: 10).socket, let message = server.receive() {
                    return message
                }
            }
            return server.receive()
        }

        /// The libzmq socket's next message, pumping the server meanwhile, within `seconds`.
        func receive(_ socket: ZeroMQSocket, seconds: TimeInterval = 5) throws -> [Data]? {
            let deadline = Date().addingTimeInterval(seconds)
            while Date() < deadline {
                _ = server.wait(orDescriptor: -1, milliseconds: 5)
                if try socket.waitForInput(milliseconds: 5) { return try socket.receive(dontWait: true) }
            }
            return nil
        }
    }

    @Test("a DEALER's message reaches the ROUTER with its identity, credentials and descriptor; the reply comes back")
    func dealerRequestAndReply() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        let dealer = try fixture.connected(.dealer, to: fixture.routerEndpoint)
        defer { dealer.close() }
        try dealer.send([Data("hello".utf8)])

        let message = try #require(fixture.serverReceive())
        #expect(message.frames.count == 2)
        let identity = try #require(message.frames.first)
        #expect(identity.count == 5 && identity.first == 0)  // a generated identity: a zero, then a counter
        #expect(message.frames.last == Data("hello".utf8))
        #expect(message.peer?.pid == getpid())
        #expect(message.peer?.uid == getuid())
        #expect(message.descriptor >= 0)

        #expect(fixture.server.send(to: identity, Data("world".utf8)))
        #expect(try fixture.receive(dealer) == [Data("world".utf8)])
        #expect(fixture.events.accepted.count == 1)
        #expect(fixture.events.accepted.first?.0 == message.descriptor)
        #expect(fixture.events.accepted.first?.1 == .router)
        #expect(fixture.events.closing.isEmpty)
        #expect(fixture.server.connectionCount(.router) == 1)
        // To an identity nobody has: dropped.
        #expect(!fixture.server.send(to: Data("nobody".utf8), Data("lost".utf8)))
    }

    @Test("a REQ's request arrives as identity, empty delimiter, body; a reply with the delimiter reaches it")
    func requestSocket() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        let request = try fixture.connected(.request, to: fixture.routerEndpoint)
        defer { request.close() }
        try request.send([Data("question".utf8)])

        let message = try #require(fixture.serverReceive())
        #expect(message.frames.count == 3)
        #expect(message.frames.count == 3 && message.frames[1].isEmpty)
        #expect(message.frames.last == Data("question".utf8))
        let identity = try #require(message.frames.first)
        #expect(fixture.server.send(to: identity, frames: [Data(), Data("answer".utf8)]))
        #expect(try fixture.receive(request) == [Data("answer".utf8)])
    }

    @Test("a DEALER's routing id is its identity")
    func routingIdentity() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        let dealer = try fixture.connected(.dealer, to: fixture.routerEndpoint) {
            try $0.setOption(Self.routingIDOption, Data("alice".utf8))
        }
        defer { dealer.close() }
        try dealer.send([Data("hi".utf8)])
        let message = try #require(fixture.serverReceive())
        #expect(message.frames == [Data("alice".utf8), Data("hi".utf8)])
        #expect(fixture.server.send(to: Data("alice".utf8), Data("hi alice".utf8)))
        #expect(try fixture.receive(dealer) == [Data("hi alice".utf8)])
    }

    @Test("messages waiting from two connections are handed out in turn")
    func fairQueueing() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        let first = try fixture.connected(.dealer, to: fixture.routerEndpoint)
        defer { first.close() }
        let second = try fixture.connected(.dealer, to: fixture.routerEndpoint)
        defer { second.close() }
        for index in 0..<3 {
            try first.send([Data("first \(index)".utf8)])
            try second.send([Data("second \(index)".utf8)])
        }
        #expect(fixture.server.readAhead(until: 6, milliseconds: 5_000))

        var messages: [[Data]] = []
        while let message = fixture.server.receive() { messages.append(message.frames) }
        #expect(messages.count == 6)
        let identities = messages.map { $0[0] }
        #expect(Set(identities).count == 2)
        for index in 1..<identities.count {
            #expect(
                identities[index] != identities[index - 1],
                "receive \(index) is from the same connection as the one before")
        }
        // Each connection's messages in the order it sent them.
        for identity in Set(identities) {
            let bodies = messages.filter { $0[0] == identity }.map { String(decoding: $0[1], as: UTF8.self) }
            #expect(bodies == ["first 0", "first 1", "first 2"] || bodies == ["second 0", "second 1", "second 2"])
        }
    }

    @Test("a frame over the maximum message size closes the connection, is never handed out, and the server goes on")
    func oversizeFrame() throws {
        let fixture = try Fixture(maximumMessageSize: 100)
        defer { fixture.remove() }
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        let big = try fixture.connected(.dealer, to: fixture.routerEndpoint)
        try big.send([Data(repeating: 7, count: 1_000)])
        #expect(fixture.pump { !fixture.events.closing.isEmpty })
        #expect(fixture.events.closing.allSatisfy { $0.1 == .router })
        #expect(!fixture.server.hasInput)
        #expect(fixture.server.receive() == nil)
        big.close()

        let small = try fixture.connected(.dealer, to: fixture.routerEndpoint)
        defer { small.close() }
        try small.send([Data("small".utf8)])
        let message = try #require(fixture.serverReceive())
        #expect(message.frames.count == 2)
        #expect(message.frames.last == Data("small".utf8))
        #expect(fixture.server.send(to: message.frames[0], Data("ok".utf8)))
        #expect(try fixture.receive(small) == [Data("ok".utf8)])
    }

    @Test("a SUB gets the messages whose first frame starts with its prefix, and no other")
    func publishToSubscriber() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        try fixture.server.listen(.publisher, endpoint: fixture.publisherEndpoint)
        let subscriber = try fixture.connected(.subscriber, to: fixture.publisherEndpoint) {
            try $0.subscribe(Data("a".utf8))
        }
        defer { subscriber.close() }

        // The subscription arrives some time after the connection: publish until it is heard.
        var heard: [Data]?
        let deadline = Date().addingTimeInterval(5)
        while heard == nil && Date() < deadline {
            _ = fixture.server.wait(orDescriptor: -1, milliseconds: 10)
            fixture.server.publish([Data("a1".utf8), Data("x".utf8)])
            if try subscriber.waitForInput(milliseconds: 0) { heard = try subscriber.receive(dontWait: true) }
        }
        #expect(heard == [Data("a1".utf8), Data("x".utf8)])
        #expect(fixture.server.connectionCount(.publisher) == 1)
        #expect(fixture.events.accepted.map(\.1) == [.publisher])

        // The subscription is known now: a message it does not take goes to nobody.
        #expect(fixture.server.publish([Data("b1".utf8), Data("y".utf8)]) == 0)
        #expect(fixture.server.publish([Data("a2".utf8), Data("z".utf8)]) == 1)
        // Copies of a1 published before a1 was heard may come first; b1 never does.
        var received: [[Data]] = []
        while let message = try fixture.receive(subscriber) {
            received.append(message)
            if message.first == Data("a2".utf8) { break }
        }
        #expect(received.last == [Data("a2".utf8), Data("z".utf8)])
        #expect(received.allSatisfy { $0.first?.first == UInt8(ascii: "a") })
        #expect(try fixture.receive(subscriber, seconds: 0.1) == nil)
    }

    @Test("a SUB that admit refuses is closed and gets nothing")
    func refusedSubscriber() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        var asked: [PeerCredentials?] = []
        try fixture.server.listen(.publisher, endpoint: fixture.publisherEndpoint) { peer in
            asked.append(peer)
            return false
        }
        let subscriber = try fixture.connected(.subscriber, to: fixture.publisherEndpoint) { try $0.subscribe() }
        defer { subscriber.close() }
        #expect(fixture.pump { !fixture.events.closing.isEmpty })
        #expect(fixture.events.closing.allSatisfy { $0.1 == .publisher })
        #expect(fixture.events.accepted.allSatisfy { $0.1 == .publisher })
        #expect(asked.first??.pid == getpid())
        #expect(fixture.server.connectionCount(.publisher) == 0)
        // Nobody to publish to, and nothing arrives.
        let deadline = Date().addingTimeInterval(0.2)
        while Date() < deadline {
            #expect(fixture.server.publish([Data("a".utf8)]) == 0)
            _ = fixture.server.wait(orDescriptor: -1, milliseconds: 10)
            #expect(try !subscriber.waitForInput(milliseconds: 0))
        }
    }

    @Test("a peer that does not speak ZMTP is closed, and the ROUTER goes on serving")
    func garbagePeer() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        let raw = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        #expect(raw >= 0)
        defer { close(raw) }
        let path = String(fixture.routerEndpoint.dropFirst("ipc://".count))
        #expect(withUnixSocketAddress(path, { connect(raw, $0, $1) }) == 0)
        let garbage = Array("GET / HTTP/1.1\r\n".utf8)
        #expect(write(raw, garbage, garbage.count) == garbage.count)

        // The server's end is closed: the raw socket reads its greeting, then end of file.
        var closed = false
        var total = 0
        var bytes = [UInt8](repeating: 0, count: 4_096)
        let deadline = Date().addingTimeInterval(5)
        while !closed && Date() < deadline {
            _ = fixture.server.wait(orDescriptor: -1, milliseconds: 10)
            while true {
                let count = recv(raw, &bytes, bytes.count, Int32(MSG_DONTWAIT))
                if count > 0 {
                    total += count
                    continue
                }
                if count == 0 || (count < 0 && errno == ECONNRESET) { closed = true }
                break
            }
        }
        #expect(closed)
        #expect(total >= 64)  // the greeting went out before the garbage was read
        #expect(fixture.events.closing.count == 1)
        #expect(fixture.events.closing.first?.1 == .router)
        #expect(fixture.server.receive() == nil)
        #expect(fixture.server.connectionCount(.router) == 0)

        let dealer = try fixture.connected(.dealer, to: fixture.routerEndpoint)
        defer { dealer.close() }
        try dealer.send([Data("after".utf8)])
        let message = try #require(fixture.serverReceive())
        #expect(message.frames.last == Data("after".utf8))
        #expect(fixture.server.send(to: message.frames[0], Data("served".utf8)))
        #expect(try fixture.receive(dealer) == [Data("served".utf8)])
    }

    /// A peer speaking ZMTP from raw bytes: a greeting of version 3.1, then `frames` (each
    /// already with its header); returns what it read until `done` holds of it (5 s at most),
    /// pumping the server meanwhile.
    private func rawPeer(
        _ fixture: Fixture, endpoint: String, socketType: String, frames: [UInt8], done: ([UInt8]) -> Bool
    ) -> [UInt8] {
        let raw = rawConnection(endpoint, minorVersion: 1, socketType: socketType, frames: frames)
        defer { close(raw) }
        guard raw >= 0 else { return [] }
        var read: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 4_096)
        let deadline = Date().addingTimeInterval(5)
        while !done(read) && Date() < deadline {
            _ = fixture.server.wait(orDescriptor: -1, milliseconds: 10)
            let count = recv(raw, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            if count > 0 { read += buffer[0..<count] } else if count == 0 { break }
        }
        return read
    }

    @Test("a ZMTP 3.1 peer's PING is answered with a PONG carrying its context")
    func pingPong() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        // PING: name, TTL (2 bytes), context "ctx".
        let ping: [UInt8] = [4] + Array("PING".utf8) + [0, 0] + Array("ctx".utf8)
        let pong: [UInt8] = [0x04, 8, 4] + Array("PONG".utf8) + Array("ctx".utf8)
        let read = rawPeer(
            fixture, endpoint: fixture.routerEndpoint, socketType: "DEALER", frames: [0x04, UInt8(ping.count)] + ping
        ) {
            $0.count >= pong.count && Array($0.suffix(pong.count)) == pong
        }
        #expect(Array(read.suffix(pong.count)) == pong)
        #expect(read.prefix(1) == [0xFF])
        #expect(fixture.events.closing.isEmpty)
    }

    @Test("a ZMTP 3.1 SUBSCRIBE command subscribes, as the 3.0 message does")
    func subscribeCommand() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        try fixture.server.listen(.publisher, endpoint: fixture.publisherEndpoint)
        let subscribe: [UInt8] = [9] + Array("SUBSCRIBE".utf8) + Array("t".utf8)
        var published = 0
        let read = rawPeer(
            fixture, endpoint: fixture.publisherEndpoint, socketType: "SUB",
            frames: [0x04, UInt8(subscribe.count)] + subscribe
        ) { read in
            // Published until it arrives: the subscription is read by the server's pump.
            published += fixture.server.publish([Array("u".utf8), Array("no".utf8)])
            published += fixture.server.publish([Array("t1".utf8), Array("yes".utf8)])
            return read.count >= 3 && Array(read.suffix(3)) == Array("yes".utf8)
        }
        #expect(Array(read.suffix(3)) == Array("yes".utf8))
        #expect(!String(decoding: read, as: UTF8.self).contains("no"))
        #expect(published >= 1)
    }

    /// A raw peer's connection to `endpoint` that has written a greeting of version 3.0 (or
    /// 3.`minorVersion`), a READY of `socketType` (nil: none) with `identity` (nil: none), then
    /// `frames` (each with its header); -1 when it could not connect.
    private func rawConnection(
        _ endpoint: String, minorVersion: UInt8 = 0, socketType: String? = "DEALER", identity: [UInt8]? = nil,
        frames: [UInt8] = []
    ) -> Int32 {
        let raw = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        guard withUnixSocketAddress(String(endpoint.dropFirst("ipc://".count)), { connect(raw, $0, $1) }) == 0 else {
            close(raw)
            return -1
        }
        var greeting = [UInt8](repeating: 0, count: 64)
        greeting[0] = 0xFF
        greeting[9] = 0x7F
        greeting[10] = 3
        greeting[11] = minorVersion
        for (index, byte) in "NULL".utf8.enumerated() { greeting[12 + index] = byte }
        var bytes = greeting
        if let socketType {
            var ready =
                [5] + Array("READY".utf8) + [11] + Array("Socket-Type".utf8) + [0, 0, 0, UInt8(socketType.utf8.count)]
                + Array(socketType.utf8)
            if let identity { ready += [8] + Array("Identity".utf8) + [0, 0, 0, UInt8(identity.count)] + identity }
            bytes += [0x04, UInt8(ready.count)] + ready
        }
        bytes += frames
        var written = 0
        while written < bytes.count {
            let count = bytes[written...].withUnsafeBytes { write(raw, $0.baseAddress, $0.count) }
            guard count > 0 else { break }
            written += count
        }
        return raw
    }

    @Test(
        "messages read past the high-water mark are handed out once the first ones are taken, with nothing more to read"
    )
    func pausedConnectionResumes() throws {
        let fixture = try Fixture(highWaterMark: 100)
        defer { fixture.remove() }
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        // 150 messages in one write: one read brings them all, 50 past the mark.
        var frames: [UInt8] = []
        for index in 0..<150 { frames += [0x00, 2, UInt8(index / 256), UInt8(index % 256)] }
        let raw = rawConnection(fixture.routerEndpoint, frames: frames)
        #expect(raw >= 0)
        defer { close(raw) }
        var received: [Data] = []
        #expect(
            fixture.pump {
                while let message = fixture.server.receive() { received.append(message.frames[1]) }
                return received.count == 150
            })
        let sent: [Data] = (0..<150).map { (index: Int) -> Data in Data([UInt8(index / 256), UInt8(index % 256)]) }
        #expect(received == sent)
    }

    @Test("the messages of a connection closed before they are taken are handed out with no descriptor")
    func closedConnectionMessages() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        let raw = rawConnection(fixture.routerEndpoint, frames: [0x00, 3] + Array("bye".utf8))
        #expect(raw >= 0)
        #expect(fixture.server.readAhead(until: 1, milliseconds: 5_000))
        close(raw)
        #expect(fixture.pump { fixture.events.closing.count == 1 })
        let message = try #require(fixture.server.receive())
        #expect(message.frames.last == Data("bye".utf8))
        // Its descriptor number may already be another connection's.
        #expect(message.descriptor == -1)
    }

    @Test("a message of endless frames marked 'more' closes its connection before it outgrows the maximum message size")
    func endlessFrames() throws {
        let fixture = try Fixture(maximumMessageSize: 1_000)
        defer { fixture.remove() }
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        // 200 frames of 100 bytes, each small enough alone, all marked "more".
        var frames: [UInt8] = []
        for _ in 0..<200 { frames += [0x01, 100] + [UInt8](repeating: 7, count: 100) }
        let raw = rawConnection(fixture.routerEndpoint, frames: frames)
        #expect(raw >= 0)
        defer { close(raw) }
        #expect(fixture.pump { fixture.events.closing.count == 1 })
        #expect(fixture.server.receive() == nil)
    }

    @Test("a connection that does not end its handshake in time is closed; one that did is kept")
    func handshakeTimeout() throws {
        let fixture = try Fixture(handshakeTimeout: 0.2)
        defer { fixture.remove() }
        try fixture.server.listen(.publisher, endpoint: fixture.publisherEndpoint)
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        let dealer = try fixture.connected(.dealer, to: fixture.routerEndpoint)
        defer { dealer.close() }
        try dealer.send([Data("one".utf8)])
        let first = try #require(fixture.serverReceive())
        // A silent connection to the event socket: no greeting, no READY.
        let silent = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(silent) }
        let path = String(fixture.publisherEndpoint.dropFirst("ipc://".count))
        #expect(withUnixSocketAddress(path, { connect(silent, $0, $1) }) == 0)
        #expect(fixture.pump { fixture.events.closing.count == 1 })
        #expect(fixture.events.closing.first?.1 == .publisher)
        // The DEALER, older than the timeout by now, is still served.
        #expect(fixture.server.send(to: first.frames[0], Data("two".utf8)))
        #expect(try fixture.receive(dealer) == [Data("two".utf8)])
        #expect(fixture.events.closing.count == 1)
    }

    @Test("a command other than READY before the handshake ended closes the connection")
    func commandBeforeReady() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        let bogus: [UInt8] = [5] + Array("BOGUS".utf8)
        let raw = rawConnection(fixture.routerEndpoint, socketType: nil, frames: [0x04, UInt8(bogus.count)] + bogus)
        #expect(raw >= 0)
        defer { close(raw) }
        #expect(fixture.pump { fixture.events.closing.count == 1 })
    }

    @Test("a READY that waited in the kernel while the server was busy past the handshake timeout counts")
    func readyReadBeforeExpiry() throws {
        let fixture = try Fixture(handshakeTimeout: 0.1)
        defer { fixture.remove() }
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        let raw = rawConnection(fixture.routerEndpoint, frames: [0x00, 4] + Array("late".utf8))
        #expect(raw >= 0)
        defer { close(raw) }
        // One poll accepts the connection (its bytes are read on a later one); then the server
        // is busy, not polled, for longer than the timeout: the handshake and the message wait
        // unread in the kernel meanwhile.
        _ = fixture.server.wait(orDescriptor: -1, milliseconds: 0)  // one poll: the accept
        #expect(fixture.events.accepted.count == 1)
        Thread.sleep(forTimeInterval: 0.3)
        let message = try #require(fixture.serverReceive())
        #expect(message.frames.last == Data("late".utf8))
        #expect(fixture.events.closing.isEmpty)
    }

    @Test("at most highWaterMarkBytes wait to be written to a connection: past it, a message to it is dropped")
    func byteHighWaterMarkOut() throws {
        let fixture = try Fixture(highWaterMarkBytes: 256 << 10)
        defer { fixture.remove() }
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        // A peer that says READY, sends one message, and never reads.
        let raw = rawConnection(fixture.routerEndpoint, frames: [0x00, 2] + Array("hi".utf8))
        #expect(raw >= 0)
        defer { close(raw) }
        let message = try #require(fixture.serverReceive())
        // 100 messages of 64 KiB (6.4 MiB): far below the 1,000 messages of the message mark;
        // the kernel's buffer takes a few hundred KiB, the queue 256 KiB more.
        let large = [UInt8](repeating: 1, count: 64 << 10)
        var accepted = 0
        for _ in 0..<100 where fixture.server.send(to: message.frames[0], large) { accepted += 1 }
        #expect(accepted < 100)
        #expect(accepted > 4)  // what the kernel took, then at least 256 KiB
        #expect(fixture.events.closing.isEmpty)
    }

    @Test(
        "a connection whose messages waiting make highWaterMarkBytes is not read until they are taken; then all come, in order"
    )
    func byteHighWaterMarkIn() throws {
        let fixture = try Fixture(highWaterMarkBytes: 10_000)
        defer { fixture.remove() }
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        // 100 messages of 1,000 bytes in one write (100 KB): the server stops after 10 KB.
        var frames: [UInt8] = []
        for index in 0..<100 { frames += ZMTP.encode([[UInt8(index)] + [UInt8](repeating: 0, count: 999)]) }
        let raw = rawConnection(fixture.routerEndpoint, frames: frames)
        #expect(raw >= 0)
        defer { close(raw) }
        #expect(fixture.server.readAhead(until: 10, milliseconds: 5_000))
        #expect(!fixture.server.readAhead(until: 20, milliseconds: 100))  // paused at the mark
        var received: [UInt8] = []
        #expect(
            fixture.pump {
                while let message = fixture.server.receive() { received.append(message.frames[1][0]) }
                return received.count == 100
            })
        #expect(received == (0..<100).map { UInt8($0) })
    }

    @Test(
        "a peer claiming another connection's identity, or one starting with a zero byte, gets no reply meant for the other"
    )
    func claimedIdentities() throws {
        let fixture = try Fixture()
        defer { fixture.remove() }
        try fixture.server.listen(.router, endpoint: fixture.routerEndpoint)
        let alice = try fixture.connected(.dealer, to: fixture.routerEndpoint) {
            try $0.setOption(Self.routingIDOption, Data("alice".utf8))
        }
        defer { alice.close() }
        let plain = try fixture.connected(.dealer, to: fixture.routerEndpoint)
        defer { plain.close() }
        try alice.send([Data("a".utf8)])
        try plain.send([Data("p".utf8)])
        var identities: [Data: Data] = [:]
        for _ in 0..<2 {
            let message = try #require(fixture.serverReceive())
            identities[message.frames[1]] = message.frames[0]
        }
        #expect(identities[Data("a".utf8)] == Data("alice".utf8))
        let made = try #require(identities[Data("p".utf8)])
        #expect(made.first == 0)

        // One claims "alice": closed, never served. One claims the identity made for the
        // other: it gets one of its own.
        let thief = rawConnection(fixture.routerEndpoint, identity: Array("alice".utf8), frames: [0x00, 1, 0x74])
        defer { close(thief) }
        #expect(fixture.pump { fixture.events.closing.count == 1 })
        let impostor = rawConnection(fixture.routerEndpoint, identity: Array(made), frames: [0x00, 1, 0x69])
        defer { close(impostor) }
        let fromImpostor = try #require(fixture.serverReceive())
        #expect(fromImpostor.frames[1] == Data("i".utf8))
        #expect(fromImpostor.frames[0] != made && fromImpostor.frames[0].first == 0)

        #expect(fixture.server.send(to: Data("alice".utf8), Data("for alice".utf8)))
        #expect(fixture.server.send(to: made, Data("for plain".utf8)))
        #expect(try fixture.receive(alice) == [Data("for alice".utf8)])
        #expect(try fixture.receive(plain) == [Data("for plain".utf8)])
        // The impostor read the server's handshake only (64 + a READY of 38 bytes).
        var buffer = [UInt8](repeating: 0, count: 4_096)
        var total = 0
        while true {
            let count = recv(impostor, &buffer, buffer.count, Int32(MSG_DONTWAIT))
            guard count > 0 else { break }
            total += count
        }
        #expect(total == ZMTP.handshake(.router).count)
    }
}
