import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// The client end of a ZeroMQ `DEALER` or `SUB` socket on a Unix-domain socket file (an
/// `ipc://` endpoint), speaking ZMTP 3.0 with the NULL mechanism (rfc.zeromq.org/spec/23)
/// itself, on the calling thread.
///
/// libzmq runs every socket's I/O on a thread of its own: each message a client sends or
/// receives wakes that thread, which then wakes the caller. A client that makes one request at
/// a time pays those two thread hops on each one (about a third of a shared-stack client's
/// processor time per save). This socket writes and reads the connection itself: a request is
/// one `send` system call, and its reply wakes the waiting thread directly. To the daemon's
/// sockets (``ZMTPServer``, or libzmq's `ROUTER` and `PUB`) this is any ZMTP 3.0 peer.
///
/// It behaves as libzmq's connecting socket does where a client can tell:
/// - it connects when first used, and again after a connection failed or was closed by the
///   peer: 1 to 2 times ``reconnectInterval`` later, at random so that the clients of a
///   restarted daemon do not all come back at the same instant (libzmq's
///   `ZMQ_RECONNECT_IVL`, and its jitter), or at once when the lost connection had lasted
///   ``longLivedConnection`` (nobody reads an idle socket: libzmq would have reconnected in
///   the background long before the next use); while the caller waits or sends;
/// - a message sent while there is no connection, or before the peer's READY command came
///   (libzmq closes a connection whose message arrives before it sent its own READY), waits
///   for the connection to be ready; a message the
///   connection was lost in the middle of is sent again whole on the next one (its part that
///   went out is discarded by the peer with the connection);
/// - a `SUB` socket sends its subscriptions again on each new connection;
/// - at most `sendQueueLimit` messages, and `sendQueueBytes` bytes of them, wait to be
///   written (a message is queued while less than that waits): past it, ``send(_:)`` drops
///   the message and returns false (libzmq's `ZMQ_SNDHWM`, where a send fails with `EAGAIN`);
/// - a frame larger than its maximum message size closes the connection (`ZMQ_MAXMSGSIZE`), and
///   so does anything else ``ZMTPCodec`` refuses (a peer of another socket type, a command
///   before its READY…); a ZMTP 3.1 peer's PING is answered with a PONG.
///
/// Not thread-safe: use it from one thread at a time (its state is not checked for
/// overlapping access at run time: `@exclusivity(unchecked)`, a check per access on the
/// request path). Nothing in it blocks past the timeout a
/// caller gives: the descriptor is non-blocking and every wait is a bounded `poll`. Writes use
/// `MSG_NOSIGNAL`: a peer that went away is a lost connection, never a `SIGPIPE`.
package final class ZMTPSocket {
    /// The socket types a client uses.
    package enum Kind: Sendable {
        case dealer, subscriber

        /// Its type in ZMTP.
        var socketType: ZMTPSocketType { self == .dealer ? .dealer : .subscriber }
    }

    /// What this socket is to the peer.
    package let kind: Kind
    /// The socket file it connects to.
    package let path: String
    /// How long after a failed or lost connection the next one is tried (libzmq's default).
    package static let reconnectInterval: UInt64 = 100_000_000
    /// A lost connection that had lasted this long is made again at once (1 s).
    package static let longLivedConnection: UInt64 = 1_000_000_000
    /// For tests: how many connections were made (each handshake sent counts).
    @exclusivity(unchecked) package private(set) var connectionsMade = 0
    /// Whether a connection is open (it may still be handshaking).
    package var isConnected: Bool { descriptor >= 0 }
    /// Whether the peer's READY command came on the connection: messages may go out.
    @exclusivity(unchecked) package private(set) var isReady = false

    private let maximumMessageSize: Int
    private let receiveBufferBytes: Int32?
    private let receiveQueueLimit: Int
    private let receiveQueueBytes: Int
    private let sendQueueLimit: Int
    private let sendQueueBytes: Int
    @exclusivity(unchecked) private var descriptor: Int32 = -1
    /// When the next connection may be tried (monotonic nanoseconds).
    @exclusivity(unchecked) private var nextConnect: UInt64 = 0
    /// When the current connection was made (monotonic nanoseconds).
    @exclusivity(unchecked) private var connectedAt: UInt64 = 0
    /// What the peer sent on this connection, parsed.
    @exclusivity(unchecked) private var codec: ZMTPCodec
    /// Whole messages received and not handed out yet (from `receivedStart`).
    @exclusivity(unchecked) private var received: [[Data]] = []
    @exclusivity(unchecked) private var receivedStart = 0
    /// The bytes of the frames of the messages received and not handed out yet.
    @exclusivity(unchecked) private var receivedBytes = 0
    /// What to write on the current connection, in order, the first one `outputOffset` bytes
    /// in; `isMessage` tells a caller's message (sent again on a new connection if not wholly
    /// written) from the handshake and subscriptions (which each connection makes anew).
    @exclusivity(unchecked) private var output: [(bytes: [UInt8], isMessage: Bool)] = []
    @exclusivity(unchecked) private var outputOffset = 0
    /// Messages waiting for a connection.
    @exclusivity(unchecked) private var waiting: [[UInt8]] = []
    /// The subscriptions of a `SUB` socket, in the order they were made.
    @exclusivity(unchecked) private var subscriptions: [Data] = []
    /// Where `recv` reads to.
    private let chunk = UnsafeMutableRawBufferPointer.allocate(byteCount: 65_536, alignment: 8)

    /// A socket of `kind` for the socket file of `endpoint` (`ipc://PATH`); it connects when
    /// first used.
    ///
    /// - Parameters:
    ///   - maximumMessageSize: a larger frame from the peer closes the connection.
    ///   - receiveBufferBytes: the kernel receive buffer (`SO_RCVBUF`), when not the system's.
    ///   - receiveQueueLimit: it stops reading while this many received messages wait for the
    ///     caller (one read may bring in more; 0: no limit); meanwhile messages wait in the
    ///     kernel's buffer, then in the peer's queue.
    ///   - receiveQueueBytes: it stops reading likewise while the received messages waiting
    ///     make this many bytes (libzmq counts messages only: 1,000 of 16 MiB would be 16 GiB).
    ///   - sendQueueLimit: the most messages waiting to be written (for a connection, or on
    ///     one); past it, a message sent is dropped.
    ///   - sendQueueBytes: the most bytes of messages waiting to be written.
    package init(
        kind: Kind, endpoint: String, maximumMessageSize: Int, receiveBufferBytes: Int32? = nil,
        receiveQueueLimit: Int = 1_000, receiveQueueBytes: Int = 64 << 20, sendQueueLimit: Int = 1_000,
        sendQueueBytes: Int = 64 << 20
    ) throws {
        let scheme = "ipc://"
        guard endpoint.hasPrefix(scheme) else {
            throw ZMTPError(code: EPROTONOSUPPORT, operation: "connect \(endpoint)")
        }
        let path = String(endpoint.dropFirst(scheme.count))
        guard withUnixSocketAddress(path, { _, _ in () }) != nil else {
            throw ZMTPError(code: ENAMETOOLONG, operation: "connect \(endpoint)")
        }
        self.kind = kind
        self.path = path
        self.maximumMessageSize = maximumMessageSize
        codec = ZMTPCodec(socketType: kind.socketType, maximumMessageSize: maximumMessageSize)
        self.receiveBufferBytes = receiveBufferBytes
        self.receiveQueueLimit = receiveQueueLimit > 0 ? receiveQueueLimit : .max
        self.receiveQueueBytes = max(1, receiveQueueBytes)
        self.sendQueueLimit = max(1, sendQueueLimit)
        self.sendQueueBytes = max(1, sendQueueBytes)
    }

    deinit {
        close()
        chunk.deallocate()
    }

    /// Closes the connection and forgets every message not yet sent or received; the next use
    /// connects anew (what closing a libzmq socket and making another one does). A `SUB`
    /// socket keeps its subscriptions, and sends them on the new connection.
    package func close() {
        dropConnection()
        output = []
        outputOffset = 0
        waiting = []
        received = []
        receivedStart = 0
        receivedBytes = 0
        nextConnect = 0
    }

    /// Connects now (rather than when first used) and writes the handshake; a failure leaves
    /// the next try to the next use.
    package func open() {
        connectIfDue()
        flush()
    }

    /// Waits, for at most `milliseconds`, until the peer's READY came on a connection and
    /// what waited for it (subscriptions, messages) is written; returns at once when there
    /// is no connection. Returns ``isReady``. Messages received meanwhile are kept.
    @discardableResult
    package func waitUntilReady(milliseconds: Int) -> Bool {
        let deadline = ZMTP.deadline(milliseconds: max(0, milliseconds)) ?? .max
        while descriptor >= 0 && !isReady {
            let now = ZMTP.now()
            guard now < deadline, pollOnce(other: -1, timeout: ZMTP.milliseconds(from: now, to: deadline)) != nil else {
                break
            }
        }
        flush()
        return isReady
    }

    // MARK: Messages

    /// Sends a message (its frames: `Data`, `[UInt8]`…); it goes out now, or on the next
    /// connection. Returns false, and drops it, when the send queue is full (`sendQueueLimit`
    /// messages, or `sendQueueBytes` bytes, wait to be written).
    @discardableResult
    @_specialize(exported:true,where Frame == [UInt8])  // the client's requests
    package func send<Frame: Collection<UInt8>>(_ message: [Frame]) -> Bool {
        precondition(!message.isEmpty, "a message has at least one frame")
        precondition(kind == .dealer, "a SUB socket sends nothing but its subscriptions")
        connectIfDue()
        if !hasRoom() {
            flush()
            guard hasRoom() else { return false }
        }
        let bytes = ZMTP.encode(message)
        guard isReady else {
            waiting.append(bytes)
            return true
        }
        output.append((bytes, true))
        flush()
        return true
    }

    /// Whether less than the send queue's worth of messages waits to be written.
    private func hasRoom() -> Bool {
        var count = waiting.count
        var bytes = waiting.reduce(0) { $0 + $1.count } - (output.first?.isMessage == true ? outputOffset : 0)
        for entry in output where entry.isMessage {
            count += 1
            bytes += entry.bytes.count
        }
        return count < sendQueueLimit && bytes < sendQueueBytes
    }

    /// The next message received, if one is here (see ``waitForInput(milliseconds:)``).
    package func receive() -> [Data]? {
        guard receivedStart < received.count else { return nil }
        let message = received[receivedStart]
        receivedStart += 1
        receivedBytes -= message.reduce(0) { $0 + $1.count }
        if receivedStart == received.count {
            received.removeAll(keepingCapacity: true)
            receivedStart = 0
        }
        return message
    }

    /// Waits until a message can be received, for at most `milliseconds` (-1: forever),
    /// connecting and writing what waits meanwhile.
    package func waitForInput(milliseconds: Int) -> Bool {
        wait(orDescriptor: -1, milliseconds: milliseconds).socket
    }

    /// Waits until a message can be received or `descriptor` (a file descriptor) is readable,
    /// for at most `milliseconds` (-1: forever); returns which of the two are ready.
    package func waitForInput(orDescriptor descriptor: Int32, milliseconds: Int) -> (socket: Bool, descriptor: Bool) {
        wait(orDescriptor: descriptor, milliseconds: milliseconds)
    }

    // MARK: Subscriptions

    /// Subscribes a `SUB` socket to messages whose first frame starts with `prefix` (empty:
    /// all); each connection sends the subscriptions again.
    package func subscribe(_ prefix: Data = Data()) {
        precondition(kind == .subscriber, "only a SUB socket subscribes")
        guard !subscriptions.contains(prefix) else { return }
        subscriptions.append(prefix)
        sendSubscription(prefix, subscribe: true)
    }

    /// Removes a subscription made with ``subscribe(_:)``.
    package func unsubscribe(_ prefix: Data = Data()) {
        precondition(kind == .subscriber, "only a SUB socket subscribes")
        guard let index = subscriptions.firstIndex(of: prefix) else { return }
        subscriptions.remove(at: index)
        sendSubscription(prefix, subscribe: false)
    }

    /// ZMTP 3.0's subscription message: a frame of 1 (subscribe) or 0 (cancel), then the prefix.
    private func sendSubscription(_ prefix: Data, subscribe: Bool) {
        guard isReady else { return }
        var bytes: [UInt8] = []
        ZMTP.appendSubscription(to: &bytes, prefix, subscribe: subscribe)
        output.append((bytes, false))
        flush()
    }

    // MARK: The connection

    /// When to try again after a failure: 1 to 2 intervals from now (libzmq's jitter).
    private static func retryTime() -> UInt64 {
        ZMTP.now() + reconnectInterval + UInt64.random(in: 0..<reconnectInterval)
    }

    private func connectIfDue() {
        guard descriptor < 0, ZMTP.now() >= nextConnect else { return }
        connect()
    }

    /// Opens a connection and queues the handshake (greeting, READY); the subscriptions and
    /// the messages that wait go out once the peer's READY came (``peerIsReady()``). On
    /// failure, the next try is due after the interval.
    private func connect() {
        let socketType = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue)
        let fd = socket(AF_UNIX, socketType, 0)
        guard fd >= 0 else {
            nextConnect = Self.retryTime()
            return
        }
        if var size = receiveBufferBytes {
            _ = setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &size, socklen_t(MemoryLayout<Int32>.size))
        }
        // A Unix-domain connect completes at once, or fails (no listener, a full backlog).
        guard withUnixSocketAddress(path, { Glibc.connect(fd, $0, $1) }) == 0 else {
            Glibc.close(fd)
            nextConnect = Self.retryTime()
            return
        }
        descriptor = fd
        connectedAt = ZMTP.now()
        connectionsMade += 1
        output = [(ZMTP.handshake(kind.socketType), false)]
        outputOffset = 0
    }

    /// The peer's READY came: the subscriptions, then the messages that waited, go out.
    private func peerIsReady() {
        isReady = true
        var subscribing: [UInt8] = []
        for prefix in subscriptions { ZMTP.appendSubscription(to: &subscribing, prefix, subscribe: true) }
        if !subscribing.isEmpty { output.append((subscribing, false)) }
        output += waiting.map { ($0, true) }
        waiting = []
    }

    /// Closes the connection: what was not wholly written of the caller's messages waits for
    /// the next one (due at once when this one was long-lived, else after the interval, so
    /// that a peer that closes every connection is not hammered); what was read of an
    /// incomplete message is lost.
    private func dropConnection() {
        guard descriptor >= 0 else { return }
        let now = ZMTP.now()
        Glibc.close(descriptor)
        descriptor = -1
        isReady = false
        codec = ZMTPCodec(socketType: kind.socketType, maximumMessageSize: maximumMessageSize)
        waiting = output.filter(\.isMessage).map(\.bytes) + waiting
        output = []
        outputOffset = 0
        nextConnect = now - connectedAt >= Self.longLivedConnection ? now : Self.retryTime()
    }

    /// Writes what the connection takes without blocking. A connection that fails is read
    /// first (what the peer sent before it went away is kept), then closed.
    private func flush() {
        while descriptor >= 0, let first = output.first {
            let offset = outputOffset
            switch first.bytes.withUnsafeBytes({
                ZMTP.send(descriptor, UnsafeRawBufferPointer(rebasing: $0[offset...]))
            }) {
            case .bytes(let sent):
                outputOffset += sent
                if outputOffset == first.bytes.count {
                    output.removeFirst()
                    outputOffset = 0
                }
            case .interrupted: continue
            case .wouldBlock: return
            case .failed:
                readAvailable()
                dropConnection()
            }
        }
    }

    /// Reads what has arrived (up to the receive queue's limit) and parses it.
    private func readAvailable() {
        while descriptor >= 0, received.count - receivedStart < receiveQueueLimit, receivedBytes < receiveQueueBytes {
            switch ZMTP.receive(descriptor, into: chunk) {
            case .bytes(let count):
                codec.receive(UnsafeRawBufferPointer(rebasing: chunk[0..<count]))
                guard parse() else {
                    dropConnection()
                    return
                }
                if count < chunk.count { return }  // drained; poll says when there is more
            case .interrupted: continue
            case .wouldBlock: return
            case .failed: dropConnection()  // closed by the peer, or failed
            }
        }
    }

    private func wait(orDescriptor other: Int32, milliseconds: Int) -> (socket: Bool, descriptor: Bool) {
        let deadline = ZMTP.deadline(milliseconds: milliseconds)
        var first = true
        while true {
            connectIfDue()
            flush()
            if receivedStart < received.count { return (true, false) }
            let now = ZMTP.now()
            if !first, let deadline, now >= deadline { return (false, false) }
            first = false
            // Until the deadline, or the next connection try while there is none.
            var until = deadline
            if descriptor < 0 { until = min(until ?? .max, nextConnect) }
            guard
                let otherReady = pollOnce(
                    other: other, timeout: until.map { ZMTP.milliseconds(from: now, to: $0) } ?? -1)
            else { return (false, false) }
            if otherReady || receivedStart < received.count {
                return (receivedStart < received.count, otherReady)
            }
        }
    }

    /// One `poll` of the connection (none: only the timeout counts) and of `other` (when not
    /// negative), for at most `timeout` milliseconds (-1: forever); reads what came, then
    /// writes what the connection takes. Returns whether `other` is readable; nil when `poll`
    /// failed (other than interrupted, which counts as nothing ready).
    private func pollOnce(other: Int32, timeout: Int32) -> Bool? {
        // Two entries on the stack (no array allocated per wait); a negative descriptor is
        // ignored by poll.
        var items = (
            pollfd(fd: descriptor, events: Int16(POLLIN) | (output.isEmpty ? 0 : Int16(POLLOUT)), revents: 0),
            pollfd(fd: other, events: Int16(POLLIN), revents: 0)
        )
        let count: nfds_t = other >= 0 ? 2 : 1
        let polled = withUnsafeMutableBytes(of: &items) {
            poll($0.baseAddress!.assumingMemoryBound(to: pollfd.self), count, timeout)
        }
        guard polled >= 0 else { return errno == EINTR ? false : nil }
        // Read first: what came before a failure is kept (libzmq reads before it writes too).
        let socketEvents = items.0.revents
        if socketEvents & Int16(POLLIN | POLLHUP | POLLERR) != 0 { readAvailable() }
        if socketEvents & Int16(POLLOUT) != 0 { flush() }
        return other >= 0 && items.1.revents != 0
    }

    /// Takes in what the peer sent: its READY, messages, and PINGs (answered). False on a
    /// protocol error or an ERROR command.
    private func parse() -> Bool {
        while true {
            let event: ZMTPCodec.Event?
            do {
                event = try codec.next()
            } catch {
                return false
            }
            switch event {
            case nil: return true
            case .ready: peerIsReady()
            case .message(let frames):
                received.append(frames)
                receivedBytes += frames.reduce(0) { $0 + $1.count }
            case .ping(let context): output.append((ZMTP.pong(context: context), false))
            case .subscription: return false  // never to a DEALER or a SUB (the codec refuses it)
            }
        }
    }
}

@available(*, unavailable)
extension ZMTPSocket: Sendable {}
