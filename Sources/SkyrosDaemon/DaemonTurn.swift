import Foundation
import Skyros
import SkyrosSync
import SkyrosWire

/// The daemon's turns as a value (postgres-nio's connection state machines are the model):
/// it takes what arrived on the request socket and returns the ``Action``s the server
/// performs — replies, reads for the reader, group commits, publications. No socket, no
/// thread: the protocol is tested as transcripts (``DaemonServer`` is the loop around it).
///
/// It owns the group's store once there is one (a hello creates it, a newer hello migrates
/// it), the sessions, the projections of earlier schema versions, the events held under load
/// (``EventPublisher``) and the group commit's state (``GroupCommit``). Saves wait in the
/// turn until ``endOfInput(requestsWaiting:)``, or until a `deleteAll` or a migrating hello
/// makes them go first.
struct DaemonTurn {
    /// What the turn needs of the daemon's configuration.
    struct Settings: Sendable {
        /// The group container (where a hello creates the store).
        var container: GroupContainer
        var durability: Durability
        /// The largest request accepted.
        var maximumMessageSize: Int
        /// How much history is kept.
        var retention: Journal.Retention
        /// How long the events of a commit may wait while more requests are waiting.
        var maximumEventDelay: TimeInterval
        /// How many connections the daemon remembers the hello of.
        var maximumConnections: Int
        /// Where the turn writes what it does.
        var log: @Sendable (String) -> Void
        /// The longest wait for more saves before a group commit (``CommitDelay``).
        var maximumCommitDelay: Duration = .zero
    }

    /// A request, after the admin sessions had their look at it (``AdminSessions``).
    struct Arrival {
        /// The connection's identity, then the message's frames.
        var frames: [Data]
        /// Why the peer may not send requests (``PeerAccess``); nil when it may, or when the
        /// connection opened an admin session.
        var refusal: String? = nil
        /// Whether the connection opened an admin session (it is answered as a session).
        var isAdmin = false
    }

    /// What the server does for the turn, in order.
    enum Action {
        /// Send a reply on the request socket.
        case reply(Data, WireMessage)
        /// Submit a fetch, count or fault to the reader.
        case read(ReadWorker.Job)
        /// Commit these saves now: ``commit(_:resetting:requestsWaiting:now:)``.
        case commit([GroupCommit.Save], resetting: Int?)
        /// Publish a message of two frames, a topic and a message, carrying `changeSets` change
        /// sets (0: a heartbeat, or a copy for the sessions of an earlier schema version).
        case publish(topic: [UInt8], message: [UInt8], changeSets: Int)
        /// A hello of a newer schema version may migrate the store: answer the reads
        /// submitted, then ``migrate(_:hello:requestID:)``.
        case migrate(Data, hello: WireMessage.Hello, requestID: UInt64)
        /// A connection was welcomed (the connection guard, the statistics, the admin view).
        case welcomed(Data, WireMessage.Hello, sessions: Int)
        /// A group commit ended: the latency of each save, and for a commit that stored
        /// something, the number of change sets.
        case committed([(identity: Data, received: ContinuousClock.Instant, succeeded: Bool)], changeSets: Int?)
        /// A client asked for the changes since a sequence (a metric).
        case caughtUp
        /// Change sets were queued for upload, `through` the highest number so far: hand them
        /// to the sync engine (``SyncEngine/localCommitted(_:through:)``).
        case queued([QueuedEntry], through: Int64)
    }

    let settings: Settings
    /// The group's store: nil until the first hello creates it.
    var store: SQLiteStore?
    /// The store's identity (see ``WireMessage/Welcome/storeEpoch``).
    var epoch = ChangeEvent.noAuthor
    /// The store's schema version.
    var schemaVersion: UInt64 = 1
    /// The connections that said hello.
    var sessions: SessionTable
    /// How the sessions of each earlier schema version see the store (docs/PROTOCOL.md,
    /// "Mixed schema versions").
    var projections: [UInt64: SchemaProjection] = [:]
    var publisher: EventPublisher
    var groupCommit: GroupCommit
    /// The saves of this turn, waiting for its group commit.
    var pending: [GroupCommit.Save] = []
    var lastHeartbeat = Date.distantPast
    /// History pruned since the last log line about it, and when that line was written.
    var unloggedPruning = Journal.Pruned()
    var lastPruningLog = Date.distantPast

