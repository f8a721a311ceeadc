import CoreMetrics
import Foundation
import Prometheus
import SkyrosSync
import Synchronization

/// What a gateway's `/metrics` shows (swift-metrics, exposed in Prometheus' text format by
/// swift-prometheus, as the daemon's): connected machines, whether it listens, the fan-out lag,
/// the checkpoint position, the server connections, notifications fanned out, refusals by
/// reason.
package final class GatewayMetrics: Sendable {
    let registry = PrometheusCollectorRegistry()
    private let connectedMachines: CoreMetrics.Gauge
    private let listeningGauge: CoreMetrics.Gauge
    private let lagGauge: CoreMetrics.Gauge
    private let positionGauge: CoreMetrics.Gauge
    private let serverConnections: CoreMetrics.Gauge
    private let notificationsCounter: CoreMetrics.Counter
    private let toldCounter: CoreMetrics.Counter
    /// Notifications written to machines, in all (for the tests and the benchmark).
    package let toldTotal = Mutex(0)
    private let refusals: CounterFamily

    /// The connections of each machine whose hello was accepted (a daemon holds two).
    private let machines = Mutex<[UUID: Int]>([:])
    /// Whether the LISTEN connection is up.
    let listening = Mutex(false)
    /// How old the newest change of the newest checkpoint read was when it was read (ms).
    let lag = Mutex(0)
    /// The highest checkpoint number (a snapshot's xmin) read for a machine.
    let position = Mutex<UInt64>(0)

    init() {
        let factory = PrometheusMetricsFactory(registry: registry)
        connectedMachines = CoreMetrics.Gauge(label: "skyros_gateway_connected_machines", factory: factory)
        listeningGauge = CoreMetrics.Gauge(label: "skyros_gateway_listening", factory: factory)
        lagGauge = CoreMetrics.Gauge(label: "skyros_gateway_fanout_lag_milliseconds", factory: factory)
        positionGauge = CoreMetrics.Gauge(label: "skyros_gateway_checkpoint_position", factory: factory)
        serverConnections = CoreMetrics.Gauge(label: "skyros_gateway_server_connections", factory: factory)
        notificationsCounter = CoreMetrics.Counter(label: "skyros_gateway_notifications_total", factory: factory)
        toldCounter = CoreMetrics.Counter(label: "skyros_gateway_machines_told_total", factory: factory)
        refusals = CounterFamily(label: "skyros_gateway_refusals_total", dimension: "reason", factory: factory)
    }

    func connected(_ machine: UUID) { machines.withLock { $0[machine, default: 0] += 1 } }

    func disconnected(_ machine: UUID) {
        machines.withLock { machines in
            let left = (machines[machine] ?? 1) - 1
            machines[machine] = left > 0 ? left : nil
        }
    }

    /// A change fanned out.
    func notified() { notificationsCounter.increment() }

    /// `count` machines told of a change (those it concerns).
    func told(_ count: Int) {
        toldCounter.increment(by: Int64(count))
        toldTotal.withLock { $0 += count }
    }

    /// Counts a refusal: a close (`code`) or a change set the rules refused (`code` nil).
    func refused(_ code: GatewayClose?, reason: String) {
        let label: String
        switch code {
        case .unauthorized?:
            label = SyncTokenRefusal.Reason.allCases.first { reason.contains("(\($0.rawValue))") }?.rawValue ?? "token"
        case .forbidden?: label = "other_subject"
        case .protocolError?: label = "protocol"
        default: label = reason
        }
        refusals.increment(label)
    }

    /// The exposition, the gauges read now.
    package func text(gateway: GatewayServer) async -> String {
        let listening = listening.withLock { $0 }
        connectedMachines.record(machines.withLock { $0.count })
        listeningGauge.record(listening ? 1 : 0)
        lagGauge.record(lag.withLock { $0 })
        positionGauge.record(Double(position.withLock { $0 }))
        serverConnections.record(await gateway.pool.openCount + (listening ? 1 : 0))
        return registry.emitToString()
    }
}
