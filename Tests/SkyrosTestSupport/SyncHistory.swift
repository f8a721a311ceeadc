import Foundation

/// What the clients of a sync fault campaign did and saw, and what the machines and the
/// server hold at its end: the input of ``SyncHistory/check()``.
///
/// Every value a campaign writes is a token no other write uses (`c3.17`: client 3's 17th
/// operation; `psql-5`), so each value read names the write that made it. The server's order
/// of the writes comes from an audit table the campaign adds to the server (a row trigger on
/// `User`: one row per insert, update and delete, numbered in the order they happened; a
/// row's updates are serialized by its lock, so the numbers follow their commits).
public struct SyncHistory: Sendable {
    /// One operation of a client: a save (with what it wrote) or a read.
    public struct Operation: Sendable {
        public enum Kind: String, Sendable {
            case insert, update, delete, read
        }

        /// The client (an app's stack), numbered from 0; `psql` writes have client -1.
        public var client: Int
        /// The machine whose daemon the client used (-1: psql, on the server).
        public var machine: Int
        public var kind: Kind
        /// The object written (an update, a delete, an insert's new object).
        public var object: UUID?
        /// The property written (`firstname`, `lastname`; `handle` for an insert).
        public var property: String?
        /// The token written.
        public var value: String?
        /// Whether the save was acknowledged (returned without an error).
        public var acknowledged: Bool
        /// Why the save failed, when it did (its outcome is then unknown: it may be saved).
        public var error: String?
        /// When the operation started and ended, in seconds since the campaign started.
        public var start: Double
        public var end: Double
        /// What the client read after the operation (a read, or the check after a save).
        public var reads: [Read] = []
    }

    /// One value read by a client.
    public struct Read: Sendable {
        public var object: UUID
        public var property: String
        /// The value read; nil when the object was missing.
        public var value: String?
        /// The machine's sync checkpoint (the server snapshot it last applied) when the value
        /// was read, read from its store just before the read: the value is at this checkpoint
        /// or a later one.
        public var checkpoint: String?
    }

    /// One row of the server's audit table.
    public struct AuditRow: Sendable {
        public var sequence: Int64
        /// `I`, `U` or `D`.
        public var operation: Character
        public var object: UUID
        public var handle: String
        public var firstname: String
        public var lastname: String
    }

    /// An object's stored values: `handle|firstname|lastname`.
    public typealias Rows = [UUID: String]

    /// What one machine holds at the end.
    public struct Machine: Sendable {
        /// Its machine id (`syncMachine`).
        public var id: UUID?
        /// Its `User` objects.
        public var rows: Rows
        /// Change sets still queued.
        public var queued: Int
        /// The highest queue number it ever gave (its change sets are 1 … this).
        public var lastNumber: Int64
        /// Its rejected log: number, reason, and the objects of the change set.
        public var rejected: [(number: Int64, reason: String, objects: Set<UUID>)]
        /// Its checkpoint.
        public var checkpoint: String?
    }

    /// One `_skyros_uploads` row.
    public struct Upload: Sendable {
        public var machine: UUID
        public var number: Int64
        public var rejected: String?
    }

    public var operations: [Operation] = []
    /// The values of the shared objects before the campaign (tokens `init-…`).
    public var initialTokens: Set<String> = []
    public var audit: [AuditRow] = []
    public var serverRows: Rows = [:]
    public var uploads: [Upload] = []
    public var machines: [Machine] = []

    public init() {}

    /// What the checker found: each guarantee's verdict with its counts and first violations.
    public struct Verdict: Sendable, CustomStringConvertible {
        public struct Check: Sendable {
            public var name: String
            public var passed: Bool
            /// What was checked (counts).
            public var detail: String
            /// The first violations (at most 10).
            public var violations: [String]
        }

        public var checks: [Check]
        public var passed: Bool { checks.allSatisfy(\.passed) }

        public var description: String {
            checks.map { check in
                let head = "\(check.passed ? "PASS" : "FAIL") \(check.name): \(check.detail)"
                return ([head] + check.violations.map { "    \($0)" }).joined(separator: "\n")
            }.joined(separator: "\n")
        }
    }

