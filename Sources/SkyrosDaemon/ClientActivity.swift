import Foundation
import Skyros
import SkyrosZeroMQ

/// What the daemon knows of each connection for `skyros status`: its user (peer
/// credentials), when it first and last sent a request, how many saves it committed; and
/// the saves of the last minute, for the save rate and latency percentiles.
struct ClientActivity {
    struct Connection {
        var uid: UInt32?
        var connectedAt: Date
        var lastSeenAt: Date
        var saves = 0
    }

    /// The open connections that sent a request, by routing identity.
    private(set) var connections: [Data: Connection] = [:]
    /// How many connections that sent a request have closed since the daemon started.
    private(set) var closedCount = 0
    /// The most connections remembered (past it, the oldest are forgotten).
    let maximumConnections: Int

    /// One second of saves: how many, and a sample of their latencies in microseconds.
    private struct Second {
        var second: Int
        var count = 0
        var latencies: [Double] = []
    }

    private var seconds: [Second] = []
    /// Picks the latencies kept past the first ones of a second (reservoir sampling): a
    /// generator of its own (Skyros' SplitMix64), since the system's asks the kernel
    /// (`getrandom`) at every save.
    private var sampler = SplitMix64(seed: UInt64.random(in: .min ... .max))
    /// The most latencies kept per second (the rest are sampled away; the count is exact).
    static let latenciesPerSecond = 2_000

    init(maximumConnections: Int = 10_000) {
        self.maximumConnections = max(1, maximumConnections)
    }

    /// A request arrived on a connection.
    mutating func seen(_ identity: Data, peer: PeerCredentials?, now: Date = Date()) {
        if connections[identity] != nil {
            connections[identity]?.lastSeenAt = now
            if let peer { connections[identity]?.uid = peer.uid }
            return
        }
        if connections.count >= maximumConnections {
            let oldest = connections.sorted { $0.value.lastSeenAt < $1.value.lastSeenAt }.prefix(connections.count / 2)
            for (key, _) in oldest { connections[key] = nil }
        }
        connections[identity] = Connection(uid: peer?.uid, connectedAt: now, lastSeenAt: now)
    }

    /// A connection closed (its client exited, or the daemon closed it): it is no longer listed.
    mutating func closed(_ identity: Data) {
        if connections.removeValue(forKey: identity) != nil { closedCount += 1 }
    }

    /// A save of the connection was committed, `latency` seconds after it arrived.
    mutating func saved(_ identity: Data, latency: Double, now: Date = Date()) {
        connections[identity]?.saves += 1
        let second = Int(now.timeIntervalSince1970)
        if seconds.last?.second != second {
            seconds.append(Second(second: second))
            seconds.removeAll { $0.second <= second - 60 }
        }
        seconds[seconds.count - 1].count += 1
        let micros = latency * 1_000_000
        if seconds[seconds.count - 1].latencies.count < Self.latenciesPerSecond {
            seconds[seconds.count - 1].latencies.append(micros)
        } else {
            let slot = Int.random(in: 0..<seconds[seconds.count - 1].count, using: &sampler)
            if slot < Self.latenciesPerSecond { seconds[seconds.count - 1].latencies[slot] = micros }
        }
    }

    /// Saves per second over the last minute (or since `start`, when that is shorter), and
    /// the p50 and p99 of their latencies in microseconds (nil without saves).
    func lastMinute(since start: Date, now: Date = Date()) -> (perSecond: Double, p50: Double?, p99: Double?) {
        let current = Int(now.timeIntervalSince1970)
        let recent = seconds.filter { $0.second > current - 60 }
        let count = recent.reduce(0) { $0 + $1.count }
        let span = min(60, max(1, now.timeIntervalSince(start)))
        let latencies = recent.flatMap(\.latencies).sorted()
        func percentile(_ p: Double) -> Double? {
            guard !latencies.isEmpty else { return nil }
            return latencies[min(latencies.count - 1, Int((Double(latencies.count) * p).rounded(.down)))]
        }
        return (Double(count) / span, percentile(0.5), percentile(0.99))
    }
}
