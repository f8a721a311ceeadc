import Foundation
import SkyrosZeroMQ
import Testing

/// ``ZMTPCodec`` as transcripts, no socket: the bytes a peer sends in, the events (or the
/// failure that closes the connection) out.
@Suite("ZMTP codec transcripts")
struct ZMTPCodecTests {
    /// A peer's greeting: ZMTP 3.`minor`, mechanism `mechanism`.
    static func greeting(minor: UInt8 = 0, mechanism: String = "NULL") -> [UInt8] {
        var bytes = [UInt8](repeating: 0, count: 64)
        bytes[0] = 0xFF
        bytes[9] = 0x7F
        bytes[10] = 3
        bytes[11] = minor
        for (index, byte) in mechanism.utf8.enumerated() { bytes[12 + index] = byte }
        return bytes
    }

    /// A command frame: its name, then `data`.
    static func command(_ name: String, _ data: [UInt8] = []) -> [UInt8] {
        let body = [UInt8(name.utf8.count)] + Array(name.utf8) + data
        var bytes: [UInt8] = []
        ZMTP.appendHeader(to: &bytes, size: body.count, more: false, command: true)
        return bytes + body
    }

    /// A READY command with these properties, in order.
    static func ready(_ properties: [(String, [UInt8])]) -> [UInt8] {
        var data: [UInt8] = []
        for (name, value) in properties {
            data += [UInt8(name.utf8.count)] + Array(name.utf8)
            data += [0, 0, UInt8(value.count >> 8), UInt8(value.count & 0xFF)] + value
        }
        return command("READY", data)
    }

    static func ready(_ socketType: String, identity: [UInt8]? = nil) -> [UInt8] {
        ready([("Socket-Type", Array(socketType.utf8))] + (identity.map { [("Identity", $0)] } ?? []))
    }

    /// One frame of a message.
    static func frame(_ body: [UInt8], more: Bool = false) -> [UInt8] {
        var bytes: [UInt8] = []
        ZMTP.appendHeader(to: &bytes, size: body.count, more: more, command: false)
        return bytes + body
    }

    /// What `codec` makes of `bytes`, fed in pieces of `piece` bytes (0: all at once): its
    /// events, and the failure that ended them if one did.
    static func transcript(
        _ codec: inout ZMTPCodec, _ bytes: [UInt8], piece: Int = 0
    ) -> (events: [ZMTPCodec.Event], failure: ZMTPCodec.Failure?) {
        var events: [ZMTPCodec.Event] = []
        var offset = 0
        repeat {
            let end = piece > 0 ? min(bytes.count, offset + piece) : bytes.count
            codec.receive(bytes[offset..<end])
            offset = end
            do {
                while let event = try codec.next() { events.append(event) }
            } catch {
                return (events, error)
            }
        } while offset < bytes.count
        return (events, nil)
    }

    static func transcript(_ type: ZMTPSocketType, _ bytes: [UInt8], maximumMessageSize: Int = 1 << 20, piece: Int = 0)
        -> (events: [ZMTPCodec.Event], failure: ZMTPCodec.Failure?)
    {
        var codec = ZMTPCodec(socketType: type, maximumMessageSize: maximumMessageSize)
        return transcript(&codec, bytes, piece: piece)
    }

    @Test("a DEALER's greeting, READY and message come out as its READY and the message, however the bytes are cut")
    func handshakeThenMessage() {
        let bytes =
            Self.greeting() + Self.ready("DEALER") + Self.frame(Array("a".utf8), more: true) + Self.frame([])
            + Self.frame(Array("b".utf8))
        let expected: [ZMTPCodec.Event] = [
            .ready(socketType: "DEALER", identity: nil), .message([Data("a".utf8), Data()]), .message([Data("b".utf8)]),
        ]
        for piece in [0, 1, 2, 7, 63, 64, 65] {
            let result = Self.transcript(.router, bytes, piece: piece)
            #expect(result.events == expected, "in pieces of \(piece)")
            #expect(result.failure == nil)
        }
        var codec = ZMTPCodec(socketType: .router, maximumMessageSize: 100)
        #expect(!codec.isReady)
        _ = Self.transcript(&codec, bytes)
        #expect(codec.isReady)
        #expect(codec.peerSocketType == "DEALER")
        #expect(codec.unparsedBytes == 0)
    }

    @Test("a READY's Identity property is the peer's claimed routing identity; property names are case-insensitive")
    func identityProperty() {
        let claimed = Self.transcript(.router, Self.greeting() + Self.ready("DEALER", identity: Array("alice".utf8)))
        #expect(claimed.events == [.ready(socketType: "DEALER", identity: Data("alice".utf8))])
        let lower = Self.transcript(
            .router, Self.greeting() + Self.ready([("socket-type", Array("REQ".utf8)), ("IDENTITY", [])]))
        #expect(lower.events == [.ready(socketType: "REQ", identity: Data())])
    }

