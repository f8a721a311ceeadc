import Foundation

#if canImport(Glibc)
    import Glibc
#endif

extension ZMTPServer {
    // MARK: ZMTP

    /// Takes in what the peer sent, until it has nothing more or the connection is paused:
    /// READY, messages, subscriptions, PINGs. False on a protocol error (``ZMTPCodec``), or a
    /// routing identity another connection holds.
    func parse(_ connection: Connection) -> Bool {
        while connection.isOpen && !connection.paused {
            let event: ZMTPCodec.Event?
            do {
                event = try connection.codec.next()
            } catch {
                return false
            }
            switch event {
            case nil: return true
            case .ready(_, let claimed):
                if connection.role == .publisher {
                    subscribers.append(connection)
                } else {
                    guard let identity = routingIdentity(claimed) else { return false }
                    connection.identity = identity
                    byIdentity[identity] = connection
                }
            case .subscription(let prefix, let subscribing):
                subscribe(connection, prefix, subscribing)
            case .ping(let context):
                // A PONG with the ping's context, unless the high-water mark's worth waits already.
                if hasRoom(connection) { enqueue(ZMTP.pong(context: context), to: connection) }
            case .message(let frames):
                guard let identity = connection.identity else { return false }
                if connection.queued == 0 { active.append(connection) }
                connection.inbox.append(
                    Message(frames: [identity] + frames, peer: connection.peer, descriptor: connection.descriptor))
                connection.inboxBytes += identity.count + frames.reduce(0) { $0 + $1.count }
                waiting += 1
                if connection.queued >= highWaterMark || connection.inboxBytes >= highWaterMarkBytes {
                    connection.paused = true
                    updateInterest(connection)
                }
            }
        }
        return true
    }

    /// The routing identity of a new connection of the router: the one its peer claimed
    /// (nil when another connection holds it: libzmq without `ZMQ_ROUTER_HANDOVER` closes
    /// it), else one made here, that skips those in use. A claim that starts with a zero byte
    /// is not taken: those are the ones made here (libzmq reserves them likewise), and one
    /// made for a connection that closed may still have replies on their way to it.
    private func routingIdentity(_ claimed: Data?) -> Data? {
        var identity = claimed ?? Data()
        if identity.first == 0 { identity = Data() }
        guard byIdentity[identity] == nil else { return nil }
        while identity.isEmpty || byIdentity[identity] != nil {
            identity = Data([0]) + withUnsafeBytes(of: nextIdentity.bigEndian) { Data($0) }
            nextIdentity &+= 1
        }
        return identity
    }
}
