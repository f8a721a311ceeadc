/// When a turn waits for more saves before its group commit, as a value the turn holds
/// (``DaemonTurn/commitDelay``): the server only performs the wait it decides.
///
/// When fewer connections have a save waiting than had one in the largest of the last 16
/// group commits, the turn waits up to ``maximum`` for theirs, so that clients saving in turn
/// commit together (one transaction and one WAL sync for all of them). A client saving alone
/// never waits; the widths of the last commits are forgotten when no commit followed them for
/// ``widthsLifetime``.
package struct CommitDelay {
    /// The longest wait (`--commit-delay`; zero: never wait).
    package let maximum: Duration
    /// How many connections had a save in each of the last group commits.
    private var widths = [Int](repeating: 0, count: 16)
    private var count = 0
    /// When the last group commit ended.
    private var lastCommitAt: ContinuousClock.Instant
    /// How long the widths of the last commits count when no commit follows them.
    static let widthsLifetime = Duration.milliseconds(100)
    /// Whether the turn's group commit has several clients that save in turn: its events may wait.
    package private(set) var savingInTurn = false

    /// A delay of at most `maximum`, with no commit seen yet (as of `now`).
    package init(maximum: Duration, now: ContinuousClock.Instant = .now) {
        self.maximum = maximum
        lastCommitAt = now
    }

    /// A wait for more saves: until `deadline`, while fewer than `expected` connections have one.
    package struct Wait: Equatable {
        package var deadline: ContinuousClock.Instant
        package var expected: Int

        /// Whether the wait goes on with `connections` connections having a save, at `now`.
        package func goesOn(connections: Int, now: ContinuousClock.Instant) -> Bool {
            connections < expected && now < deadline
        }
    }

    /// The turn has saves of `connections` connections waiting at `now`: how long to wait for
    /// more (nil: commit now). Then tell ``collected(connections:)``.
    package mutating func wait(connections: Int, now: ContinuousClock.Instant) -> Wait? {
        // Clients that stopped saving in turn a while ago are not waited for.
        if now - lastCommitAt > Self.widthsLifetime { widths = widths.map { _ in 0 } }
        let expected = widths.max() ?? 0
        savingInTurn = expected > 1
        let deadline = now + maximum
        guard deadline > now, connections < expected else { return nil }
        return Wait(deadline: deadline, expected: expected)
    }

    /// The turn commits the saves of `connections` connections.
    package mutating func collected(connections: Int) {
        widths[count % widths.count] = connections
        count &+= 1
    }

    /// A group commit ended at `now`.
    package mutating func committed(at now: ContinuousClock.Instant) {
        lastCommitAt = now
    }
}