    /// When the turn waits for more saves before its group commit (the server performs the wait).
    var commitDelay: CommitDelay

    /// A turn for a group without a store (`store` nil) or with the store `opened`.
    init(settings: Settings, store: SQLiteStore?, opened: Journal.Opened?) {
        self.settings = settings
        commitDelay = CommitDelay(maximum: settings.maximumCommitDelay)
        sessions = SessionTable(maximumSessions: settings.maximumConnections)
        publisher = EventPublisher(maximumDelay: .seconds(settings.maximumEventDelay))
        groupCommit = GroupCommit(
            sequence: opened?.sequence ?? 0, retention: settings.retention, saves: opened?.saves ?? [])
        if let store, let opened {
            self.store = store
            (epoch, schemaVersion) = (opened.epoch, opened.schemaVersion)
        }
    }

    /// The last sequence number given.
    var sequence: UInt64 { groupCommit.sequence }
    /// Whether committed events wait to be published (the loop then wakes within a millisecond).
    var holdsEvents: Bool { !publisher.held.isEmpty }
    /// When the events held are due to go out (nil: none held).
    var heldEventsDue: ContinuousClock.Instant? { publisher.heldUntil }

    // MARK: - Requests

    /// Takes a request: answers it, hands it to the reader, or keeps it when it is a save for
    /// this turn's group commit. Every reply carries the ID of the request it answers: 0 only
    /// when the frame does not even hold a message header.
    mutating func received(_ arrival: Arrival) -> [Action] {
        let frames = arrival.frames
        guard frames.count == 2 else {
            guard frames.count > 2 || frames.count == 1 else { return [] }
            let header = frames.count > 1 ? WireHeader([UInt8](frames[1])) : nil
            return [
                .reply(
                    frames[0],
                    WireMessage(
                        requestID: header?.requestID ?? 0,
                        body: .error(
                            code: SkyrosError.Code.malformedMessage.rawValue,
                            message: "a request is exactly one frame, not \(frames.count - 1)")))
            ]
        }
        let identity = frames[0]
        let bytes = [UInt8](frames[1])
        if let refusal = arrival.refusal {
            return [
                .reply(
                    identity,
                    WireMessage(
                        requestID: WireHeader(bytes)?.requestID ?? 0,
                        body: .error(
                            code: SkyrosError.Code.permissionDenied.rawValue, message: refusal)))
            ]
        }
        var message: WireMessage
        do {
            message = try WireMessage.decode(bytes, maximumSize: settings.maximumMessageSize)
        } catch {
            let code: SkyrosError.Code =
                if case .unsupportedVersion = error { .unsupportedProtocolVersion } else { .malformedMessage }
            return [
                .reply(
                    identity,
                    WireMessage(
                        requestID: WireHeader(bytes)?.requestID ?? 0,
                        body: .error(
                            code: code.rawValue, message: error.description)))
            ]
        }
        switch message.body {
        case .save(_, 0, _), .deleteAll(_, 0), .batch(_, 0, _):
            return [
                .reply(
                    identity,
                    WireMessage(
                        requestID: message.requestID,
                        body: .error(
                            code: SkyrosError.Code.malformedMessage.rawValue, message: "save numbers start at 1")))
            ]
        default: break
        }
        // A session of an earlier schema version: its request in the store's terms.
        let projection = projection(of: identity)
        if let projection {
            do {
                message.body = try projection.current(message.body)
            } catch {
                return [
                    .reply(
                        identity,
                        WireMessage(requestID: message.requestID, body: Self.errorReply(SkyrosError.wrap(error))))
                ]
            }
        }
        let isSession = sessions[identity] != nil
        let save = {
            (
                clientID: UUID, saveNumber: UInt64, changes: ChangeSet, batch: BatchOperation?,
                projection: SchemaProjection?
            ) in
            GroupCommit.Save(
                identity: identity, requestID: message.requestID, clientID: clientID, saveNumber: saveNumber,
                changes: changes, batch: batch, projection: projection)
        }
        switch message.body {
        case .save(let clientID, let saveNumber, let changes) where (isSession || arrival.isAdmin) && store != nil:
            pending.append(save(clientID, saveNumber, changes, nil, projection))
            return []
        case .batch(let clientID, let saveNumber, let operation) where isSession && store != nil:
            pending.append(save(clientID, saveNumber, ChangeSet(), operation, projection))
            return []
        case .deleteAll(let clientID, let saveNumber) where isSession && store != nil:
            // Saves that arrived first are committed first; the reset is a change set of its own.
            pending.append(save(clientID, saveNumber, ChangeSet(), nil, nil))
            defer { pending = [] }
            return [.commit(pending, resetting: pending.count - 1)]
        default:
            break
        }
        var actions: [Action] = []
        if case .hello(let hello) = message.body, hello.schemaVersion > schemaVersion, !pending.isEmpty {
            // A hello of a newer version may migrate the store: the saves that arrived first are
            // committed first, in the schema they were made in (other hellos leave the turn's
            // group commit whole).
            actions.append(.commit(pending, resetting: nil))
            pending = []
        }
        if ReadWorker.answers(message.body), isSession || arrival.isAdmin, let store {
            return [
                .read(
                    ReadWorker.Job(
                        identity: identity, requestID: message.requestID, body: message.body, store: store,
                        projection: projection))
            ]
        }
        if case .hello(let hello) = message.body, SessionTable.refusal(of: hello) == nil, store != nil,
            hello.schemaVersion > schemaVersion
        {
            return actions + [.migrate(identity, hello: hello, requestID: message.requestID)]
        }
        let body: WireMessage.Body
        do {
            let answer = try respond(to: message.body, from: identity, isAdmin: arrival.isAdmin, actions: &actions)
            body = projection?.old(answer) ?? answer
        } catch {
            body = Self.errorReply(SkyrosError.wrap(error))
        }
        return actions + [.reply(identity, WireMessage(requestID: message.requestID, body: body))]
    }

