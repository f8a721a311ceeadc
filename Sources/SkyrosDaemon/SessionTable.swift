import Foundation
import Skyros
import SkyrosWire

/// The daemon's sessions as a value: the connections that said hello, by ZeroMQ identity,
/// with what each said (name, pid, schema version) and the event topic each was given.
///
/// It decides hellos and nothing else: no socket, no store. The daemon feeds it a decoded
/// hello and carries out the outcome (a welcome or an error reply).
struct SessionTable {
    /// A connection that said hello.
    struct Session: Equatable {
        var name: String
        var pid: UInt64
        var schemaVersion: UInt64
        /// See ``WireProtocol/broadcastTopic``: topics are given in turn from 1 to 255; two
        /// connections share one only past 255 of them.
        var topic: UInt8
    }

    /// How many sessions are remembered; past it, all are forgotten (each client says hello
    /// again when told `helloRequired`), so a daemon serving short-lived clients for months
    /// does not grow without bound.
    let maximumSessions: Int
    private(set) var sessions: [Data: Session] = [:] {
        didSet { knownVersions = nil }
    }
    private var nextTopic: UInt8 = 1
    /// ``schemaVersions``, gathered again after a change of `sessions` (hellos and forgetting
    /// are rare; the daemon asks on every publish).
    private var knownVersions: Set<UInt64>?

    /// The schema versions the sessions have: O(1) while no session came or went, however
    /// many sessions there are.
    var schemaVersions: Set<UInt64> {
        mutating get {
            if let knownVersions { return knownVersions }
            let versions = Set(sessions.values.map(\.schemaVersion))
            knownVersions = versions
            return versions
        }
    }

    init(maximumSessions: Int) {
        self.maximumSessions = max(1, maximumSessions)
    }

    subscript(identity: Data) -> Session? { sessions[identity] }

    /// What a hello leads to.
    enum HelloOutcome: Equatable {
        /// Welcome the connection with this event topic; `forgotOthers`: the table was full
        /// and every other session was forgotten first.
        case welcome(topic: UInt8, forgotOthers: Bool)
        case refuse(code: SkyrosError.Code, message: String)
    }

    /// The refusal of a hello for what it says besides its schema (protocol version, name);
    /// nil when those are acceptable. Checked before anything is done for its schema.
    static func refusal(of hello: WireMessage.Hello) -> HelloOutcome? {
        guard hello.protocolVersion == UInt64(WireProtocol.version) else {
            return .refuse(
                code: .unsupportedProtocolVersion,
                message: "the daemon speaks protocol \(WireProtocol.version), not \(hello.protocolVersion)")
        }
        guard hello.schemaVersion >= 1 else {
            return .refuse(code: .malformedMessage, message: "the hello's schema version is 1 or more, not 0")
        }
        let nameBytes = hello.clientName.utf8.count
        guard nameBytes <= WireProtocol.maximumClientNameBytes else {
            return .refuse(
                code: .malformedMessage,
                message:
                    "the client name is \(nameBytes) bytes; at most \(WireProtocol.maximumClientNameBytes) are allowed")
        }
        return nil
    }

    /// Forgets the sessions of a schema version (a migration left them unprojectable): each
    /// is told `helloRequired` on its next request, and its hello is refused with the reason.
    mutating func forget(schemaVersion: UInt64) {
        sessions = sessions.filter { $0.value.schemaVersion != schemaVersion }
    }

    /// Decides a hello against the store's schema fingerprint (nil: the group has no store
    /// yet and the hello's description is about to create it), or the fingerprint of the
    /// earlier version the daemon projects for it.
    mutating func hello(_ identity: Data, _ hello: WireMessage.Hello, storeFingerprint: String) -> HelloOutcome {
        if let refusal = Self.refusal(of: hello) { return refusal }
        guard storeFingerprint == hello.schemaFingerprint else {
            return .refuse(
                code: .schemaMismatch,
                message:
                    "the group's store has schema \(storeFingerprint), the client \(hello.clientName) has \(hello.schemaFingerprint)"
            )
        }
        var forgot = false
        if sessions[identity] == nil && sessions.count >= maximumSessions {
            sessions.removeAll()
            forgot = true
        }
        let topic: UInt8
        if let known = sessions[identity]?.topic {
            topic = known
        } else {
            topic = nextTopic
            nextTopic = nextTopic == .max ? 1 : nextTopic + 1
        }
        sessions[identity] = Session(
            name: hello.clientName, pid: hello.pid, schemaVersion: hello.schemaVersion, topic: topic)
        return .welcome(topic: topic, forgotOthers: forgot)
    }
}
