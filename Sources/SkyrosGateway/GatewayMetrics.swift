import Foundation
import SkyrosSync
import Synchronization

/// What a gateway's `/metrics` shows (Prometheus' text format): connected machines, the
/// checkpoint position, the server connections, notifications fanned out, refusals by reason.
final class GatewayMetrics: Sendable {
    /// The connections of each machine whose hello was accepted (a daemon holds two).
    private let machines = Mutex<[UUID: Int]>([:])
    /// How old the newest change of the newest checkpoint read was when it was read (ms).
    let lag = Mutex(0)

    func connected(_ machine: UUID) { machines.withLock { $0[machine, default: 0] += 1 } }

    func disconnected(_ machine: UUID) {
        machines.withLock { machines in
            let left = (machines[machine] ?? 1) - 1
            machines[machine] = left > 0 ? left : nil
        }
    }
    let listening = Mutex(false)
    let notifications = Mutex(0)
    /// The highest checkpoint number (a snapshot's xmin) read for a machine.
    let position = Mutex<UInt64>(0)
    private let refusals = Mutex<[String: Int]>([:])

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
        refusals.withLock { $0[label, default: 0] += 1 }
    }

    func text(gateway: GatewayServer) async -> String {
        let connections = await gateway.pool.openCount + (listening.withLock { $0 } ? 1 : 0)
        var lines = [
            "# HELP skyros_gateway_connected_machines Machines connected now (their hello accepted).",
            "# TYPE skyros_gateway_connected_machines gauge",
            "skyros_gateway_connected_machines \(machines.withLock { $0.count })",
            "# HELP skyros_gateway_listening Whether the gateway listens for the group's changes (its LISTEN connection is up).",
            "# TYPE skyros_gateway_listening gauge",
            "skyros_gateway_listening \(listening.withLock { $0 } ? 1 : 0)",
            "# HELP skyros_gateway_fanout_lag_milliseconds How old the newest change of the newest checkpoint read was when it was read.",
            "# TYPE skyros_gateway_fanout_lag_milliseconds gauge",
            "skyros_gateway_fanout_lag_milliseconds \(lag.withLock { $0 })",
            "# HELP skyros_gateway_server_connections PostgreSQL connections open (the pool and LISTEN).",
            "# TYPE skyros_gateway_server_connections gauge",
            "skyros_gateway_server_connections \(connections)",
            "# HELP skyros_gateway_checkpoint_position The newest checkpoint read for a machine (its snapshot's xmin).",
            "# TYPE skyros_gateway_checkpoint_position gauge",
            "skyros_gateway_checkpoint_position \(position.withLock { $0 })",
            "# HELP skyros_gateway_notifications_total Changes of the group fanned out to machines.",
            "# TYPE skyros_gateway_notifications_total counter",
            "skyros_gateway_notifications_total \(notifications.withLock { $0 })",
            "# HELP skyros_gateway_refusals_total Connections and change sets refused, by reason.",
            "# TYPE skyros_gateway_refusals_total counter",
        ]
        for (reason, count) in refusals.withLock({ $0 }).sorted(by: { $0.key < $1.key }) {
            lines.append("skyros_gateway_refusals_total{reason=\"\(reason)\"} \(count)")
        }
        return lines.joined(separator: "\n") + "\n"
    }
}
