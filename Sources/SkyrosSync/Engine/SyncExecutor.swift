import NIOCore
import NIOPosix

/// Where the sync engine's tasks run: one SwiftNIO event loop, the one its PostgreSQL
/// connections use, instead of Swift's shared cooperative pool.
///
/// Two reasons. A process that embeds a daemon (a service built on SkyrosServiceLifecycle, a
/// test) may block the cooperative pool's few threads (one per core) for seconds with
/// synchronous work of its own: sync must not stall meanwhile, nor its statement timeouts fire
/// because their answers could not be handled. And a reply read by the event loop resumes the
/// engine on that same thread, with no hop to another one (sync's latency is made of such
/// steps).
///
/// The engine's work on the loop is short (a statement's reply decoded, a batch read from the
/// local queue): the connections that share the loop are its own.
package final class SyncExecutor: TaskExecutor {
    /// The event loop the engine's tasks and connections run on.
    package let eventLoop: any EventLoop

    /// An executor on one loop of SwiftNIO's shared group (never shut down, so that a job
    /// enqueued late, a connection's close, always has a thread to run on).
    package init(eventLoop: any EventLoop = MultiThreadedEventLoopGroup.singleton.next()) {
        self.eventLoop = eventLoop
    }

    package func enqueue(_ job: consuming ExecutorJob) {
        let job = UnownedJob(job)
        eventLoop.execute { job.runSynchronously(on: self.asUnownedTaskExecutor()) }
    }
}

extension TimeAmount {
    /// The same length of time as `duration` (to the nanosecond), for a timer of an event loop.
    init(_ duration: Duration) {
        let components = duration.components
        self = .nanoseconds(components.seconds * 1_000_000_000 + components.attoseconds / 1_000_000_000)
    }
}
