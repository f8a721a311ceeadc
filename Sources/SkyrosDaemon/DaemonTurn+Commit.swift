import Foundation
import Skyros
import SkyrosWire

extension DaemonTurn {
    // MARK: - The end of a turn

    /// No more requests are waiting for this turn: its saves are committed together, or,
    /// when there are none, held events may go out. `requestsWaiting` is asked only when the
    /// answer matters.
    mutating func endOfInput(requestsWaiting: () -> Bool, now: ContinuousClock.Instant = .now) -> [Action] {
        if !pending.isEmpty {
            defer { pending = [] }
            return [.commit(pending, resetting: nil)]
        }
        guard holdsEvents else { return [] }
        return publishing(publisher.committed([], requestsWaiting: requestsWaiting(), now: now))
    }

    /// A wait ended with nothing to read: held events past their delay go out.
    mutating func idle(now: ContinuousClock.Instant = .now) -> [Action] {
        publishing(publisher.committed([], requestsWaiting: false, now: now))
    }

    /// A heartbeat is an event of kind heartbeat with the current sequence: clients learn
    /// that their subscription is live and notice gaps even when nothing is saved. Due every
    /// `interval` seconds.
    mutating func heartbeatIfDue(every interval: TimeInterval, now: Date = Date()) -> [Action] {
        guard now.timeIntervalSince(lastHeartbeat) >= interval else { return [] }
        lastHeartbeat = now
        var actions: [Action] = []
        for publication in publisher.heartbeat(sequence: sequence) { actions += publishing(publication) }
        return actions
    }

    /// The daemon stops: whatever events are held go out.
    mutating func stopping() -> [Action] {
        publishing(publisher.flush())
    }

    // MARK: - Group commit

    /// Commits saves (an action of ``received(_:)`` or ``endOfInput(requestsWaiting:now:)``)
    /// in one transaction (``GroupCommit``), and returns the replies, sent once the commit is
    /// durable, then its events (held under load, see ``EventPublisher``).
    ///
    /// `requestsWaiting` is asked after the commit and before the replies (after them, a
    /// client just answered may already have sent its next request, which is no sign of load).
    mutating func commit(
        _ saves: [GroupCommit.Save], resetting: Int?, requestsWaiting: () -> Bool, now: ContinuousClock.Instant = .now
    ) -> [Action] {
        guard let store else { return [] }
        let queuedBefore = groupCommit.lastQueued
        let saves = saves.map { save in
            var save = save
            (save.author, save.topic) = (sessions[save.identity]?.name, sessions[save.identity]?.topic)
            return save
        }
        let outcome = groupCommit.commit(saves, resetting: resetting, in: store)
        for line in outcome.log { settings.log(line) }
        if outcome.committed { logPruning(outcome.pruned) }
        var actions: [Action] = []
        if resetting != nil { actions += publishing(publisher.flush()) }  // the events before a reset go first
        let waiting = !outcome.events.isEmpty && resetting == nil && requestsWaiting()
        for (save, result) in zip(saves, outcome.results) {
            let body: WireMessage.Body =
                switch result {
                case .success(.saved(let sequence)): .saved(sequence: sequence)
                case .success(.batch(let affected, let event)): .batchDone(affected: affected, event: event)
                case .failure(let error): Self.errorReply(error)
                }
            actions.append(
                .reply(save.identity, WireMessage(requestID: save.requestID, body: save.projection?.old(body) ?? body)))
        }
        actions.append(
            .committed(
                zip(saves, outcome.results).map { save, result in
                    (save.identity, save.received, { if case .success = result { true } else { false } }())
                },
                changeSets: outcome.committed ? outcome.events.count : nil))
        actions += publishing(publisher.committed(outcome.events, requestsWaiting: waiting, now: now))
        if resetting != nil { actions += publishing(publisher.flush()) }
        if groupCommit.lastQueued != queuedBefore {
            actions.append(.queued(groupCommit.takeRecentlyQueued(), through: groupCommit.lastQueued))
        }
        return actions
    }

    /// The actions that publish what the publisher decided: the message, then for the
    /// sessions of earlier schema versions a copy in their terms, under the same topic
    /// followed by their version (docs/PROTOCOL.md, "Mixed schema versions").
    mutating func publishing(_ publication: EventPublisher.Publication?) -> [Action] {
        guard let publication else { return [] }
        var actions: [Action] = [
            .publish(topic: [publication.topic], message: publication.message, changeSets: publication.changeSets)
        ]
        let versions = sessions.schemaVersions.filter { $0 < schemaVersion }
        guard !versions.isEmpty else { return actions }
        let body = publication.body
        for version in versions.sorted() {
            guard let projection = projections[version] else { continue }
            var topic = WireWriter()
            topic.byte(publication.topic)
            topic.uvarint(version)
            let translated = WireMessage(requestID: 0, body: projection.old(body))
            actions.append(.publish(topic: topic.bytes, message: translated.encoded(), changeSets: 0))
        }
        return actions
    }

