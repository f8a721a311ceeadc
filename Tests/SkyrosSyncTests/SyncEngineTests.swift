import Foundation
import GRDB
import Skyros
import Synchronization
import Testing

@testable import SkyrosSync

/// The engine's loop driven end to end with no PostgreSQL: a real store file for its queue, a
/// scripted ``SyncServer`` (the second conformance of the protocol, as a gateway would be) and
/// a host that records what the daemon would be asked. The rules themselves are the state
/// machines' tests; these check that the loop performs their actions.
@Suite(.timeLimit(.minutes(1))) struct SyncEngineTests {
    /// What the engine did, as the scripted server and host saw it.
    enum Event: Sendable, Equatable {
        case state(SyncEngine.Status.State, String?)
        case uploaded([Int64])
        case dropped(through: Int64)
        case applied(snapshot: String, objects: Int)
    }

    /// Events in order, and waits for one that matches, bounded.
    final class Recorder: Sendable {
        private struct Waiter {
            var predicate: @Sendable (Event) -> Bool
            var continuation: CheckedContinuation<Event?, Never>
        }
        private let state = Mutex<(events: [Event], waiters: [Int: Waiter], next: Int)>(([], [:], 0))

        var events: [Event] { state.withLock { $0.events } }

        func record(_ event: Event) {
            let matched = state.withLock { state -> [CheckedContinuation<Event?, Never>] in
                state.events.append(event)
                let keys = state.waiters.filter { $0.value.predicate(event) }.keys
                return keys.compactMap { state.waiters.removeValue(forKey: $0)?.continuation }
            }
            for continuation in matched { continuation.resume(returning: event) }
        }

        /// The first event (recorded already, or to come within `timeout`) that matches.
        func first(within timeout: Duration = .seconds(20), where predicate: @escaping @Sendable (Event) -> Bool) async
            -> Event?
        {
            await withCheckedContinuation { continuation in
                let key = state.withLock { state -> Int? in
                    if state.events.contains(where: predicate) { return nil }
                    state.next += 1
                    state.waiters[state.next] = Waiter(predicate: predicate, continuation: continuation)
                    return state.next
                }
                guard let key else {
                    continuation.resume(returning: events.first(where: predicate))
                    return
                }
                Task {
                    try? await Task.sleep(for: timeout)
                    state.withLock { $0.waiters.removeValue(forKey: key) }?.continuation.resume(returning: nil)
                }
            }
        }
    }

    /// A server in memory: it records uploads, hands out checkpoints of the objects other
    /// machines wrote, and refuses connections while told to.
    final class ScriptedServer: SyncServer {
        struct Refused: Error, CustomStringConvertible {
            var description: String
        }
        private struct State {
            var refusal: String?
            var uploadedThrough: Int64 = 0
            var xid: UInt64 = 100
            var others: [ObjectID: StoredValues?] = [:]
            var notify: (@Sendable (UInt64?) -> Void)?
        }
        private let state = Mutex(State())
        let recorder: Recorder

        init(recorder: Recorder) { self.recorder = recorder }

        var redacted: String { "scripted" }

        func refuse(_ message: String?) { state.withLock { $0.refusal = message } }

        /// Another machine wrote an object: the server notifies its transaction.
        func otherMachineWrote(_ id: ObjectID) {
            let (notify, xid) = state.withLock { state in
                state.xid += 1
                state.others[id] = StoredValues([])
                return (state.notify, state.xid)
            }
            notify?(xid)
        }

        func connect(machine: UUID, closed: @escaping @Sendable () -> Void) async throws -> any SyncServerConnection {
            if let refusal = state.withLock({ $0.refusal }) { throw Refused(description: refusal) }
            return Connection(server: self)
        }

        func listen(machine: UUID, _ notify: @escaping @Sendable (UInt64?) -> Void) async throws {
            state.withLock { $0.notify = notify }
            notify(nil)
            try await Task.sleep(for: .seconds(3_600))
        }

        func classify(_ error: any Error) -> (SyncEngine.Status.State, String) { (.offline, "\(error)") }

        struct Connection: SyncServerConnection {
            let server: ScriptedServer
            var serverName: String? { nil }

            func prepare(_ schema: ServerSchema) async throws {}

            func uploadedThrough(machine: UUID) async throws -> Int64 { server.state.withLock { $0.uploadedThrough } }

            func digests(machine: UUID, numbers: [Int64]) async throws -> [Int64: Int64] { [:] }

            func upload(_ batch: [QueuedEntry], machine: UUID) async throws -> (
                outcomes: [ServerSession.UploadOutcome], transactions: [UInt64]?
            ) {
                let xid = server.state.withLock { state in
                    state.uploadedThrough = batch.last!.number
                    state.xid += 1
                    return state.xid
                }
                server.recorder.record(.uploaded(batch.map(\.number)))
                return (Array(repeating: .applied, count: batch.count), [xid])
            }

            func readCheckpoint(
                after previous: String?, rejectedAfter: Int64, machine: UUID, pageSize: Int,
                stage: @escaping @Sendable (SnapshotPage) async -> String?
            ) async throws -> Checkpoint {
                let (xid, uploaded, objects) = server.state.withLock { state in
                    defer { state.others = [:] }
                    return (state.xid, state.uploadedThrough, state.others)
                }
                let snapshot = "\(xid + 1):\(xid + 1):"
                if previous == nil {
                    let page = SnapshotPage(snapshot: snapshot, isFirst: true, entity: "Item", rows: [], unreadable: [])
                    if let refusal = await stage(page) { throw Checkpoint.StagingFailed(reason: refusal) }
                }
                return Checkpoint(
                    snapshot: snapshot, number: xid + 1, isSnapshot: previous == nil, uploadedThrough: uploaded,
                    objects: previous == nil ? [:] : objects, unreadable: [], rejected: [], lagMilliseconds: 0)
            }

            func compact(retention: TimeInterval) async throws {}

            func close() {}
        }
    }

    /// The daemon's side, recording what it is asked.
    final class RecordingHost: SyncHost {
        let recorder: Recorder
        init(recorder: Recorder) { self.recorder = recorder }

        func apply(_ checkpoint: Checkpoint) async -> SyncApplyResult {
            recorder.record(.applied(snapshot: checkpoint.snapshot, objects: checkpoint.objects.count))
            return .applied
        }

        func stage(_ page: SnapshotPage) async -> String? { nil }

        func applyStaged(_ checkpoint: Checkpoint, base: String) async -> SyncApplyResult {
            recorder.record(.applied(snapshot: checkpoint.snapshot, objects: checkpoint.objects.count))
            return .applied
        }

        func uploaded(through number: Int64) async { recorder.record(.dropped(through: number)) }

        func reidentify(as machine: UUID, dropping: [Int64], reason: String) async -> Bool { false }

        func syncStateChanged(_ status: SyncEngine.Status) { recorder.record(.state(status.state, status.message)) }
    }

    /// A store file with the upload queue, and change sets queued in it.
    final class QueueFile {
        let directory: URL
        let queue: DatabaseQueue
        var path: String { directory.appendingPathComponent("store.sqlite").path }

        init() throws {
            directory = FileManager.default.temporaryDirectory.appendingPathComponent(
                "skyros-sync-engine-\(UUID().uuidString)")
            try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
            var configuration = Configuration()
            configuration.journalMode = .wal
            queue = try DatabaseQueue(
                path: directory.appendingPathComponent("store.sqlite").path, configuration: configuration)
            try queue.write { try $0.execute(sql: SyncTables.queueTableSQL) }
        }

        deinit {
            try? queue.close()
            try? FileManager.default.removeItem(at: directory)
        }

        @discardableResult
        func enqueue() throws -> QueuedEntry {
            var changes = QueuedChangeSet()
            changes.inserted = [QueuedChangeSet.Row(entity: "Item", id: UUID(), values: ["title": .text("queued")])]
            let number = try queue.write { db -> Int64 in
                try db.execute(
                    sql: "INSERT INTO skyros_sync_queue (sequence, timestamp, changes) VALUES (0, 0, ?)",
                    arguments: [changes.encoded()])
                return db.lastInsertedRowID
            }
            return (number, changes)
        }
    }

    static func engine(_ file: QueueFile, _ server: ScriptedServer, _ host: RecordingHost, queuedThrough: Int64)
        -> SyncEngine
    {
        var settings = SyncEngine.Settings()
        settings.pollInterval = .seconds(60)  // only signals drive it
        return SyncEngine(
            configuration: SyncConfiguration(host: "scripted", username: "u", database: "d", schema: "g"),
            schema: ServerSchema(SchemaDescription(entities: []), version: 1, name: "g"), machine: UUID(),
            checkpoint: nil,
            queuedThrough: queuedThrough, storePath: file.path, host: host, settings: settings, server: server,
            log: { _ in })
    }

    @Test func theEngineUploadsTheQueueThenAppliesWhatOtherMachinesWrite() async throws {
        let file = try QueueFile()
        try file.enqueue()
        try file.enqueue()
        let recorder = Recorder()
        let server = ScriptedServer(recorder: recorder)
        let host = RecordingHost(recorder: recorder)
        let engine = Self.engine(file, server, host, queuedThrough: 2)
        engine.start()
        defer { engine.stop() }

        // Online, the queue read from the store and uploaded in one batch, then dropped.
        #expect(await recorder.first { $0 == .state(.online, nil) } != nil)
        #expect(await recorder.first { $0 == .dropped(through: 2) } != nil)
        #expect(recorder.events.contains(.uploaded([1, 2])))
        // A first sync: a snapshot, applied after the uploads (the write-checkpoint rule).
        #expect(await recorder.first { if case .applied(_, 0) = $0 { true } else { false } } != nil)

        // A local commit, handed over: uploaded from memory.
        let entry = try file.enqueue()
        engine.localCommitted([entry], through: entry.number)
        #expect(await recorder.first { $0 == .dropped(through: 3) } != nil)
        #expect(recorder.events.contains(.uploaded([3])))

        // Another machine's write, notified: read and applied as a change, not a snapshot.
        server.otherMachineWrote(ObjectID(entityName: "Item", uuid: UUID()))
        #expect(await recorder.first { if case .applied(_, 1) = $0 { true } else { false } } != nil)
        #expect(engine.status.state == .online)
        #expect(engine.status.uploadedThrough == 3)
    }

    @Test func anUnreachableServerIsOfflineAndTheQueueWaitsForIt() async throws {
        let file = try QueueFile()
        try file.enqueue()
        let recorder = Recorder()
        let server = ScriptedServer(recorder: recorder)
        server.refuse("cannot reach the server (connection refused)")
        let host = RecordingHost(recorder: recorder)
        let engine = Self.engine(file, server, host, queuedThrough: 1)
        engine.start()
        defer { engine.stop() }

        #expect(await recorder.first { $0 == .state(.offline, "cannot reach the server (connection refused)") } != nil)
        #expect(engine.status.state == .offline)
        #expect(!recorder.events.contains { if case .uploaded = $0 { true } else { false } })

        server.refuse(nil)
        #expect(await recorder.first { $0 == .dropped(through: 1) } != nil)
        #expect(recorder.events.contains(.state(.online, nil)))
        #expect(engine.status.message == nil)
    }
}
