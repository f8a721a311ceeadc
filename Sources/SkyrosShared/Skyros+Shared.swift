import Foundation
import Skyros
import SkyrosWire

extension Skyros {
    /// A stack whose store is the daemon (`skyrosd`) of an application group: every
    /// process of the group shares it, and each sees the others' changes in its main context.
    ///
    /// - Parameters:
    ///   - schema: the entities; the group's store must have the same fingerprint.
    ///   - applicationGroup: the group identifier; its container is
    ///     ``Skyros/containerURL(forApplicationGroup:)``.
    ///   - timeout: how long a call waits for the daemon before failing with
    ///     ``SkyrosError/Code/daemonUnavailable``.
    ///   - savesOnStop: whether SIGTERM, SIGINT and a normal exit save in-flight writes
    ///     through process-wide handlers (default true); false when the application stops
    ///     the stack itself (`flush(timeout:)`, or a `SkyrosService` under
    ///     swift-service-lifecycle).
    public convenience init(
        sharedStack schema: Schema, applicationGroup: String, allowsConcurrentWritings: Bool = false,
        timeout: TimeInterval = 5, savesOnStop: Bool = true
    ) throws {
        let url = try Skyros.containerURL(forApplicationGroup: applicationGroup)
        try self.init(
            sharedStack: schema, container: url, allowsConcurrentWritings: allowsConcurrentWritings, timeout: timeout,
            savesOnStop: savesOnStop)
    }

    /// A shared stack on an explicit container directory.
    public convenience init(
        sharedStack schema: Schema, container: URL, allowsConcurrentWritings: Bool = false, timeout: TimeInterval = 5,
        savesOnStop: Bool = true
    ) throws {
        let remote = try RemoteStore(schema: schema, container: GroupContainer(url: container), timeout: timeout)
        self.init(sharedStack: remote, allowsConcurrentWritings: allowsConcurrentWritings, savesOnStop: savesOnStop)
    }

    /// A shared stack on a connection made and configured by the caller (timeouts, event
    /// queue): change events of other processes are merged into the main context.
    public convenience init(
        sharedStack remote: RemoteStore, allowsConcurrentWritings: Bool = false, savesOnStop: Bool = true
    ) {
        self.init(store: remote, allowsConcurrentWritings: allowsConcurrentWritings, savesOnStop: savesOnStop)
        // Inserts of other processes come with their values encoded: the main context keeps
        // them as rows, decoded if read (and for observers).
        remote.setOnChange({ [weak self] changes in self?.merge(changes) }, takingEncodedInserts: true)
        remote.onSyncRejected = { [weak self] errors in
            guard let self else { return }
            self.completionQueue.async { for error in errors { self.handleError(error) } }
        }
        // Refusals that came while no app of this stack ran are told too (PowerSync's upload
        // queue keeps a failed entry until the app deals with it): asked once, here (one round
        // trip, before any request of the app's: asked in the background, it came among them),
        // told on the completion queue; a daemon without sync has none, one older than the
        // request says so.
        if let outstanding = try? remote.syncRejections(), !outstanding.isEmpty {
            completionQueue.async { [weak self] in
                guard let self else { return }
                for rejection in outstanding { self.handleError(rejection.error) }
            }
        }
        remote.onRestart = { [weak self] in
            // The daemon restarted and may have lost events: what the main context holds is refreshed.
            self?.merge(StoreChange(sequence: 0, author: "", isRefresh: true))
        }
    }
}