    /// Answers a hello or a `changes-since` (reads go to the reader, see ``ReadWorker``).
    mutating func respond(
        to body: WireMessage.Body, from identity: Data, isAdmin: Bool, actions: inout [Action]
    ) throws -> WireMessage.Body {
        if case .hello(let hello) = body {
            return try welcome(hello, identity, actions: &actions)
        }
        guard sessions[identity] != nil || isAdmin, let store else {
            throw SkyrosError(.helloRequired, "say hello first")
        }
        switch body {
        case .changesSince(let since, let limit):
            actions.append(.caughtUp)
            let page = try Journal.changes(since: since, current: sequence, limit: limit, in: store)
            return .changes(page.events, more: page.more)
        case .syncRejections:
            return .rejectionsReply(try SyncTables.rejections(in: store))
        case .acknowledgeRejections(let numbers):
            let removed = try store.transaction { transaction in
                try SyncTables.acknowledge(numbers.map { Int64(clamping: $0) }, in: transaction)
            }
            if removed > 0 { settings.log("acknowledged \(removed) refused change set(s)") }
            return .countReply(removed)
        default:
            throw SkyrosError(.malformedMessage, "a client cannot send a \(body.kind) message")
        }
    }

    /// Answers a hello: the first one of a group with no store creates the store from its
    /// schema description; one of an earlier schema version is projected.
    private mutating func welcome(_ hello: WireMessage.Hello, _ identity: Data, actions: inout [Action]) throws
        -> WireMessage.Body
    {
        // A hello refused for its name (SessionTable) does not create the store either.
        var accepted = store?.schema.fingerprint ?? ""
        if SessionTable.refusal(of: hello) == nil {
            // Every hello's description must have the fingerprint it announces, whether it
            // creates the store or not: the fingerprint alone decides the rest.
            let described = try Self.schema(of: hello)
            if store == nil {
                let created = try SQLiteStore(
                    schema: described, url: settings.container.store,
                    durability: settings.durability, serialAccess: false)
                let opened = try Journal.open(created)
                (store, epoch, schemaVersion) = (created, opened.epoch, opened.schemaVersion)
                groupCommit.restart(sequence: opened.sequence, saves: opened.saves)
                settings.log("created the store for schema \(hello.schemaFingerprint)")
                accepted = hello.schemaFingerprint
            } else if hello.schemaVersion < schemaVersion, let store {
                projections[hello.schemaVersion] = try Journal.projection(
                    version: hello.schemaVersion, fingerprint: hello.schemaFingerprint, storeVersion: schemaVersion,
                    in: store)
                accepted = hello.schemaFingerprint
            } else if hello.schemaFingerprint != accepted {
                throw SkyrosError(
                    .schemaMismatch,
                    "the group's store has schema \(accepted) at version \(schemaVersion); the client \(hello.clientName) has \(hello.schemaFingerprint) at the same version: a changed model needs a higher version to be migrated"
                )
            }
        }
        return try session(identity, hello, accepted: accepted, actions: &actions)
    }

