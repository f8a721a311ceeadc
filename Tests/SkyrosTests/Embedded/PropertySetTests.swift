import Testing

@testable import Skyros

/// An object's changed properties: bits for the first 64 indexes, a set beside for the rest.
@Suite("Changed-property sets")
struct PropertySetTests {
    @Test("inserts, removes and contains, below and past 64, iterated in ascending order")
    func basics() {
        var set: PropertySet = []
        #expect(set.isEmpty)
        #expect(set.insert(5).inserted)
        #expect(!set.insert(5).inserted)
        set.insert(0)
        set.insert(63)
        set.insert(200)
        set.insert(64)
        #expect(set.count == 5)
        #expect(Array(set) == [0, 5, 63, 64, 200])
        #expect(set.contains(63) && set.contains(64) && set.contains(200))
        #expect(!set.contains(1) && !set.contains(65) && !set.contains(-1))
        #expect(set.remove(5) == 5)
        #expect(set.remove(5) == nil)
        #expect(set.remove(200) == 200)
        #expect(set.remove(201) == nil)
        #expect(Array(set) == [0, 63, 64])
        #expect(set == PropertySet([64, 0, 63]))
        #expect(set != PropertySet([0, 63]))
        for index in [0, 63, 64] { set.remove(index) }
        #expect(set.isEmpty)
        #expect(set == [])
    }
}
