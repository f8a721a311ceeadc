import Foundation
import Synchronization

#if canImport(Glibc)
    import Glibc
#endif

/// A TCP proxy between one machine's daemon and PostgreSQL that a test can break and heal:
/// the network faults of the sync fault campaign (issue 35), on this machine only.
///
/// The daemon's sync URL names the proxy's loopback ``port``; each connection it opens is
/// relayed to the server's port by one thread that `poll`s every socket. A fault covers one
/// direction or both — *outbound* is the machine's bytes to the server, *inbound* the server's
/// to the machine — and several may be active at once (their effects combine):
///
/// - ``FaultKind/cut``: the link resets. The first bytes that would cross in a cut direction
///   reset the connection on both sides (`SO_LINGER` 0: the peers read `ECONNRESET`), as a
///   router answering with a reset would; a new connection is reset at its first bytes. With
///   only *inbound* cut, the machine's statement reaches the server (and may commit) and the
///   reply resets the link: the lost commit reply of the exactly-once argument.
/// - ``FaultKind/blackHole``: bytes vanish without a word. Nothing in that direction is read
///   or written any more (the kernel's buffers fill and the sender stalls, as TCP
///   retransmitting into a black hole does); the peers notice only by their own timeouts and
///   keepalives. On heal, what was held is delivered, as TCP would once the path returns,
///   unless a peer gave up and closed meanwhile.
/// - ``FaultKind/slow(_:)``: every chunk waits that long before it is forwarded, in order.
///
/// Connections to a stopped server fail at their start: the proxy accepts, cannot reach the
/// server, and resets the machine's connection, as a refused connection would.
public final class FaultProxy: Sendable {
    /// Which way a fault applies, seen from the machine.
    public enum Direction: String, Sendable, CaseIterable {
        /// The server's bytes to the machine.
        case inbound
        /// The machine's bytes to the server.
        case outbound
        /// Both ways.
        case both

        func covers(_ way: Way) -> Bool { self == .both || (self == .inbound) == (way == .inbound) }
    }

    /// What a fault does to the bytes it covers.
    public enum FaultKind: Sendable, Equatable {
        /// The connection is reset (see ``FaultProxy``).
        case cut
        /// The bytes vanish until the fault heals.
        case blackHole
        /// Each chunk is forwarded after this delay.
        case slow(Duration)
    }

    /// One active fault, returned by ``inject(_:_:)`` and given back to ``heal(_:)``.
    public struct Fault: Sendable, Hashable {
        let id: Int
    }

    /// What the proxy did, for the campaign's report.
    public struct Statistics: Sendable {
        /// Connections accepted from the machine.
        public var connections = 0
        /// Connections reset by a cut (or because the server could not be reached).
        public var resets = 0
        /// Bytes forwarded each way.
        public var outboundBytes = 0
        public var inboundBytes = 0
    }

    /// One way of a connection.
    enum Way { case inbound, outbound }

    /// The loopback port the machine connects to.
    public let port: Int
    /// The server's loopback port.
    public let upstreamPort: Int

    private let core: ProxyCore

    fileprivate struct State {
        var faults: [Int: (kind: FaultKind, direction: Direction)] = [:]
        var nextFault = 0
        var stopping = false
        var statistics = Statistics()
        /// Reset every open connection at the next turn (``resetAll()``).
        var resetRequested = false
        /// The active faults that did something to a connection: a cut that reset one, a black
        /// hole that held bytes, a slow link that delayed some.
        var effective: Set<Int> = []

        /// Notes that the active faults of `kind` covering `way` acted.
        mutating func acted(_ way: Way, _ matches: (FaultKind) -> Bool) {
            for (id, fault) in faults where fault.direction.covers(way) && matches(fault.kind) { effective.insert(id) }
        }
    }

