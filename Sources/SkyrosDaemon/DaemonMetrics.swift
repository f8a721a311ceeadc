import CoreMetrics
import Foundation
import Prometheus
import SkyrosSync

/// What the daemon records for operators: swift-metrics handles backed by a Prometheus
/// registry of its own (not the process-wide metrics system: each daemon in a process, as in
/// tests, has its own), served as Prometheus text by the admin `metrics` request.
final class DaemonMetrics: Sendable {
    let registry = PrometheusCollectorRegistry()
    /// Change sets committed.
    let saves: CoreMetrics.Counter
    /// From a save's arrival to its acknowledgement.
    let saveLatency: CoreMetrics.Timer
    /// Connections that said hello (sessions the daemon remembers).
    let clients: CoreMetrics.Gauge
    /// Change sets published on the event socket.
    let eventsPublished: CoreMetrics.Counter
    /// `changesSince` requests answered (clients catching up).
    let catchUps: CoreMetrics.Counter
    /// Hellos welcomed.
    let welcomes: CoreMetrics.Counter
    let storeBytes: CoreMetrics.Gauge
    let walBytes: CoreMetrics.Gauge
    let sequence: CoreMetrics.Gauge
    /// Sync (docs/SYNC.md), for a daemon that syncs: 1 online, 0 offline, -1 error.
    let syncState: CoreMetrics.Gauge
    let syncUploadQueue: CoreMetrics.Gauge
    let syncOldestQueuedSeconds: CoreMetrics.Gauge
    let syncCheckpoint: CoreMetrics.Gauge
    let syncLagMilliseconds: CoreMetrics.Gauge
    let syncRejected: CoreMetrics.Gauge
    /// The error counters, by code, made at the first error of each code.
    private let errors: CounterFamily

    init() {
        var factory = PrometheusMetricsFactory(registry: registry)
        factory.durationHistogramBuckets["skyros_save_duration_seconds"] = [
            .microseconds(100), .microseconds(250), .microseconds(500), .milliseconds(1), .microseconds(2_500),
            .milliseconds(5), .milliseconds(10), .milliseconds(25), .milliseconds(50), .milliseconds(100),
            .milliseconds(250), .seconds(1), .seconds(5),
        ]
        errors = CounterFamily(label: "skyros_errors_total", dimension: "code", factory: factory)
        saves = CoreMetrics.Counter(label: "skyros_saves_total", factory: factory)
        saveLatency = CoreMetrics.Timer(label: "skyros_save_duration_seconds", factory: factory)
        clients = CoreMetrics.Gauge(label: "skyros_clients", factory: factory)
        eventsPublished = CoreMetrics.Counter(label: "skyros_events_published_total", factory: factory)
        catchUps = CoreMetrics.Counter(label: "skyros_catch_ups_total", factory: factory)
        welcomes = CoreMetrics.Counter(label: "skyros_welcomes_total", factory: factory)
        storeBytes = CoreMetrics.Gauge(label: "skyros_store_bytes", factory: factory)
        walBytes = CoreMetrics.Gauge(label: "skyros_wal_bytes", factory: factory)
        sequence = CoreMetrics.Gauge(label: "skyros_sequence", factory: factory)
        syncState = CoreMetrics.Gauge(label: "skyros_sync_state", factory: factory)
        syncUploadQueue = CoreMetrics.Gauge(label: "skyros_sync_upload_queue", factory: factory)
        syncOldestQueuedSeconds = CoreMetrics.Gauge(label: "skyros_sync_oldest_queued_seconds", factory: factory)
        syncCheckpoint = CoreMetrics.Gauge(label: "skyros_sync_checkpoint", factory: factory)
        syncLagMilliseconds = CoreMetrics.Gauge(label: "skyros_sync_lag_milliseconds", factory: factory)
        syncRejected = CoreMetrics.Gauge(label: "skyros_sync_rejected", factory: factory)
    }

    /// Counts an error reply by its code.
    func error(_ code: String) {
        errors.increment(code)
    }

    /// The Prometheus text exposition of everything recorded.
    func exposition() -> String { registry.emitToString() }
}
