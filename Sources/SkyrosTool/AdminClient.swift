// `--group ID`: an admin session with the group's daemon (docs/PROTOCOL.md, "Admin sessions").
import Foundation
import Skyros
import SkyrosWire
import SkyrosZeroMQ

/// An admin session on a group's `requests.ipc`: no schema, allowed by the daemon only to
/// root, its own user and its admin groups. It speaks ZMTP itself (``ZMTPSocket``), as the
/// shared stack's clients do.
final class AdminClient {
    let container: GroupContainer
    private let socket: ZMTPSocket
    private var nextRequest: UInt64 = 1
    /// The daemon's welcome: its sequence and schema version at the start of the session.
    private(set) var welcome = WireMessage.Welcome(
        sequence: 0, eventTopic: 0, storeEpoch: ChangeEvent.noAuthor, schemaVersion: 0)
    private let timeout: Int32
    private var cachedSchema: SchemaInfo?

    /// Connects and opens the admin session; exits 69 when no daemon answers, 77 when the
    /// daemon refuses this user.
    init(container: GroupContainer, timeoutMilliseconds: Int32 = 5_000) throws {
        self.container = container
        timeout = timeoutMilliseconds
        do {
            try container.checkAccess()
        } catch let error as SkyrosError {
            throw ToolFailure(ToolExit.notAllowed, error.message)
        }
        guard FileManager.default.fileExists(atPath: container.requestsSocket), Self.isLocked(container.lockFile.path)
        else {
            throw ToolFailure(
                ToolExit.unavailable,
                "no daemon serves the group at \(container.url.path): start it (systemctl start skyrosd@GROUP, or skyrosd --group GROUP), or use --store FILE"
            )
        }
        socket = try ZMTPSocket(
            kind: .dealer, endpoint: container.requestsEndpoint, maximumMessageSize: WireProtocol.maximumMessageSize)
        let name = "skyros " + CommandLine.arguments.dropFirst().prefix(1).joined()
        let reply = try request(
            bytes: AdminMessage.hello(clientName: name, pid: UInt64(getpid())).encoded(requestID: takeRequestID()))
        guard case .wire(.welcome(let welcome)) = reply else { throw Self.unexpected(reply) }
        self.welcome = welcome
    }

    deinit { socket.close() }

    /// A `SUB` socket on the group's events, subscribed to all of them.
    func eventSubscriber() throws -> ZMTPSocket {
        let subscriber = try ZMTPSocket(
            kind: .subscriber, endpoint: container.eventsEndpoint, maximumMessageSize: WireProtocol.maximumMessageSize)
        subscriber.subscribe()
        subscriber.open()
        // The subscription goes out once the daemon's handshake came back.
        subscriber.waitUntilReady(milliseconds: Int(timeout))
        return subscriber
    }

    /// Whether someone (the daemon) holds the group's lock.
    static func isLocked(_ path: String) -> Bool {
        let fd = open(path, O_RDONLY | O_CLOEXEC)
        // A lock file this user may not read: the daemon will tell (permissionDenied).
        guard fd >= 0 else { return errno == EACCES }
        defer { close(fd) }
        if flock(fd, LOCK_SH | LOCK_NB) == 0 {
            flock(fd, LOCK_UN)
            return false
        }
        return true
    }

    /// A reply: a message of the client protocol, or an admin message.
    enum Reply {
        case wire(WireMessage.Body)
        case admin(AdminMessage)
    }

    private func takeRequestID() -> UInt64 {
        defer { nextRequest += 1 }
        return nextRequest
    }

    /// Sends a request and waits for its reply (an error reply becomes a ``ToolFailure``).
    private func request(bytes: [UInt8]) throws -> Reply {
        let id = WireHeader(bytes)?.requestID ?? 0
        try send(bytes)
        return try receive(requestID: id)
    }

    /// The next reply to request `id` (replies to other requests are skipped).
    func receive(requestID id: UInt64, timeoutMilliseconds: Int32? = nil) throws -> Reply {
        let timeout = timeoutMilliseconds ?? self.timeout
        while true {
            guard socket.waitForInput(milliseconds: Int(timeout)), let frames = socket.receive() else {
                throw ToolFailure(
                    ToolExit.unavailable,
                    "the daemon of \(container.url.path) did not answer within \(timeout / 1000) s")
            }
            let bytes = [UInt8](frames.last ?? Data())
            guard let header = WireHeader(bytes), header.requestID == id else { continue }
            if AdminMessage.isAdmin(header) {
                do {
                    return .admin(try AdminMessage.decode(bytes).message)
                } catch {
                    throw ToolFailure(ToolExit.failure, "the daemon's reply cannot be read: \(error)")
                }
            }
            let body: WireMessage.Body
            do {
                body = try WireMessage.decode(bytes).body
            } catch {
                throw ToolFailure(ToolExit.failure, "the daemon's reply cannot be read: \(error)")
            }
            if case .error(let code, let message) = body {
                // A daemon of an earlier version answers admin kinds as reserved.
                if code == SkyrosError.Code.malformedMessage.rawValue && message.contains("reserved") {
                    throw ToolFailure(
                        ToolExit.unavailable,
                        "the daemon of \(container.url.path) does not serve admin sessions (upgrade skyrosd): \(message)"
                    )
                }
                throw SkyrosError(SkyrosError.Code(rawValue: code), "the daemon refused: \(message) (\(code))")
            }
            return .wire(body)
        }
    }

