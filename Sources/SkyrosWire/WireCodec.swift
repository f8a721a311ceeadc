import Foundation
import Skyros

/// Why a frame could not be decoded. The daemon answers each with an error reply (or drops
/// the frame when it cannot even tell who sent it) and goes on serving.
package enum WireError: Error, Equatable, Sendable, CustomStringConvertible {
    case truncated
    case trailingBytes(Int)
    case tooLarge(Int)
    case unsupportedVersion(UInt8)
    case unknownMessageType(UInt8)
    /// A kind the protocol reserves that this build does not implement yet.
    case unimplementedMessageType(UInt8)
    case invalidTag(String, UInt8)
    case invalidUTF8
    case tooDeep
    /// A field that is not valid: the description is "invalid " then the field's name (a noun
    /// phrase: "varint", "merge policy 7").
    case invalidValue(String)
    /// A message the protocol does not allow, said as a sentence of its own.
    case refused(String)

    /// The reason, for an error reply or a log.
    package var description: String {
        switch self {
        case .truncated: "the message ends too early"
        case .trailingBytes(let count): "\(count) unexpected bytes after the message"
        case .tooLarge(let size): "the message is \(size) bytes, more than allowed"
        case .unsupportedVersion(let version):
            "protocol version \(version) is not supported (this side speaks \(WireProtocol.version))"
        case .unknownMessageType(let type): "unknown message type \(type)"
        case .unimplementedMessageType(let type): "message type \(type) is reserved and not implemented by this daemon"
        case .invalidTag(let what, let tag): "invalid \(what) tag \(tag)"
        case .invalidUTF8: "a string is not valid UTF-8"
        case .tooDeep: "the predicate is nested too deeply"
        case .invalidValue(let what): "invalid \(what)"
        case .refused(let why): why
        }
    }
}

/// Appends the primitives of the wire format (see docs/PROTOCOL.md) to a byte buffer.
package struct WireWriter {
    package private(set) var bytes: [UInt8] = []

    package init() {}

    /// A writer whose buffer has room for `capacity` bytes before it grows.
    package init(capacity: Int) { bytes.reserveCapacity(capacity) }

    package mutating func byte(_ value: UInt8) { bytes.append(value) }

    /// Unsigned LEB128.
    package mutating func uvarint(_ value: UInt64) {
        var value = value
        while value >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: value) | 0x80)
            value >>= 7
        }
        bytes.append(UInt8(value))
    }

    /// Signed integers, zigzag then LEB128.
    package mutating func varint(_ value: Int64) {
        uvarint(UInt64(bitPattern: (value << 1) ^ (value >> 63)))
    }

    /// Eight bytes, little-endian.
    package mutating func fixed64(_ value: UInt64) {
        withUnsafeBytes(of: value.littleEndian) { bytes.append(contentsOf: $0) }
    }

    /// IEEE 754 binary64, little-endian.
    package mutating func double(_ value: Double) { fixed64(value.bitPattern) }

    package mutating func bool(_ value: Bool) { bytes.append(value ? 1 : 0) }

    package mutating func data<C: Collection>(_ value: C) where C.Element == UInt8 {
        uvarint(UInt64(value.count))
        bytes.append(contentsOf: value)
    }

    package mutating func string(_ value: String) {
        var value = value
        value.withUTF8 { data($0) }
    }

    package mutating func uuid(_ value: UUID) {
        withUnsafeBytes(of: value.uuid) { bytes.append(contentsOf: $0) }
    }
}