    // MARK: - Migration

    /// Migrates the store to the newer schema of a hello (the ``Action/migrate(_:hello:requestID:)``
    /// the server performs once the reads submitted are answered), with the same code as an
    /// embedded stack (``SQLiteStore`` infers the migration, in one transaction): the events
    /// held are published; then the store is opened with the new schema, its history restarts
    /// with a `schemaChanged` event, which is published, and the sessions of earlier versions
    /// are projected anew (those that cannot be are forgotten). Then the hello is answered.
    ///
    /// On failure the store is left as it was and the daemon serves on with it: the hello is
    /// refused with ``SkyrosError/Code/migrationFailed`` (or `schemaMismatch` for a description
    /// that cannot be read).
    mutating func migrate(_ identity: Data, hello: WireMessage.Hello, requestID: UInt64) -> [Action] {
        var actions: [Action] = []
        let body: WireMessage.Body
        do {
            try migrate(for: hello, actions: &actions)
            body = try session(identity, hello, accepted: store?.schema.fingerprint ?? "", actions: &actions)
        } catch {
            body = Self.errorReply(SkyrosError.wrap(error))
        }
        return actions + [.reply(identity, WireMessage(requestID: requestID, body: body))]
    }

    private mutating func migrate(for hello: WireMessage.Hello, actions: inout [Action]) throws {
        guard let current = store else { return }
        let schema = try Self.schema(of: hello)
        actions += publishing(publisher.flush())
        let migrated: SQLiteStore
        do {
            migrated = try SQLiteStore(
                schema: schema, url: settings.container.store, durability: settings.durability, serialAccess: false)
        } catch {
            let wrapped = SkyrosError.wrap(error)
            settings.log(
                "refused to migrate the store from schema version \(schemaVersion) to \(hello.schemaVersion) for \(Self.describe(hello.clientName)): \(wrapped.message)"
            )
            throw SkyrosError(
                .migrationFailed,
                wrapped.code == .migrationFailed
                    ? wrapped.message
                    : "the store cannot be migrated from schema version \(schemaVersion) to \(hello.schemaVersion): \(wrapped.code): \(wrapped.message)"
            )
        }
        try? current.close()
        let previous = schemaVersion
        let opened: Journal.Opened
        do {
            opened = try Journal.open(migrated, author: hello.clientName)
        } catch {
            // Migrated, but its journal cannot be opened: serve nothing rather than the wrong schema.
            settings.log("the migrated store's history cannot be opened: \(error)")
            throw SkyrosError(
                .storeFailure, "the migrated store's history cannot be opened: \(SkyrosError.wrap(error).message)")
        }
        (store, epoch, schemaVersion) = (migrated, opened.epoch, opened.schemaVersion)
        groupCommit.restart(sequence: opened.sequence, saves: opened.saves)
        settings.log(
            "migrated the store from schema version \(previous) to \(schemaVersion) (\(schema.fingerprint)) for \(Self.describe(hello.clientName)), sequence \(sequence)"
        )
        projections = [:]
        for version in sessions.schemaVersions where version < schemaVersion {
            do {
                projections[version] = try Journal.projection(
                    version: version, fingerprint: nil, storeVersion: schemaVersion, in: migrated)
            } catch {
                settings.log(
                    "sessions of schema version \(version) cannot be served any more: \(SkyrosError.wrap(error).message)"
                )
                sessions.forget(schemaVersion: version)
            }
        }
        if let event = opened.schemaChanged {
            actions += publishing(
                publisher.committed(
                    [
                        EventPublisher.Committed(
                            event: event, encoded: WireMessage(requestID: 0, body: .event(event)).encoded(), topic: nil)
                    ],
                    requestsWaiting: false, now: .now))
            actions += publishing(publisher.flush())
        }
    }

    // MARK: - The history's pruning in the log

    /// How often at most the pruning of the history is logged: with a full history, every
    /// commit prunes a change set, and a line per commit would drown the log.
    static let pruningLogInterval: TimeInterval = 60

    /// Logs committed pruning: at once the first time, then what was pruned since at most
    /// once every ``pruningLogInterval`` (and when the daemon closes, `force`).
    mutating func logPruning(_ pruned: Journal.Pruned, force: Bool = false, now: Date = Date()) {
        unloggedPruning = unloggedPruning + pruned
        guard !unloggedPruning.isEmpty, force || now.timeIntervalSince(lastPruningLog) >= Self.pruningLogInterval
        else { return }
        let changeSets = unloggedPruning.changeSets
        let records = unloggedPruning.saveRecords
        settings.log(
            """
            pruned the history (retention: the last \(settings.retention.count) change sets, none older than \
            \(settings.retention.age) s): removed \(changeSets) change set\(changeSets == 1 ? "" : "s") and \
            \(records) exactly-once record\(records == 1 ? "" : "s") of silent clients\
            \(lastPruningLog == .distantPast ? "" : " since the last such line")
            """)
        unloggedPruning = Journal.Pruned()
        lastPruningLog = now
    }
}
