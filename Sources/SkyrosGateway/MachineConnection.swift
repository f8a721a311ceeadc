import Foundation
import NIOCore
import NIOWebSocket
import Skyros
import SkyrosSync
import SkyrosWire
import Synchronization

/// One machine's WebSocket connection to a gateway: its hello (the token, the machine id bound
/// to the token's subject), then its requests, answered one at a time on the gateway's
/// server connections within the machine's buckets (``RulesScope``).
final class MachineConnection: Sendable {
    let gateway: GatewayServer
    let channel: NIOAsyncChannel<WebSocketFrame, WebSocketFrame>
    let path: String
    let deadline: Scheduled<Void>
    let inbox: MessageQueue
    private let writer = Mutex<NIOAsyncChannelOutboundWriter<WebSocketFrame>?>(nil)
    /// The machine, once its hello was accepted (for the connected machines' gauge).
    private let welcomed = Mutex<UUID?>(nil)
    /// The keys of the bucket instances its token gives it, once its hello was accepted.
    private let held = Mutex<Set<String>>([])
    /// The gateway's change (``GatewayServer/changesTold``) it was last told of, or started
    /// listening at.
    let lastTold = Mutex(0)

    /// Whether a change that touched `touched` concerns the machine.
    func isConcerned(by touched: ChangeFeed.Touched) -> Bool {
        touched.everyone || !held.withLock { $0.isDisjoint(with: touched.keys) }
    }

    init(
        gateway: GatewayServer, channel: NIOAsyncChannel<WebSocketFrame, WebSocketFrame>, path: String,
        deadline: Scheduled<Void>
    ) {
        self.gateway = gateway
        self.channel = channel
        self.path = path
        self.deadline = deadline
        inbox = MessageQueue(eventLoop: channel.channel.eventLoop)
    }

    private var key: ObjectIdentifier { ObjectIdentifier(self) }

    /// Where the connection's tasks run: its channel's event loop.
    private var executor: SyncExecutor { SyncExecutor(eventLoop: channel.channel.eventLoop) }

    func run() async {
        await withTaskExecutorPreference(executor) { await serve() }
    }

    private func serve() async {
        gateway.sessions.withLock { $0[key] = self }
        defer {
            gateway.sessions.withLock { $0[key] = nil }
            gateway.listeners.withLock { $0[key] = nil }
            if let machine = welcomed.withLock({ $0 }) { gateway.metrics.disconnected(machine) }
        }
        try? await channel.executeThenClose { inbound, outbound in
            writer.withLock { $0 = outbound }
            await withTaskGroup(of: Void.self) { group in
                group.addTask {
                    do {
                        for try await frame in inbound {
                            switch frame.opcode {
                            case .binary:
                                // One request at a time: a machine that sends more before the
                                // answers (pages acknowledged aside) is not one of ours.
                                guard self.inbox.count < 4 else {
                                    await self.close(
                                        .protocolError, "requests sent before the answers to the earlier ones")
                                    return
                                }
                                self.inbox.push(Array(buffer: frame.unmaskedData))
                            case .ping:
                                try? await outbound.write(
                                    WebSocketFrame(fin: true, opcode: .pong, data: frame.unmaskedData))
                            case .connectionClose:
                                self.inbox.finish()
                                return
                            case .pong:
                                continue
                            default:
                                await self.close(.protocolError, "only binary messages are part of the protocol")
                                return
                            }
                        }
                    } catch {}
                    self.inbox.finish()
                }
                group.addTask {
                    await self.converse()
                }
                await group.next()
                group.cancelAll()
                self.inbox.finish()
                try? await self.channel.channel.close()
            }
        }
    }

    /// Whether a notification is being written, and whether another came meanwhile: one is
    /// written at a time, and those that come meanwhile become one more, written after it
    /// (without a transaction id: several changes). A machine that does not read piles nothing
    /// up, and every change is still followed by a notification (a machine told of none would
    /// wait for its next poll, or for ever for an engine that reads only when told).
    private let notifying = Mutex<(writing: Bool, pending: Bool)>((false, false))