    /// Decides a hello against the schema fingerprint accepted for it (``SessionTable``), and
    /// welcomes the connection.
    mutating func session(_ identity: Data, _ hello: WireMessage.Hello, accepted: String, actions: inout [Action])
        throws
        -> WireMessage.Body
    {
        switch sessions.hello(identity, hello, storeFingerprint: accepted) {
        case .refuse(let code, let message):
            throw SkyrosError(code, message)
        case .welcome(let topic, let forgotOthers):
            if forgotOthers {
                settings.log("forgot the connections that said hello: each says it again")
            }
            actions.append(.welcomed(identity, hello, sessions: sessions.sessions.count))
            return .welcome(
                WireMessage.Welcome(
                    sequence: sequence, eventTopic: topic, storeEpoch: epoch, schemaVersion: schemaVersion))
        }
    }

    /// The schema a hello describes, checked against the fingerprint it announces.
    static func schema(of hello: WireMessage.Hello) throws -> Schema {
        let decoded: SchemaDescription
        do {
            decoded = try SchemaDescription(json: hello.schemaDescription)
        } catch {
            throw SkyrosError(.schemaMismatch, "the hello's schema description cannot be read: \(error)")
        }
        let schema = try Schema(description: decoded, version: Int(clamping: hello.schemaVersion))
        guard schema.fingerprint == hello.schemaFingerprint else {
            throw SkyrosError(.schemaMismatch, "the schema description does not have the announced fingerprint")
        }
        return schema
    }

    /// The projection of a session, when it has an earlier schema version than the store's.
    private func projection(of identity: Data) -> SchemaProjection? {
        guard let session = sessions[identity], session.schemaVersion < schemaVersion else { return nil }
        return projections[session.schemaVersion]
    }

    /// The reply to a failed request: the conflict list of a refused save, or an error.
    static func errorReply(_ error: SkyrosError) -> WireMessage.Body {
        if error.code == .mergeConflict { return .conflicts(message: error.message, error.conflicts) }
        return .error(code: error.code.rawValue, message: error.message)
    }

    /// A client's name in the log.
    static func describe(_ name: String?) -> String {
        guard let name, !name.isEmpty else { return "an unnamed client" }
        return "'\(name)'"
    }
}
