import Foundation

/// One line of results: Skyros and the raw baseline measured in the same run.
struct Row: Encodable {
    let name: String
    let unit: String
    let skyros: Double
    let baseline: Double
    var ratio: Double { baseline == 0 ? 0 : skyros / baseline }

    enum CodingKeys: String, CodingKey { case name, unit, skyros, baseline, ratio }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(name, forKey: .name)
        try container.encode(unit, forKey: .unit)
        // A percentile with timeouts in it is +∞ (JSON has no infinity: "inf").
        func encode(_ value: Double, places: Double, forKey key: CodingKeys) throws {
            if value.isFinite {
                try container.encode((value * places).rounded() / places, forKey: key)
            } else {
                try container.encode(value > 0 ? "inf" : value < 0 ? "-inf" : "nan", forKey: key)
            }
        }
        try encode(skyros, places: 100, forKey: .skyros)
        try encode(baseline, places: 100, forKey: .baseline)
        try encode(ratio, places: 1000, forKey: .ratio)
    }
}

enum Clock {
    static func now() -> UInt64 { DispatchTime.now().uptimeNanoseconds }

    /// Seconds taken by `body`.
    static func seconds(_ body: () throws -> Void) rethrows -> Double {
        let start = now()
        try body()
        return Double(now() - start) / 1e9
    }
}

/// Percentile of microsecond samples.
func percentile(_ samples: [Double], _ p: Double) -> Double {
    let sorted = samples.sorted()
    // A percentile of nothing is no figure: a measurement that produced no sample fails.
    guard !sorted.isEmpty else {
        benchmarkFailure("a percentile of an empty sample: the measurement produced no figure")
    }
    let index = min(sorted.count - 1, Int((p / 100 * Double(sorted.count)).rounded(.up)) - 1)
    return sorted[max(0, index)]
}

/// Resident set size in MB, from /proc/self/statm.
func residentMB() -> Double {
    guard let text = try? String(contentsOfFile: "/proc/self/statm", encoding: .utf8) else { return 0 }
    let fields = text.split(separator: " ")
    guard fields.count > 1, let pages = Double(fields[1]) else { return 0 }
    return pages * Double(sysconf(Int32(_SC_PAGESIZE))) / 1_048_576
}

/// A benchmark's assertion (a memory bound): when it does not hold, says so on stderr and the
/// benchmark exits with status 1 once it has printed its rows.
func benchmarkAssert(_ condition: Bool, _ message: @autoclosure () -> String) {
    guard !condition else { return }
    FileHandle.standardError.write(Data("skyros-bench: FAILED: \(message())\n".utf8))
    benchmarkFailed = true
}

/// Set by a failed ``benchmarkAssert(_:_:)``: the process exits with status 1 at the end.
nonisolated(unsafe) var benchmarkFailed = false

/// Ends the run with a message: a benchmark whose figures would be wrong prints none.
func benchmarkFailure(_ message: String) -> Never {
    FileHandle.standardError.write(Data("skyros-bench: \(message)\n".utf8))
    exit(1)
}
