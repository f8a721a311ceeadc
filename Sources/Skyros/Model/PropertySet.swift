/// A set of property indexes (an object's changed properties): a bit per index below 64,
/// a `Set` beside for the rest (entities that wide are rare).
///
/// Every object a save touches gets one in each context it passes through; as a `Set<Int>`
/// each allocated storage on its first insert and hashed each index, where a word of bits
/// does neither. Iterates in ascending order.
struct PropertySet: Sequence, Equatable, ExpressibleByArrayLiteral, Sendable {
    /// Indexes 0–63.
    private var bits: UInt64 = 0
    /// Indexes 64 and up (nil while there are none).
    private var wide: Set<Int>?

    init() {}

    init(arrayLiteral indexes: Int...) {
        for index in indexes { insert(index) }
    }

    init(_ indexes: some Sequence<Int>) {
        for index in indexes { insert(index) }
    }

    var isEmpty: Bool { bits == 0 && (wide?.isEmpty ?? true) }

    var count: Int { bits.nonzeroBitCount + (wide?.count ?? 0) }

    func contains(_ index: Int) -> Bool {
        if index >= 0 && index < 64 { return bits & (1 << UInt64(index)) != 0 }
        return wide?.contains(index) ?? false
    }

    /// Adds `index`; like `Set.insert`, says whether it was new.
    @discardableResult
    mutating func insert(_ index: Int) -> (inserted: Bool, memberAfterInsert: Int) {
        if index >= 0 && index < 64 {
            let bit: UInt64 = 1 << UInt64(index)
            defer { bits |= bit }
            return (bits & bit == 0, index)
        }
        if wide == nil { wide = [] }
        return wide!.insert(index)
    }

    /// Removes `index`; like `Set.remove`, returns it when it was there.
    @discardableResult
    mutating func remove(_ index: Int) -> Int? {
        if index >= 0 && index < 64 {
            let bit: UInt64 = 1 << UInt64(index)
            guard bits & bit != 0 else { return nil }
            bits &= ~bit
            return index
        }
        return wide?.remove(index)
    }

    func makeIterator() -> Iterator { Iterator(bits: bits, wide: wide.map { $0.sorted() } ?? []) }

    /// The indexes in ascending order: the bits, then the wide ones.
    struct Iterator: IteratorProtocol {
        var bits: UInt64
        let wide: [Int]
        var position = 0

        mutating func next() -> Int? {
            if bits != 0 {
                let index = bits.trailingZeroBitCount
                bits &= bits - 1
                return index
            }
            guard position < wide.count else { return nil }
            defer { position += 1 }
            return wide[position]
        }
    }

    static func == (lhs: PropertySet, rhs: PropertySet) -> Bool {
        lhs.bits == rhs.bits && (lhs.wide ?? []) == (rhs.wide ?? [])
    }
}
