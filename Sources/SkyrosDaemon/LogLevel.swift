import Logging

/// The level a line of the daemon's log is logged at by `skyrosd` (swift-log): sync's errors
/// at `error` (an operator must act: credentials, permissions, a schema set up for another
/// group), its offline state and refusals at `warning`, the rest at `info`.
package enum DaemonLogLevel {
    /// The level of `line`, as the daemon writes it (`sync: error: …`, `sync: offline: …`).
    package static func of(_ line: String) -> Logger.Level {
        if line.hasPrefix("sync: error") || line.hasPrefix("sync: cannot start") { return .error }
        if line.hasPrefix("sync: offline") || line.contains("was refused by the server") { return .warning }
        return .info
    }
}
