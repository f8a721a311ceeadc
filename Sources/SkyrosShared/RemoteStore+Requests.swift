import Foundation
import Skyros
import SkyrosWire
import SkyrosZeroMQ

/// Requests on the request socket: attempts and retries, hellos, and saves numbered and
/// applied in order (a save whose outcome is unknown is resolved before any new one).
extension RemoteStore {
    /// Sends a request and waits for its reply; error replies become ``SkyrosError``s.
    ///
    /// An attempt that gets no reply within ``retryInterval`` is abandoned and the request is
    /// sent again on a new connection; when the daemon answers that it does not know this
    /// client (it restarted), the client says hello again and resends. When ``timeout`` has
    /// passed: ``SkyrosError/Code/daemonUnavailable``.
    func request(_ body: WireMessage.Body) throws -> WireMessage.Body {
        try connection.withLock { try request(body, on: &$0) }
    }

    /// A request, on the connection its caller holds.
    private func request(_ body: WireMessage.Body, on connection: inout Connection) throws -> WireMessage.Body {
        var attempts = RequestAttempts(now: .now, timeout: timeoutDuration, retryInterval: retryDuration)
        connection.requestWentOut = false
        while true {
            guard case .attempt(let wait, let newConnection, let sayHelloFirst) = attempts.next(now: .now) else {
                if connection.requestWentOut, let number = Self.saveNumber(of: body) { throw outcomeUnknown(number) }
                throw SkyrosError(
                    .daemonUnavailable,
                    "the daemon of \(container.url.path) did not answer within \(timeout) seconds (is skyrosd running?)"
                )
            }
            do {
                if newConnection { connection.dealer.close() }
                if sayHelloFirst {
                    try sayHelloAgain(on: &connection, wait: wait.timeInterval)
                    attempts.welcomed()
                }
                return try exchange(body, on: &connection, wait: wait.timeInterval)
            } catch let error as SkyrosError where error.code == .helloRequired {
                attempts.helloRequired()
            } catch let timeout as ExchangeTimeout {
                attempts.timedOut(daemonHeldConnection: timeout.connectionHeld)
            }
        }
    }

    /// The save number a save, a reset or a batch carries (nil for other requests).
    private static func saveNumber(of body: WireMessage.Body) -> UInt64? {
        switch body {
        case .save(_, let number, _), .deleteAll(_, let number), .batch(_, let number, _): number
        default: nil
        }
    }

    /// An attempt got no reply in time; `connectionHeld`: on one connection, ready all along
    /// (the daemon is there, and slow), rather than one lost or never made (it went away).
    private struct ExchangeTimeout: Error {
        var connectionHeld: Bool
    }

    /// One request and its reply, on the current connection.
    private func exchange(_ body: WireMessage.Body, on connection: inout Connection, wait: TimeInterval) throws
        -> WireMessage.Body
    {
        let id = connection.nextRequestID
        connection.requestsSent[Int(body.kind.rawValue)] += 1
        connection.nextRequestID += 1
        connection.dealer.send([WireMessage(requestID: id, body: body).encoded()])
        connection.requestWentOut = true
        let connectionAtSend = connection.dealer.connectionsMade
        let deadline = Date().addingTimeInterval(wait)
        while Date() < deadline {
            let remaining = max(1, Int(deadline.timeIntervalSinceNow * 1000))
            guard connection.dealer.waitForInput(milliseconds: remaining) else { break }
            guard let frame = connection.dealer.receive()?.last,
                let reply = try? WireMessage.decodeReply([UInt8](frame))
            else { continue }
            if reply.requestID == 0, case .error(let code, let message) = reply.body {
                throw SkyrosError(SkyrosError.Code(rawValue: code), message)
            }
            guard reply.requestID == id else { continue }  // a late reply to an abandoned request
            if reply.body.kind == .saved || reply.body.kind == .batchDone, connection.droppedSaveReplies > 0 {
                connection.droppedSaveReplies -= 1
                continue
            }
            if case .error(let code, let message) = reply.body {
                throw SkyrosError(SkyrosError.Code(rawValue: code), message)
            }
            if case .conflicts(let message, let conflicts) = reply.body {
                throw SkyrosError(.mergeConflict, message, conflicts: conflicts)
            }
            return reply.body
        }
        throw ExchangeTimeout(
            connectionHeld: connection.dealer.isReady && connection.dealer.connectionsMade == connectionAtSend)
    }

    /// Says hello to a daemon that restarted. Its sequence numbers go on where they were, so
    /// the event thread catches up with what was missed; a daemon of another store (a new
    /// epoch), or behind this client, makes ``onRestart`` refresh everything.
    private func sayHelloAgain(on connection: inout Connection, wait: TimeInterval) throws {
        guard case .welcome(let welcome) = try exchange(.hello(helloMessage), on: &connection, wait: wait) else {
            throw SkyrosError(.malformedMessage, "the daemon did not welcome this client back")
        }
        queue(welcomed(welcome, startingOver: false))
    }

    // MARK: - Saves

