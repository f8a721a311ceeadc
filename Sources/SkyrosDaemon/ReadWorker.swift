import Foundation
import Skyros
import SkyrosWire

/// The daemon's reader: answers fetches, counts and faults on a thread of its own, through
/// a reader connection of the store's pool (WAL: it reads beside the serve loop's commits),
/// so that saves are never queued behind read work, however much of it members ask for.
///
/// Its thread runs at a lower priority than the daemon's others (its nice value
/// ``niceIncrement`` higher): when the machine is busy, the commits and the replies of the
/// serve loop get the processor first, and reads wait (with 4 processes fetching 2,000
/// objects in a loop beside a writer on 2 cores, the writer's saves per second went from
/// 0.33× to about 0.5–0.6× of its rate alone; the reads from 62 to 41–51 fetches per second).
/// The price: a nice value is weighed against every thread of the machine, not only the
/// daemon's. Beside 6 processes that only burn the processor on 2 cores, eight clients each
/// fetching 4,000 users and 8,000 posts waited more than 30 s for their replies at +10, 8–14 s
/// at +5, 4–6 s at 0 (debug build). +5 made the test suite's in-process daemons' readers
/// slow its sync tests past their limits; +10 stays until `skyros-bench shared --flood`
/// weighs the two.
///
/// The serve loop hands it requests with ``submit(_:)``; the encoded replies come back
/// through ``takeReplies()``, and ``wakeDescriptor`` becomes readable when there are some
/// (the loop polls it beside the request socket: only the loop sends on the socket).
///
/// Reads nobody waits for any more are not answered: those of a connection that closed
/// (``cancel(identity:)``: a client whose attempt timed out sends the request again on a new
/// connection, and closes the old one; or it exited). Otherwise a
/// reader slower than the clients' retry interval (a busy machine, where its lower priority
/// leaves it little) would answer each abandoned attempt in turn, and fall further behind
/// with each: the kill-storm test's eight clients, each fetching 4,000 users again every
/// second, kept a starved reader busy past their 30 s timeout and past SIGTERM's.
final class ReadWorker: @unchecked Sendable {
    /// A read to answer.
    struct Job {
        var identity: Data
        var requestID: UInt64
        var body: WireMessage.Body
        var store: SQLiteStore
        /// The session's projection when it has an earlier schema version: the body is in the
        /// store's terms already, the reply is translated back.
        var projection: SchemaProjection? = nil
    }

    /// A reply ready to go out: the connection's identity and the encoded message.
    struct Reply {
        var identity: Data
        var message: [UInt8]
    }

    /// Readable while replies wait to be taken (the read end of a pipe).
    let wakeDescriptor: Int32
    private let wakeWriter: Int32
    private let condition = NSCondition()
    private var jobs: [Job] = []
    private var replies: [Reply] = []
    private var busy = false
    private var stopping = false
    /// Connections closed while the reader answers a batch: their jobs in it are skipped.
    private var closed: Set<Data> = []
    /// Told how many reads were dropped (their connection closed before they were answered),
    /// each time some are; on the thread that dropped them.
    var onDropped: @Sendable (Int) -> Void {
        get { condition.withLock { droppedHandler } }
        set { condition.withLock { droppedHandler = newValue } }
    }
    private var droppedHandler: @Sendable (Int) -> Void = { _ in }
    private var thread: Thread?
    private let finished = DispatchSemaphore(value: 0)

    init() throws {
        var ends: [Int32] = [-1, -1]
        guard pipe(&ends) == 0 else {
            throw SkyrosError(.storeFailure, "the daemon could not make a pipe (errno \(errno))")
        }
        for end in ends {
            _ = fcntl(end, F_SETFL, fcntl(end, F_GETFL) | O_NONBLOCK)
            _ = fcntl(end, F_SETFD, FD_CLOEXEC)
        }
        (wakeDescriptor, wakeWriter) = (ends[0], ends[1])
        let thread = Thread { [self] in run() }
        thread.name = "skyrosd.reader"
        self.thread = thread
        thread.start()
    }

    deinit {
        close(wakeDescriptor)
        close(wakeWriter)
    }

    /// The reads submitted and not answered yet.
    var pending: Int { condition.withLock { jobs.count + (busy ? 1 : 0) } }

