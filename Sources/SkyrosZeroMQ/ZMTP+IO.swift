import Foundation

#if canImport(Glibc)
    import Glibc
#endif

/// An error of a ZMTP socket's system call (`socket`, `bind`, `epoll_create1`…) or of its
/// endpoint: its `errno` code and the operation.
package struct ZMTPError: Error, Sendable, CustomStringConvertible, Equatable {
    package let code: Int32
    package let operation: String
    package var message: String { String(cString: strerror(code)) }
    package var description: String { "ZMTP \(operation) failed: \(message) (\(code))" }
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
}

/// Calls `body` with the address of the Unix-domain socket file at `path` (for `bind` or
/// `connect`); nil, without calling it, when the path does not fit a socket address.
package func withUnixSocketAddress<T>(_ path: String, _ body: (UnsafePointer<sockaddr>, socklen_t) -> T) -> T? {
    var address = sockaddr_un()
    let bytes = Array(path.utf8)
    guard bytes.count < MemoryLayout.size(ofValue: address.sun_path) else { return nil }
    address.sun_family = sa_family_t(AF_UNIX)
    withUnsafeMutableBytes(of: &address.sun_path) { raw in
        for (index, byte) in bytes.enumerated() { raw[index] = byte }
    }
    return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { body($0, socklen_t(MemoryLayout<sockaddr_un>.size)) }
    }
}

/// The system calls and clocks both ends use.
extension ZMTP {
    /// When `milliseconds` from now will have passed (monotonic nanoseconds); nil for a
    /// negative number (no deadline) or one past the clock's range.
    static func deadline(milliseconds: Int) -> UInt64? {
        guard milliseconds >= 0 else { return nil }
        let (span, overflow) = UInt64(milliseconds).multipliedReportingOverflow(by: 1_000_000)
        let (deadline, later) = now().addingReportingOverflow(span)
        return overflow || later ? nil : deadline
    }

    /// What a `send` or `recv` on a non-blocking descriptor came to.
    enum Transfer {
        /// It moved this many bytes (at least 1).
        case bytes(Int)
        /// A signal came first (`EINTR`): try again.
        case interrupted
        /// Nothing can move now (`EAGAIN`): wait for the poll.
        case wouldBlock
        /// The connection ended (`recv` read end of file) or failed.
        case failed

        init(_ result: Int, error: Int32) {
            if result > 0 {
                self = .bytes(result)
            } else if result < 0 && error == EINTR {
                self = .interrupted
            } else if result < 0 && (error == EAGAIN || error == EWOULDBLOCK) {
                self = .wouldBlock
            } else {
                self = .failed
            }
        }
    }

    /// Sends `bytes` without blocking and without `SIGPIPE` (a peer gone is a failed transfer).
    static func send(_ descriptor: Int32, _ bytes: UnsafeRawBufferPointer) -> Transfer {
        let result = Glibc.send(descriptor, bytes.baseAddress, bytes.count, Int32(MSG_NOSIGNAL) | Int32(MSG_DONTWAIT))
        return Transfer(result, error: errno)
    }

    /// Receives into `buffer` without blocking.
    static func receive(_ descriptor: Int32, into buffer: UnsafeMutableRawBufferPointer) -> Transfer {
        let result = recv(descriptor, buffer.baseAddress, buffer.count, Int32(MSG_DONTWAIT))
        return Transfer(result, error: errno)
    }

    /// Monotonic nanoseconds.
    static func now() -> UInt64 {
        var time = timespec()
        clock_gettime(CLOCK_MONOTONIC, &time)
        return UInt64(time.tv_sec) * 1_000_000_000 + UInt64(time.tv_nsec)
    }

    /// The milliseconds from `now` to `deadline` (monotonic nanoseconds), rounded up: 0 when
    /// it has passed.
    static func milliseconds(from now: UInt64, to deadline: UInt64) -> Int32 {
        deadline > now ? Int32(clamping: (deadline - now + 999_999) / 1_000_000) : 0
    }
}
