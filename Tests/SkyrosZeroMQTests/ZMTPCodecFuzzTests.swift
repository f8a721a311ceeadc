import Foundation
import SkyrosZeroMQ
import Testing

/// ``ZMTPCodec`` under mutated and random input, as the wire codec is fuzzed.
@Suite("ZMTP codec fuzzing")
struct ZMTPCodecFuzzTests {
    /// A seeded xorshift generator: the same inputs on every run.
    struct Generator: RandomNumberGenerator {
        var state: UInt64
        mutating func next() -> UInt64 {
            state ^= state << 13
            state ^= state >> 7
            state ^= state << 17
            return state
        }
    }

    /// Whole conversations as a peer of each socket type sends them, for mutation.
    static let seeds: [(ZMTPSocketType, [UInt8])] = {
        typealias T = ZMTPCodecTests
        var subscribing = ZMTP.handshake(.subscriber)
        ZMTP.appendSubscription(to: &subscribing, Data("ab".utf8), subscribe: true)
        ZMTP.appendSubscription(to: &subscribing, Data(), subscribe: false)
        let ping = T.command("PING", [0, 1] + Array("c".utf8))
        return [
            (
                .router,
                ZMTP.handshake(.dealer) + ZMTP.encode([Data("hello".utf8)])
                    + ZMTP.encode([Data(), Data(repeating: 1, count: 300)])
            ),
            (
                .router,
                T.greeting(minor: 1) + T.ready("REQ", identity: Array("id".utf8)) + ping
                    + ZMTP.encode([Data(), Data("q".utf8)])
            ),
            (
                .publisher,
                subscribing + ZMTP.encode([Data("x".utf8), Data("y".utf8)]) + T.command("SUBSCRIBE", Array("t".utf8))
            ),
            (.dealer, ZMTP.handshake(.router) + ZMTP.encode([Data("reply".utf8)]) + T.command("ERROR", [1, 0x41])),
            (
                .subscriber,
                ZMTP.handshake(.publisher) + ZMTP.encode([Data([1]), Data(repeating: 2, count: 260)]) + ping
            ),
        ]
    }()

    /// Feeds `bytes` to a codec in pieces cut by `random`; returns its events and failure.
    /// Checks what must hold of any input: no message beyond the bounds, nothing before READY,
    /// and nothing left unparsed that makes a whole frame.
    static func run(_ type: ZMTPSocketType, _ bytes: [UInt8], maximumMessageSize: Int, random: inout Generator)
        -> (events: [ZMTPCodec.Event], failure: ZMTPCodec.Failure?)
    {
        var codec = ZMTPCodec(socketType: type, maximumMessageSize: maximumMessageSize)
        var events: [ZMTPCodec.Event] = []
        var offset = 0
        while offset < bytes.count {
            let end = min(bytes.count, offset + Int.random(in: 1...64, using: &random))
            codec.receive(bytes[offset..<end])
            offset = end
            do {
                while let event = try codec.next() {
                    if case .message(let frames) = event {
                        let size = frames.reduce(0) { $0 + $1.count + 9 }
                        #expect(size <= maximumMessageSize + ZMTPCodec.messageOverhead)
                        #expect(type != .publisher)
                    }
                    if case .ready = event { #expect(events.isEmpty) } else { #expect(!events.isEmpty) }
                    events.append(event)
                }
            } catch {
                return (events, error)
            }
        }
        return (events, nil)
    }

    /// One mutation aimed at ZMTP's framing: a byte changed (a flag, a size, a name), the
    /// conversation cut short, a run of it repeated (a second READY, a frame twice), another
    /// conversation's tail spliced on, or a frame header of any flags and size let in.
    static func mutate(_ bytes: inout [UInt8], using random: inout Generator) {
        guard !bytes.isEmpty else { return }
        let at = Int.random(in: 0..<bytes.count, using: &random)
        let kind = Int.random(in: 0..<5, using: &random)
        if kind == 0 {
            bytes[at] = UInt8.random(in: 0...255, using: &random)
        } else if kind == 1 {
            bytes.removeSubrange(at...)
        } else if kind == 2 {
            let run = bytes[at..<min(bytes.count, at + Int.random(in: 1...48, using: &random))]
            bytes.insert(contentsOf: run, at: Int.random(in: 0...bytes.count, using: &random))
        } else if kind == 3 {
            let other = seeds[Int.random(in: 0..<seeds.count, using: &random)].1
            bytes += other[Int.random(in: 0..<other.count, using: &random)...]
        } else {
            let header: [UInt8] = [UInt8.random(in: 0...7, using: &random), UInt8.random(in: 0...255, using: &random)]
            bytes.insert(contentsOf: header, at: at)
        }
    }

    /// 50,000 inputs here (a few seconds); set SKYROS_FUZZ_ITERATIONS=1000000 (or more) for
    /// the long run.
    @Test("mutated and random input never crashes the codec, and gives the same events however it is cut")
    func mutationFuzzing() {
        let iterations = ProcessInfo.processInfo.environment["SKYROS_FUZZ_ITERATIONS"].flatMap(Int.init) ?? 50_000
        var random = Generator(state: 0x5EED_2A11)
        var reachedMessages = 0
        var failures: Set<String> = []
        for iteration in 0..<iterations {
            let (type, seed) = Self.seeds[Int.random(in: 0..<Self.seeds.count, using: &random)]
            var bytes: [UInt8]
            if iteration % 10 == 0 {
                // Random bytes after a valid greeting, or from the start.
                bytes = (0..<Int.random(in: 0...128, using: &random)).map { _ in
                    UInt8.random(in: 0...255, using: &random)
                }
                if iteration % 20 == 0 { bytes = ZMTP.greeting + bytes }
            } else {
                bytes = seed
                for _ in 0...Int.random(in: 0...3, using: &random) { Self.mutate(&bytes, using: &random) }
            }
            let maximum = [100, 1_000, 1 << 20][iteration % 3]
            let cut = Self.run(type, bytes, maximumMessageSize: maximum, random: &random)
            var whole = ZMTPCodec(socketType: type, maximumMessageSize: maximum)
            let once = ZMTPCodecTests.transcript(&whole, bytes)
            guard cut.events == once.events, cut.failure == once.failure else {
                Issue.record("iteration \(iteration): the events depend on how the bytes are cut")
                return
            }
            if once.events.contains(where: { if case .message = $0 { true } else { false } }) { reachedMessages += 1 }
            if let failure = once.failure { failures.insert("\(failure)".prefix(while: { $0 != "(" }).description) }
        }
        // The mutations reach the inner paths: messages, and most kinds of failure.
        #expect(reachedMessages > 0)
        #expect(failures.count >= 5, "failures seen: \(failures.sorted())")
    }
}
