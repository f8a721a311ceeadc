import CoreMetrics
import Synchronization

/// Counters of one metric told apart by one dimension (`skyros_errors_total{code="…"}`,
/// `skyros_gateway_refusals_total{reason="…"}`), each made at its value's first increment: a
/// value never seen is not exposed.
package final class CounterFamily: Sendable {
    private let label: String
    private let dimension: String
    private let factory: any MetricsFactory
    private let counters = Mutex<[String: CoreMetrics.Counter]>([:])

    /// The counters of metric `label`, by `dimension`, made with `factory`.
    package init(label: String, dimension: String, factory: any MetricsFactory) {
        self.label = label
        self.dimension = dimension
        self.factory = factory
    }

    /// Adds one to the counter of `value`.
    package func increment(_ value: String) {
        let counter = counters.withLock { counters in
            if let counter = counters[value] { return counter }
            let counter = CoreMetrics.Counter(label: label, dimensions: [(dimension, value)], factory: factory)
            counters[value] = counter
            return counter
        }
        counter.increment()
    }
}
