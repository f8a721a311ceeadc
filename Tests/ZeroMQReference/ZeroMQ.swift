// libzmq, the reference peer: the tests hold SkyrosZeroMQ's own ZMTP against its sockets, and
// the benchmarks' baseline runs on them. Test support only: no shipped binary links libzmq.
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

    /// Waits until the socket can be read, for at most `milliseconds` (-1: forever).
    package func waitForInput(milliseconds: Int) throws -> Bool {
        var item = zmq_pollitem_t(socket: handle, fd: 0, events: Int16(ZMQ_POLLIN), revents: 0)
        let ready = zmq_poll(&item, 1, milliseconds)
        guard ready >= 0 else { throw ZeroMQError.last("poll") }
        return ready > 0
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

/// The version of the linked libzmq, "4.3.4".
package var zeroMQVersion: String {
    var major: Int32 = 0
    var minor: Int32 = 0
    var patch: Int32 = 0
    zmq_version(&major, &minor, &patch)
    return "\(major).\(minor).\(patch)"
}