    /// Starts a proxy on a free loopback port relaying to `upstreamPort` on 127.0.0.1.
    public init(upstreamPort: Int) throws {
        self.upstreamPort = upstreamPort
        let descriptor = socket(
            AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue) | Int32(SOCK_NONBLOCK.rawValue), 0)
        guard descriptor >= 0 else { throw PostgresServerError.failed("socket: \(String(cString: strerror(errno)))") }
        var one: Int32 = 1
        setsockopt(descriptor, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var address = Self.loopback(port: 0)
        var length = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &address) { pointer in
            pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) { address in
                bind(descriptor, address, length) == 0 && getsockname(descriptor, address, &length) == 0
            }
        }
        guard bound, listen(descriptor, 128) == 0 else {
            close(descriptor)
            throw PostgresServerError.failed("cannot listen on 127.0.0.1: \(String(cString: strerror(errno)))")
        }
        port = Int(UInt16(bigEndian: address.sin_port))
        var pipeDescriptors: [Int32] = [0, 0]
        guard pipe(&pipeDescriptors) == 0 else {
            close(descriptor)
            throw PostgresServerError.failed("pipe: \(String(cString: strerror(errno)))")
        }
        for descriptor in pipeDescriptors {
            _ = fcntl(descriptor, F_SETFL, fcntl(descriptor, F_GETFL) | O_NONBLOCK)
            _ = fcntl(descriptor, F_SETFD, FD_CLOEXEC)
        }
        core = ProxyCore(
            listener: descriptor, wakeRead: pipeDescriptors[0], wakeWrite: pipeDescriptors[1],
            upstreamPort: upstreamPort)
        let loop = Loop(core: core)
        let thread = Thread { loop.run() }
        thread.name = "FaultProxy :\(port)"
        thread.start()
    }

    deinit { core.stop() }

    /// Starts a fault on every connection, open or to come, and returns it for ``heal(_:)``.
    @discardableResult
    public func inject(_ kind: FaultKind, _ direction: Direction = .both) -> Fault {
        let fault = core.state.withLock { state in
            state.nextFault += 1
            state.faults[state.nextFault] = (kind, direction)
            return Fault(id: state.nextFault)
        }
        core.wake()
        return fault
    }

    /// Ends a fault (nothing when it ended already), and returns whether it did something
    /// while it was active: a cut reset a connection, a black hole held bytes that had to
    /// cross, a slow link delayed some. A fault over an idle link did nothing.
    @discardableResult
    public func heal(_ fault: Fault) -> Bool {
        let acted = core.state.withLock { state in
            state.faults.removeValue(forKey: fault.id)
            return state.effective.remove(fault.id) != nil
        }
        core.wake()
        return acted
    }

    /// Ends every fault.
    public func healAll() {
        core.state.withLock {
            $0.faults.removeAll()
            $0.effective.removeAll()
        }
        core.wake()
    }

    /// Resets every open connection once (as a cut that heals at once would).
    public func resetAll() {
        core.state.withLock { $0.resetRequested = true }
        core.wake()
    }

    /// How many faults are active.
    public var activeFaults: Int { core.state.withLock { $0.faults.count } }

    /// What the proxy did so far.
    public var statistics: Statistics { core.state.withLock { $0.statistics } }

    /// Resets every connection and ends the proxy's thread; returns once it ended (5 s at
    /// most). Also done when the proxy is released.
    public func stop() { core.stop() }

    static func loopback(port: Int) -> sockaddr_in {
        var address = sockaddr_in()
        address.sin_family = sa_family_t(AF_INET)
        address.sin_port = in_port_t(UInt16(port).bigEndian)
        address.sin_addr.s_addr = inet_addr("127.0.0.1")
        return address
    }
}

/// What the proxy and its thread share: the sockets, the faults, the statistics.
private final class ProxyCore: Sendable {
    let listener: Int32
    let wakeRead: Int32
    let wakeWrite: Int32
    let upstreamPort: Int
    let state = Mutex(FaultProxy.State())
    private let finished = DispatchSemaphore(value: 0)

    init(listener: Int32, wakeRead: Int32, wakeWrite: Int32, upstreamPort: Int) {
        self.listener = listener
        self.wakeRead = wakeRead
        self.wakeWrite = wakeWrite
        self.upstreamPort = upstreamPort
    }

    deinit {
        close(listener)
        close(wakeRead)
        close(wakeWrite)
    }

    func wake() {
        var byte: UInt8 = 1
        _ = write(wakeWrite, &byte, 1)
    }

    func stop() {
        let first = state.withLock { state in
            defer { state.stopping = true }
            return !state.stopping
        }
        guard first else { return }
        wake()
        _ = finished.wait(timeout: .now() + 5)
    }

    func loopEnded() { finished.signal() }

    /// The effect of the active faults on one way: cut, held, and the delay.
    func effect(_ way: FaultProxy.Way) -> Effect {
        state.withLock { state in
            var effect = Effect(stopping: state.stopping, reset: state.resetRequested)
            for fault in state.faults.values where fault.direction.covers(way) {
                switch fault.kind {
                case .cut: effect.cut = true
                case .blackHole: effect.held = true
                case .slow(let delay): effect.delay = max(effect.delay, delay)
                }
            }
            return effect
        }
    }

    func count(_ update: (inout FaultProxy.Statistics) -> Void) {
        state.withLock { state in update(&state.statistics) }
    }

    func resetHandled() { state.withLock { $0.resetRequested = false } }

    /// Notes that the active faults of `kind` covering `way` acted on a connection.
    func acted(_ way: FaultProxy.Way, _ matches: @escaping (FaultProxy.FaultKind) -> Bool) {
        state.withLock { $0.acted(way, matches) }
    }
}

