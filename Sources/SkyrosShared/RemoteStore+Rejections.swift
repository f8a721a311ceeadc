import Foundation
import Skyros
import SkyrosWire

extension RemoteStore {
    /// The change sets of this machine that the group's sync server refused and no app has
    /// acknowledged yet, oldest first (docs/SYNC.md, "Refusals"): empty when the daemon does
    /// not sync.
    ///
    /// - Throws: ``SkyrosError/Code/daemonUnavailable`` when the daemon does not answer;
    ///   ``SkyrosError/Code/malformedMessage`` from a daemon older than this request.
    public func syncRejections() throws -> [SyncRejection] {
        guard case .rejectionsReply(let rejections) = try request(.syncRejections) else { throw unexpected() }
        return rejections
    }

    /// Removes refusals from the daemon's rejected log once the app has dealt with them (told
    /// its user, saved the change again): they are no longer listed, nor told to apps that
    /// connect later. Numbers not in the log are ignored.
    ///
    /// - Returns: how many were removed.
    @discardableResult
    public func acknowledgeSyncRejections(_ numbers: [Int64]) throws -> Int {
        let numbers = numbers.filter { $0 > 0 }.map { UInt64($0) }
        guard !numbers.isEmpty else { return 0 }
        guard case .countReply(let removed) = try request(.acknowledgeRejections(numbers)) else { throw unexpected() }
        return removed
    }
}

extension Skyros {
    /// The change sets of this machine that the group's sync server refused and no app has
    /// acknowledged yet, oldest first (a shared stack whose daemon syncs with PostgreSQL;
    /// empty for an embedded stack or a daemon without sync). Each was told to
    /// ``handleError(_:)`` when it came, and again when a shared stack connects while it is
    /// outstanding; acknowledge it with ``acknowledgeSyncRejections(_:)``.
    public func syncRejections() throws -> [SyncRejection] {
        guard let remote = store as? RemoteStore else { return [] }
        return try remote.syncRejections()
    }

    /// Acknowledges refusals (``SyncRejection/number``, or ``SkyrosError/rejectionNumber`` of
    /// the error told): they leave the daemon's rejected log. How many were removed (0 for an
    /// embedded stack).
    @discardableResult
    public func acknowledgeSyncRejections(_ numbers: [Int64]) throws -> Int {
        guard let remote = store as? RemoteStore else { return 0 }
        return try remote.acknowledgeSyncRejections(numbers)
    }
}
