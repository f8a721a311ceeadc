import Foundation

/// The identity of a managed object, stable for its whole life.
///
/// An object ID is assigned when an object is created, in any process, and never changes
/// on save: there are no temporary IDs and nothing to remap. It is made of the entity name
/// and a time-ordered UUID (version 7), so new rows append to the store's index.
///
/// Its URI form is `skyros://<Entity>/<UUID>`.
public struct ObjectID: Hashable, Sendable, Codable, CustomStringConvertible {
    /// The name of the entity of the object.
    public let entityName: String
    /// The primary key of the object.
    public let uuid: UUID

    /// The identifier of an existing object, from its parts (as read from a store or a URI);
    /// ``make(entityName:)`` makes a new one.
    public init(entityName: String, uuid: UUID) {
        self.entityName = entityName
        self.uuid = uuid
    }

    /// A new, unique, time-ordered identifier for an object of `entityName`.
    public static func make(entityName: String) -> ObjectID {
        ObjectID(entityName: entityName, uuid: UUIDv7.next())
    }

    /// The URI form, `skyros://User/0190E4C8-…`.
    public var uriRepresentation: URL {
        URL(string: "skyros://\(entityName)/\(uuid.uuidString)")!
    }

    /// Parses the URI form made by ``uriRepresentation``.
    public init?(uriRepresentation url: URL) {
        guard url.scheme == "skyros", let host = url.host, !host.isEmpty,
            let uuid = UUID(uuidString: url.lastPathComponent)
        else { return nil }
        self.init(entityName: host, uuid: uuid)
    }

    /// `Entity/UUID`, for logs and messages.
    public var description: String { "\(entityName)/\(uuid.uuidString)" }

    /// The identifier its ``description`` names (`Entity/UUID`); nil for other text.
    package init?<Text: StringProtocol>(description text: Text) {
        let parts = text.split(separator: "/", maxSplits: 1)
        guard parts.count == 2, let uuid = UUID(uuidString: String(parts[1])) else { return nil }
        self.init(entityName: String(parts[0]), uuid: uuid)
    }

    /// The store's order of identifiers (ties of a sort): their bytes, as SQLite compares blobs.
    static func compareBytes(_ a: UUID, _ b: UUID) -> ComparisonResult {
        withUnsafeBytes(of: a.uuid) { x in
            withUnsafeBytes(of: b.uuid) { y in
                let order = memcmp(x.baseAddress!, y.baseAddress!, 16)
                return order < 0 ? .orderedAscending : (order == 0 ? .orderedSame : .orderedDescending)
            }
        }
    }

    /// Hashes the UUID alone, which identifies the object.
    public func hash(into hasher: inout Hasher) {
        // The UUID alone identifies the object; two words hash faster than sixteen bytes.
        withUnsafeBytes(of: uuid.uuid) { bytes in
            hasher.combine(bytes.loadUnaligned(as: UInt64.self))
            hasher.combine(bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self))
        }
    }

    /// The hash a `Dictionary` or `Set` of object IDs uses: the UUID's two words mixed with
    /// the table's seed by two rounds of a 64-bit finalizer (MurmurHash3's), a fraction of
    /// SipHash's cost for lookups in a context's registry. Hashing into a `Hasher` (a
    /// Snapshot's hash, for one) goes through ``hash(into:)``.
    public func _rawHashValue(seed: Int) -> Int {
        withUnsafeBytes(of: uuid.uuid) { bytes in
            var x = bytes.loadUnaligned(as: UInt64.self) &+ UInt64(truncatingIfNeeded: seed)
            x = (x ^ (x >> 33)) &* 0xFF51_AFD7_ED55_8CCD
            x ^= bytes.loadUnaligned(fromByteOffset: 8, as: UInt64.self)
            x = (x ^ (x >> 33)) &* 0xC4CE_B9FE_1A85_EC53
            return Int(truncatingIfNeeded: x ^ (x >> 33))
        }
    }

    /// Whether both identify the same object: same UUID and entity.
    public static func == (lhs: ObjectID, rhs: ObjectID) -> Bool {
        lhs.uuid == rhs.uuid && lhs.entityName == rhs.entityName
    }
}

/// Generates RFC 9562 version 7 UUIDs: 48 bits of Unix milliseconds, a 12-bit counter that
/// keeps them monotonic within a process, then 62 random bits from a generator seeded once
/// from the system (no system call per identifier).
enum UUIDv7 {
    private static let state = LockedState()

    private final class LockedState: @unchecked Sendable {
        let lock = NSLock()
        var lastMillis: UInt64 = 0
        var counter: UInt16 = 0
        var random = SplitMix64(seed: UInt64.random(in: .min ... .max))
    }

    static func next() -> UUID {
        var now = timespec()
        clock_gettime(CLOCK_REALTIME, &now)
        let millis = UInt64(now.tv_sec) * 1000 + UInt64(now.tv_nsec) / 1_000_000
        state.lock.lock()
        if millis > state.lastMillis {
            state.lastMillis = millis
            state.counter = UInt16(truncatingIfNeeded: state.random.next()) & 0x3FF
        } else {
            state.counter &+= 1
            if state.counter >= 0x1000 {  // 12-bit counter overflow: borrow the next millisecond
                state.lastMillis += 1
                state.counter = 0
            }
        }
        let ms = state.lastMillis
        let counter = state.counter
        let random = state.random.next()
        state.lock.unlock()
        return UUID(
            uuid: (
                UInt8(truncatingIfNeeded: ms >> 40), UInt8(truncatingIfNeeded: ms >> 32),
                UInt8(truncatingIfNeeded: ms >> 24), UInt8(truncatingIfNeeded: ms >> 16),
                UInt8(truncatingIfNeeded: ms >> 8), UInt8(truncatingIfNeeded: ms),
                0x70 | UInt8(counter >> 8), UInt8(truncatingIfNeeded: counter),
                0x80 | UInt8(truncatingIfNeeded: random >> 58), UInt8(truncatingIfNeeded: random >> 48),
                UInt8(truncatingIfNeeded: random >> 40), UInt8(truncatingIfNeeded: random >> 32),
                UInt8(truncatingIfNeeded: random >> 24), UInt8(truncatingIfNeeded: random >> 16),
                UInt8(truncatingIfNeeded: random >> 8), UInt8(truncatingIfNeeded: random)
            ))
    }
}

/// A small, fast generator (SplitMix64): UUIDv7's random bits (the seed carries the
/// unpredictability), and the same sequence on every run of a seeded test.
package struct SplitMix64: RandomNumberGenerator {
    package var state: UInt64
    package init(seed: UInt64) { state = seed }
    package mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