    /// Queues a read; its reply comes back through ``takeReplies()``.
    func submit(_ job: Job) {
        condition.withLock {
            jobs.append(job)
            condition.broadcast()
        }
    }

    /// The replies ready, oldest first; resets ``wakeDescriptor``.
    func takeReplies() -> [Reply] {
        var drained = [UInt8](repeating: 0, count: 64)
        while read(wakeDescriptor, &drained, drained.count) == drained.count {}
        return condition.withLock {
            defer { replies = [] }
            return replies
        }
    }

    /// Drops the reads of the connection with `identity` that are not started: it closed, and
    /// nobody would take their replies.
    func cancel(identity: Data) {
        let (count, handler) = condition.withLock {
            let before = jobs.count
            jobs.removeAll { $0.identity == identity }
            if busy { closed.insert(identity) }
            return (before - jobs.count, droppedHandler)
        }
        if count > 0 { handler(count) }
    }

    /// Returns once every read submitted is answered (its reply waiting to be taken).
    func waitUntilIdle() {
        condition.withLock {
            while !jobs.isEmpty || busy { condition.wait() }
        }
    }

    /// Answers what was submitted (the reads of connections still open: their clients wait
    /// for them, and would otherwise ask again only after their retry interval), then stops
    /// the thread; returns once it has.
    func stop() {
        condition.withLock {
            stopping = true
            condition.broadcast()
        }
        if thread != nil { finished.wait() }
        thread = nil
    }

    /// How much higher the reader thread's nice value is than the thread that made it.
    static let niceIncrement: Int32 = 10

    private func run() {
        Self.lowerPriority(by: Self.niceIncrement)
        while let batch = nextJobs() {
            var answered: [Reply] = []
            for job in batch {
                let skipped = condition.withLock { closed.contains(job.identity) ? droppedHandler : nil }
                if let skipped {
                    skipped(1)
                    continue
                }
                let body: WireMessage.Body
                do {
                    let answer = try Self.answer(job.body, from: job.store)
                    body = job.projection?.old(answer) ?? answer
                } catch {
                    body = DaemonTurn.errorReply(SkyrosError.wrap(error))
                }
                answered.append(
                    Reply(identity: job.identity, message: WireMessage(requestID: job.requestID, body: body).encoded()))
            }
            condition.withLock {
                replies += answered
                busy = false
                closed = []
                condition.broadcast()
            }
            wake()
        }
        finished.signal()
    }

    /// Makes ``wakeDescriptor`` readable: the serve loop wakes and looks at its replies, and
    /// at the sync engine's work (SyncLink.swift), which wakes it this way too.
    func wake() {
        var one: UInt8 = 1
        _ = write(wakeWriter, &one, 1)  // a full pipe already wakes the loop
    }

    /// Raises the calling thread's nice value (on Linux a thread's own: `PRIO_PROCESS` with
    /// 0 names the calling thread); always allowed, never undone.
    private static func lowerPriority(by increment: Int32) {
        errno = 0
        let current = getpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0)
        guard errno == 0 else { return }
        _ = setpriority(__priority_which_t(PRIO_PROCESS.rawValue), 0, min(19, current + increment))
    }

    /// Waits for jobs and takes them all; nil once stopped with nothing left.
    private func nextJobs() -> [Job]? {
        condition.withLock {
            while jobs.isEmpty && !stopping { condition.wait() }
            guard !jobs.isEmpty else { return nil }
            defer { jobs = [] }
            busy = true
            return jobs
        }
    }

    /// Whether the reader answers `body` (the rest is answered by the serve loop).
    static func answers(_ body: WireMessage.Body) -> Bool {
        switch body {
        case .fetch, .fetchIdentifiers, .count, .snapshots: true
        default: false
        }
    }

    private static func answer(_ body: WireMessage.Body, from store: SQLiteStore) throws -> WireMessage.Body {
        switch body {
        case .fetch(let request): .snapshotsReply(try store.fetchSnapshots(request))
        case .fetchIdentifiers(let request): .identifiersReply(try store.fetchIdentifiers(request))
        case .count(let request): .countReply(try store.count(request))
        case .snapshots(let ids): .snapshotsReply(try store.snapshots(for: ids))
        default: throw SkyrosError(.malformedMessage, "the reader does not answer a \(body.kind) message")
        }
    }
}