/// What the active faults do to one way of every connection.
private struct Effect {
    var cut = false
    var held = false
    var delay = Duration.zero
    var stopping: Bool
    var reset: Bool
}

/// The proxy's thread: every connection's two sockets, polled together.
private final class Loop: @unchecked Sendable {  // used by its one thread only
    /// One way of a connection: the chunks read and not yet written, each with its time.
    struct Pipe {
        var chunks: [(due: ContinuousClock.Instant, bytes: [UInt8])] = []
        var written = 0  // of the first chunk
        var ended = false  // the source closed
        var buffered: Int { chunks.reduce(0) { $0 + $1.bytes.count } - written }
    }

    final class Connection {
        let machine: Int32
        let server: Int32
        var outbound = Pipe()  // machine → server
        var inbound = Pipe()  // server → machine
        var closed = false
        init(machine: Int32, server: Int32) {
            self.machine = machine
            self.server = server
        }
    }

    let proxy: ProxyCore
    var connections: [Connection] = []
    static let bufferLimit = 1 << 20

    init(core: ProxyCore) { proxy = core }

    func run() {
        var buffer = [UInt8](repeating: 0, count: 65_536)
        while true {
            let outbound = proxy.effect(.outbound)
            let inbound = proxy.effect(.inbound)
            if outbound.stopping { break }
            if outbound.reset {
                for connection in connections { reset(connection) }
                proxy.resetHandled()
            }
            connections.removeAll { $0.closed }
            // What to watch: the listener, the wake-up pipe, and each socket that may be read
            // (its way not held, its buffer not full) or has bytes due to it.
            var descriptors = [
                pollfd(fd: proxy.listener, events: Int16(POLLIN), revents: 0),
                pollfd(fd: proxy.wakeRead, events: Int16(POLLIN), revents: 0),
            ]
            let now = ContinuousClock.now
            var nextDue: ContinuousClock.Instant?
            for connection in connections {
                var machineEvents: Int16 = 0
                var serverEvents: Int16 = 0
                if !outbound.held, !connection.outbound.ended, connection.outbound.buffered < Self.bufferLimit {
                    machineEvents |= Int16(POLLIN)
                }
                if !inbound.held, !connection.inbound.ended, connection.inbound.buffered < Self.bufferLimit {
                    serverEvents |= Int16(POLLIN)
                }
                if !outbound.held, let first = connection.outbound.chunks.first {
                    if first.due <= now {
                        serverEvents |= Int16(POLLOUT)
                    } else {
                        nextDue = min(nextDue ?? first.due, first.due)
                    }
                }
                if !inbound.held, let first = connection.inbound.chunks.first {
                    if first.due <= now {
                        machineEvents |= Int16(POLLOUT)
                    } else {
                        nextDue = min(nextDue ?? first.due, first.due)
                    }
                }
                // A socket with nothing to wait for is left out (-1): poll would report its
                // hang-up at every turn.
                descriptors.append(
                    pollfd(fd: machineEvents == 0 ? -1 : connection.machine, events: machineEvents, revents: 0))
                descriptors.append(
                    pollfd(fd: serverEvents == 0 ? -1 : connection.server, events: serverEvents, revents: 0))
            }
            // While a way is held, the loop looks for held bytes every 50 ms (a black hole is
            // counted only when it held some).
            var timeout: Int32 = outbound.held || inbound.held ? 50 : 1_000
            if let nextDue {
                let wait = nextDue - now
                timeout = Int32(
                    max(
                        1,
                        min(
                            Int64(timeout),
                            wait.components.seconds * 1_000 + wait.components.attoseconds / 1_000_000_000_000_000 + 1)))
            }
            let ready = poll(&descriptors, nfds_t(descriptors.count), timeout)
            if ready < 0 {
                if errno == EINTR { continue }
                break
            }
            if descriptors[1].revents != 0 {
                var drain = [UInt8](repeating: 0, count: 256)
                while read(proxy.wakeRead, &drain, drain.count) > 0 {}
            }
            if descriptors[0].revents & Int16(POLLIN) != 0 { acceptAll() }
            for (index, connection) in connections.enumerated() where index * 2 + 3 < descriptors.count {
                let machineEvents = descriptors[2 + index * 2].revents
                let serverEvents = descriptors[3 + index * 2].revents
                transfer(
                    connection, way: .outbound, effect: outbound, from: connection.machine, to: connection.server,
                    readable: machineEvents & Int16(POLLIN | POLLHUP | POLLERR) != 0, buffer: &buffer)
                transfer(
                    connection, way: .inbound, effect: inbound, from: connection.server, to: connection.machine,
                    readable: serverEvents & Int16(POLLIN | POLLHUP | POLLERR) != 0, buffer: &buffer)
            }
        }
        for connection in connections { reset(connection) }
        connections.removeAll()
        proxy.loopEnded()
    }