    /// Checks the guarantees of docs/SYNC.md "Consistency and guarantees":
    ///
    /// - **no lost write**: every acknowledged save is on the server (its value in the audit,
    ///   or replaced within the same upload batch by a later save of the same machine, which
    ///   is), or in its machine's rejected log; every change set a machine numbered is recorded
    ///   on the server (applied or refused) and none is still queued;
    /// - **exactly once**: no (machine, number) recorded twice; no value comes back on the
    ///   server after being replaced (a change set applied twice), nor in any client's reads
    ///   unless what replaced it was refused;
    /// - **convergence**: every machine's store equals the server's table;
    /// - **read-your-writes and monotonic reads**: per client, a value read is never older
    ///   (in the server's order) than one the client wrote or read before, except after a
    ///   refusal undid it;
    /// - **no value out of thin air**: every value read was written by someone;
    /// - **refusals told**: each machine's rejected log holds exactly the change sets the
    ///   server recorded as refused for it.
    public func check() -> Verdict {
        var checks: [Verdict.Check] = []

        // Where each (object, property, value) first appears in the server's order.
        var position: [String: Int64] = [:]
        var inserted: Set<UUID> = []
        var deleted: Set<UUID> = []
        for row in audit {
            switch row.operation {
            case "I": inserted.insert(row.object)
            case "D": deleted.insert(row.object)
            default: break
            }
            guard row.operation != "D" else { continue }
            for (property, value) in [("firstname", row.firstname), ("lastname", row.lastname), ("handle", row.handle)]
            {
                let key = "\(row.object)/\(property)/\(value)"
                if position[key] == nil { position[key] = row.sequence }
            }
        }
        func positionOf(_ object: UUID, _ property: String, _ value: String) -> Int64? {
            position["\(object)/\(property)/\(value)"]
        }

        // The refused saves: the rejected log names objects, not values, so a save counts as
        // refused when its machine's log has a change set of its object and its value is not
        // on the server.
        let writes = operations.filter { $0.kind != .read && $0.acknowledged }
        let rejectedObjects = machines.map { Set($0.rejected.flatMap(\.objects)) }
        var rejectedTokens: Set<String> = []
        for write in writes where write.machine >= 0 && write.machine < machines.count {
            guard let object = write.object, let value = write.value, rejectedObjects[write.machine].contains(object)
            else { continue }
            let onServer =
                write.kind == .insert
                ? inserted.contains(object) : positionOf(object, write.property ?? "", value) != nil
            if !onServer { rejectedTokens.insert(value) }
        }
        let deletedBy = Set(writes.filter { $0.kind == .delete }.compactMap(\.object))
        // The acknowledged updates of each machine, object and property.
        let sameProperty = Dictionary(
            grouping: writes.filter { $0.kind == .update && $0.object != nil && $0.property != nil },
            by: { "\($0.machine)/\($0.object!)/\($0.property!)" })

        // No lost write.
        var lost: [String] = []
        var madeAndDeleted = 0
        var concurrent = 0
        var onServer = 0
        var superseded = 0
        var refused = 0
        for write in writes {
            guard let object = write.object else { continue }
            if let value = write.value, rejectedTokens.contains(value) {
                refused += 1
                continue
            }
            switch write.kind {
            case .insert:
                if inserted.contains(object) {
                    onServer += 1
                } else if deletedBy.contains(object) {
                    madeAndDeleted += 1  // an object made and deleted within one upload batch is not sent
                } else {
                    lost.append(
                        "client \(write.client) inserted \(object) (\(write.value ?? "")): not on the server, not refused"
                    )
                }
            case .update:
                guard let property = write.property, let value = write.value else { continue }
                if positionOf(object, property, value) != nil {
                    onServer += 1
                } else if deleted.contains(object) {
                    onServer += 1
                } else if sameProperty["\(write.machine)/\(object)/\(property)", default: []].contains(where: { later in
                    later.start >= write.end && later.value.map { positionOf(object, property, $0) != nil } == true
                }) {
                    superseded += 1
                } else if sameProperty["\(write.machine)/\(object)/\(property)", default: []].contains(where: { other in
                    other.end > write.start && other.start < write.end && other.value != write.value
                        && other.value.map { positionOf(object, property, $0) != nil } == true
                }) {
                    // A save of another client of the machine, at the same time: which one the
                    // machine committed last is not known here; the other's value is the net effect.
                    concurrent += 1
                } else {
                    lost.append(
                        "client \(write.client) (machine \(write.machine)) wrote \(property) = \(value) on \(object) at \(String(format: "%.3f", write.end)) s: not on the server, not refused"
                    )
                }
            case .delete:
                if serverRows[object] == nil {
                    onServer += 1
                } else {
                    lost.append("client \(write.client) deleted \(object): the server still has it")
                }
            case .read: break
            }
        }
        for (index, machine) in machines.enumerated() {
            guard let id = machine.id else {
                lost.append("machine \(index) has no machine id")
                continue
            }
            let numbers = uploads.filter { $0.machine == id }.map(\.number)
            let expected = machine.lastNumber
            let numbered: Set<Int64> = expected > 0 ? Set(1...expected) : []
            if Set(numbers) != numbered {
                let missing = numbered.subtracting(numbers).sorted()
                lost.append(
                    "machine \(index): numbered 1…\(expected), the server recorded \(numbers.count) (missing \(missing.prefix(10)))"
                )
            }
            if machine.queued > 0 { lost.append("machine \(index) still has \(machine.queued) change sets queued") }
        }
        checks.append(
            .init(
                name: "no lost write", passed: lost.isEmpty,
                detail:
                    "\(writes.count) acknowledged saves: \(onServer) on the server, \(superseded) replaced in their upload batch by a later save of the same machine, \(concurrent) by a concurrent one (order unknown), \(madeAndDeleted) inserts deleted within their upload batch, \(refused) refused; \(machines.map(\.lastNumber).reduce(0, +)) change sets numbered by the machines, \(uploads.count) recorded by the server",
                violations: Array(lost.prefix(10))))

        // Exactly once.
        var twice: [String] = []
        var uploadKeys: Set<String> = []
        for upload in uploads where !uploadKeys.insert("\(upload.machine)/\(upload.number)").inserted {
            twice.append("(\(upload.machine), \(upload.number)) recorded twice")
        }
        var insertedTwice: Set<UUID> = []
        for row in audit where row.operation == "I" && !insertedTwice.insert(row.object).inserted {
            twice.append("\(row.object) inserted twice on the server")
        }
        var comebacks = 0
        let byObject = Dictionary(grouping: audit.filter { $0.operation != "D" }, by: \.object)
        for (object, rows) in byObject {
            for property in ["firstname", "lastname"] {
                var seen: Set<String> = []
                var last: String?
                for row in rows.sorted(by: { $0.sequence < $1.sequence }) {
                    let value = property == "firstname" ? row.firstname : row.lastname
                    guard value != last else { continue }
                    if seen.contains(value) {
                        comebacks += 1
                        twice.append("server: \(object).\(property) went back to \(value) at audit row \(row.sequence)")
                    }
                    seen.insert(value)
                    last = value
                }
            }
        }
        var readSequences = 0
        for (client, operations) in Dictionary(grouping: operations.filter { $0.client >= 0 }, by: \.client) {
            var history: [String: [String]] = [:]
            for read in operations.flatMap(\.reads) {
                guard let value = read.value else { continue }
                let key = "\(read.object)/\(read.property)"
                if history[key]?.last != value { history[key, default: []].append(value) }
            }
            for (key, values) in history {
                readSequences += 1
                var seenAt: [String: Int] = [:]
                for (index, value) in values.enumerated() {
                    if let earlier = seenAt[value] {
                        let between = values[(earlier + 1)..<index]
                        if !between.allSatisfy({ rejectedTokens.contains($0) }) {
                            twice.append(
                                "client \(client) read \(key) = \(value) again after \(Array(between).prefix(3))")
                        }
                    }
                    seenAt[value] = index
                }
            }
        }
        checks.append(
            .init(
                name: "exactly once", passed: twice.isEmpty,
                detail:
                    "\(uploads.count) upload records unique; \(audit.count) audit rows with no value coming back; \(readSequences) per-client read sequences with no value coming back",
                violations: Array(twice.prefix(10))))

        // Convergence.
        var divergent: [String] = []
        for (index, machine) in machines.enumerated() where machine.rows != serverRows {
            let missing = serverRows.keys.filter { machine.rows[$0] == nil }
            let extra = machine.rows.keys.filter { serverRows[$0] == nil }
            let different = serverRows.keys.filter { machine.rows[$0] != nil && machine.rows[$0] != serverRows[$0] }
            var example = ""
            if let object = different.first {
                example = "\(object): \(machine.rows[object] ?? "") here, \(serverRows[object] ?? "") on the server"
            } else if let object = missing.first {
                example = "\(object) missing"
            } else if let object = extra.first {
                example = "\(object) extra"
            }
            divergent.append(
                "machine \(index): \(missing.count) missing, \(extra.count) extra, \(different.count) different (e.g. \(example))"
            )
        }
        checks.append(
            .init(
                name: "convergence", passed: divergent.isEmpty,
                detail: "\(machines.count) machines against the server's \(serverRows.count) objects",
                violations: divergent))

        // Read-your-writes and monotonic reads.
        var sessions: [String] = []
        var compared = 0
        var unknown = 0
        for (client, operations) in Dictionary(grouping: operations.filter { $0.client >= 0 }, by: \.client) {
            var floor: [String: (position: Int64, value: String, wrote: Bool)] = [:]
            for operation in operations.sorted(by: { $0.start < $1.start }) {
                if operation.kind == .update, operation.acknowledged, let object = operation.object,
                    let property = operation.property, let value = operation.value, !rejectedTokens.contains(value),
                    let position = positionOf(object, property, value)
                {
                    let key = "\(object)/\(property)"
                    if (floor[key]?.position ?? -1) < position { floor[key] = (position, value, true) }
                }
                for read in operation.reads {
                    guard let value = read.value, !rejectedTokens.contains(value) else { continue }
                    let key = "\(read.object)/\(read.property)"
                    guard let position = positionOf(read.object, read.property, value) else {
                        unknown += 1
                        continue
                    }
                    compared += 1
                    if let before = floor[key], position < before.position {
                        sessions.append(
                            "client \(client) read \(key) = \(value) (server position \(position)) at \(String(format: "%.3f", operation.end)) s after \(before.wrote ? "writing" : "reading") \(before.value) (position \(before.position))"
                        )
                    }
                    if (floor[key]?.position ?? -1) < position { floor[key] = (position, value, false) }
                }
            }
        }
        checks.append(
            .init(
                name: "read-your-writes and monotonic reads", passed: sessions.isEmpty,
                detail:
                    "\(compared) reads compared in the server's order; \(unknown) reads of values replaced within an upload batch (no server position) skipped",
                violations: Array(sessions.prefix(10))))

        // No value out of thin air.
        var written = initialTokens
        for operation in operations { if let value = operation.value { written.insert(value) } }
        var invented: [String] = []
        var readCount = 0
        for operation in operations {
            for read in operation.reads {
                readCount += 1
                if let value = read.value, !written.contains(value) {
                    invented.append(
                        "client \(operation.client) read \(read.object).\(read.property) = \(value), which nobody wrote"
                    )
                }
            }
        }
        checks.append(
            .init(
                name: "no value out of thin air", passed: invented.isEmpty,
                detail: "\(readCount) values read, \(written.count) values written",
                violations: Array(invented.prefix(10))))

        // Refusals told.
        var untold: [String] = []
        for (index, machine) in machines.enumerated() {
            guard let id = machine.id else { continue }
            let onServer = Set(uploads.filter { $0.machine == id && $0.rejected != nil }.map(\.number))
            let local = Set(machine.rejected.map(\.number))
            if onServer != local {
                untold.append(
                    "machine \(index): server refused \(onServer.sorted().prefix(10)), its rejected log holds \(local.sorted().prefix(10))"
                )
            }
        }
        checks.append(
            .init(
                name: "refusals told", passed: untold.isEmpty,
                detail:
                    "\(uploads.filter { $0.rejected != nil }.count) change sets refused by the server, each in its machine's rejected log",
                violations: untold))
        return Verdict(checks: checks)
    }
}
