import Foundation

/// The socket types of ZMTP 3.0 that Skyros speaks, on its own end of a connection.
package enum ZMTPSocketType: String, Sendable {
    /// The daemon's request socket (libzmq's `ROUTER`).
    case router = "ROUTER"
    /// The daemon's event socket (libzmq's `PUB`).
    case publisher = "PUB"
    /// A client's request socket (libzmq's `DEALER`).
    case dealer = "DEALER"
    /// A client's event socket (libzmq's `SUB`).
    case subscriber = "SUB"

    /// The `Socket-Type` values of the peers this type talks to (ZMTP 3.0's table, as libzmq
    /// checks it); a peer of another type is closed.
    var peerTypes: Set<String> {
        switch self {
        case .router: ["DEALER", "REQ", "ROUTER"]
        case .publisher: ["SUB", "XSUB"]
        case .dealer: ["ROUTER", "REP", "DEALER"]
        case .subscriber: ["PUB", "XPUB"]
        }
    }
}

/// One end of a ZMTP 3.0 connection with the NULL mechanism (rfc.zeromq.org/spec/23), as a
/// value: bytes in (``receive(_:)``), events out (``next()``), no socket.
///
/// What a peer sends goes through it in the order ZMTP sets: the 64-byte greeting, the `READY`
/// command (the NULL mechanism's whole handshake), then messages and commands. It refuses, by
/// throwing a ``Failure`` from which the connection is closed:
/// - a greeting that is not ZMTP 3 with the NULL mechanism (the first byte tells already);
/// - a frame with unknown flags, or larger than the maximum message size (told from its
///   header, before its body is read), or a message whose frames together outgrow it by more
///   than ``messageOverhead`` (endless frames marked "more");
/// - a command other than `READY` first, a second `READY`, a `READY` whose properties run past
///   its body or from a peer of a type this end does not talk to, an `ERROR` command;
/// - a message before the `READY`;
/// - ZMTP 3.1's `SUBSCRIBE` and `CANCEL` commands to anything but a publisher.
///
/// A publisher takes a message whose first frame starts with 1 or 0 as a subscription or its
/// cancellation (ZMTP 3.0), and drops every other message; the other types hand messages out
/// whole. Other commands after the `READY` (ZMTP 3.1's `PONG`…) are ignored.
///
/// ``ZMTPServer`` keeps one per connection, ``ZMTPSocket`` one per connection it makes.
package struct ZMTPCodec {
    /// What the peer sent, in order.
    package enum Event: Equatable, Sendable {
        /// The peer's `READY`: its `Socket-Type` and its `Identity` property (nil when it sent
        /// none).
        case ready(socketType: String, identity: Data?)
        /// A whole message: its frames (never from a publisher's peer).
        case message([Data])
        /// A subscriber's subscription to `prefix`, or its cancellation (only to a publisher).
        case subscription(prefix: Data, subscribe: Bool)
        /// ZMTP 3.1's heartbeat: answer with ``ZMTP/pong(context:)``.
        case ping(context: [UInt8])
    }

    /// Why the peer's bytes were refused: the connection is to be closed.
    package enum Failure: Error, Equatable, Sendable {
        /// The greeting is not ZMTP 3 with the NULL mechanism.
        case notZMTP
        /// A frame with unknown flags, or larger than the maximum message size.
        case invalidFrame
        /// A message whose frames together outgrow the maximum message size.
        case messageTooLarge
        /// A command whose body does not hold a name, or a `READY` whose properties run past it.
        case malformedCommand
        /// A command other than `READY` before the handshake ended, or a second `READY`.
        case unexpectedCommand(String)
        /// A `READY` without a `Socket-Type`, or of a type this end does not talk to.
        case incompatiblePeer(String?)
        /// A message before the peer's `READY`.
        case messageBeforeReady
        /// The peer's `ERROR` command, with its reason.
        case peerError(String)
    }

    /// What a message's frames may add to the maximum message size together (their headers,
    /// a few small frames besides the largest).
    package static let messageOverhead = 4_096

    /// This end's socket type.
    package let socketType: ZMTPSocketType
    /// A larger frame, or message, is refused.
    package let maximumMessageSize: Int
    /// Whether the peer's `READY` came.
    package private(set) var isReady = false
    /// The peer's `Socket-Type`, once its `READY` came.
    package private(set) var peerSocketType: String?

    private var greeted = false
    /// Bytes received and not parsed yet (from `inputStart`).
    private var input: [UInt8] = []
    private var inputStart = 0
    /// The frames of the message being received, so far, and their size with 9 bytes for each
    /// header.
    private var frames: [Data] = []
    private var messageBytes = 0
    /// Whether the next frame continues a message (a publisher only looks at first frames).
    private var inMessage = false
    /// The failure, once one happened: it is thrown again.
    private var failure: Failure?

    /// A codec for a new connection of `socketType`.
    ///
    /// - Parameter maximumMessageSize: a larger frame closes the connection (at most 2 GiB:
    ///   sizes computed from it never overflow).
    package init(socketType: ZMTPSocketType, maximumMessageSize: Int) {
        self.socketType = socketType
        self.maximumMessageSize = min(max(0, maximumMessageSize), Int(Int32.max))
    }

    /// Bytes received and not parsed yet.
    package var unparsedBytes: Int { input.count - inputStart }

    /// Takes bytes the peer sent.
    package mutating func receive(_ bytes: UnsafeRawBufferPointer) {
        input.append(contentsOf: bytes)
    }

    /// Takes bytes the peer sent.
    package mutating func receive(_ bytes: some Collection<UInt8>) {
        input.append(contentsOf: bytes)
    }

    /// The next event in what was received; nil when more bytes are needed. Throws when the
    /// peer broke the protocol (and again on every later call).
    package mutating func next() throws(Failure) -> Event? {
        if let failure { throw failure }
        do {
            return try parse()
        } catch {
            failure = error
            input = []
            inputStart = 0
            frames = []
            throw error
        }
    }

    private mutating func parse() throws(Failure) -> Event? {
        while true {
            let start = inputStart
            let available = input.count - start
            if !greeted {
                // The signature's first byte shows at once whether this is a ZMTP peer.
                guard available >= 64 else {
                    if available > 0 && input[start] != 0xFF { throw .notZMTP }
                    return nil
                }
                guard ZMTP.isGreeting(input[start..<(start + 64)]) else { throw .notZMTP }
                inputStart += 64
                greeted = true
                continue
            }
            let flags: UInt8
            let body: Range<Int>
            switch ZMTP.frame(in: input, at: start, maximumSize: maximumMessageSize) {
            case .invalid: throw .invalidFrame
            case .incomplete(let needs):
                dropParsed()
                // A large frame's bytes come in many reads: room for all of it at once (only
                // when short of it, and only once the handshake ended: a stranger's header
                // alone reserves nothing).
                if let needs, isReady, input.capacity < inputStart + needs {
                    input.reserveCapacity(inputStart + needs)
                }
                return nil
            case .frame(let frameFlags, let frameBody): (flags, body) = (frameFlags, frameBody)
            }
            inputStart = body.upperBound
            if flags & 0x04 != 0 {
                if let event = try command(input[body]) { return event }
                continue
            }
            guard isReady else { throw .messageBeforeReady }
            if let event = try messageFrame(body, more: flags & 0x01 != 0) { return event }
        }
    }

    /// A command: the `READY`, a ZMTP 3.1 command, or `ERROR`.
    private mutating func command(_ body: ArraySlice<UInt8>) throws(Failure) -> Event? {
        guard let command = ZMTP.Command(body) else { throw .malformedCommand }
        // The NULL mechanism's handshake is READY and nothing else (libzmq closes a connection
        // whose first command is another).
        guard isReady || command.name == "READY" else { throw .unexpectedCommand(command.name) }
        switch command.name {
        case "READY":
            guard !isReady else { throw .unexpectedCommand(command.name) }
            let type = command.properties["socket-type"].map { String(decoding: $0, as: UTF8.self) }
            guard let type, socketType.peerTypes.contains(type) else { throw .incompatiblePeer(type) }
            isReady = true
            peerSocketType = type
            return .ready(socketType: type, identity: command.properties["identity"])
        case "ERROR":
            // The reason: a one-byte length, then the text.
            throw .peerError(String(decoding: command.body.dropFirst(1 + 5 + 1), as: UTF8.self))
        case "SUBSCRIBE", "CANCEL":
            // ZMTP 3.1's subscriptions, from a peer that took this one for 3.1.
            guard socketType == .publisher else { throw .unexpectedCommand(command.name) }
            let prefix = Data(command.body.dropFirst(1 + command.name.utf8.count))
            return .subscription(prefix: prefix, subscribe: command.name == "SUBSCRIBE")
        case "PING":
            // ZMTP 3.1's heartbeat: its context is what follows its name and 2-byte TTL (at
            // most 16 bytes, as libzmq).
            return .ping(context: Array(command.body.dropFirst(1 + 4 + 2).prefix(16)))
        default:
            return nil
        }
    }

    /// A message's frame: a message once its last frame came; a subscription for a publisher.
    private mutating func messageFrame(_ body: Range<Int>, more: Bool) throws(Failure) -> Event? {
        if socketType == .publisher {
            // A subscription is a message's first frame: 1 or 0, then the prefix (as libzmq
            // takes it); anything else is dropped.
            defer { inMessage = more }
            guard !inMessage, let first = body.first.map({ input[$0] }), first <= 1 else { return nil }
            return .subscription(prefix: Data(input[(body.lowerBound + 1)..<body.upperBound]), subscribe: first == 1)
        }
        // The frames of one message together (9 bytes counted for each frame's header):
        // endless frames marked "more" must not grow it without end.
        messageBytes += body.count + 9
        guard messageBytes <= maximumMessageSize + Self.messageOverhead else { throw .messageTooLarge }
        frames.append(body.isEmpty ? Data() : Data(input[body]))
        guard !more else { return nil }
        defer {
            frames = []
            messageBytes = 0
        }
        return .message(frames)
    }

    /// Drops the parsed front of the input (all of it, or most of it once it is large):
    /// amortised O(1) per byte.
    private mutating func dropParsed() {
        if inputStart == input.count {
            // A buffer grown for a large frame is given back.
            input.removeAll(keepingCapacity: input.capacity <= 1 << 20)
            inputStart = 0
        } else if inputStart > 65_536 && inputStart * 2 > input.count {
            input.removeFirst(inputStart)
            inputStart = 0
            if input.capacity > 1 << 20 && input.count < input.capacity / 4 { input = Array(input) }
        }
    }
}