    /// Sends a notification (any thread).
    func send(_ bytes: [UInt8]) {
        guard let writer = writer.withLock({ $0 }) else { return }
        let starts = notifying.withLock { state -> Bool in
            if state.writing {
                state.pending = true
                return false
            }
            state.writing = true
            return true
        }
        guard starts else { return }
        Task(executorPreference: executor) {
            var next: [UInt8]? = bytes
            while let bytes = next {
                try? await writer.write(WebSocketFrame(fin: true, opcode: .binary, data: ByteBuffer(bytes: bytes)))
                next = self.notifying.withLock { state -> [UInt8]? in
                    guard state.pending else {
                        state.writing = false
                        return nil
                    }
                    state.pending = false
                    return GatewayMessage.notify(transaction: nil).encoded(id: 0)
                }
            }
        }
    }

    /// Starts telling the machine of changes (its `listen`, request `id`), from the gateway's
    /// current change on.
    private func listen(id: UInt64) async {
        lastTold.withLock { $0 = gateway.changesTold }
        gateway.listeners.withLock { $0[key] = self }
        await reply(.done, id: id)
    }

    private func reply(_ message: GatewayMessage, id: UInt64) async {
        guard let writer = writer.withLock({ $0 }) else { return }
        let frame = WebSocketFrame(fin: true, opcode: .binary, data: ByteBuffer(bytes: message.encoded(id: id)))
        try? await writer.write(frame)
    }

    /// Closes the connection with `code` and `reason` (the machine shows the reason).
    func close(_ code: GatewayClose, _ reason: String) async {
        if code == .unauthorized || code == .forbidden || code == .protocolError {
            gateway.metrics.refused(code, reason: reason)
        }
        if let writer = writer.withLock({ $0 }) {
            var data = ByteBuffer()
            data.writeInteger(code.rawValue)
            // At most 123 bytes of reason in a close frame: cut at a character's boundary.
            var shown = ""
            for character in reason {
                if shown.utf8.count + character.utf8.count > 120 { break }
                shown.append(character)
            }
            data.writeString(shown)
            try? await writer.write(WebSocketFrame(fin: true, opcode: .connectionClose, data: data))
        }
        try? await channel.channel.close()
    }