    /// Sends a save (or a reset, or a batch) with the next save number, and tells the
    /// sequencer its outcome: the reply's sequence is this client's own, never merged.
    ///
    /// A save whose outcome is still unknown is resolved first, on the same turn of the
    /// connection: the daemon applies a client's saves in order, and a newer save must not
    /// overtake one that may not have arrived. When it cannot be resolved, the new save is
    /// not sent (``SkyrosError/Code/daemonUnavailable``: not applied).
    @discardableResult
    func saveRequest(_ body: (UInt64) -> WireMessage.Body) throws -> WireMessage.Body {
        // Told once the connection is released: a handler may save, or wait for a context
        // whose queue is itself waiting for the connection (a lock-order deadlock otherwise).
        var resolved: ResolvedSave?
        defer { if let resolved { onSaveResolved?(resolved) } }
        return try connection.withLock { connection in
            while true {
                switch state.withLock({ $0.sequencer.nextSave() }) {
                case .resend(let unknown):
                    resolved = try resolve(unknown, on: &connection)
                case .send(let number):
                    do {
                        return try send(save: body(number), on: &connection)
                    } catch let error as SkyrosError where error.code == .outcomeUnknown {
                        state.withLock { $0.sequencer.saveOutcomeUnknown(number: number, body: body(number)) }
                        wakeEventThread()  // it resends in the background
                        throw error
                    } catch {
                        // Refused, or never sent: not applied, so the next save takes its number.
                        state.withLock { $0.sequencer.saveNotApplied(number: number) }
                        throw error
                    }
                }
            }
        }
    }

    /// One save request, with the sequencer told of it and of its answer (its sequence);
    /// returns the reply (`saved`, or `batchDone`).
    ///
    /// `resending`: the save whose outcome was unknown. Its change set, once applied, is merged
    /// into the main context when its event comes (the saver was told the outcome is unknown,
    /// and its main context forgot what the save touched), and it does not settle the main
    /// context's save in flight, which is another one.
    private func send(
        save body: WireMessage.Body, resending: Bool = false, on connection: inout Connection
    ) throws -> WireMessage.Body {
        state.withLock { $0.sequencer.saveSent() }
        var saved: UInt64?
        defer {
            queue(
                state.withLock {
                    resending
                        ? $0.sequencer.unknownSaveAnswered(sequence: saved) : $0.sequencer.saveAnswered(sequence: saved)
                })
        }
        let reply = try request(body, on: &connection)
        switch reply {
        case .saved(let sequence):
            saved = sequence
            if !resending { state.withLock { $0.ownWrites }?.numbered(sequence) }
        case .batchDone(_, let event): saved = event.sequence
        default: throw unexpected()
        }
        return reply
    }

    /// Resends a save whose outcome is unknown, until the request's timeout; on an answer the
    /// sequencer forgets it, and what to tell ``onSaveResolved`` is returned (the caller does,
    /// once the connection is released).
    private func resolve(_ unknown: EventSequencer.UnknownSave, on connection: inout Connection) throws -> ResolvedSave
    {
        let resolved: ResolvedSave
        do {
            let sequence: UInt64? =
                switch try send(save: unknown.body, resending: true, on: &connection) {
                case .saved(let sequence): sequence
                case .batchDone(_, let event): event.sequence
                default: nil
                }
            resolved = ResolvedSave(saveNumber: unknown.number, sequence: sequence)
        } catch let error as SkyrosError where error.code == .outcomeUnknown || error.code == .daemonUnavailable {
            throw SkyrosError(
                .daemonUnavailable,
                "save \(unknown.number)'s outcome is still unknown (the daemon of \(container.url.path) does not answer); nothing new was sent"
            )
        } catch {
            // The daemon answered with a refusal: the save is not in the store.
            resolved = ResolvedSave(saveNumber: unknown.number, sequence: nil, error: SkyrosError.wrap(error))
        }
        state.withLock {
            $0.sequencer.unknownSaveResolved()
            if resolved.sequence == nil { $0.sequencer.saveNotApplied(number: unknown.number) }
        }
        return resolved
    }

    /// Tries, on the event thread, to resolve a save whose outcome is unknown; a request in
    /// flight (a saver resolving it already, or any other) makes this a no-op until the
    /// next wake-up.
    func resolveInBackground() {
        guard state.withLock({ $0.sequencer.unknownSave != nil }) else { return }
        let resolved = connection.withLockIfAvailable { connection -> ResolvedSave? in
            guard let unknown = state.withLock({ $0.sequencer.unknownSave }) else { return nil }
            return try? resolve(unknown, on: &connection)
        }
        if let resolved = resolved ?? nil { onSaveResolved?(resolved) }
    }

    private func outcomeUnknown(_ number: UInt64) -> SkyrosError {
        SkyrosError(
            .outcomeUnknown,
            "save \(number) went out but the daemon of \(container.url.path) did not acknowledge it within \(timeout) seconds: it may or may not have been applied; it is resent until the daemon answers (RemoteStore.onSaveResolved)"
        )
    }
}
