import Foundation
import Skyros
import SkyrosSync
import Testing

/// The upload queue's binary form, byte for byte: queues written by earlier versions must read
/// the same (docs: ``QueuedChangeSet/binaryFormat``).
@Suite struct QueuedChangeSetCodecTests {
    static let id = UUID(uuidString: "00112233-4455-6677-8899-AABBCCDDEEFF")!
    static let idBytes: [UInt8] = [
        0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xAA, 0xBB, 0xCC, 0xDD, 0xEE, 0xFF,
    ]

    /// One value of each kind, each in a row of its own (a row's values are a dictionary, in no order).
    static func bytes(tag: UInt8, payload: [UInt8]) -> [UInt8] {
        [QueuedChangeSet.binaryFormat, 0, 1] + [4] + Array("Item".utf8) + idBytes + [1, 1] + Array("n".utf8) + [tag]
            + payload
            + [0] + [1] + [4] + Array("Item".utf8) + idBytes
    }

    static func changes(_ value: StoredValue) -> QueuedChangeSet {
        var changes = QueuedChangeSet()
        changes.inserted = [QueuedChangeSet.Row(entity: "Item", id: id, values: ["n": value])]
        changes.deleted = [QueuedChangeSet.Reference(entity: "Item", id: id)]
        return changes
    }

    static let cases: [(StoredValue, UInt8, [UInt8])] = [
        (.null, 0, []),
        (.integer(-2), 1, [0xFE, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]),
        (.real(1.5), 2, [0, 0, 0, 0, 0, 0, 0xF8, 0x3F]),
        (.text("é"), 3, [2, 0xC3, 0xA9]),
        (.blob(Data([1, 2, 3])), 4, [3, 1, 2, 3]),
    ]

    @Test(arguments: 0..<5) func eachKindOfValueIsWrittenAndReadAsBefore(_ index: Int) throws {
        let (value, tag, payload) = Self.cases[index]
        let expected = Self.bytes(tag: tag, payload: payload)
        #expect([UInt8](Self.changes(value).encoded()) == expected)
        #expect(try QueuedChangeSet.decode(Data(expected)) == Self.changes(value))
    }

    @Test func aResetAndManyValuesRoundTrip() throws {
        var changes = QueuedChangeSet()
        changes.reset = true
        changes.updated = [
            QueuedChangeSet.Row(
                entity: "Ü", id: UUID(),
                values: ["a": .integer(.max), "b": .text(String(repeating: "x", count: 300)), "c": .null])
        ]
        #expect(try QueuedChangeSet.decode(changes.encoded()) == changes)
    }

    @Test func truncatedOrUnknownBytesAreAStoreFailure() {
        let whole = Self.bytes(tag: 1, payload: [1, 0, 0, 0, 0, 0, 0, 0])
        for length in [1, 3, 10, whole.count - 1] {
            #expect(throws: SkyrosError.self) { try QueuedChangeSet.decode(Data(whole.prefix(length))) }
        }
        #expect(throws: SkyrosError.self) { try QueuedChangeSet.decode(Data([9] + whole.dropFirst())) }
        #expect(throws: SkyrosError.self) { try QueuedChangeSet.decode(Data(whole + [0])) }
        #expect(throws: SkyrosError.self) { try QueuedChangeSet.decode(Data(Self.bytes(tag: 7, payload: []))) }
        // A forged count never allocates: refused before.
        #expect(throws: SkyrosError.self) { try QueuedChangeSet.decode(Data([1, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F])) }
    }

    @Test func jsonFromQueuesBeforeTheBinaryFormIsRead() throws {
        let changes = Self.changes(.integer(3))
        let json = try JSONEncoder().encode(changes)
        #expect(try QueuedChangeSet.decode(json) == changes)
    }

    @Test func aNonceFollowsTheFlagsAndMakesTheSameContentAnotherDigest() throws {
        var changes = Self.changes(.integer(3))
        let without = [UInt8](changes.encoded())
        changes.nonce = 0x0102_0304_0506_0708
        let with = [UInt8](changes.encoded())
        // The flags byte says a nonce follows; then its 8 bytes, little-endian; then as before.
        #expect(Array(with.prefix(10)) == [QueuedChangeSet.binaryFormat, without[1] | 2, 8, 7, 6, 5, 4, 3, 2, 1])
        #expect(Array(with.dropFirst(10)) == Array(without.dropFirst(2)))
        #expect(try QueuedChangeSet.decode(Data(with)) == changes)
        var again = changes
        again.nonce = 0x0102_0304_0506_0709
        #expect(again.digest != changes.digest)
        #expect(try QueuedChangeSet.decode(Data(without)).nonce == nil)
        #expect(throws: SkyrosError.self) { try QueuedChangeSet.decode(Data(with.prefix(6))) }
    }
}
