import Foundation

extension ZMTPServer {
    /// One connection of a ``ZMTPServer``: its codec, its routing identity or subscriptions, what it
    /// sent that waits to be taken, and what waits to be written to it.
    final class Connection {
        let descriptor: Int32
        let role: Role
        let peer: PeerCredentials?
        /// A subscriber's prefixes, each with how many times it was subscribed.
        var subscriptions: [Data: Int] = [:]
        /// What the peer sent, parsed.
        var codec: ZMTPCodec
        /// Whether the peer's READY came.
        var ready: Bool { codec.isReady }
        var identity: Data?
        var output: [[UInt8]] = []
        var outputOffset = 0
        /// The bytes of `output` (from its first message's start).
        var outputBytes = 0
        /// Its messages received and not taken yet, and the bytes of their frames.
        var inbox = FIFO<Message>()
        var inboxBytes = 0
        var queued: Int { inbox.count }
        /// Whether it is not read (too many of its messages wait).
        var paused = false
        /// The events `epoll` waits for on it (0: it is off the poll, which would report a
        /// hang-up even then).
        var interest: UInt32 = 0
        /// When it was accepted (monotonic nanoseconds), for the handshake timeout.
        let acceptedAt = ZMTP.now()
        var isOpen = true

        init(descriptor: Int32, role: Role, peer: PeerCredentials?, maximumMessageSize: Int) {
            self.descriptor = descriptor
            self.role = role
            self.peer = peer
            codec = ZMTPCodec(
                socketType: role == .router ? .router : .publisher, maximumMessageSize: maximumMessageSize)
        }

        /// Whether a subscriber takes a message whose first frame is `topic`.
        func takes(_ topic: some Collection<UInt8>) -> Bool {
            if subscriptions.isEmpty { return false }
            if subscriptions[Data()] != nil { return true }
            var prefix = Data()
            for byte in topic {
                prefix.append(byte)
                if subscriptions[prefix] != nil { return true }
            }
            return false
        }
    }
}

@available(*, unavailable)
extension ZMTPServer.Connection: Sendable {}
