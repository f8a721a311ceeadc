import Foundation

/// The stored values of one object: one per property of its entity, in declaration order
/// (NULL for a to-many relationship, which has no column).
///
/// A copy-on-write collection, like `ContiguousArray<StoredValue>`, but allocated in one step
/// for a count known up front and with no generic lookup: a fetch makes one for every row.
///
/// ```swift
/// let values: StoredValues = [.text("Ada"), .integer(36), .null]
/// var copy = values
/// copy[1] = .integer(37)  // `values` is unchanged
/// ```
public struct StoredValues: RandomAccessCollection, MutableCollection, Hashable, Codable, ExpressibleByArrayLiteral,
    CustomStringConvertible
{
    /// Elements, with how many of them are initialized as the header. Values of their own
    /// have a buffer each; the rows of one fetch share buffers (see ``Arena``).
    @usableFromInline
    final class Buffer: ManagedBuffer<Int, StoredValue> {
        /// A buffer for `capacity` values, none initialized yet.
        @inlinable
        static func make(capacity: Int) -> Buffer {
            unsafeDowncast(create(minimumCapacity: capacity) { _ in 0 }, to: Buffer.self)
        }

        deinit {
            withUnsafeMutablePointers { count, elements in Self.deinitialize(elements, count: count.pointee) }
        }

        /// Deinitializes the values, destroying only those that hold a reference (text, blob):
        /// an arena's buffer holds thousands of integers and doubles, and the runtime's
        /// `deinitialize(count:)` calls a destroy witness for every one of them.
        static func deinitialize(_ elements: UnsafeMutablePointer<StoredValue>, count: Int) {
            for index in 0..<count {
                switch elements[index] {
                case .null, .integer, .real: continue
                case .text, .blob: (elements + index).deinitialize(count: 1)
                }
            }
        }
    }

    @usableFromInline var buffer: Buffer
    /// Where these values start in `buffer`, and how many there are.
    @usableFromInline var offset: Int32
    @usableFromInline var length: Int32

    @inlinable
    init(buffer: Buffer, offset: Int, count: Int) {
        self.buffer = buffer
        self.offset = Int32(offset)
        self.length = Int32(count)
    }

    /// Makes `count` values that `initializer` initializes, all of them, in place.
    @inlinable
    public init(
        unsafeUninitializedCount count: Int, initializingWith initializer: (UnsafeMutablePointer<StoredValue>) -> Void
    ) {
        precondition(count >= 0 && count <= Int(Int32.max), "an impossible count of values")
        let buffer = Buffer.make(capacity: count)
        buffer.withUnsafeMutablePointers { header, elements in
            initializer(elements)
            header.pointee = count
        }
        self.init(buffer: buffer, offset: 0, count: count)
    }

    /// Makes the values of many rows, a few thousand values to a buffer: a fetch makes one
    /// allocation per buffer instead of one per row. The rows of a buffer keep it alive
    /// together (about 100 KB); a row written to gets a buffer of its own first.
    package struct Arena {
        /// The buffer being filled; its header counts the values given out.
        private var buffer: StoredValues.Buffer?
        /// Values per shared buffer.
        static let valuesPerBuffer = 4096

        /// An arena with no buffer yet.
        package init() {}

        /// Makes `count` values that `initializer` initializes, all of them, in place.
        package mutating func make(
            count: Int, initializingWith initializer: (UnsafeMutablePointer<StoredValue>) -> Void
        ) -> StoredValues {
            if count > Self.valuesPerBuffer / 4 {
                return StoredValues(unsafeUninitializedCount: count, initializingWith: initializer)
            }
            var start = buffer?.withUnsafeMutablePointerToHeader { $0.pointee } ?? Self.valuesPerBuffer
            if start + count > Self.valuesPerBuffer {
                buffer = .make(capacity: Self.valuesPerBuffer)
                start = 0
            }
            let buffer = buffer!
            buffer.withUnsafeMutablePointers { header, elements in
                initializer(elements + start)
                header.pointee = start + count
            }
            return StoredValues(buffer: buffer, offset: start, count: count)
        }
    }

    /// `count` copies of `value`.
    public init(repeating value: StoredValue, count: Int) {
        self.init(unsafeUninitializedCount: count) { $0.initialize(repeating: value, count: count) }
    }

    /// The values of a sequence, in order.
    public init<S: Sequence>(_ elements: S) where S.Element == StoredValue {
        let array = ContiguousArray(elements)
        self.init(unsafeUninitializedCount: array.count) { target in
            array.withUnsafeBufferPointer { source in
                if let base = source.baseAddress { target.initialize(from: base, count: source.count) }
            }
        }
    }

    /// No values.
    public init() { self.init(unsafeUninitializedCount: 0) { _ in } }

    /// The values of an array literal, as `[.integer(1), .text("a")]`.
    public init(arrayLiteral elements: StoredValue...) { self.init(elements) }

    // MARK: Collection

    /// Always 0.
    /// The number of values.
    @inlinable public var startIndex: Int { 0 }
    @inlinable public var endIndex: Int { Int(length) }

    /// The value at `position` (0 ≤ position < count; anything else traps). Setting it copies
    /// values shared with another `StoredValues` first.
    @inlinable
    public subscript(position: Int) -> StoredValue {
        get {
            precondition(position >= 0 && position < Int(length), "StoredValues index out of range")
            return buffer.withUnsafeMutablePointerToElements { $0[Int(offset) + position] }
        }
        set {
            precondition(position >= 0 && position < Int(length), "StoredValues index out of range")
            if !isKnownUniquelyReferenced(&buffer) { self = copied() }
            buffer.withUnsafeMutablePointerToElements { $0[Int(offset) + position] = newValue }
        }
    }

    /// The same values in a buffer of their own, before a write to values that are shared.
    @usableFromInline
    func copied() -> StoredValues {
        buffer.withUnsafeMutablePointerToElements { source in
            StoredValues(unsafeUninitializedCount: count) { $0.initialize(from: source + Int(offset), count: count) }
        }
    }

    // MARK: Hashable, Codable, description

    /// Whether both hold equal values in the same order.
    public static func == (lhs: StoredValues, rhs: StoredValues) -> Bool {
        (lhs.buffer === rhs.buffer && lhs.offset == rhs.offset && lhs.length == rhs.length) || lhs.elementsEqual(rhs)
    }

    /// Hashes the count and every value.
    public func hash(into hasher: inout Hasher) {
        hasher.combine(count)
        for value in self { hasher.combine(value) }
    }

    /// Encoded as an array of values, as `[StoredValue]` is.
    public init(from decoder: any Decoder) throws {
        self.init(try [StoredValue](from: decoder))
    }

    /// Encodes the values as an array, as `[StoredValue]` does.
    public func encode(to encoder: any Encoder) throws {
        try Array(self).encode(to: encoder)
    }

    /// The values as an array literal.
    public var description: String { Array(self).description }
}

// Values are only written through a buffer no other copy shares (copy on write).
extension StoredValues: @unchecked Sendable {}