    @Test("both ends' own handshakes are read by the other: a ROUTER's has an empty Identity")
    func ownHandshakes() {
        #expect(
            Self.transcript(.dealer, ZMTP.handshake(.router)).events == [.ready(socketType: "ROUTER", identity: Data())]
        )
        #expect(
            Self.transcript(.router, ZMTP.handshake(.dealer)).events == [.ready(socketType: "DEALER", identity: nil)])
        #expect(
            Self.transcript(.subscriber, ZMTP.handshake(.publisher)).events == [
                .ready(socketType: "PUB", identity: nil)
            ])
        #expect(
            Self.transcript(.publisher, ZMTP.handshake(.subscriber)).events == [
                .ready(socketType: "SUB", identity: nil)
            ])
    }

    @Test("frames of every size length encoding round-trip through ZMTP.encode")
    func frameSizes() {
        let frames = [
            Data(), Data("x".utf8), Data(repeating: 1, count: 255), Data(repeating: 2, count: 256),
            Data(repeating: 3, count: 70_000),
        ]
        let result = Self.transcript(.dealer, ZMTP.handshake(.router) + ZMTP.encode(frames), piece: 1_000)
        #expect(result.events.last == .message(frames))
        #expect(result.failure == nil)
    }

    @Test("a peer that is not ZMTP is refused at its first byte; another mechanism or version at the greeting's end")
    func greetings() {
        #expect(Self.transcript(.router, Array("GET / HTTP/1.1\r\n".utf8)).failure == .notZMTP)
        #expect(Self.transcript(.router, [0x47]).failure == .notZMTP)
        #expect(Self.transcript(.router, [0xFF]).failure == nil)  // not yet known
        #expect(Self.transcript(.router, Self.greeting(mechanism: "PLAIN")).failure == .notZMTP)
        var version2 = Self.greeting()
        version2[10] = 2
        #expect(Self.transcript(.router, version2).failure == .notZMTP)
        // A 3.1 peer talks 3.0 with this end.
        #expect(Self.transcript(.router, Self.greeting(minor: 1) + Self.ready("DEALER")).events.count == 1)
    }

    @Test(
        "a frame larger than the maximum is refused from its header alone; endless frames marked 'more' once they outgrow it"
    )
    func sizeLimits() {
        let handshake = Self.greeting() + Self.ready("DEALER")
        // A long header announcing 1 GiB: refused before any of its body.
        let header: [UInt8] = [0x02, 0, 0, 0, 0, 0x40, 0, 0, 0]
        #expect(Self.transcript(.router, handshake + header, maximumMessageSize: 1_000).failure == .invalidFrame)
        #expect(
            Self.transcript(.router, handshake + Self.frame([UInt8](repeating: 0, count: 101)), maximumMessageSize: 100)
                .failure == .invalidFrame)
        #expect(
            Self.transcript(.router, handshake + Self.frame([UInt8](repeating: 0, count: 100)), maximumMessageSize: 100)
                .failure == nil)
        var endless: [UInt8] = []
        for _ in 0..<200 { endless += Self.frame([UInt8](repeating: 7, count: 100), more: true) }
        let result = Self.transcript(.router, handshake + endless, maximumMessageSize: 1_000)
        #expect(result.failure == .messageTooLarge)
        #expect(result.events.count == 1)  // the READY only
        // The same on a client's end.
        #expect(
            Self.transcript(.dealer, ZMTP.handshake(.router) + endless, maximumMessageSize: 1_000).failure
                == .messageTooLarge)
        // Unknown flags.
        #expect(Self.transcript(.router, handshake + [0x08, 0]).failure == .invalidFrame)
    }

    @Test("the handshake is READY first, once, from a peer of a type this end talks to")
    func handshakeOrder() {
        let greeting = Self.greeting()
        #expect(Self.transcript(.router, greeting + Self.command("BOGUS")).failure == .unexpectedCommand("BOGUS"))
        #expect(
            Self.transcript(.dealer, greeting + Self.command("PING", [0, 0])).failure == .unexpectedCommand("PING"))
        #expect(Self.transcript(.router, greeting + Self.frame(Array("early".utf8))).failure == .messageBeforeReady)
        #expect(Self.transcript(.dealer, greeting + Self.frame(Array("early".utf8))).failure == .messageBeforeReady)
        let twice = Self.transcript(.router, greeting + Self.ready("DEALER") + Self.ready("DEALER"))
        #expect(twice.failure == .unexpectedCommand("READY"))
        #expect(Self.transcript(.router, greeting + Self.ready("PUB")).failure == .incompatiblePeer("PUB"))
        #expect(Self.transcript(.publisher, greeting + Self.ready("DEALER")).failure == .incompatiblePeer("DEALER"))
        #expect(Self.transcript(.dealer, greeting + Self.ready("SUB")).failure == .incompatiblePeer("SUB"))
        #expect(Self.transcript(.subscriber, greeting + Self.ready("ROUTER")).failure == .incompatiblePeer("ROUTER"))
        #expect(Self.transcript(.router, greeting + Self.ready([("Identity", [])])).failure == .incompatiblePeer(nil))
        // Properties that run past the command's body; a command with no name.
        let truncated = Self.command("READY", [11] + Array("Socket-Type".utf8) + [0, 0, 0, 9] + Array("DEAL".utf8))
        #expect(Self.transcript(.router, greeting + truncated).failure == .malformedCommand)
        #expect(Self.transcript(.router, greeting + [0x04, 0]).failure == .malformedCommand)
    }

    @Test("an ERROR command ends the connection with its reason; unknown commands after READY are ignored")
    func errorAndUnknownCommands() {
        let handshake = Self.greeting() + Self.ready("ROUTER")
        let error = Self.transcript(.dealer, handshake + Self.command("ERROR", [4] + Array("gone".utf8)))
        #expect(error.failure == .peerError("gone"))
        let unknown = Self.transcript(.dealer, handshake + Self.command("PONG", Array("ctx".utf8)) + Self.frame([1]))
        #expect(unknown.events == [.ready(socketType: "ROUTER", identity: nil), .message([Data([1])])])
    }

    @Test("after a failure the codec throws it again, whatever comes")
    func failureIsFinal() {
        var codec = ZMTPCodec(socketType: .router, maximumMessageSize: 100)
        #expect(Self.transcript(&codec, [0x00]).failure == .notZMTP)
        #expect(Self.transcript(&codec, Self.greeting() + Self.ready("DEALER")).failure == .notZMTP)
        #expect(!codec.isReady)
    }

    @Test("a PING's context (16 bytes at most) comes out to be answered with a PONG")
    func pingPong() {
        let handshake = Self.greeting(minor: 1) + Self.ready("DEALER")
        let ping = Self.command("PING", [0, 10] + Array("ctx".utf8))
        #expect(Self.transcript(.router, handshake + ping).events.last == .ping(context: Array("ctx".utf8)))
        let long = Self.command("PING", [0, 10] + [UInt8](repeating: 9, count: 40))
        #expect(
            Self.transcript(.router, handshake + long).events.last == .ping(context: [UInt8](repeating: 9, count: 16)))
        #expect(ZMTP.pong(context: Array("ctx".utf8)) == [0x04, 8, 4] + Array("PONG".utf8) + Array("ctx".utf8))
        // A client answers them too.
        #expect(
            Self.transcript(.dealer, Self.greeting(minor: 1) + Self.ready("ROUTER") + ping).events.last
                == .ping(context: Array("ctx".utf8)))
    }

    @Test(
        "a publisher takes a first frame of 1 or 0 as a subscription or its cancellation, 3.1's commands too, and drops the rest"
    )
    func subscriptions() {
        var bytes = Self.greeting() + Self.ready("SUB")
        bytes += Self.frame([1] + Array("ab".utf8))
        bytes += Self.frame([0] + Array("ab".utf8))
        bytes += Self.frame([1])  // everything
        bytes += Self.frame(Array("hello".utf8))  // not a subscription: dropped
        bytes += Self.frame([7], more: true) + Self.frame([1] + Array("x".utf8))  // a later frame: dropped
        bytes += Self.frame([])  // empty: dropped
        bytes += Self.command("SUBSCRIBE", Array("t".utf8)) + Self.command("CANCEL", Array("t".utf8))
        let result = Self.transcript(.publisher, bytes, piece: 3)
        #expect(result.failure == nil)
        #expect(
            result.events == [
                .ready(socketType: "SUB", identity: nil),
                .subscription(prefix: Data("ab".utf8), subscribe: true),
                .subscription(prefix: Data("ab".utf8), subscribe: false),
                .subscription(prefix: Data(), subscribe: true),
                .subscription(prefix: Data("t".utf8), subscribe: true),
                .subscription(prefix: Data("t".utf8), subscribe: false),
            ])
        // To anything but a publisher, 3.1's subscriptions are a protocol error; a ZMTP 3.0
        // subscription message to a ROUTER is just a message.
        let router = Self.greeting(minor: 1) + Self.ready("DEALER")
        #expect(Self.transcript(.router, router + Self.command("SUBSCRIBE")).failure == .unexpectedCommand("SUBSCRIBE"))
        #expect(Self.transcript(.router, router + Self.frame([1])).events.last == .message([Data([1])]))
        // What a client's SUB socket sends is read as subscriptions.
        var subscribing = ZMTP.handshake(.subscriber)
        ZMTP.appendSubscription(to: &subscribing, Data("q".utf8), subscribe: true)
        #expect(
            Self.transcript(.publisher, subscribing).events.last
                == .subscription(prefix: Data("q".utf8), subscribe: true))
    }

    @Test("a large frame's room is reserved only after the handshake, and the buffer is given back once it is taken")
    func largeFrameBuffer() {
        var codec = ZMTPCodec(socketType: .dealer, maximumMessageSize: 8 << 20)
        _ = Self.transcript(&codec, ZMTP.handshake(.router))
        let big = ZMTP.encode([Data(repeating: 5, count: 4 << 20)])
        let result = Self.transcript(&codec, big, piece: 65_536)
        #expect(result.events == [.message([Data(repeating: 5, count: 4 << 20)])])
        #expect(codec.unparsedBytes == 0)
    }
}
