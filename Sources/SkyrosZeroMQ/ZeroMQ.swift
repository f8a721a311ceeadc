import CZeroMQ
import Foundation

/// An error of the ZeroMQ library: its `errno` code and message.
package struct ZeroMQError: Error, Sendable, CustomStringConvertible, Equatable {
    package let code: Int32
    package let operation: String
    package var message: String { String(cString: zmq_strerror(code)) }
    package var description: String { "ZeroMQ \(operation) failed: \(message) (\(code))" }

    /// The call would block, or a receive timed out.
    package var isTimeout: Bool { code == EAGAIN }

    static func last(_ operation: String) -> ZeroMQError {
        ZeroMQError(code: zmq_errno(), operation: operation)
    }
}

/// A ZeroMQ context: owns the I/O threads of its sockets. Thread-safe.
package final class ZeroMQContext: @unchecked Sendable {
    let handle: UnsafeMutableRawPointer

    package init() throws {
        guard let handle = zmq_ctx_new() else { throw ZeroMQError.last("zmq_ctx_new") }
        self.handle = handle
    }

    /// Makes blocking calls on every socket of the context fail (with ETERM), so that
    /// threads using them can finish; sockets must still be closed.
    package func shutdown() {
        zmq_ctx_shutdown(handle)
    }

    deinit {
        while zmq_ctx_term(handle) != 0 && zmq_errno() == EINTR {}
    }
}