/// Reads the primitives of the wire format, refusing anything out of bounds: every read
/// checks the remaining length, and counts are checked against it before allocating.
package struct WireReader {
    let bytes: [UInt8]
    package internal(set) var position = 0
    /// Short strings this reader decoded, by their bytes: a message of events names the same
    /// entities and author again and again, and each is validated and made once.
    private var recentStrings = RecentStrings()

    /// Where the inserted objects of change events go with their values still encoded, when
    /// set (``WireMessage/decodeReply(_:keepingInsertedValuesEncoded:)``).
    var encodedRows: EncodedRows.Source?

    package init(_ bytes: [UInt8]) { self.bytes = bytes }

    /// A reader of `bytes` from `position` on.
    init(_ bytes: [UInt8], at position: Int) {
        self.bytes = bytes
        self.position = position
    }

    package var remaining: Int { bytes.count - position }

    package mutating func byte() throws(WireError) -> UInt8 {
        guard position < bytes.count else { throw .truncated }
        defer { position += 1 }
        return bytes[position]
    }

    package mutating func uvarint() throws(WireError) -> UInt64 {
        // One byte (counts, lengths, small numbers): most of them.
        if position < bytes.count, bytes[position] < 0x80 {
            defer { position += 1 }
            return UInt64(bytes[position])
        }
        var result: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            let next = try byte()
            if shift == 63 && next > 1 { throw .invalidValue("varint") }
            result |= UInt64(next & 0x7F) << shift
            if next & 0x80 == 0 { return result }
            shift += 7
            if shift > 63 { throw .invalidValue("varint") }
        }
    }

    package mutating func varint() throws(WireError) -> Int64 {
        let raw = try uvarint()
        return Int64(bitPattern: (raw >> 1) ^ (0 &- (raw & 1)))
    }

    /// A count of elements that each take at least `minimumSize` bytes: refused when the
    /// message is too short to hold them, so a forged count never allocates.
    package mutating func count(minimumSize: Int = 1) throws(WireError) -> Int {
        let value = try uvarint()
        guard value <= UInt64(remaining / max(1, minimumSize)) else { throw .truncated }
        return Int(value)
    }

    package mutating func int() throws(WireError) -> Int {
        let value = try uvarint()
        guard value <= UInt64(Int.max) else { throw .invalidValue("integer") }
        return Int(value)
    }

    /// Eight bytes, little-endian.
    package mutating func fixed64() throws(WireError) -> UInt64 {
        guard remaining >= 8 else { throw .truncated }
        let raw = bytes.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: position, as: UInt64.self) }
        position += 8
        return UInt64(littleEndian: raw)
    }

    package mutating func double() throws(WireError) -> Double {
        Double(bitPattern: try fixed64())
    }

    package mutating func bool() throws(WireError) -> Bool {
        switch try byte() {
        case 0: return false
        case 1: return true
        case let tag: throw .invalidTag("bool", tag)
        }
    }

    package mutating func data() throws(WireError) -> [UInt8] {
        let length = try count()
        defer { position += length }
        return Array(bytes[position..<(position + length)])
    }

    /// A string, refused unless its bytes are valid UTF-8. Decoded straight from the message
    /// (no copy of the bytes first); `String(decoding:)` replaces invalid sequences, so
    /// unless the bytes are ASCII (entity names, most text: always valid) the result is
    /// compared with them, which costs less than the generic validating path.
    ///
    /// With `remembered` (the default: names, which repeat), a short string is looked for
    /// among the last few this reader decoded, and kept among them.
    package mutating func string(remembered: Bool = true) throws(WireError) -> String {
        let length = try count()
        let key = remembered && length <= RecentStrings.maximumLength ? RecentStrings.key(bytes, position, length) : nil
        if let key, let text = recentStrings[key] {
            position += length
            return text
        }
        let text = bytes.withUnsafeBufferPointer { buffer -> String? in
            let raw = UnsafeBufferPointer(rebasing: buffer[position..<(position + length)])
            return Self.isASCII(raw) ? String(decoding: raw, as: UTF8.self) : Self.validatedText(raw)
        }
        guard let text else { throw .invalidUTF8 }
        position += length
        if let key { recentStrings.keep(text, for: key) }
        return text
    }

    /// Goes past a string, refused as ``string(remembered:)`` refuses it (not UTF-8), without
    /// making it when it is ASCII.
    mutating func skipString() throws(WireError) {
        let length = try count()
        let valid = bytes.withUnsafeBufferPointer { buffer -> Bool in
            let raw = UnsafeBufferPointer(rebasing: buffer[position..<(position + length)])
            return Self.isASCII(raw) || Self.validatedText(raw) != nil
        }
        guard valid else { throw .invalidUTF8 }
        position += length
    }

    /// Whether the bytes are ASCII (so valid UTF-8 as they are).
    private static func isASCII(_ raw: UnsafeBufferPointer<UInt8>) -> Bool {
        var high: UInt8 = 0
        for byte in raw { high |= byte }
        return high < 0x80
    }

    /// The text of the bytes when they are valid UTF-8: `String(decoding:)` replaces invalid
    /// sequences, so the result is compared with them.
    private static func validatedText(_ raw: UnsafeBufferPointer<UInt8>) -> String? {
        let text = String(decoding: raw, as: UTF8.self)
        var copy = text
        return copy.withUTF8 { $0.elementsEqual(raw) } ? text : nil
    }

    package mutating func uuid() throws(WireError) -> UUID {
        guard remaining >= 16 else { throw .truncated }
        // Loaded as a UUID (16 plain bytes): `UUID(uuid:)` is a call into Foundation.
        let value = bytes.withUnsafeBytes { $0.loadUnaligned(fromByteOffset: position, as: UUID.self) }
        position += 16
        return value
    }
}

/// The last few short strings a ``WireReader`` decoded (valid UTF-8 all), found again by
/// their bytes: four slots, the oldest replaced.
struct RecentStrings {
    /// A string's bytes, zero-padded, and its length: equal keys are equal bytes.
    struct Key: Equatable {
        var low: UInt64
        var high: UInt64
        var length: Int
    }

    static let maximumLength = 16
    private var slots: [(key: Key, text: String)] = []
    private var next = 0

    /// The key of the `length` bytes at `position` (at most ``maximumLength``, in bounds).
    static func key(_ bytes: [UInt8], _ position: Int, _ length: Int) -> Key {
        bytes.withUnsafeBytes { buffer in
            // Two loads when 16 bytes are there (the bytes past the string masked off).
            if position + 16 <= buffer.count {
                let low = UInt64(littleEndian: buffer.loadUnaligned(fromByteOffset: position, as: UInt64.self))
                let high = UInt64(littleEndian: buffer.loadUnaligned(fromByteOffset: position + 8, as: UInt64.self))
                return Key(
                    low: length >= 8 ? low : low & ((1 << (UInt64(length) * 8)) - 1),
                    high: length >= 16 ? high : length <= 8 ? 0 : high & ((1 << (UInt64(length - 8) * 8)) - 1),
                    length: length)
            }
            var words: (UInt64, UInt64) = (0, 0)
            withUnsafeMutableBytes(of: &words) {
                $0.copyMemory(from: UnsafeRawBufferPointer(rebasing: buffer[position..<(position + length)]))
            }
            return Key(low: UInt64(littleEndian: words.0), high: UInt64(littleEndian: words.1), length: length)
        }
    }

    subscript(key: Key) -> String? {
        for index in slots.indices where slots[index].key == key { return slots[index].text }
        return nil
    }

    mutating func keep(_ text: String, for key: Key) {
        if slots.count < 4 {
            slots.append((key, text))
        } else {
            slots[next] = (key, text)
            next = (next + 1) % 4
        }
    }
}
