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
    /// The elements, with their count as the header.
    @usableFromInline
    final class Buffer: ManagedBuffer<Int, StoredValue> {
        deinit {
            _ = withUnsafeMutablePointers { count, elements in elements.deinitialize(count: count.pointee) }
        }
    }

    @usableFromInline var buffer: Buffer

    /// Makes `count` values that `initializer` initializes, all of them, in place.
    @inlinable
    public init(unsafeUninitializedCount count: Int, initializingWith initializer: (UnsafeMutablePointer<StoredValue>) -> Void) {
        precondition(count >= 0, "a negative count of values")
        buffer = unsafeDowncast(Buffer.create(minimumCapacity: count) { _ in 0 }, to: Buffer.self)
        buffer.withUnsafeMutablePointers { header, elements in
            initializer(elements)
            header.pointee = count
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

    public init(arrayLiteral elements: StoredValue...) { self.init(elements) }

    // MARK: Collection

    @inlinable public var startIndex: Int { 0 }
    // Read through its address: `ManagedBuffer.header` is a class property, each access of
    // which would be checked for exclusivity at run time.
    @inlinable public var endIndex: Int { buffer.withUnsafeMutablePointerToHeader { $0.pointee } }

    @inlinable
    public subscript(position: Int) -> StoredValue {
        get {
            precondition(position >= 0 && position < endIndex, "StoredValues index out of range")
            return buffer.withUnsafeMutablePointerToElements { $0[position] }
        }
        set {
            precondition(position >= 0 && position < endIndex, "StoredValues index out of range")
            if !isKnownUniquelyReferenced(&buffer) { buffer = copiedBuffer() }
            buffer.withUnsafeMutablePointerToElements { $0[position] = newValue }
        }
    }

    /// A buffer of its own, before a write to values that are shared.
    @usableFromInline
    func copiedBuffer() -> Buffer {
        buffer.withUnsafeMutablePointerToElements { source in
            StoredValues(unsafeUninitializedCount: count) { $0.initialize(from: source, count: count) }.buffer
        }
    }

    // MARK: Hashable, Codable, description

    public static func == (lhs: StoredValues, rhs: StoredValues) -> Bool {
        lhs.buffer === rhs.buffer || lhs.elementsEqual(rhs)
    }

    public func hash(into hasher: inout Hasher) {
        hasher.combine(count)
        for value in self { hasher.combine(value) }
    }

    /// Encoded as an array of values, as `[StoredValue]` is.
    public init(from decoder: any Decoder) throws {
        self.init(try [StoredValue](from: decoder))
    }

    public func encode(to encoder: any Encoder) throws {
        try Array(self).encode(to: encoder)
    }

    public var description: String { Array(self).description }
}

// Values are only written through a buffer no other copy shares (copy on write).
extension StoredValues: @unchecked Sendable {}