    private func converse() async {
        let expected = "/" + gateway.configuration.group
        let requested = path.split(separator: "?", maxSplits: 1).first.map(String.init) ?? path
        guard requested == expected else {
            await close(
                .unknownGroup,
                "this gateway serves the group \(gateway.configuration.group), not \(requested.dropFirst())")
            return
        }
        guard let first = await inbox.next() else { return }
        guard case .some((let helloID, .hello(let token, let machine))) = try? GatewayMessage.decode(first) else {
            await close(.protocolError, "the first message must be a hello")
            return
        }
        let claims: SyncTokenClaims
        do {
            claims = try await gateway.configuration.verifier.verify(token)
        } catch let refusal as SyncTokenRefusal {
            await close(.unauthorized, refusal.description)
            return
        } catch {
            await close(.unauthorized, "token refused: \(error)")
            return
        }
        do {
            if try await gateway.bind(machine: machine, subject: claims.subject) != nil {
                await close(
                    .forbidden,
                    "the machine id \(machine.uuidString.lowercased()) is bound to another subject than \(claims.subject)"
                )
                return
            }
        } catch {
            // The database (offline: the machine tries again), or its tables (an operator's).
            await reply(failure(error), id: helloID)
            await close(.goingAway, "the gateway could not bind the machine")
            return
        }
        deadline.cancel()
        // A token that expires while connected closes the connection then, even one that only
        // listens (the machine connects again with its renewed token file).
        let remaining = claims.expiration.addingTimeInterval(gateway.configuration.verifier.leeway).timeIntervalSinceNow
        let expiry = channel.channel.eventLoop.scheduleTask(
            in: .milliseconds(Int64(clamping: Int(min(max(0, remaining), 1e12) * 1000)))
        ) {
            Task(executorPreference: self.executor) {
                await self.close(
                    .unauthorized, SyncTokenRefusal(.expired, "the token expired while connected").description)
            }
        }
        defer { expiry.cancel() }
        let instances = gateway.configuration.rules.instances(for: claims)
        let scope = RulesScope(rules: gateway.configuration.rules, instances: instances, schemaName: gateway.schemaName)
        welcomed.withLock { $0 = machine }
        gateway.metrics.connected(machine)
        await reply(.welcome(subject: claims.subject, buckets: instances.count), id: helloID)
        var schema: ServerSchema?
        let keys = SyncRules.instanceKeys(of: instances)
        held.withLock { $0 = keys }
        var state = MachineState(keys: keys)
        while let bytes = await inbox.next() {
            let id: UInt64
            let message: GatewayMessage
            do {
                (id, message) = try GatewayMessage.decode(bytes)
            } catch {
                await close(.protocolError, "a message could not be read: \(error)")
                return
            }
            if claims.expiration.addingTimeInterval(gateway.configuration.verifier.leeway) < Date() {
                await close(.unauthorized, SyncTokenRefusal(.expired, "the token expired while connected").description)
                return
            }
            if case .prepare(let json, let version) = message {
                do {
                    let description = try SchemaDescription(json: json)
                    let made = ServerSchema(description, version: version, name: gateway.schemaName)
                    let missing = try await gateway.pool.withSession(made, scope: nil) { session in
                        try await session.missingTablesAndColumns()
                    }
                    guard missing.isEmpty else {
                        await reply(
                            .failure(
                                needsOperator: true,
                                message:
                                    "the server's tables lack \(missing.joined(separator: ", ")) (schema \(gateway.schemaName)): an operator sets them up with skyrosd --sync-setup"
                            ), id: id)
                        continue
                    }
                    schema = made
                    await reply(.done, id: id)
                } catch {
                    await reply(failure(error), id: id)
                }
                continue
            }
            guard let schema else {
                if case .listen = message {
                    await listen(id: id)
                    continue
                }
                await close(.protocolError, "a request before the schema was prepared")
                return
            }
            await handle(message, id: id, machine: machine, schema: schema, scope: scope, state: &state)
        }
    }

    private func failure(_ error: any Error) -> GatewayMessage {
        let (state, message) = ServerErrors.classify(error, configuration: gateway.configuration.database)
        return .failure(needsOperator: state == .error, message: message)
    }

    /// What a connection knows of its machine between requests.
    struct MachineState {
        /// Its bucket instances' keys.
        let keys: Set<String>
        /// Whether its next checkpoint must be read for it alone: the first of the connection,
        /// and the first after an upload (it says which of its uploads it includes, and the refusals).
        var readsOwn = true
        /// Its uploads the server has, as its own last read said (no upload since).
        var uploadedThrough: Int64 = 0
    }

