import Foundation
import Skyros
import SkyrosSync
import Synchronization

/// The group's changes as a gateway reads them once for every machine it serves (DESIGN §10):
/// a chain of reads, each the changes after the previous one's snapshot with the server
/// transactions behind each object and the bucket instances each object is in, found once. A
/// machine's checkpoint is then made in memory: the objects changed by transactions its
/// previous checkpoint did not see, each as the newest read has it, kept where its buckets
/// hold it and gone elsewhere. No statement runs per machine for a change; the server's work
/// per change is the same for ten machines or ten thousand.
///
/// A machine whose previous checkpoint is older than the chain's start (one that was away, or
/// connected before the chain began), or that uploaded since its last read (whose checkpoint
/// must say what of its uploads it holds, and the refusals), reads its own
/// (``RulesScope/restrict(_:in:)``).
actor ChangeFeed {
    /// One read of the chain.
    struct Entry: Sendable {
        /// The snapshot it read after.
        let base: String
        /// What it read (nobody's uploads and refusals), with the objects reaching a changed one.
        let checkpoint: Checkpoint
        /// The server transactions that changed each object (the reached ones: every
        /// transaction of the read).
        let transactions: [ObjectID: [UInt64]]
        /// The bucket instances (``SyncRules/instanceKey(bucket:values:)``) each present object is in.
        let keys: [ObjectID: Set<String>]
        /// The bucket instances each object was in before the read's changes, where known (an
        /// object absent: not known; a machine told of its change deletes it unless it holds it now).
        var before: [ObjectID: Set<String>] = [:]

        /// Whether a machine holding `held` may have held object `id` before the read: it must
        /// be told the object left it.
        func mayHaveHeld(_ id: ObjectID, _ held: Set<String>) -> Bool {
            guard let before = before[id] else { return true }
            return !before.isDisjoint(with: held)
        }
    }

    let schema: ServerSchema
    let rules: SyncRules
    let pool: ServerPool
    private var entries: [Entry] = []
    /// Whether the group changed since the newest read (a notification came): set at once by
    /// the notification's thread, before the machines are told (a machine's read that follows
    /// must not find the chain clean).
    private let dirty = Mutex(true)
    private var advancing: Task<Void, any Error>?
    private let executor = SyncExecutor()
    /// The most reads kept: a machine further behind reads its own.
    let limit: Int
    /// Reads made (for the metrics and the tests).
    private(set) var reads = 0

    /// The machines a change concerns: those holding a bucket instance in `keys`, or every
    /// one.
    struct Touched: Sendable, Equatable {
        var everyone = false
        var keys: Set<String> = []

        static let all = Touched(everyone: true)

        mutating func formUnion(_ other: Touched) {
            everyone = everyone || other.everyone
            if !everyone { keys.formUnion(other.keys) }
        }
    }

    /// The bucket instances of every object the chain's reads found since it started (an
    /// object's after its newest change): the ones it was in before a change, that the
    /// machines holding them learn it left. Emptied when the chain breaks, or past
    /// ``knownLimit`` objects (a change of an object not in it is then told to every machine).
    private var known: [ObjectID: Set<String>] = [:]
    let knownLimit: Int
    /// What the reads since the machines were last told touched (``untold()``).
    private var touched = Touched()
    /// Whether the server's log records operations (asked once; nil before).
    private var operations: Bool?

    init(schema: ServerSchema, rules: SyncRules, pool: ServerPool, limit: Int = 256, knownLimit: Int = 100_000) {
        self.schema = schema
        self.rules = rules
        self.pool = pool
        self.limit = limit
        self.knownLimit = knownLimit
    }

    /// The group changed: reads the changes (once, whoever else asks meanwhile) and returns
    /// which machines the reads since the last call concern: the ones holding, or having held,
    /// a changed object or an object reaching one. Every machine when the chain has not
    /// started (no machine read through the feed yet), broke, or read an object whose buckets
    /// before the change it does not know (changed for the first time since the chain started,
    /// and not created by the change).
    func untold() async -> Touched {
        guard !entries.isEmpty else { return .all }
        do {
            if dirty.withLock({ $0 }) || advancing != nil { try await advance(from: head) }
        } catch {
            touched = Touched()
            return .all
        }
        defer { touched = Touched() }
        return entries.isEmpty ? .all : touched
    }

    /// Adds what `entry` touched to ``touched``, and remembers its objects' buckets; returns
    /// the buckets its objects were in before it, where known.
    private func touch(_ entry: Entry, created: Set<ObjectID>) -> [ObjectID: Set<String>] {
        var before: [ObjectID: Set<String>] = [:]
        if known.count > knownLimit { known = [:] }
        for id in Set(entry.checkpoint.objects.keys).union(entry.transactions.keys) {
            if let was = known[id] {
                touched.keys.formUnion(was)
                before[id] = was
            } else if created.contains(id) {
                before[id] = []
            } else {
                touched.everyone = true
            }
            // Changed by several transactions of the read: a machine's own read may have seen it
            // between them, in buckets this read cannot name; every machine is told.
            if (entry.transactions[id]?.count ?? 0) > 1 { touched.everyone = true }
            switch entry.checkpoint.objects[id] {
            case .some(.some):
                let now = entry.keys[id] ?? []
                touched.keys.formUnion(now)
                known[id] = now
            case .some(.none):
                known[id] = []  // gone: in no bucket
            case .none:
                // Not readable: where it is now is not known.
                touched.everyone = true
                known[id] = nil
            }
        }
        if touched.everyone { touched.keys = [] }
        return before
    }

    /// The chain broke (a read past the horizon, a gap): what it knew of buckets is forgotten,
    /// and every machine is told.
    private func broke() {
        entries = []
        known = [:]
        touched = .all
        operations = nil  // asked again: a --sync-setup meanwhile may have added the column
    }

    /// The group changed on the server: the next checkpoint asked for reads the changes.
    nonisolated func changed() { dirty.withLock { $0 = true } }

    /// The checkpoint after `cursor` for a machine holding the bucket instances `keys`; nil when
    /// the chain does not cover `cursor` (the machine reads its own).
    func checkpoint(after cursor: String, keys: Set<String>) async throws -> Checkpoint? {
        // A read under way may be the one that holds what this machine was just told of.
        if let advancing { try await advancing.value }
        // The chain starts only at a snapshot the server gave (``seed(_:)``), never at a
        // machine's word: a made-up cursor must not become everyone's start.
        guard !entries.isEmpty else { return nil }
        guard let start = entries.first?.base, Self.sees(cursor, everything: start) else { return nil }
        if dirty.withLock({ $0 }) || !Self.sees(head, everything: cursor) {
            try await advance(from: head)
        }
        guard let first = entries.first, Self.sees(cursor, everything: first.base), let newest = entries.last,
            Self.sees(newest.checkpoint.snapshot, everything: cursor)
        else { return nil }
        var objects: [ObjectID: StoredValues?] = [:]
        var changedAny = false
        for entry in entries {
            for (id, values) in entry.checkpoint.objects {
                let transactions = entry.transactions[id] ?? []
                guard transactions.contains(where: { !(Checkpoint.isVisible($0, in: cursor) ?? false) }) else {
                    continue
                }
                changedAny = true
                // A cursor that sees some of the read's transactions of the object (a machine's
                // own read, made while the read's changes were being committed) saw a state
                // between its buckets before and now: the machine may hold it whatever `before` says.
                let sawSome = transactions.contains { Checkpoint.isVisible($0, in: cursor) ?? true }
                if let values, let held = entry.keys[id], !held.isDisjoint(with: keys) {
                    objects[id] = .some(values)
                } else if sawSome || entry.mayHaveHeld(id, keys) {
                    objects[id] = .some(nil)  // left its buckets, or gone
                }
            }
        }
        var checkpoint = newest.checkpoint
        checkpoint.objects = objects
        checkpoint.unreadable = []
        checkpoint.rejected = []
        checkpoint.uploadedThrough = 0
        if !changedAny { checkpoint.lagMilliseconds = 0 }
        return checkpoint
    }

    private var head: String { entries.last?.checkpoint.snapshot ?? "" }

    /// Starts the chain, when it has none, at `checkpoint`'s snapshot: a machine's own read,
    /// just made by the server (the next read of the chain reads the changes after it).
    func seed(_ checkpoint: Checkpoint) {
        guard entries.isEmpty, !checkpoint.isSnapshot else { return }
        var start = checkpoint
        start.objects = [:]
        start.unreadable = []
        start.rejected = []
        start.uploadedThrough = 0
        entries = [Entry(base: checkpoint.snapshot, checkpoint: start, transactions: [:], keys: [:])]
    }

    /// Reads the changes after `base` (once, whoever else asks meanwhile) and chains them; a
    /// read past the server's horizon empties the chain.
    private func advance(from base: String) async throws {
        if let running = advancing {
            try await running.value
            // Over: it is no longer under way, whether or not its owner has resumed yet (else
            // the read again below would wait on it once more, for ever).
            if advancing == running { advancing = nil }
            // Told of a change during that read: it may not hold it; read again.
            guard dirty.withLock({ $0 }) else { return }
            try await advance(from: head)
            return
        }
        dirty.withLock { $0 = false }
        // On an event loop, as every task of the gateway (not the cooperative pool).
        let task = Task(executorPreference: executor) { try await self.read(after: base) }
        advancing = task
        defer { if advancing == task { advancing = nil } }
        do {
            try await task.value
        } catch {
            changed()
            throw error
        }
    }

    private func read(after base: String) async throws {
        let schema = schema
        let rules = rules
        let asked = operations
        let (made, operations) = try await pool.withSession(schema, scope: nil) {
            session -> ((entry: Entry, created: Set<ObjectID>)?, Bool) in
            let operations: Bool
            if let asked { operations = asked } else { operations = try await session.logRecordsOperations() }
            // The changes, the rows reaching them and every bucket: one snapshot of the server.
            let made = try await session.inSnapshot { () -> (entry: Entry, created: Set<ObjectID>)? in
                guard
                    let (checkpoint, transactions, created) = try await session.readChangesWithTransactions(
                        after: base, operations: operations)
                else { return nil }
                let entry = try await Self.entry(
                    base: base, checkpoint: checkpoint, transactions: transactions, rules: rules, session: session)
                return (entry, created)
            }
            return (made, operations)
        }
        self.operations = operations
        reads += 1
        guard let made else { return broke() }
        if let last = entries.last, last.checkpoint.snapshot != base { broke() }
        var entry = made.entry
        entry.before = touch(entry, created: made.created)
        entries.append(entry)
        if entries.count > limit { entries.removeFirst(entries.count - limit) }
    }

    /// A read's entry: the objects reaching changed ones through the rules' relationships
    /// added (their buckets may have changed with them), and every present object's instances.
    static func entry(
        base: String, checkpoint: Checkpoint, transactions: [ObjectID: [UInt64]], rules: SyncRules,
        session: ServerSession
    ) async throws -> Entry {
        let qualify = { (entity: String) in ServerSchema.quote(session.schema.name) + "." + ServerSchema.quote(entity) }
        var checkpoint = checkpoint
        var transactions = transactions
        let all = Array(Set(transactions.values.joined()))
        var present: [String: [UUID]] = [:]
        for (id, values) in checkpoint.objects where values != nil {
            present[id.entityName, default: []].append(id.uuid)
        }
        let reached = try await RulesScope.reached(
            from: present, besides: checkpoint.objects, rules: rules, qualify: qualify, in: session)
        for (entity, ids) in reached {
            guard let table = session.schema.table(entity) else { continue }
            for uuid in ids {
                checkpoint.objects[ObjectID(entityName: entity, uuid: uuid)] = .some(nil)
                transactions[ObjectID(entityName: entity, uuid: uuid)] = all
            }
            for row in try await session.rows(of: table, ids: Array(ids), condition: nil).rows {
                checkpoint.objects[ObjectID(entityName: entity, uuid: row.id)] = .some(row.values)
                present[entity, default: []].append(row.id)
            }
        }
        var keys: [ObjectID: Set<String>] = [:]
        for membership in rules.memberships(qualify: qualify) {
            guard let ids = present[membership.entity], !ids.isEmpty, session.schema.table(membership.entity) != nil
            else { continue }
            for row in try await session.run(membership.sql, [RulesScope.list(ids)] + membership.parameters) {
                guard let text = row.first ?? nil, let uuid = UUID(uuidString: text) else { continue }
                var values: [String: String] = [:]
                var consistent = true
                for (index, name) in membership.parameterNames.enumerated() {
                    guard let value = row[index + 1] ?? nil, values[name].map({ $0 == value }) ?? true else {
                        consistent = false
                        break
                    }
                    values[name] = value
                }
                guard consistent else { continue }
                keys[ObjectID(entityName: membership.entity, uuid: uuid), default: []].insert(
                    SyncRules.instanceKey(bucket: membership.bucket, values: values))
            }
        }
        return Entry(base: base, checkpoint: checkpoint, transactions: transactions, keys: keys)
    }

    /// Whether snapshot `later` sees every transaction `earlier` sees (both `pg_snapshot`
    /// texts): its xmax is not below `earlier`'s, and no transaction it sees running below
    /// `earlier`'s xmax was committed for `earlier`. False for text that is not a snapshot.
    static func sees(_ later: String, everything earlier: String) -> Bool {
        guard let a = parse(earlier), let b = parse(later) else { return false }
        guard a.xmax <= b.xmax else { return false }
        for running in b.running where running < a.xmax {
            if !a.running.contains(running) { return false }
        }
        return true
    }

    private static func parse(_ snapshot: String) -> (xmin: UInt64, xmax: UInt64, running: Set<UInt64>)? {
        let parts = snapshot.split(separator: ":", omittingEmptySubsequences: false)
        guard parts.count == 3, let xmin = UInt64(parts[0]), let xmax = UInt64(parts[1]) else { return nil }
        var running = Set<UInt64>()
        for part in parts[2].split(separator: ",") {
            guard let xid = UInt64(part) else { return nil }
            running.insert(xid)
        }
        return (xmin, xmax, running)
    }
}