/// A ZeroMQ socket. Not thread-safe: use it from one thread at a time (ZeroMQ's rule).
package final class ZeroMQSocket {
    package enum Kind: Sendable {
        case request, reply, dealer, router, publisher, subscriber, push, pull, pair

        var raw: Int32 {
            switch self {
            case .request: ZMQ_REQ
            case .reply: ZMQ_REP
            case .dealer: ZMQ_DEALER
            case .router: ZMQ_ROUTER
            case .publisher: ZMQ_PUB
            case .subscriber: ZMQ_SUB
            case .push: ZMQ_PUSH
            case .pull: ZMQ_PULL
            case .pair: ZMQ_PAIR
            }
        }
    }

    let handle: UnsafeMutableRawPointer
    private var isClosed = false
    /// Keeps the context alive as long as the socket.
    package let context: ZeroMQContext

    package init(context: ZeroMQContext, kind: Kind) throws {
        guard let handle = zmq_socket(context.handle, kind.raw) else { throw ZeroMQError.last("zmq_socket") }
        self.handle = handle
        self.context = context
        try setOption(ZMQ_LINGER, Int32(0))  // closing never blocks on unsent messages
    }

    deinit { close() }

    /// Closes the socket; further calls fail.
    package func close() {
        guard !isClosed else { return }
        isClosed = true
        zmq_close(handle)
    }

    package func bind(_ endpoint: String) throws {
        guard zmq_bind(handle, endpoint) == 0 else { throw ZeroMQError.last("bind \(endpoint)") }
    }

    package func connect(_ endpoint: String) throws {
        guard zmq_connect(handle, endpoint) == 0 else { throw ZeroMQError.last("connect \(endpoint)") }
    }

    package func disconnect(_ endpoint: String) throws {
        guard zmq_disconnect(handle, endpoint) == 0 else { throw ZeroMQError.last("disconnect \(endpoint)") }
    }

    // MARK: Options

    package func setOption(_ option: Int32, _ value: Int32) throws {
        var value = value
        guard zmq_setsockopt(handle, option, &value, MemoryLayout<Int32>.size) == 0 else {
            throw ZeroMQError.last("setsockopt \(option)")
        }
    }

    package func setOption(_ option: Int32, _ value: Int64) throws {
        var value = value
        guard zmq_setsockopt(handle, option, &value, MemoryLayout<Int64>.size) == 0 else {
            throw ZeroMQError.last("setsockopt \(option)")
        }
    }

    package func setOption(_ option: Int32, _ bytes: Data) throws {
        let result = bytes.withUnsafeBytes { zmq_setsockopt(handle, option, $0.baseAddress, bytes.count) }
        guard result == 0 else { throw ZeroMQError.last("setsockopt \(option)") }
    }

    /// Receive timeout in milliseconds (-1: block).
    package func setReceiveTimeout(milliseconds: Int32) throws { try setOption(ZMQ_RCVTIMEO, milliseconds) }
    /// Send timeout in milliseconds (-1: block).
    package func setSendTimeout(milliseconds: Int32) throws { try setOption(ZMQ_SNDTIMEO, milliseconds) }
    /// Messages larger than this are refused by the library (the peer is disconnected).
    package func setMaximumMessageSize(_ bytes: Int64) throws { try setOption(ZMQ_MAXMSGSIZE, bytes) }
    /// Receive high-water mark, in messages.
    package func setReceiveHighWaterMark(_ messages: Int32) throws { try setOption(ZMQ_RCVHWM, messages) }
    /// Send high-water mark, in messages.
    package func setSendHighWaterMark(_ messages: Int32) throws { try setOption(ZMQ_SNDHWM, messages) }
    /// Accepts `ipc://` connections only from peers whose user is one of `users`, whose
    /// primary group is one of `groups`, or who are listed as members of one of `groups` in the
    /// group database; every other connection is closed as soon as it is accepted (libzmq's
    /// `ZMQ_IPC_FILTER_UID`/`ZMQ_IPC_FILTER_GID`, checked with `SO_PEERCRED`). Set before `bind`.
    package func acceptIPCPeers(users: [uid_t], groups: [gid_t]) throws {
        for user in Set(users) { try setOption(ZMQ_IPC_FILTER_UID, Int32(bitPattern: user)) }
        for group in Set(groups) { try setOption(ZMQ_IPC_FILTER_GID, Int32(bitPattern: group)) }
    }
    /// Subscribes a SUB socket to messages starting with `prefix` (empty: all).
    package func subscribe(_ prefix: Data = Data()) throws { try setOption(ZMQ_SUBSCRIBE, prefix) }
    /// Removes a subscription made with ``subscribe(_:)`` (the same prefix).
    package func unsubscribe(_ prefix: Data = Data()) throws { try setOption(ZMQ_UNSUBSCRIBE, prefix) }

    // MARK: Messages

    /// Sends a multipart message.
    package func send(_ frames: [Data], dontWait: Bool = false) throws {
        precondition(!frames.isEmpty, "a message has at least one frame")
        for (index, frame) in frames.enumerated() {
            var flags: Int32 = index < frames.count - 1 ? ZMQ_SNDMORE : 0
            if dontWait { flags |= ZMQ_DONTWAIT }
            let sent = frame.withUnsafeBytes { buffer in zmq_send(handle, buffer.baseAddress, buffer.count, flags) }
            guard sent >= 0 else { throw ZeroMQError.last("send") }
        }
    }

    /// Receives a multipart message; throws a timeout error (``ZeroMQError/isTimeout``)
    /// when the receive timeout expires.
    package func receive(dontWait: Bool = false) throws -> [Data] {
        var frames: [Data] = []
        var message = zmq_msg_t()
        zmq_msg_init(&message)
        defer { zmq_msg_close(&message) }
        repeat {
            guard zmq_msg_recv(&message, handle, dontWait ? ZMQ_DONTWAIT : 0) >= 0 else {
                throw ZeroMQError.last("receive")
            }
            let size = zmq_msg_size(&message)
            frames.append(size == 0 ? Data() : Data(bytes: zmq_msg_data(&message), count: size))
        } while zmq_msg_more(&message) != 0
        return frames
    }

    /// Receives a multipart message with the credentials of the process that sent it, when
    /// the connection is an `ipc://` one (libzmq reads them with `SO_PEERCRED`), and the file
    /// descriptor of the connection it came from (`ZMQ_SRCFD`; -1 when libzmq does not say).
    package func receiveWithCredentials(dontWait: Bool = false) throws -> (
        frames: [Data], peer: PeerCredentials?, descriptor: Int32
    ) {
        var frames: [Data] = []
        var peer: PeerCredentials?
        var descriptor: Int32 = -1
        var message = zmq_msg_t()
        zmq_msg_init(&message)
        defer { zmq_msg_close(&message) }
        repeat {
            guard zmq_msg_recv(&message, handle, dontWait ? ZMQ_DONTWAIT : 0) >= 0 else {
                throw ZeroMQError.last("receive")
            }
            if peer == nil, let address = zmq_msg_gets(&message, "Peer-Address") {
                peer = PeerCredentials(peerAddress: UnsafeRawPointer(address).assumingMemoryBound(to: UInt8.self))
            }
            if descriptor < 0 { descriptor = zmq_msg_get(&message, ZMQ_SRCFD) }
            let size = zmq_msg_size(&message)
            frames.append(size == 0 ? Data() : Data(bytes: zmq_msg_data(&message), count: size))
        } while zmq_msg_more(&message) != 0
        return (frames, peer, descriptor)
    }

    /// Starts libzmq's monitor of this socket: the `events` (a mask of `ZMQ_EVENT_…`) are
    /// published on a `PAIR` socket bound at `endpoint` (an `inproc://` address), to be read
    /// with ``receiveMonitorEvent(dontWait:)`` by a `PAIR` socket connected to it.
    package func monitor(_ endpoint: String, events: Int32) throws {
        guard zmq_socket_monitor(handle, endpoint, events) == 0 else { throw ZeroMQError.last("monitor \(endpoint)") }
    }

    /// Receives one event of a socket monitor (see ``monitor(_:events:)``): its kind (a
    /// `ZMQ_EVENT_…` value) and value (for a connection accepted or gone, its file descriptor).
    package func receiveMonitorEvent(dontWait: Bool = false) throws -> ZeroMQMonitorEvent {
        let frames = try receive(dontWait: dontWait)
        guard let first = frames.first, first.count >= 6 else {
            return ZeroMQMonitorEvent(event: 0, value: 0)
        }
        // libzmq copies the two fields in the host's byte order.
        return first.withUnsafeBytes { raw in
            ZeroMQMonitorEvent(
                event: Int32(raw.loadUnaligned(fromByteOffset: 0, as: UInt16.self)),
                value: Int32(bitPattern: raw.loadUnaligned(fromByteOffset: 2, as: UInt32.self)))
        }
    }

    /// Waits until the socket can be read, for at most `milliseconds` (-1: forever).
    package func waitForInput(milliseconds: Int) throws -> Bool {
        var item = zmq_pollitem_t(socket: handle, fd: 0, events: Int16(ZMQ_POLLIN), revents: 0)
        let ready = zmq_poll(&item, 1, milliseconds)
        guard ready >= 0 else { throw ZeroMQError.last("poll") }
        return ready > 0
    }

    /// Waits until the socket can be read or `descriptor` (a file descriptor) is readable,
    /// for at most `milliseconds` (-1: forever); returns which of the two are ready.
    package func waitForInput(orDescriptor descriptor: Int32, milliseconds: Int) throws -> (socket: Bool, descriptor: Bool) {
        var items = [
            zmq_pollitem_t(socket: handle, fd: 0, events: Int16(ZMQ_POLLIN), revents: 0),
            zmq_pollitem_t(socket: nil, fd: descriptor, events: Int16(ZMQ_POLLIN), revents: 0),
        ]
        guard zmq_poll(&items, 2, milliseconds) >= 0 else { throw ZeroMQError.last("poll") }
        return (items[0].revents & Int16(ZMQ_POLLIN) != 0, items[1].revents & Int16(ZMQ_POLLIN) != 0)
    }

    /// Waits until any of `sockets` can be read; returns the indexes of those that can.
    package static func poll(_ sockets: [ZeroMQSocket], milliseconds: Int) throws -> [Int] {
        var items = sockets.map { zmq_pollitem_t(socket: $0.handle, fd: 0, events: Int16(ZMQ_POLLIN), revents: 0) }
        let ready = zmq_poll(&items, Int32(items.count), milliseconds)
        guard ready >= 0 else { throw ZeroMQError.last("poll") }
        return items.indices.filter { items[$0].revents & Int16(ZMQ_POLLIN) != 0 }
    }
}