    private func handle(
        _ message: GatewayMessage, id: UInt64, machine: UUID, schema: ServerSchema, scope: RulesScope,
        state: inout MachineState
    ) async {
        let pool = gateway.pool
        do {
            switch message {
            case .uploadedThrough:
                let number = try await pool.withSession(schema, scope: scope) {
                    try await $0.uploadedThrough(machine: machine)
                }
                await reply(.number(number), id: id)
            case .digests(let numbers):
                let digests = try await pool.withSession(schema, scope: scope) {
                    try await $0.digests(machine: machine, numbers: numbers)
                }
                await reply(.recordedDigests(digests), id: id)
            case .upload(let batch):
                state.readsOwn = true
                var entries: [QueuedEntry] = []
                for (number, bytes) in batch {
                    do {
                        entries.append((number, try QueuedChangeSet.decode(Data(bytes))))
                    } catch {
                        await close(.protocolError, "change set \(number) could not be read")
                        return
                    }
                }
                let result = try await pool.withSession(schema, scope: scope) { [entries] in
                    try await $0.uploadReportingTransactions(entries, machine: machine)
                }
                for outcome in result.outcomes {
                    if case .rejected(let reason) = outcome, reason.hasPrefix("not permitted by the sync rules") {
                        gateway.metrics.refused(GatewayClose?.none, reason: "rules")
                    }
                }
                await reply(.outcomes(result.outcomes, transactions: result.transactions), id: id)
            case .readCheckpoint(let previous, let rejectedAfter, let pageSize):
                // Read once for every machine (the feed), unless this machine's own read is needed.
                if !state.readsOwn, let previous, rejectedAfter >= state.uploadedThrough,
                    var shared = try await gateway.feed(for: schema)?.checkpoint(after: previous, keys: state.keys)
                {
                    shared.uploadedThrough = state.uploadedThrough
                    gateway.metrics.position.withLock { $0 = max($0, shared.number) }
                    gateway.metrics.lag.withLock { $0 = shared.lagMilliseconds }
                    await reply(.checkpoint(shared), id: id)
                    return
                }
                let checkpoint = try await pool.withSession(schema, scope: scope) { session in
                    try await session.readCheckpoint(
                        after: previous, rejectedAfter: rejectedAfter, machine: machine, pageSize: pageSize
                    ) { page in
                        await self.reply(.page(page), id: id)
                        // Bounded: a machine that does not acknowledge holds a server connection.
                        guard
                            let bytes = await self.inbox.next(within: self.gateway.configuration.statementTimeout * 3),
                            case .some((let answered, .staged(let failure))) = try? GatewayMessage.decode(bytes),
                            answered == id
                        else { return "the machine did not acknowledge a snapshot page" }
                        return failure
                    }
                }
                gateway.metrics.position.withLock { $0 = max($0, checkpoint.number) }
                if !checkpoint.isSnapshot {
                    state.readsOwn = false
                    state.uploadedThrough = checkpoint.uploadedThrough
                    await gateway.feed(for: schema)?.seed(checkpoint)
                }
                await reply(.checkpoint(checkpoint), id: id)
            case .compact:
                // The gateway compacts the log itself (GatewayConfiguration.compactionInterval).
                await reply(.done, id: id)
            case .listen:
                await listen(id: id)
            default:
                await close(.protocolError, "a message a machine does not send")
            }
        } catch let staging as Checkpoint.StagingFailed {
            await reply(.failure(needsOperator: false, message: staging.reason), id: id)
        } catch {
            await reply(failure(error), id: id)
        }
    }
}

extension GatewayServer {
    /// Binds `machine` to `subject` the first time it is seen; the subject it is bound to
    /// when that is another one (nil: bound to `subject`). Uploads and reads are under the
    /// hello's machine id only, so a token cannot act as another subject's machine.
    func bind(machine: UUID, subject: String) async throws -> String? {
        let table = ServerSchema.quote(schemaName) + "._skyros_gateway_machines"
        let empty = ServerSchema(SchemaDescription(entities: []), version: 0, name: schemaName)
        let ready = bindingsReady.withLock { $0 }
        return try await pool.withSession(empty, scope: nil) { session in
            if !ready {
                _ = try? await session.run(
                    "CREATE TABLE IF NOT EXISTS \(table) (machine uuid PRIMARY KEY, subject text NOT NULL, bound timestamptz NOT NULL DEFAULT now())"
                )
                self.bindingsReady.withLock { $0 = true }
            }
            let text = machine.uuidString.lowercased()
            try await session.run(
                "INSERT INTO \(table) (machine, subject) VALUES ($1::uuid, $2) ON CONFLICT (machine) DO NOTHING",
                [text, subject])
            let rows = try await session.run("SELECT subject FROM \(table) WHERE machine = $1::uuid", [text])
            guard let owner = rows.first?.first ?? nil else { return "nobody" }
            return owner == subject ? nil : owner
        }
    }
}
