import Dispatch
import Synchronization

#if canImport(Glibc)
    import Glibc
#elseif canImport(Musl)
    import Musl
#elseif canImport(Darwin)
    import Darwin
#endif

/// A context's serial execution: its blocks run one at a time, in the order they were
/// scheduled, as on a serial `DispatchQueue`, which it wraps.
///
/// A waited-for block (``sync(_:)``) runs at once on the calling thread, without entering the
/// dispatch queue, when the context is idle: no block running, none waiting on the queue. A
/// `sync` on a serial dispatch queue runs on the calling thread too, but copies its closure to
/// the heap and goes through the queue's state (some 450 instructions; a one-object write of
/// a shared stack waits for four or five of them). Otherwise it waits its turn on the queue,
/// behind the blocks queued before it.
///
/// Exclusion is a lock every block holds while it runs, whichever way it came; the queue keeps
/// the order of scheduled blocks and of waited-for blocks that found them.
///
/// The running block's thread is kept (``isRunningOnCurrentThread``): a block that waits for
/// its own context runs inline, and objects check they are used on their context's queue.
final class ContextQueue: Sendable {
    private let queue: DispatchQueue
    /// Held by the block running.
    private let running = Mutex<Void>(())
    /// Blocks on the dispatch queue not started yet: scheduled ones, and waited-for ones that
    /// found the context busy (a waited-for block that finds any does not pass them).
    private let queued = Atomic<Int>(0)
    /// The thread running a block (see ``currentThread``), 0 when none does.
    private let owner = Atomic<UInt>(0)

    init(label: String) {
        queue = DispatchQueue(label: label)
    }

    /// Runs `block` and waits for it, after the blocks queued before. Not reentrant: a block
    /// of this queue that calls it waits for itself (``ObjectContext`` runs such a block inline,
    /// see ``isRunningOnCurrentThread``).
    func sync(_ block: () -> Void) {
        if queued.load(ordering: .acquiring) == 0, running.withLockIfAvailable({ _ in run(block) }) != nil { return }
        queued.add(1, ordering: .releasing)
        queue.sync { runDequeued(block) }
    }

    /// Schedules `block`, after the blocks scheduled before.
    func async(_ block: @escaping @Sendable () -> Void) {
        queued.add(1, ordering: .releasing)
        queue.async { [self] in runDequeued(block) }
    }

    /// Whether the current thread is running a block of this queue. A thread reads back only
    /// its own id, which it stored and clears itself: a relaxed load cannot mistake another
    /// thread's block for its own.
    var isRunningOnCurrentThread: Bool { owner.load(ordering: .relaxed) == Self.currentThread }

    /// Runs a block that waited on the dispatch queue: the lock taken, then no longer queued.
    private func runDequeued(_ block: () -> Void) {
        running.withLock { _ in
            queued.subtract(1, ordering: .releasing)
            run(block)
        }
    }

    /// Runs `block` as the queue's, on the current thread (the lock held).
    private func run(_ block: () -> Void) {
        owner.store(Self.currentThread, ordering: .relaxed)
        defer { owner.store(0, ordering: .relaxed) }
        block()
    }

    /// The current thread's id, never 0.
    private static var currentThread: UInt { UInt(bitPattern: Int(bitPattern: pthread_self())) }
}