@available(*, unavailable)
extension ZeroMQSocket: Sendable {}

/// One event of a socket monitor: its kind (`ZMQ_EVENT_ACCEPTED`, `ZMQ_EVENT_DISCONNECTED`, …)
/// and its value (the connection's file descriptor for those two; libzmq's event frame is a
/// 16-bit kind then a 32-bit value, in the host's byte order).
package struct ZeroMQMonitorEvent: Sendable, Equatable {
    package var event: Int32
    package var value: Int32

    package static let accepted = ZMQ_EVENT_ACCEPTED
    package static let disconnected = ZMQ_EVENT_DISCONNECTED
    package static let monitorStopped = ZMQ_EVENT_MONITOR_STOPPED
}

/// The version of the linked libzmq, "4.3.4".
package var zeroMQVersion: String {
    var major: Int32 = 0
    var minor: Int32 = 0
    var patch: Int32 = 0
    zmq_version(&major, &minor, &patch)
    return "\(major).\(minor).\(patch)"
}

/// The user, group and process of the peer of an `ipc://` connection.
package struct PeerCredentials: Sendable, Hashable {
    package var uid: UInt32
    package var gid: UInt32
    package var pid: Int32

    package init(uid: UInt32, gid: UInt32, pid: Int32) {
        self.uid = uid
        self.gid = gid
        self.pid = pid
    }

    /// Parses libzmq's `Peer-Address` of a Unix-domain connection, which ends with
    /// `:uid:gid:pid`; nil for any other address.
    package init?(peerAddress: String) {
        var bytes = Array(peerAddress.utf8)
        bytes.append(0)
        guard let parsed = bytes.withUnsafeBufferPointer({ PeerCredentials(peerAddress: $0.baseAddress!) }) else {
            return nil
        }
        self = parsed
    }

    /// Parses a NUL-terminated `Peer-Address` in place: read for every request the daemon
    /// receives, so without making a string.
    init?(peerAddress: UnsafePointer<UInt8>) {
        var end: Int? = strlen(UnsafeRawPointer(peerAddress).assumingMemoryBound(to: CChar.self))
        /// The field that ends at `end`: 1 to 10 digits, after a ':' or at the start.
        func field() -> UInt64? {
            guard let last = end else { return nil }
            var start = last
            while start > 0 && peerAddress[start - 1] != UInt8(ascii: ":") { start -= 1 }
            guard start < last, last - start <= 10 else { return nil }
            var value: UInt64 = 0
            for index in start..<last {
                let digit = peerAddress[index] &- UInt8(ascii: "0")
                guard digit < 10 else { return nil }
                value = value * 10 + UInt64(digit)
            }
            end = start > 0 ? start - 1 : nil
            return value
        }
        guard let pid = field().flatMap(Int32.init(exactly:)), let gid = field().flatMap(UInt32.init(exactly:)),
            let uid = field().flatMap(UInt32.init(exactly:))
        else { return nil }
        self.init(uid: uid, gid: gid, pid: pid)
    }
}
