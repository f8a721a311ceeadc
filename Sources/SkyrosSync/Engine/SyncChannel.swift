import Foundation
import Synchronization

/// The one boundary between a daemon and its sync engine: the engine's requests to the store
/// (apply a checkpoint, stage a snapshot's page, drop what the server has), posted from the
/// engine's thread and answered on the daemon's, which owns the store. It is the engine's
/// ``SyncHost``: the engine awaits each answer; the daemon is woken (`wake`), takes the requests
/// (``take()``) and answers each (``Request``'s replies). The daemon's messages the other way
/// are the engine's methods (``SyncEngine/localCommitted(_:through:)``,
/// ``SyncEngine/schemaChanged(_:)``), which never block.
package final class SyncChannel: SyncHost {
    /// What the engine asks of the store.
    package enum Request: Sendable {
        /// Apply this checkpoint (``SyncHost/apply(_:)``) and answer what became of it.
        case apply(Checkpoint, Reply<SyncApplyResult>)
        /// Stage this page of a snapshot (``SyncHost/stage(_:)``): nil when staged, else why not.
        case stage(SnapshotPage, Reply<String?>)
        /// Patch the staged snapshot (its base) with a checkpoint and apply it (``SyncHost/applyStaged(_:base:)``).
        case applyStaged(Checkpoint, base: String, Reply<SyncApplyResult>)
        /// The queued change sets through this number are on the server: drop them.
        case uploaded(Int64, Reply<Void>)
        /// Give the store a new machine id, dropping these queued change sets (``SyncHost/reidentify(as:dropping:reason:)``).
        case reidentify(UUID, dropping: [Int64], reason: String, Reply<Bool>)
    }

    /// The answer to one request, given once by the daemon.
    package struct Reply<Value: Sendable>: Sendable {
        fileprivate let continuation: CheckedContinuation<Value, Never>

        /// Answers the engine.
        package func callAsFunction(_ value: Value) {
            continuation.resume(returning: value)
        }
    }

    private let wake: @Sendable () -> Void
    private let inbox = Mutex<(requests: [Request], closed: Bool)>(([], false))
    private let lastStatus = Mutex(SyncEngine.Status())

    /// A channel that calls `wake` (from the engine's thread) when a request is posted.
    package init(wake: @escaping @Sendable () -> Void) {
        self.wake = wake
    }

    /// The engine's state as it last reported it.
    package var status: SyncEngine.Status { lastStatus.withLock { $0 } }

    // MARK: - The engine's side (SyncHost)

    package func apply(_ checkpoint: Checkpoint) async -> SyncApplyResult {
        await withCheckedContinuation { post(.apply(checkpoint, Reply(continuation: $0))) }
    }

    package func applyStaged(_ checkpoint: Checkpoint, base: String) async -> SyncApplyResult {
        await withCheckedContinuation { post(.applyStaged(checkpoint, base: base, Reply(continuation: $0))) }
    }

    package func stage(_ page: SnapshotPage) async -> String? {
        await withCheckedContinuation { post(.stage(page, Reply(continuation: $0))) }
    }

    package func uploaded(through number: Int64) async {
        await withCheckedContinuation { post(.uploaded(number, Reply(continuation: $0))) }
    }

    package func reidentify(as machine: UUID, dropping: [Int64], reason: String) async -> Bool {
        await withCheckedContinuation {
            post(.reidentify(machine, dropping: dropping, reason: reason, Reply(continuation: $0)))
        }
    }

    package func syncStateChanged(_ status: SyncEngine.Status) {
        lastStatus.withLock { $0 = status }
    }

    private func post(_ request: Request) {
        let refused = inbox.withLock { inbox -> Request? in
            if inbox.closed { return request }
            inbox.requests.append(request)
            return nil
        }
        if let refused {
            Self.refuse(refused)
        } else {
            wake()
        }
    }

    // MARK: - The daemon's side

    /// The requests posted since the last call, oldest first.
    package func take() -> [Request] {
        inbox.withLock { inbox in
            defer { inbox.requests = [] }
            return inbox.requests
        }
    }

    /// The daemon is stopping: the requests still posted, and any posted later, are answered
    /// with a refusal.
    package func close() {
        let left = inbox.withLock { inbox -> [Request] in
            inbox.closed = true
            defer { inbox.requests = [] }
            return inbox.requests
        }
        for request in left { Self.refuse(request) }
    }

    private static func refuse(_ request: Request) {
        switch request {
        case .apply(_, let reply): reply(.failed("the daemon is stopping"))
        case .stage(_, let reply): reply("the daemon is stopping (a page was not staged)")
        case .applyStaged(_, _, let reply): reply(.failed("the daemon is stopping"))
        case .uploaded(_, let reply): reply(())
        case .reidentify(_, _, _, let reply): reply(false)
        }
    }
}
