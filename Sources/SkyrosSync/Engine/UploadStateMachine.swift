import Foundation

/// A queued change set and its number in the upload queue.
package typealias QueuedEntry = (number: Int64, changes: QueuedChangeSet)

/// The upstream half of a machine's sync, as a value: what is queued, what the server has,
/// how large the next batch may be. It takes events (the daemon queued change sets, the
/// connection came up, a batch was read or uploaded) and returns what the engine must do next
/// (``Action``); it does no I/O, so that every rule below is tested as a transcript
/// (`Tests/SkyrosSyncTests`).
///
/// The rules:
/// - Change sets go up in queue order, each once: the next batch starts after the highest
///   number the server has (``uploadedThrough``), which the engine reads when it connects.
/// - When it connects, the queue first drops what the server has: a batch the server
///   committed and the machine did not mark (its reply lost, or the daemon stopped in
///   between) would otherwise stay queued for good, never uploaded again and never dropped.
/// - The change sets the daemon handed over as it queued them are uploaded from memory when
///   they follow the last upload without a gap and are all there is; otherwise the queue is read.
/// - A batch with a refusal costs two statements per halving to find it: while refusals come,
///   batches get smaller (a quarter, down to ``minimumBatch``), and they grow back (twice as
///   large) with each batch that has none. (The fault campaign, whose writers take unique
///   values from a small pool, saw batches of 1,000 with dozens of refusals each take seconds,
///   and the queues grow without end.)
package struct UploadStateMachine: Sendable {
    /// What the engine does next.
    package enum Action: Sendable, Equatable {
        /// Nothing to upload: everything queued is on the server.
        case idle
        /// Read at most `limit` change sets after number `after` from the queue, no more than
        /// about `bytes` of them (at least one), and hand them to ``queueRead(_:)``.
        case readQueue(after: Int64, limit: Int, bytes: Int)
        /// Upload these change sets (in one call), then tell ``uploaded(_:outcomes:)``.
        case upload(numbers: ClosedRange<Int64>)
        /// The server has every change set through `through`: the queue may drop them. Log the
        /// refusals (the change sets' numbers and the server's reasons); their record is on the
        /// server, and comes back with the next checkpoint.
        case markUploaded(through: Int64, refusals: [Refusal])
    }

    /// A change set the server refused.
    package struct Refusal: Sendable, Equatable {
        package var number: Int64
        package var reason: String

        package init(number: Int64, reason: String) {
            self.number = number
            self.reason = reason
        }
    }

    /// The most change sets in one upload.
    package let maximumBatch: Int
    /// About the most bytes of change sets read from the queue for one upload.
    package let maximumBytes: Int
    /// The smallest batch refusals shrink it to.
    package static let minimumBatch = 16
    /// The most change sets held in memory for the uploader; past it they are read from the queue.
    package static let handedLimit = 256

    /// The highest number the server has (0: none; valid once connected).
    package private(set) var uploadedThrough: Int64 = 0
    /// The highest number the daemon queued, as it told (nil: not told yet; read the queue).
    package private(set) var queuedThrough: Int64?
    /// How many change sets the next batch may hold.
    package private(set) var batchLimit: Int
    /// The change sets the daemon handed over as it queued them, oldest first.
    private var handed: [QueuedEntry] = []
    /// The batch being uploaded (read from the queue or handed).
    package private(set) var batch: [QueuedEntry] = []
    private var isConnected = false
    /// Whether the queue is yet to drop what the server had when the connection came up.
    private var marksOnConnect = false

    /// A machine that knows of `queuedThrough` queued change sets (nil: unknown, read the queue).
    package init(queuedThrough: Int64?, maximumBatch: Int = 1_000, maximumBytes: Int = 8 << 20) {
        self.queuedThrough = queuedThrough
        self.maximumBatch = max(1, maximumBatch)
        self.maximumBytes = maximumBytes
        batchLimit = self.maximumBatch
    }

    // MARK: - Events

    /// The daemon queued change sets, `through` the highest number so far; `handed`: those
    /// change sets themselves (possibly none), so that they need not be read back.
    package mutating func localCommitted(_ entries: [QueuedEntry], through last: Int64) {
        queuedThrough = max(queuedThrough ?? 0, last)
        handed += entries
        // Held for a moment only: while the server cannot be reached, the queue has them.
        if handed.count > Self.handedLimit { handed.removeAll() }
    }

    /// The connection came up, and the server has this machine's change sets through
    /// `uploadedThrough`: each connection starts with a full batch.
    package mutating func connected(uploadedThrough: Int64) {
        self.uploadedThrough = uploadedThrough
        batchLimit = maximumBatch
        batch = []
        isConnected = true
        marksOnConnect = uploadedThrough > 0
    }

    /// The connection was lost: nothing is uploaded until ``connected(uploadedThrough:)``.
    package mutating func disconnected() {
        isConnected = false
        batch = []
    }

    /// What to upload next.
    package mutating func nextBatch() -> Action {
        guard isConnected else { return .idle }
        if marksOnConnect {
            marksOnConnect = false
            return .markUploaded(through: uploadedThrough, refusals: [])
        }
        handed.removeAll { $0.number <= uploadedThrough }
        guard let known = queuedThrough else { return readQueue() }
        if known <= uploadedThrough { return .idle }
        guard handed.first?.number == uploadedThrough + 1, handed.last?.number == known,
            handed.count == Int(known - uploadedThrough), handed.count <= batchLimit
        else { return readQueue() }
        return upload(handed)
    }

    /// The change sets read from the queue after ``Action/readQueue(after:limit:bytes:)``.
    package mutating func queueRead(_ entries: [QueuedEntry]) -> Action {
        entries.isEmpty ? .idle : upload(entries)
    }

    /// The server answered the upload of ``batch``: one outcome per change set, in order.
    package mutating func uploaded(outcomes: [ServerSession.UploadOutcome]) -> Action {
        guard let last = batch.last?.number else { return .idle }
        var refusals: [Refusal] = []
        for (entry, outcome) in zip(batch, outcomes) {
            if case .rejected(let reason) = outcome { refusals.append(Refusal(number: entry.number, reason: reason)) }
        }
        batchLimit = refusals.isEmpty ? min(maximumBatch, batchLimit * 2) : max(Self.minimumBatch, batchLimit / 4)
        uploadedThrough = last
        batch = []
        return .markUploaded(through: last, refusals: refusals)
    }

    private func readQueue() -> Action {
        .readQueue(after: uploadedThrough, limit: batchLimit, bytes: maximumBytes)
    }

    private mutating func upload(_ entries: [QueuedEntry]) -> Action {
        batch = entries
        return .upload(numbers: entries[0].number...entries[entries.count - 1].number)
    }
}
