import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// The listening ends of ZeroMQ `ROUTER` and `PUB` sockets on Unix-domain socket files
/// (`ipc://` endpoints), speaking ZMTP 3.0 with the NULL mechanism (rfc.zeromq.org/spec/23)
/// themselves, on the calling thread, with one `epoll` for all their connections.
///
/// libzmq runs a socket's I/O on a thread of its own: every request a server receives wakes
/// that thread, which queues it and wakes the server's thread; every reply and every event
/// goes back the same way. On a machine whose processors are all busy, each of those hops
/// waits for a processor. This server accepts, reads and writes its connections itself: a
/// request is read by the thread that handles it, and its reply, or an event to a subscriber,
/// is one `send` system call.
///
/// To its peers (libzmq's sockets, ``ZMTPSocket``, any ZMTP 3 client) a ``Role/router``
/// listener is libzmq's `ROUTER`:
/// - each connection gets a routing identity: the `Identity` property of the peer's READY
///   when it has one (a connection whose identity is already in use is closed), else five
///   bytes, a zero then a 32-bit counter that starts at random; a received message is handed
///   out with it as its first frame, and a message is sent to a connection by its identity
///   (to nobody when there is none: dropped, as libzmq does); an `Identity` that starts with a
///   zero byte (libzmq reserves those for the ones it makes) is not taken: the connection gets
///   one made here, so that no peer can claim one made for another connection and get its
///   replies;
/// - a peer that is not a `DEALER`, `REQ` or `ROUTER` is closed.
///
/// A ``Role/publisher`` listener is libzmq's `PUB`:
/// - a peer that is not a `SUB` or `XSUB`, or that the listener's `admit` refuses (libzmq's
///   `ZMQ_IPC_FILTER_UID`/`GID`), is closed;
/// - its subscriptions (ZMTP 3.0's messages `1`+prefix and `0`+prefix, or 3.1's SUBSCRIBE and
///   CANCEL commands; counted, as libzmq does) choose which published messages it gets: those
///   whose first frame starts with one of its prefixes; whatever else it sends is dropped.
///
/// On both:
/// - a connection that breaks the protocol, sends a frame larger than the maximum message size
///   (`ZMQ_MAXMSGSIZE`) or a message of several frames larger than it by more than 4 KiB, or
///   has not ended its handshake in time (30 s by default, `ZMQ_HANDSHAKE_IVL`) is closed;
/// - at most `highWaterMark` messages, and `highWaterMarkBytes` bytes of them, wait in each
///   direction for each connection (a message is queued while less than that waits): past
///   it, a message to it is dropped (`ZMQ_SNDHWM`), and the connection is not read until the
///   server takes its messages (`ZMQ_RCVHWM`; the peer's messages wait in the kernel, then in
///   the peer). libzmq counts messages only: 1,000 messages of 16 MiB would be 16 GiB.
///
/// What libzmq's socket monitor reports is told to ``acceptedConnection`` and
/// ``closingConnection``, with each connection's descriptor and listener's role, and each
/// message is handed out with the peer's credentials (`SO_PEERCRED`) and its connection's
/// descriptor (libzmq's `Peer-Address` and `ZMQ_SRCFD`). Another thread may `shutdown` a
/// connection's descriptor to have it closed, between those two calls. A listener that runs
/// out of descriptors stops accepting for 100 ms (connections wait in the backlog), where
/// libzmq 4.3 aborts the process.
///
/// Not thread-safe: use it from one thread at a time. Nothing blocks but the waits, which are
/// bounded by their timeout. Writes use `MSG_NOSIGNAL`.
package final class ZMTPServer {
    /// What a listener is to its peers.
    package enum Role: Sendable {
        /// libzmq's `ROUTER`: messages are received from and sent to one connection.
        case router
        /// libzmq's `PUB`: messages are published to every subscribed connection.
        case publisher
    }

    /// A message received: its frames (the first is the connection's identity), the peer's
    /// credentials, and the descriptor of its connection.
    package struct Message {
        package var frames: [Data]
        package var peer: PeerCredentials?
        package var descriptor: Int32
    }

    /// Called with a connection's descriptor, and its listener's role, once it is accepted.
    package var acceptedConnection: (Int32, Role) -> Void = { _, _ in }
    /// Called with a connection's descriptor, and its listener's role, just before it is closed.
    package var closingConnection: (Int32, Role) -> Void = { _, _ in }
    /// Told the routing identity of each `ROUTER` connection it closes (or whose peer left),
    /// after ``closingConnection``: the daemon forgets the connection's client there.
    package var closedRoutingIdentity: (Data) -> Void = { _ in }

    /// Connections open on the listeners of `role`.
    package func connectionCount(_ role: Role) -> Int { connections.values.count(where: { $0.role == role }) }

    private let maximumMessageSize: Int
    let highWaterMark: Int
    let highWaterMarkBytes: Int
    private let poller: Epoll
    /// The listening sockets, by descriptor.
    private var listeners: [Int32: Listener] = [:]
    /// The connections of the publisher listeners that finished their handshake.
    var subscribers: [Connection] = []
    private var connections: [Int32: Connection] = [:]
    var byIdentity: [Data: Connection] = [:]
    var nextIdentity = UInt32.random(in: 0...UInt32.max)
    /// The connections with messages received and not taken yet, in turn: each hands out one
    /// message, then goes to the back (libzmq's fair queueing).
    var active = FIFO<Connection>()
    /// Messages received and not taken yet, all connections.
    var waiting = 0
    /// Connections in the order they were accepted, until their handshake ended: one that has
    /// not ended it within `handshakeTimeout` is closed.
    private var handshaking = FIFO<Connection>()

    /// The most distinct prefixes a subscriber may subscribe to (libzmq has no bound).
    static let maximumSubscriptions = 4_096

    /// How long a connection may take to send its greeting and READY, in nanoseconds.
    private let handshakeTimeout: UInt64
    /// Descriptors of other files waited for beside the connections (see ``wait(orDescriptor:milliseconds:)``).
    private var watched: Set<Int32> = []
    /// When the listeners taken off the poll after running out of descriptors are put back
    /// (monotonic nanoseconds).
    private var listenersPausedUntil: UInt64?
    /// Where `recv` reads to.
    private let chunk = UnsafeMutableRawBufferPointer.allocate(byteCount: 65_536, alignment: 8)

    /// A listening socket.
    private struct Listener {
        let role: Role
        let admit: (PeerCredentials?) -> Bool
        var paused = false
    }

    /// The default of `highWaterMarkBytes`: 64 MiB, four messages of the daemon's largest.
    package static let defaultHighWaterMarkBytes = 64 << 20

    /// A server with no listener yet (see ``listen(_:endpoint:admit:)``).
    ///
    /// - Parameters:
    ///   - maximumMessageSize: a larger frame from a peer closes its connection.
    ///   - highWaterMark: the most messages waiting each way for each connection.
    ///   - highWaterMarkBytes: the most bytes of messages waiting each way for each connection
    ///     (a message is queued while less than that waits).
    ///   - handshakeTimeout: how long, in seconds, a connection may take to send its greeting
    ///     and READY (libzmq's `ZMQ_HANDSHAKE_IVL`, 30 s by default; 0: no limit).
    package init(
        maximumMessageSize: Int, highWaterMark: Int, highWaterMarkBytes: Int = ZMTPServer.defaultHighWaterMarkBytes,
        handshakeTimeout: TimeInterval = 30
    ) throws {
        // (At most 2 GiB: sizes computed from it never overflow.)
        self.maximumMessageSize = min(max(0, maximumMessageSize), Int(Int32.max))
        self.highWaterMark = max(1, highWaterMark)
        self.highWaterMarkBytes = max(1, highWaterMarkBytes)
        // 0: none (libzmq's meaning).
        self.handshakeTimeout = handshakeTimeout > 0 ? UInt64(min(handshakeTimeout, 86_400) * 1e9) : 0
        poller = try Epoll(capacity: 256)
    }

    /// Listens on the socket file of `endpoint` (`ipc://PATH`, which must not exist) as a
    /// `ROUTER` or a `PUB`; `admit` tells whether a peer with these credentials (nil: unknown)
    /// may stay connected: one it refuses is closed as soon as it is accepted.
    package func listen(_ role: Role, endpoint: String, admit: @escaping (PeerCredentials?) -> Bool = { _ in true })
        throws
    {
        let scheme = "ipc://"
        guard endpoint.hasPrefix(scheme) else { throw ZMTPError(code: EPROTONOSUPPORT, operation: "bind \(endpoint)") }
        let path = String(endpoint.dropFirst(scheme.count))
        let type = Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue)
        let fd = socket(AF_UNIX, type, 0)
        guard fd >= 0 else { throw ZMTPError(code: errno, operation: "socket") }
        let bound = withUnixSocketAddress(path) { Glibc.bind(fd, $0, $1) }
        guard bound == 0, Glibc.listen(fd, SOMAXCONN) == 0 else {
            let error = bound == nil ? ENAMETOOLONG : errno
            Glibc.close(fd)
            throw ZMTPError(code: error, operation: "bind \(endpoint)")
        }
        listeners[fd] = Listener(role: role, admit: admit)
        control(.add, fd, Epoll.readable)
    }

    deinit {
        close()
        chunk.deallocate()
    }

    /// Closes every connection and listener (the socket files stay: their owner removes them).
    package func close() {
        for connection in Array(connections.values) { drop(connection) }
        for fd in listeners.keys { Glibc.close(fd) }
        listeners = [:]
        active = FIFO()
        waiting = 0
    }

    // MARK: Messages

    /// The next message received, if one is here; when none is, reads what the connections
    /// have without waiting first.
    package func receive() -> Message? {
        if waiting == 0 { _ = pollOnce(timeout: 0) }
        guard waiting > 0 else { return nil }
        guard let connection = active.removeFirst(), var message = connection.inbox.removeFirst() else { return nil }
        waiting -= 1
        connection.inboxBytes -= message.frames.reduce(0) { $0 + $1.count }
        if connection.queued > 0 { active.append(connection) }
        if connection.paused && connection.isOpen && connection.queued <= highWaterMark / 2
            && connection.inboxBytes <= highWaterMarkBytes / 2
        {
            resume(connection)
            // What it had read past the mark may have closed it: its number is no longer its own.
            if !connection.isOpen { message.descriptor = -1 }
        }
        return message
    }

    /// Whether a message can be received now (what the connections have is read first).
    package var hasInput: Bool {
        if waiting == 0 { _ = pollOnce(timeout: 0) }
        return waiting > 0
    }

    /// Sends a message of one frame to the connection with `identity` (dropped when there is
    /// none, or when the high-water mark's worth already waits for it); returns whether it went
    /// out or waits to.
    @discardableResult
    @_specialize(exported:true,where Frame == [UInt8])  // the daemon's replies
    package func send<Frame: Collection<UInt8>>(to identity: Data, _ frame: Frame) -> Bool {
        send(to: identity, frames: CollectionOfOne(frame))
    }

    /// Sends a message of several frames to the connection with `identity` (see
    /// ``send(to:_:)``).
    @discardableResult
    @_specialize(exported:true,where Frames == CollectionOfOne<[UInt8]>)
    package func send<Frames: Collection>(to identity: Data, frames: Frames) -> Bool
    where Frames.Element: Collection<UInt8> {
        precondition(!frames.isEmpty, "a message has at least one frame")
        guard let connection = byIdentity[identity], hasRoom(connection) else { return false }
        enqueue(ZMTP.encode(frames), to: connection)
        flush(connection)
        return true
    }

    /// Publishes a message to every subscriber whose subscriptions take its first frame (but
    /// those for which the high-water mark's worth already waits: dropped for them); returns to
    /// how many it went out or waits to.
    @discardableResult
    @_specialize(exported:true,where Frame == [UInt8])  // the daemon's events
    package func publish<Frame: Collection<UInt8>>(_ frames: [Frame]) -> Int {
        precondition(!frames.isEmpty, "a message has at least one frame")
        var bytes: [UInt8]?
        var count = 0
        for connection in subscribers where hasRoom(connection) && connection.takes(frames[0]) {
            if bytes == nil { bytes = ZMTP.encode(frames) }
            enqueue(bytes!, to: connection)
            flush(connection)
            count += 1
        }
        return count
    }

    /// Waits until a message can be received or `descriptor` (a file descriptor; -1: none) is
    /// readable, for at most `milliseconds` (-1: forever), accepting, reading and writing
    /// meanwhile; returns which of the two are ready.
    package func wait(orDescriptor descriptor: Int32, milliseconds: Int) -> (socket: Bool, descriptor: Bool) {
        if descriptor >= 0 && !watched.contains(descriptor) {
            watched.insert(descriptor)
            control(.add, descriptor, Epoll.readable)
        }
        let deadline = ZMTP.deadline(milliseconds: milliseconds)
        var timeout: Int32 = waiting > 0 ? 0 : deadline.map { ZMTP.milliseconds(from: ZMTP.now(), to: $0) } ?? -1
        while true {
            let other = pollOnce(timeout: timeout, other: descriptor)
            let socket = waiting > 0
            if socket || other { return (socket, other) }
            let now = ZMTP.now()
            if let deadline, now >= deadline { return (false, false) }
            timeout = deadline.map { ZMTP.milliseconds(from: now, to: $0) } ?? -1
        }
    }

    /// Waits at most `microseconds` until a message can be received or `descriptor` (one
    /// given to ``wait(orDescriptor:milliseconds:)`` before; -1: none) is readable, reading and
    /// writing meanwhile; returns which of the two are ready. For waits shorter than that
    /// method's millisecond: `ppoll` on the `epoll` descriptor, then one `epoll_wait` that
    /// does not wait.
    package func waitBriefly(microseconds: Int, orDescriptor descriptor: Int32 = -1) -> (socket: Bool, descriptor: Bool)
    {
        if waiting > 0 { return (true, false) }
        guard microseconds > 0 else { return (false, false) }
        var poll = pollfd(fd: poller.descriptor, events: Int16(POLLIN), revents: 0)
        var timeout = timespec(tv_sec: microseconds / 1_000_000, tv_nsec: (microseconds % 1_000_000) * 1_000)
        let ready =
            if let ppoll = Self.ppoll { ppoll(&poll, 1, &timeout, nil) } else {
                Glibc.poll(&poll, 1, Int32(max(1, microseconds / 1_000)))
            }
        guard ready > 0 else { return (false, false) }
        let other = pollOnce(timeout: 0, other: descriptor)
        return (waiting > 0, other)
    }

    /// The C library's `ppoll` (a GNU extension Swift's Glibc module leaves out, looked up as
    /// ``Epoll``'s functions are); nil where it is missing (`poll`, to the millisecond, instead).
    private typealias PPoll =
        @convention(c) (UnsafeMutablePointer<pollfd>?, UInt, UnsafePointer<timespec>?, UnsafeRawPointer?) -> Int32
    private static let ppoll: PPoll? = dlsym(dlopen(nil, RTLD_NOW), "ppoll").map {
        unsafeBitCast($0, to: PPoll.self)
    }

    /// Accepts, reads and writes, without handing anything out, until `count` messages wait
    /// and `subscribers` connections of the publisher listeners have subscribed, or
    /// `milliseconds` passed; returns whether they have. (For tests that need requests to wait
    /// together, as they do in libzmq's queue while its owner is busy, and subscribers to get
    /// what is published then.)
    package func readAhead(until count: Int, subscribers: Int = 0, milliseconds: Int) -> Bool {
        let deadline = ZMTP.deadline(milliseconds: max(0, milliseconds)) ?? .max
        while waiting < count || self.subscribers.count(where: { !$0.subscriptions.isEmpty }) < subscribers {
            let now = ZMTP.now()
            guard now < deadline else { return false }
            _ = pollOnce(timeout: ZMTP.milliseconds(from: now, to: deadline))
        }
        return true
    }

    // MARK: The connections

    /// One `epoll_wait` for at most `timeout` milliseconds: accepts, reads and writes what is
    /// ready. Returns whether `other` is readable.
    private func pollOnce(timeout: Int32, other: Int32 = -1) -> Bool {
        if let until = listenersPausedUntil, ZMTP.now() >= until {
            listenersPausedUntil = nil
            for (fd, listener) in listeners where listener.paused {
                listeners[fd]?.paused = false
                control(.add, fd, Epoll.readable)
            }
        }
        // Woken in time for the listeners' return and the next handshake to expire.
        var timeout = timeout
        var wake = expireHandshakes()
        if let until = listenersPausedUntil { wake = min(wake ?? until, until) }
        if let wake {
            let wait = ZMTP.milliseconds(from: ZMTP.now(), to: wake)
            if timeout < 0 || wait < timeout { timeout = wait }
        }
        let count = poller.wait(timeout: timeout)
        guard count > 0 else { return false }
        var otherReady = false
        for index in 0..<count {
            let (fd, ready) = poller.event(index)
            if let listener = listeners[fd] {
                acceptAll(fd, listener)
            } else if let connection = connections[fd] {
                // Read first: what came before a failure is kept.
                if ready & (Epoll.readable | Epoll.hangUp | Epoll.error) != 0 { read(connection) }
                if connection.isOpen && ready & Epoll.writable != 0 { flush(connection) }
            } else if fd == other {
                otherReady = true
            }
        }
        return otherReady
    }

    private func acceptAll(_ listenerDescriptor: Int32, _ listener: Listener) {
        for _ in 0..<256 {
            let fd = accept(listenerDescriptor, nil, nil)
            guard fd >= 0 else {
                let error = errno
                if error == EMFILE || error == ENFILE || error == ENOBUFS || error == ENOMEM {
                    // Out of descriptors: the backlog waits, and accepting again is tried later.
                    control(.delete, listenerDescriptor, 0)
                    listeners[listenerDescriptor]?.paused = true
                    listenersPausedUntil = ZMTP.now() + 100_000_000
                }
                return
            }
            // (accept4 and struct ucred are GNU extensions Swift's Glibc module leaves out.)
            _ = fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK)
            _ = fcntl(fd, F_SETFD, FD_CLOEXEC)
            // struct ucred: pid, uid, gid.
            var credentials: (Int32, UInt32, UInt32) = (0, 0, 0)
            var size = socklen_t(MemoryLayout<(Int32, UInt32, UInt32)>.size)
            let peer: PeerCredentials? =
                getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &credentials, &size) == 0
                ? PeerCredentials(uid: credentials.1, gid: credentials.2, pid: credentials.0) : nil
            let connection = Connection(
                descriptor: fd, role: listener.role, peer: peer, maximumMessageSize: maximumMessageSize)
            connections[fd] = connection
            enqueue(ZMTP.handshake(connection.codec.socketType), to: connection)
            connection.interest = Epoll.readable
            if !control(.add, fd, connection.interest) { connection.interest = 0 }
            handshaking.append(connection)
            acceptedConnection(fd, listener.role)
            if connection.interest != 0 && listener.admit(peer) { flush(connection) } else { drop(connection) }
        }
    }

    /// Reads what the connection has (at most four chunks: the others get their turn), and
    /// parses it; closes the connection at its end, or on a protocol error.
    private func read(_ connection: Connection) {
        for _ in 0..<4 {
            guard connection.isOpen, !connection.paused else { return }
            switch ZMTP.receive(connection.descriptor, into: chunk) {
            case .bytes(let count):
                connection.codec.receive(UnsafeRawBufferPointer(rebasing: chunk[0..<count]))
                guard parse(connection) else { return drop(connection) }
                if !connection.output.isEmpty { flush(connection) }  // a PONG
                if count < chunk.count { return }
            case .interrupted: continue
            case .wouldBlock: return
            case .failed: return drop(connection)
            }
        }
    }

    /// Writes what the connection takes without blocking; closes it when writing fails.
    private func flush(_ connection: Connection) {
        while connection.isOpen && !connection.output.isEmpty {
            switch writeSome(connection) {
            case .bytes(let sent):
                // Past the messages wholly written, and into the first one that is not.
                var left = sent
                var done = 0
                while left > 0 {
                    let remaining = connection.output[done].count - connection.outputOffset
                    if left < remaining {
                        connection.outputOffset += left
                        break
                    }
                    left -= remaining
                    done += 1
                    connection.outputOffset = 0
                }
                for message in connection.output[0..<done] { connection.outputBytes -= message.count }
                connection.output.removeFirst(done)
            case .interrupted: continue
            case .wouldBlock:
                updateInterest(connection)
                return
            case .failed:
                read(connection)
                drop(connection)
                return
            }
        }
        updateInterest(connection)
    }

    /// One `send` of what waits for the connection: its first message (from where it was left),
    /// or, when several wait, as many as make 64 KiB in one buffer (as libzmq's encoder
    /// batches them): a subscriber that fell behind gets them in few writes, and the kernel
    /// holds them in few buffers.
    private func writeSome(_ connection: Connection) -> ZMTP.Transfer {
        let offset = connection.outputOffset
        if connection.output.count == 1 || connection.output[0].count - offset >= 65_536 {
            return connection.output[0].withUnsafeBytes {
                ZMTP.send(connection.descriptor, UnsafeRawBufferPointer(rebasing: $0[offset...]))
            }
        }
        var batch = Array(connection.output[0][offset...])
        for message in connection.output.dropFirst() {
            guard batch.count + message.count <= 65_536 else { break }
            batch += message
        }
        return batch.withUnsafeBytes { ZMTP.send(connection.descriptor, $0) }
    }

    /// Whether less than the high-water mark's worth waits to be written to the connection.
    func hasRoom(_ connection: Connection) -> Bool {
        connection.output.count < highWaterMark && connection.outputBytes < highWaterMarkBytes
    }

    /// Queues bytes to be written to the connection.
    func enqueue(_ bytes: [UInt8], to connection: Connection) {
        connection.output.append(bytes)
        connection.outputBytes += bytes.count
    }

    func updateInterest(_ connection: Connection) {
        guard connection.isOpen else { return }
        var interest: UInt32 = connection.paused ? 0 : Epoll.readable
        if !connection.output.isEmpty { interest |= Epoll.writable }
        guard interest != connection.interest else { return }
        // Off the poll while there is nothing to wait for: a hang-up is reported whatever the
        // interest, and a paused connection's would be reported on every wait.
        let operation: Epoll.Operation = connection.interest == 0 ? .add : interest == 0 ? .delete : .modify
        let added = operation == .add
        connection.interest = interest
        if !control(operation, connection.descriptor, interest) && operation != .delete {
            // A connection the poll does not hold would never be read again.
            if added { connection.interest = 0 }
            drop(connection)
        }
    }

    /// Closes a connection; its messages already received are still handed out.
    private func drop(_ connection: Connection) {
        guard connection.isOpen else { return }
        connection.isOpen = false
        closingConnection(connection.descriptor, connection.role)
        // Its messages still to be handed out name no descriptor: the number may be reused.
        connection.inbox.modifyEach { $0.descriptor = -1 }
        if connection.role == .publisher && connection.ready { subscribers.removeAll { $0 === connection } }
        if connection.interest != 0 { control(.delete, connection.descriptor, 0) }
        Glibc.close(connection.descriptor)
        connections[connection.descriptor] = nil
        if let identity = connection.identity, byIdentity[identity] === connection {
            byIdentity[identity] = nil
            if connection.role == .router { closedRoutingIdentity(identity) }
        }
        connection.output = []
        connection.outputBytes = 0
        connection.codec = ZMTPCodec(socketType: connection.codec.socketType, maximumMessageSize: 0)
    }

    /// Reads a paused connection again, starting with what it had sent past the high-water
    /// mark (already read from the kernel: no poll would report it).
    private func resume(_ connection: Connection) {
        connection.paused = false
        guard parse(connection) else { return drop(connection) }
        updateInterest(connection)
    }

    /// Closes the connections whose handshake has not ended within `handshakeTimeout` (what
    /// they sent is read first: a READY waiting in the kernel counts), and forgets those whose
    /// handshake ended or that are closed. Returns when the next one is due (nil: none).
    private func expireHandshakes() -> UInt64? {
        guard handshakeTimeout > 0 else {
            handshaking = FIFO()
            return nil
        }
        guard handshaking.count > 0 else { return nil }
        let now = ZMTP.now()
        while let connection = handshaking.first {
            if connection.isOpen && !connection.ready {
                let deadline = connection.acceptedAt + handshakeTimeout
                guard now >= deadline else { return deadline }
                read(connection)
                if connection.isOpen && !connection.ready { drop(connection) }
            }
            _ = handshaking.removeFirst()
        }
        return nil
    }

    /// Counts a subscription to `prefix`, or cancels one.
    func subscribe(_ connection: Connection, _ prefix: Data, _ subscribing: Bool) {
        if subscribing {
            // Bounded: a client makes 256 at most; past the bound, new prefixes are ignored.
            guard connection.subscriptions[prefix] != nil || connection.subscriptions.count < Self.maximumSubscriptions
            else { return }
            connection.subscriptions[prefix, default: 0] += 1
        } else if let count = connection.subscriptions[prefix] {
            connection.subscriptions[prefix] = count > 1 ? count - 1 : nil
        }
    }

    /// Changes what `epoll` waits for on `fd`; false when it failed (no memory, or past
    /// `max_user_watches`).
    @discardableResult
    private func control(_ operation: Epoll.Operation, _ fd: Int32, _ interest: UInt32) -> Bool {
        poller.control(operation, fd, interest)
    }

}

@available(*, unavailable)
extension ZMTPServer: Sendable {}
