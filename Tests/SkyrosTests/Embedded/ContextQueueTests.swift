import Foundation
import SkyrosTestSupport
import Synchronization
import Testing

@testable import Skyros

/// A context's queue: waited-for blocks of an idle context run at once on the caller's thread;
/// otherwise every block waits its turn. One block at a time, in the order scheduled.
@Suite("Context queue", .timeLimit(.minutes(1)))
struct ContextQueueTests {
    /// Counts that only the queue's exclusion keeps right (no lock of their own).
    final class Tally: @unchecked Sendable {
        var count = 0
        var order: [Int] = []
    }

    @Test("an idle queue runs a waited-for block on the calling thread, and says so only there")
    func inline() {
        let queue = ContextQueue(label: "test")
        let caller = Thread.current
        var ranHere = false
        var owned = false
        let elsewhere = Tally()
        queue.sync {
            ranHere = Thread.current == caller
            owned = queue.isRunningOnCurrentThread
            // Another thread, asking while this block runs, is not taken for its runner.
            let asked = DispatchSemaphore(value: 0)
            Thread.detachNewThread {
                elsewhere.count = queue.isRunningOnCurrentThread ? 1 : 2
                asked.signal()
            }
            _ = asked.wait(timeout: .now() + 10)
        }
        #expect(ranHere)
        #expect(owned)
        #expect(elsewhere.count == 2)
        #expect(!queue.isRunningOnCurrentThread)

        // While a scheduled block runs, another thread is not taken for it.
        let started = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let inside = Tally()
        queue.async {
            inside.count = queue.isRunningOnCurrentThread ? 1 : 0
            started.signal()
            release.wait()
        }
        #expect(started.wait(timeout: .now() + 10) == .success)
        #expect(!queue.isRunningOnCurrentThread)
        release.signal()
        queue.sync {}
        #expect(inside.count == 1)
    }

    @Test("a waited-for block runs after the blocks scheduled before it, in order")
    func order() {
        let queue = ContextQueue(label: "test")
        let tally = Tally()
        let gate = DispatchSemaphore(value: 0)
        queue.async { gate.wait() }  // holds the queue while the rest is scheduled
        for index in 0..<100 {
            queue.async { tally.order.append(index) }
        }
        gate.signal()
        var seen: [Int] = []
        queue.sync { seen = tally.order }
        #expect(seen == Array(0..<100))
    }

    @Test("blocks from many threads, waited for and scheduled, run one at a time")
    func exclusion() {
        let queue = ContextQueue(label: "test")
        let tally = Tally()
        let inside = Atomic<Int>(0)
        let overlaps = Atomic<Int>(0)
        let threads = 8
        let rounds = 2_000
        // Real threads (not the cooperative pool, which has one per processor).
        DispatchQueue.concurrentPerform(iterations: threads) { thread in
            for round in 0..<rounds {
                let body: @Sendable () -> Void = {
                    if inside.add(1, ordering: .acquiringAndReleasing).newValue > 1 {
                        overlaps.add(1, ordering: .relaxed)
                    }
                    tally.count += 1
                    inside.subtract(1, ordering: .acquiringAndReleasing)
                }
                if (thread + round) % 3 == 0 { queue.async(body) } else { queue.sync(body) }
            }
        }
        var total = 0
        queue.sync { total = tally.count }
        #expect(total == threads * rounds)
        #expect(overlaps.load(ordering: .relaxed) == 0)
    }

    @Test(
        "a context's block that waits for its own context runs inline; a nested context's block sees both contexts as its thread's"
    )
    func reentrancy() throws {
        let stack = try Skyros(inMemoryStack: testSchema)
        let main = stack.mainContext
        let scratch = ObjectContext(name: "scratch", parent: main)
        var nested = (inner: false, outer: false, reentered: false)
        scratch.performAndWait {
            main.performAndWait {
                nested.inner = main.isPerformingOnCurrentThread
                nested.outer = scratch.isPerformingOnCurrentThread
                scratch.performAndWait { nested.reentered = scratch.isPerformingOnCurrentThread }
            }
        }
        #expect(nested.inner && nested.outer && nested.reentered)
        #expect(!main.isPerformingOnCurrentThread && !scratch.isPerformingOnCurrentThread)
    }
}
