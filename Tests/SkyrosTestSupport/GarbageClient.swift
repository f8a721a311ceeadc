import Foundation
import Skyros
import SkyrosWire
import SkyrosZeroMQ
import ZeroMQReference

/// A member of a group that sends the daemon garbage and reads every reply (so that none is
/// dropped, and the count of replies tells when the daemon has read everything): used by the
/// memory-bound test and by `skyros-bench shared --garbage`. It says hello first: a connection
/// that does not is closed after the hello timeout.
public final class GarbageClient {
    private let context: ZeroMQContext
    private let socket: ZeroMQSocket
    private let schema: Schema

    /// Connects to a daemon's request endpoint and says hello with `schema`.
    public init(_ endpoint: String, schema: Schema) throws {
        self.schema = schema
        context = try ZeroMQContext()
        socket = try ZeroMQSocket(context: context, kind: .dealer)
        try socket.setReceiveTimeout(milliseconds: 10_000)
        try socket.connect(endpoint)
        try socket.send([
            Data(
                WireMessage(
                    requestID: 1, body: .hello(try WireMessage.Hello(schema: schema, clientName: "garbage"))
                ).encoded())
        ])
        _ = try socket.receive()
    }

    deinit { socket.close() }

    /// Sends `count` frames that are not messages (random bytes, 1 to 64 of them, with a
    /// version byte that is not the protocol's); returns how many error replies came back.
    public func malformedFrames(_ count: Int) throws -> Int {
        var generator = SystemRandomNumberGenerator()
        var replies = 0
        var sent = 0
        // In windows of 500, well under the high-water marks: past them ZeroMQ drops replies.
        while sent < count {
            let window = min(500, count - sent)
            for _ in 0..<window {
                var bytes = (0..<Int.random(in: 1...64, using: &generator)).map { _ in
                    UInt8.random(in: 0...255, using: &generator)
                }
                bytes[0] = 0xEE
                try socket.send([Data(bytes)])
            }
            sent += window
            while replies < sent, (try? socket.receive()) != nil { replies += 1 }
            guard replies == sent else { break }
        }
        return replies
    }

    /// Sends `count` hellos whose client name is `nameBytes` long, one after the other;
    /// returns how many were refused with `malformedMessage`.
    public func longNameHellos(_ count: Int, nameBytes: Int) throws -> Int {
        let name = String(repeating: "n", count: nameBytes)
        let hello = WireMessage(
            requestID: 2,
            body: .hello(
                WireMessage.Hello(
                    schemaFingerprint: schema.fingerprint, schemaVersion: 1, clientName: name, pid: 1,
                    schemaDescription: [])))
        let frame = Data(hello.encoded())
        var refused = 0
        for _ in 0..<count {
            try socket.send([frame])
            let reply = try WireMessage.decode([UInt8](try socket.receive().last ?? Data()))
            if case .error(let code, _) = reply.body, code == SkyrosError.Code.malformedMessage.rawValue {
                refused += 1
            }
        }
        return refused
    }
}
