import SkyrosGateway
import Testing

/// The gateway's catching up (``CatchUpTurns``) as transcripts: machines no change concerns are
/// still told, in turns spread over the changes, never all at once.
@Suite("Sync gateway: catching up in turns")
struct CatchUpTurnsTests {
    /// Runs `changes` changes among `count` machines, each concerning `concerned` only (as the
    /// gateway's tell does); the changes at which each machine was told, and the most machines
    /// told at one change beside the concerned ones.
    func transcript(count: Int, changes: Int, concerned: Set<Int>, rounds: Int = 32) -> (
        told: [[Int]], widest: Int
    ) {
        var turns = CatchUpTurns(rounds: rounds)
        var lastTold = Array(repeating: 0, count: count)
        var told = Array(repeating: [Int](), count: count)
        var widest = 0
        for _ in 0..<changes {
            let turn = turns.next(count: count)
            var extra = 0
            for index in 0..<count {
                let isConcerned = concerned.contains(index)
                guard isConcerned || (turn.includes(index) && turn.isDue(toldAt: lastTold[index])) else { continue }
                if !isConcerned { extra += 1 }
                lastTold[index] = turn.change
                told[index].append(turn.change)
            }
            widest = max(widest, extra)
        }
        return (told, widest)
    }

    @Test(
        "three machines, every change concerning one: the two others are told once in every 32 to 64 changes, one at a time"
    )
    func fewMachines() {
        let (told, widest) = transcript(count: 3, changes: 200, concerned: [0])
        #expect(told[0].count == 200)
        for index in 1...2 {
            let gaps = zip([0] + told[index], told[index]).map { $1 - $0 }
            #expect(!gaps.isEmpty && gaps.allSatisfy { $0 >= 32 && $0 <= 64 }, "machine \(index): \(told[index])")
        }
        #expect(widest == 1)
    }

    @Test(
        "10,000 machines, no change concerning them: each is told within 64 changes, never more than 313 at one change")
    func manyMachines() {
        let (told, widest) = transcript(count: 10_000, changes: 300, concerned: [])
        #expect(widest <= (10_000 + 31) / 32)
        for index in stride(from: 0, to: 10_000, by: 97) {
            let gaps = zip([0] + told[index], told[index]).map { $1 - $0 }
            #expect(!gaps.isEmpty && gaps.allSatisfy { $0 <= 64 }, "machine \(index): \(told[index])")
        }
    }

    @Test("no machine: turns go on, telling nobody")
    func none() {
        var turns = CatchUpTurns()
        let turn = turns.next(count: 0)
        #expect(turn.change == 1)
        #expect(!turn.includes(0))
    }
}
