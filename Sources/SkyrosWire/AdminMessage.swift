import Foundation

/// A message of an *admin session* (docs/PROTOCOL.md, "Admin sessions"): what `skyros
/// status|history|backup|inspect|metrics --group ID` asks a group's daemon, and its replies.
/// An admin session needs no schema; the daemon allows it only to root, its own user, and
/// the members of its admin groups (peer credentials).
///
/// These kinds are encoded and decoded here, apart from ``WireMessage``: the header is the
/// same (`u8` version, `u8` kind, `uvarint` request ID); the answer to an `adminHello` is a
/// ``WireMessage/Body/welcome(_:)`` and failures are ``WireMessage/Body/error(code:message:)``.
package enum AdminMessage: Sendable, Hashable {
    // Requests (admin → daemon)
    /// Opens an admin session on the connection: the admin's process name and pid.
    case hello(clientName: String, pid: UInt64)
    /// The daemon's status, answered with ``statusReply(json:)``.
    case status
    /// A page of the change log: the change sets after `since`, at most `limit` (0: 1,000).
    case history(since: UInt64, limit: UInt64)
    /// An online backup of the store to a new file at `path` (written by the daemon), copied
    /// `pagesPerStep` pages at a time (0: the daemon's default).
    case backup(path: String, pagesPerStep: UInt64)
    /// The store's schema, answered with ``schemaReply(description:fingerprint:version:)``.
    case describeSchema
    /// The daemon's metrics, answered with ``metricsReply(_:)``.
    case metrics
    // Replies (daemon → admin)
    /// The status as one JSON object (the keys docs/OPERATING.md lists).
    case statusReply(json: String)
    /// Change sets of the history, oldest first; `more`: newer ones exist past the last.
    case historyReply([HistoryEntry], more: Bool)
    /// How far a backup is; the last one has `done` set.
    case backupProgress(BackupProgress)
    /// The store's schema description (canonical JSON), fingerprint and schema version.
    case schemaReply(description: String, fingerprint: String, version: UInt64)
    /// The daemon's metrics in Prometheus' text exposition format.
    case metricsReply(String)

    /// A change set of the history, as `skyros history` lists it.
    package struct HistoryEntry: Sendable, Hashable {
        package var sequence: UInt64
        package var kind: ChangeEvent.Kind
        package var authorID: UUID
        package var author: String
        /// When it was committed, in seconds since 1970.
        package var timestamp: Double
        package var inserted: Int
        package var updated: Int
        package var deleted: Int

        /// An entry with every field given.
        package init(
            sequence: UInt64, kind: ChangeEvent.Kind, authorID: UUID, author: String, timestamp: Double, inserted: Int,
            updated: Int, deleted: Int
        ) {
            self.sequence = sequence
            self.kind = kind
            self.authorID = authorID
            self.author = author
            self.timestamp = timestamp
            self.inserted = inserted
            self.updated = updated
            self.deleted = deleted
        }
    }

    /// How far an online backup is.
    package struct BackupProgress: Sendable, Hashable {
        /// Pages copied so far.
        package var copied: UInt64
        /// Pages of the store (as of the backup's snapshot).
        package var total: UInt64
        /// Whether the copy is complete and verified (`PRAGMA integrity_check`).
        package var done: Bool
        /// The copy's size in bytes (when done).
        package var bytes: UInt64
        /// The sequence of the last change set the copy holds.
        package var sequence: UInt64

        /// Progress with every field given.
        package init(copied: UInt64, total: UInt64, done: Bool, bytes: UInt64 = 0, sequence: UInt64 = 0) {
            self.copied = copied
            self.total = total
            self.done = done
            self.bytes = bytes
            self.sequence = sequence
        }
    }

    /// The kind of the message (its tag on the wire).
    package var kind: WireProtocol.Kind {
        switch self {
        case .hello: .adminHello
        case .status: .status
        case .history: .history
        case .backup: .backup
        case .describeSchema: .describeSchema
        case .metrics: .metrics
        case .statusReply: .statusReply
        case .historyReply: .historyReply
        case .backupProgress: .backupProgress
        case .schemaReply: .schemaReply
        case .metricsReply: .metricsReply
        }
    }

    /// Whether a frame's kind is one of the admin kinds (its header read, the body not).
    package static func isAdmin(_ header: WireHeader) -> Bool {
        guard let kind = WireProtocol.Kind(rawValue: header.kind) else { return false }
        return adminKinds.contains(kind)
    }

    static let adminKinds: Set<WireProtocol.Kind> = [
        .adminHello, .status, .history, .backup, .describeSchema, .metrics, .statusReply, .historyReply,
        .backupProgress,
        .schemaReply, .metricsReply,
    ]

    /// `[version][kind][requestID uvarint][body]`.
    package func encoded(requestID: UInt64) -> [UInt8] {
        var writer = WireWriter()
        writer.byte(WireProtocol.version)
        writer.byte(kind.rawValue)
        writer.uvarint(requestID)
        switch self {
        case .hello(let name, let pid):
            writer.string(name)
            writer.uvarint(pid)
        case .status, .describeSchema, .metrics:
            break
        case .history(let since, let limit):
            writer.uvarint(since)
            writer.uvarint(limit)
        case .backup(let path, let pages):
            writer.string(path)
            writer.uvarint(pages)
        case .statusReply(let json):
            writer.string(json)
        case .historyReply(let entries, let more):
            writer.list(entries) { writer, entry in
                writer.uvarint(entry.sequence)
                writer.byte(entry.kind.rawValue)
                writer.uuid(entry.authorID)
                writer.string(entry.author)
                writer.double(entry.timestamp)
                writer.uvarint(UInt64(entry.inserted))
                writer.uvarint(UInt64(entry.updated))
                writer.uvarint(UInt64(entry.deleted))
            }
            writer.bool(more)
        case .backupProgress(let progress):
            writer.uvarint(progress.copied)
            writer.uvarint(progress.total)
            writer.bool(progress.done)
            writer.uvarint(progress.bytes)
            writer.uvarint(progress.sequence)
        case .schemaReply(let description, let fingerprint, let version):
            writer.string(description)
            writer.string(fingerprint)
            writer.uvarint(version)
        case .metricsReply(let text):
            writer.string(text)
        }
        return writer.bytes
    }

    /// Decodes an admin message; throws ``WireError/unknownMessageType(_:)`` for any other kind.
    package static func decode(_ bytes: [UInt8]) throws(WireError) -> (requestID: UInt64, message: AdminMessage) {
        var reader = WireReader(bytes)
        let version = try reader.byte()
        guard version == WireProtocol.version else { throw .unsupportedVersion(version) }
        let tag = try reader.byte()
        let requestID = try reader.uvarint()
        guard let kind = WireProtocol.Kind(rawValue: tag), adminKinds.contains(kind) else {
            throw .unknownMessageType(tag)
        }
        let message: AdminMessage
        switch kind {
        case .adminHello:
            let name = try reader.string()
            message = .hello(clientName: name, pid: try reader.uvarint())
        case .status: message = .status
        case .describeSchema: message = .describeSchema
        case .metrics: message = .metrics
        case .history:
            let since = try reader.uvarint()
            message = .history(since: since, limit: try reader.uvarint())
        case .backup:
            let path = try reader.string()
            message = .backup(path: path, pagesPerStep: try reader.uvarint())
        case .statusReply: message = .statusReply(json: try reader.string())
        case .historyReply:
            let entries = try reader.list(minimumSize: 30) { reader throws(WireError) in
                let sequence = try reader.uvarint()
                let tag = try reader.byte()
                guard let kind = ChangeEvent.Kind(rawValue: tag) else { throw .invalidTag("event kind", tag) }
                let authorID = try reader.uuid()
                let author = try reader.string()
                let timestamp = try reader.double()
                let inserted = try reader.int()
                let updated = try reader.int()
                return HistoryEntry(
                    sequence: sequence, kind: kind, authorID: authorID, author: author, timestamp: timestamp,
                    inserted: inserted, updated: updated, deleted: try reader.int())
            }
            message = .historyReply(entries, more: try reader.bool())
        case .backupProgress:
            let copied = try reader.uvarint()
            let total = try reader.uvarint()
            let done = try reader.bool()
            let bytes = try reader.uvarint()
            message = .backupProgress(
                BackupProgress(
                    copied: copied, total: total, done: done, bytes: bytes, sequence: try reader.uvarint()))
        case .schemaReply:
            let description = try reader.string()
            let fingerprint = try reader.string()
            message = .schemaReply(description: description, fingerprint: fingerprint, version: try reader.uvarint())
        case .metricsReply: message = .metricsReply(try reader.string())
        default: throw .unknownMessageType(tag)
        }
        guard reader.remaining == 0 else { throw .trailingBytes(reader.remaining) }
        return (requestID, message)
    }
}
