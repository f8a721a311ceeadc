import Foundation

/// What both ends of a ZMTP 3.0 connection with the NULL mechanism read and write
/// (rfc.zeromq.org/spec/23): the greeting, frames and commands, as bytes. The order they come
/// in is ``ZMTPCodec``'s.
package enum ZMTP {
    /// The greeting: signature, version 3.0, the NULL mechanism, as-server 0 (the NULL
    /// mechanism does not look at it).
    package static let greeting: [UInt8] = {
        var bytes = [UInt8](repeating: 0, count: 64)
        bytes[0] = 0xFF
        bytes[9] = 0x7F
        bytes[10] = 3
        bytes[11] = 0
        for (index, byte) in "NULL".utf8.enumerated() { bytes[12 + index] = byte }
        return bytes
    }()

    /// Whether 64 bytes are a peer's greeting this end can talk to: the signature, a major
    /// version of 3 or more, and the NULL mechanism.
    static func isGreeting(_ bytes: ArraySlice<UInt8>) -> Bool {
        let start = bytes.startIndex
        return bytes.count == 64 && bytes[start] == 0xFF && bytes[start + 9] == 0x7F && bytes[start + 10] >= 3
            && bytes[(start + 12)..<(start + 16)].elementsEqual("NULL".utf8) && bytes[start + 16] == 0
    }

    /// What an end of `socketType` sends first: the greeting and its READY (with an empty
    /// `Identity` from a `ROUTER`, as libzmq's).
    package static func handshake(_ socketType: ZMTPSocketType) -> [UInt8] {
        var bytes = greeting
        appendReady(to: &bytes, socketType: socketType.rawValue, identity: socketType == .router)
        return bytes
    }

    /// A frame's flags and size: one byte of size up to 255, else eight (big-endian).
    package static func appendHeader(to bytes: inout [UInt8], size: Int, more: Bool, command: Bool) {
        let flags: UInt8 = (more ? 0x01 : 0) | (command ? 0x04 : 0)
        if size <= 255 {
            bytes.append(flags)
            bytes.append(UInt8(size))
        } else {
            bytes.append(flags | 0x02)
            for shift in stride(from: 56, through: 0, by: -8) {
                bytes.append(UInt8(truncatingIfNeeded: UInt64(size) >> UInt64(shift)))
            }
        }
    }

    /// The READY command with its `Socket-Type` property, and an empty `Identity` when
    /// `identity`.
    static func appendReady(to bytes: inout [UInt8], socketType: String, identity: Bool) {
        var body: [UInt8] = [5] + Array("READY".utf8)
        func property(_ name: String, _ value: [UInt8]) {
            body.append(UInt8(name.utf8.count))
            body += Array(name.utf8)
            for shift in stride(from: 24, through: 0, by: -8) {
                body.append(UInt8(truncatingIfNeeded: value.count >> shift))
            }
            body += value
        }
        property("Socket-Type", Array(socketType.utf8))
        if identity { property("Identity", []) }
        appendHeader(to: &bytes, size: body.count, more: false, command: true)
        bytes += body
    }

    /// A message's frames as ZMTP frames.
    ///
    /// Specialized (exported) for the frames the client and the daemon send, byte arrays:
    /// called from other modules, the generic version walks every frame through witness tables.
    @_specialize(exported:true,where Frames == [[UInt8]])
    @_specialize(exported:true,where Frames == CollectionOfOne<[UInt8]>)
    package static func encode<Frames: Collection>(_ frames: Frames) -> [UInt8]
    where Frames.Element: Collection<UInt8> {
        var bytes: [UInt8] = []
        var size = 0
        for frame in frames { size += frame.count + 9 }
        bytes.reserveCapacity(size)
        var left = frames.count
        for frame in frames {
            left -= 1
            appendHeader(to: &bytes, size: frame.count, more: left > 0, command: false)
            // Contiguous frames (arrays, `Data`) in one copy, in the generic version too.
            if frame.withContiguousStorageIfAvailable({ bytes.append(contentsOf: $0) }) == nil {
                bytes.append(contentsOf: frame)
            }
        }
        return bytes
    }

    /// ZMTP 3.0's subscription message: a frame of 1 (subscribe) or 0 (cancel), then the prefix.
    package static func appendSubscription(to bytes: inout [UInt8], _ prefix: Data, subscribe: Bool) {
        appendHeader(to: &bytes, size: prefix.count + 1, more: false, command: false)
        bytes.append(subscribe ? 1 : 0)
        bytes.append(contentsOf: prefix)
    }

    /// ZMTP 3.1's PONG command, with the context of the PING it answers.
    package static func pong(context: [UInt8]) -> [UInt8] {
        let body: [UInt8] = [4] + Array("PONG".utf8) + context
        var bytes: [UInt8] = []
        appendHeader(to: &bytes, size: body.count, more: false, command: true)
        return bytes + body
    }

    /// What the bytes at `start` hold.
    enum Frame {
        /// Not a frame: unknown flags, or larger than the maximum message size.
        case invalid
        /// Not all of it yet; how many bytes from `start` it takes, once its header is here.
        case incomplete(needs: Int?)
        /// A whole frame: its flags (0x01 more, 0x04 command) and where its body is.
        case frame(flags: UInt8, body: Range<Int>)
    }

    static func frame(in input: [UInt8], at start: Int, maximumSize: Int) -> Frame {
        let available = input.count - start
        guard available >= 2 else { return .incomplete(needs: nil) }
        let flags = input[start]
        guard flags & ~0x07 == 0 else { return .invalid }
        let isLong = flags & 0x02 != 0
        let headerSize = isLong ? 9 : 2
        guard available >= headerSize else { return .incomplete(needs: nil) }
        var size = 0
        if isLong {
            var value: UInt64 = 0
            for index in 1...8 { value = value << 8 | UInt64(input[start + index]) }
            guard value <= UInt64(maximumSize) else { return .invalid }
            size = Int(value)
        } else {
            size = Int(input[start + 1])
        }
        guard size <= maximumSize else { return .invalid }
        guard available >= headerSize + size else { return .incomplete(needs: headerSize + size) }
        return .frame(flags: flags & ~0x02, body: (start + headerSize)..<(start + headerSize + size))
    }

    /// A command frame's body: its name, and the properties of a READY (names lowercased:
    /// ZMTP's property names are case-insensitive).
    struct Command {
        var name: String
        var body: ArraySlice<UInt8>
        var properties: [String: Data] = [:]

        /// Nil when the body does not hold a name, or a READY's properties run past it.
        init?(_ body: ArraySlice<UInt8>) {
            guard let length = body.first, body.count >= 1 + Int(length) else { return nil }
            var index = body.startIndex + 1
            name = String(decoding: body[index..<(index + Int(length))], as: UTF8.self)
            self.body = body
            index += Int(length)
            guard name == "READY" else { return }
            while index < body.endIndex {
                let nameLength = Int(body[index])
                guard body.endIndex - index >= 1 + nameLength + 4 else { return nil }
                let key = String(decoding: body[(index + 1)..<(index + 1 + nameLength)], as: UTF8.self).lowercased()
                index += 1 + nameLength
                var valueLength = 0
                for offset in 0..<4 { valueLength = valueLength << 8 | Int(body[index + offset]) }
                index += 4
                guard body.endIndex - index >= valueLength else { return nil }
                properties[key] = Data(body[index..<(index + valueLength)])
                index += valueLength
            }
        }
    }
}