    /// Sends an admin request and returns its reply.
    func admin(_ message: AdminMessage) throws -> Reply {
        try request(bytes: message.encoded(requestID: takeRequestID()))
    }

    /// Sends an admin request without waiting; returns its request ID.
    func send(_ message: AdminMessage) throws -> UInt64 {
        let id = takeRequestID()
        try send(message.encoded(requestID: id))
        return id
    }

    /// Sends a request (it waits for the connection when there is none yet).
    private func send(_ bytes: [UInt8]) throws {
        guard socket.send([bytes]) else {
            throw ToolFailure(
                ToolExit.unavailable, "cannot reach the daemon of \(container.url.path): too many requests wait")
        }
    }

    /// Sends a client-protocol request and returns its reply.
    func wire(_ body: WireMessage.Body) throws -> WireMessage.Body {
        let reply = try request(bytes: WireMessage(requestID: takeRequestID(), body: body).encoded())
        guard case .wire(let body) = reply else { throw Self.unexpected(reply) }
        return body
    }

    static func unexpected(_ reply: Reply) -> ToolFailure {
        ToolFailure(ToolExit.failure, "unexpected reply from the daemon: \(reply)")
    }
}

extension AdminClient: OperatedStore {
    func status() throws -> JSONValue {
        let reply = try admin(.status)
        guard case .admin(.statusReply(let json)) = reply, let status = try? JSONValue.parse(Data(json.utf8)) else {
            throw Self.unexpected(reply)
        }
        return status
    }

    func schema() throws -> SchemaInfo {
        if let cachedSchema { return cachedSchema }
        let reply = try admin(.describeSchema)
        guard case .admin(.schemaReply(let json, let fingerprint, let version)) = reply else {
            throw Self.unexpected(reply)
        }
        guard !json.isEmpty else {
            throw ToolFailure(ToolExit.failure, "the group has no store yet: its first client creates it")
        }
        let description = try SchemaDescription(json: json.utf8)
        let info = SchemaInfo(description: description, fingerprint: fingerprint, version: version)
        cachedSchema = info
        return info
    }

    func history(since: UInt64, limit: UInt64) throws -> (entries: [AdminMessage.HistoryEntry], more: Bool) {
        let reply = try admin(.history(since: since, limit: limit))
        guard case .admin(.historyReply(let entries, let more)) = reply else { throw Self.unexpected(reply) }
        return (entries, more)
    }

    /// Pages of 1,000 objects, each after the last identifier of the previous one.
    func forEachObject(_ entity: String, predicate: PredicateNode?, _ body: (Snapshot) throws -> Void) throws {
        var after: UUID?
        while true {
            var condition = predicate
            if let after {
                let next = PredicateNode.compare(
                    .greater, .property(scope: 0, path: [PredicateNode.idProperty]), .constant(after.stored))
                condition = condition.map { .and(next, $0) } ?? next
            }
            let reply = try wire(.fetch(StoreRequest(entityName: entity, predicate: condition, limit: 1_000)))
            guard case .snapshotsReply(let snapshots) = reply else { throw Self.unexpected(.wire(reply)) }
            for snapshot in snapshots { try body(snapshot) }
            guard snapshots.count == 1_000, let last = snapshots.last else { return }
            after = last.id.uuid
        }
    }

    func backup(to destination: URL, progress: (UInt64, UInt64) -> Void) throws -> (bytes: UInt64, sequence: UInt64) {
        let id = try send(.backup(path: destination.path, pagesPerStep: 0))
        while true {
            // The daemon reports progress at least every second; the check at the end of a
            // large copy takes longer.
            let reply = try receive(requestID: id, timeoutMilliseconds: 600_000)
            guard case .admin(.backupProgress(let state)) = reply else { throw Self.unexpected(reply) }
            progress(state.copied, state.total)
            if state.done { return (state.bytes, state.sequence) }
        }
    }

    func importChanges(_ changes: [ChangeSet], progress: (Int) -> Void) throws -> UInt64 {
        let client = UUID()
        var sequence: UInt64 = 0
        for (index, chunk) in changes.enumerated() {
            let reply = try wire(.save(clientID: client, saveNumber: UInt64(index + 1), changes: chunk))
            switch reply {
            case .saved(let saved): sequence = saved
            case .conflicts(let message, _):
                throw ToolFailure(ToolExit.failure, "the daemon refused a chunk: \(message)")
            default: throw Self.unexpected(.wire(reply))
            }
            progress(index + 1)
        }
        return sequence
    }

    func existing(_ ids: [ObjectID]) throws -> Set<ObjectID> {
        let reply = try wire(.snapshots(ids))
        guard case .snapshotsReply(let snapshots) = reply else { throw Self.unexpected(.wire(reply)) }
        return Set(snapshots.map(\.id))
    }
}