    /// Accepts every waiting connection and opens its server side.
    func acceptAll() {
        while true {
            let machine = accept(proxy.listener, nil, nil)
            guard machine >= 0 else { return }
            _ = fcntl(machine, F_SETFL, fcntl(machine, F_GETFL) | O_NONBLOCK)
            _ = fcntl(machine, F_SETFD, FD_CLOEXEC)
            proxy.count { $0.connections += 1 }
            var one: Int32 = 1
            setsockopt(machine, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            let server = socket(AF_INET, Int32(SOCK_STREAM.rawValue) | Int32(SOCK_CLOEXEC.rawValue), 0)
            var address = FaultProxy.loopback(port: proxy.upstreamPort)
            let connected =
                server >= 0
                && withUnsafePointer(to: &address) { pointer in
                    pointer.withMemoryRebound(to: sockaddr.self, capacity: 1) {
                        connect(server, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) == 0
                    }
                }
            guard connected else {
                if server >= 0 { Glibc.close(server) }
                Self.abort(machine)
                proxy.count { $0.resets += 1 }
                continue
            }
            setsockopt(server, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            _ = fcntl(server, F_SETFL, fcntl(server, F_GETFL) | O_NONBLOCK)
            connections.append(Connection(machine: machine, server: server))
        }
    }

    /// Moves what can move one way: reads what arrived, writes what is due.
    func transfer(
        _ connection: Connection, way: FaultProxy.Way,
        effect: Effect,
        from source: Int32, to destination: Int32, readable: Bool, buffer: inout [UInt8]
    ) {
        guard !connection.closed else { return }
        if effect.held {
            // Bytes waiting to cross, in the proxy or in the socket: the black hole holds them.
            var byte: UInt8 = 0
            let pending = way == .outbound ? connection.outbound.buffered : connection.inbound.buffered
            if pending > 0 || recv(source, &byte, 1, Int32(MSG_PEEK) | Int32(MSG_DONTWAIT)) > 0 {
                proxy.acted(way) { $0 == .blackHole }
            }
            return
        }
        var pipe = way == .outbound ? connection.outbound : connection.inbound
        defer {
            if !connection.closed {
                if way == .outbound { connection.outbound = pipe } else { connection.inbound = pipe }
            }
        }
        if readable, !pipe.ended {
            let count = read(source, &buffer, buffer.count)
            if count > 0 {
                if effect.cut {
                    reset(connection)
                    proxy.count { $0.resets += 1 }
                    proxy.acted(way) { $0 == .cut }
                    return
                }
                if effect.delay > .zero {
                    proxy.acted(way) { if case .slow = $0 { true } else { false } }
                }
                pipe.chunks.append((ContinuousClock.now + effect.delay, Array(buffer[0..<count])))
            } else if count == 0 || (errno != EAGAIN && errno != EINTR) {
                pipe.ended = true
            }
        }
        let now = ContinuousClock.now
        while let first = pipe.chunks.first, first.due <= now {
            if effect.cut {
                reset(connection)
                proxy.count { $0.resets += 1 }
                proxy.acted(way) { $0 == .cut }
                return
            }
            let written = first.bytes.withUnsafeBufferPointer { bytes in
                write(destination, bytes.baseAddress! + pipe.written, bytes.count - pipe.written)
            }
            if written < 0 {
                if errno == EAGAIN || errno == EINTR { break }
                reset(connection)
                return
            }
            proxy.count { statistics in
                if way == .outbound { statistics.outboundBytes += written } else { statistics.inboundBytes += written }
            }
            pipe.written += written
            if pipe.written == first.bytes.count {
                pipe.chunks.removeFirst()
                pipe.written = 0
            } else {
                break
            }
        }
        // A side that closed: once what it sent is delivered, the connection ends.
        if pipe.ended, pipe.chunks.isEmpty {
            close(connection)
        }
    }

    /// Ends a connection with resets on both sides.
    func reset(_ connection: Connection) {
        guard !connection.closed else { return }
        connection.closed = true
        Self.abort(connection.machine)
        Self.abort(connection.server)
    }

    /// Ends a connection in order (each side reads the end of its stream).
    func close(_ connection: Connection) {
        guard !connection.closed else { return }
        connection.closed = true
        Glibc.close(connection.machine)
        Glibc.close(connection.server)
    }

    /// Closes a socket with a reset (`SO_LINGER` with a zero timeout).
    static func abort(_ descriptor: Int32) {
        var linger = Glibc.linger(l_onoff: 1, l_linger: 0)
        setsockopt(descriptor, SOL_SOCKET, SO_LINGER, &linger, socklen_t(MemoryLayout<Glibc.linger>.size))
        Glibc.close(descriptor)
    }
}
