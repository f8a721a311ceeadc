import Foundation

/// The facts of the client–daemon protocol, declared once: message kinds and their tags,
/// limits and defaults. The encoder, the decoder, the daemon, the client and
/// docs/PROTOCOL.md (whose tables a test compares with these) all take them from here.
package enum WireProtocol {
    /// The protocol version this build speaks (the first byte of every message).
    package static let version: UInt8 = 4
    /// The largest encoded message either side accepts (16 MiB).
    package static let maximumMessageSize = 16 * 1_048_576
    /// The first message kind sent by the daemon (replies 64 and up, events 96): a client
    /// ignores bytes after the fields it knows in these; requests (below 64) stay strict.
    package static let firstReplyKind: UInt8 = 64
    /// The longest client name a hello may carry, in UTF-8 bytes.
    package static let maximumClientNameBytes = 256
    /// How long a connection to `requests.ipc` may stay without saying hello before the daemon
    /// closes it (`skyrosd --hello-timeout`).
    package static let helloTimeout: Duration = .seconds(5)
    /// The most messages ZeroMQ queues per connection, each way, on the daemon's request socket
    /// (replies to a client that does not read them are dropped past it) and on its event
    /// socket (events to a subscriber that does not keep up are dropped past it: it notices
    /// the gap and catches up with `changesSince`).
    package static let highWaterMark = 1_000
    /// The most change sets one `changes` reply carries (a request may ask for fewer).
    package static let maximumChangesPage = 10_000
    /// The most bytes of change sets one `changes` reply carries (it stops before the
    /// change set that would cross this, unless it is the first).
    package static let maximumChangesPageBytes = 8 * 1_048_576
    /// The event topic of messages for everyone: heartbeats, and `changes` messages of change
    /// sets saved on several connections.
    package static let broadcastTopic: UInt8 = 0
    /// How often the daemon publishes a heartbeat.
    package static let heartbeatInterval: Duration = .milliseconds(100)
    /// How long a client lets its event socket stay silent before it asks `changes-since`.
    package static let silenceInterval: Duration = .seconds(1)
    /// How long one attempt of a request waits for its reply before it is sent again on a
    /// new connection (client default).
    package static let retryInterval: Duration = .seconds(1)
    /// How long a request waits for the daemon in all (client default).
    package static let requestTimeout: Duration = .seconds(5)
    /// How long the events of a commit may wait under load (daemon default).
    package static let maximumEventDelay: Duration = .milliseconds(2)
    /// The deepest predicate tree accepted, counting every node on the longest path from the
    /// root to a leaf (a lone constant is 1 deep). Deeper trees would overflow SQLite's parser
    /// once translated.
    package static let maximumPredicateDepth = 32
    /// The most objects a batch operation's change event names: past it, its lists are empty
    /// and a receiver refreshes everything it holds.
    package static let maximumBatchEventObjects = 10_000

    /// The kind of a message: its second byte. A daemon answers an unknown kind with
    /// `malformedMessage`.
    package enum Kind: UInt8, Sendable, CaseIterable {
        // Requests (client → daemon)
        case hello = 1
        case fetch = 2
        case fetchIdentifiers = 3
        case count = 4
        case snapshots = 5
        case save = 6
        case changesSince = 7
        case deleteAll = 8
        /// A batch update or delete by predicate (one change set, one sequence).
        case batch = 9
        /// The change sets the sync server refused that no app has acknowledged yet.
        case syncRejections = 10
        /// Acknowledges refused change sets: they leave the rejected log.
        case acknowledgeRejections = 11
        /// The hello of an admin session (no schema; see ``AdminMessage``).
        case adminHello = 16
        /// The daemon's status (admin).
        case status = 17
        /// A page of the change log (admin).
        case history = 18
        /// An online backup to a file (admin).
        case backup = 19
        /// The store's schema and recorded version (admin).
        case describeSchema = 20
        /// The daemon's metrics in Prometheus text format (admin).
        case metrics = 21
        // Replies (daemon → client)
        case welcome = 64
        case snapshotsReply = 65
        case identifiersReply = 66
        case countReply = 67
        case saved = 68
        case error = 69
        case changes = 70
        case conflicts = 71
        /// The reply to `status`.
        case statusReply = 72
        /// The reply to `history`.
        case historyReply = 73
        /// Progress and end of a `backup`.
        case backupProgress = 74
        /// The reply to `describeSchema`.
        case schemaReply = 75
        /// The reply to `metrics`.
        case metricsReply = 76
        /// The reply to `batch`.
        case batchDone = 77
        /// The reply to `syncRejections`.
        case rejectionsReply = 78
        // Published on the event socket
        case event = 96

    }
}

extension Duration {
    /// The duration in seconds, for the APIs that take a `TimeInterval`.
    package var timeInterval: TimeInterval {
        // One division of the attosecond counts (`components` splits them with a 128-bit
        // division, some 400 instructions, at every request).
        self / .seconds(1)
    }
}

/// The header every message starts with, in every protocol version: `u8` version, `u8`
/// kind, `uvarint` request ID. Readable on its own, so that a reply to a message that cannot
/// be decoded still carries the request ID it answers.
package struct WireHeader: Sendable, Hashable {
    /// The protocol version of the message.
    package var version: UInt8
    /// The tag of its kind (see ``WireProtocol/Kind``; unknown tags are kept as read).
    package var kind: UInt8
    /// Its request ID.
    package var requestID: UInt64

    /// Reads the header of a frame; nil when even that is not there.
    package init?(_ bytes: [UInt8]) {
        var reader = WireReader(bytes)
        guard let version = try? reader.byte(), let kind = try? reader.byte(), let id = try? reader.uvarint() else {
            return nil
        }
        self.version = version
        self.kind = kind
        self.requestID = id
    }
}
