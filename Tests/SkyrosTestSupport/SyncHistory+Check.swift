import Foundation

extension SyncHistory {
    /// Checks the guarantees of docs/SYNC.md "Consistency and guarantees" (each a
    /// ``Guarantee``; docs/SYNC.md "Testing" says what each check counts and excuses):
    ///
    /// - **no lost write**: every acknowledged save that changed something is on the server at
    ///   the end (an insert's object there, unless one of its deletes took it away; an update's
    ///   value in the audit; a deleted object gone), or was refused (matched to one refused
    ///   change set of its machine, naming exactly its object, each change set once), or was
    ///   replaced within its upload batch by a later or concurrent save of the same machine
    ///   (the other save's value on the server, in a server transaction this save may have gone
    ///   up in; a save whose outcome was unknown, sent again until the daemon answered, counts
    ///   as concurrent with every save after its start, and replaces as an acknowledged one
    ///   would); every change set each machine numbered is recorded on the server, and no queue
    ///   holds anything;
    /// - **exactly once**: the server recorded no number its machine never gave; no object was
    ///   inserted twice; no value comes back on the server after being replaced (a change set
    ///   applied twice), nor in any client's reads unless what replaced it was refused;
    /// - **convergence**: every machine's store file, and every app's main context, equals the
    ///   server's table;
    /// - **read-your-writes and monotonic reads**: per client, a value read is never older (in
    ///   the server's order) than one the client wrote or read before, except after a refusal
    ///   undid it; an object the client inserted is there until it deletes it (unless the
    ///   insert was refused), and gone once it did; and at least a tenth of the values the
    ///   clients meant to read were compared, and at most half of their reads failed;
    /// - **no value out of thin air**: every value read, and every value on the server, was
    ///   written by someone;
    /// - **refusals told**: each machine's rejected log holds exactly the change sets the
    ///   server recorded as refused for it, with their objects, and every app of the machine
    ///   was told of each of them, and of nothing else.
    public func check() -> Verdict {
        let context = CheckContext(self)
        return Verdict(checks: [
            context.lostWrites(), context.exactlyOnce(), context.convergence(), context.sessions(),
            context.thinAir(), context.refusalsTold(),
        ])
    }
}

/// What the checks share: the server's order of the values, the machines' upload batches, the
/// saves matched to refused change sets.
///
/// A machine's change sets are numbered, uploaded and refused per life of its store
/// (``SyncHistory/Machine/Life``): a store restored from a backup numbers on from the backup's
/// last number under a new machine id, so what the checks infer from the numbering (the upload
/// batches, the order of the saves in them, the refusals) is keyed by life, not by machine.
private struct CheckContext {
    let history: SyncHistory
    /// Every machine's lives, in order (a life is an index here).
    let lives: [(machine: Int, life: SyncHistory.Machine.Life)]
    /// The lives of each machine (indexes in `lives`), oldest first.
    let livesOf: [Int: [Int]]
    /// Where each (object, property, value) first appears in the server's order, and in
    /// which server transaction.
    var position: [String: (sequence: Int64, transaction: String)] = [:]
    var inserted: Set<UUID> = []
    var deleted: Set<UUID> = []
    /// The acknowledged saves that changed something.
    let writes: [SyncHistory.Operation]
    /// Each life's change sets recorded by each server transaction (the upload batches).
    var batches: [Int: [String: ClosedRange<Int64>]] = [:]
    /// Per life, the saves whose value the server has, with the batch that brought them:
    /// by start, each with the lowest last number of the batches of the saves that started
    /// then or later; by end, each with the highest first number of the batches of the saves
    /// that ended then or earlier.
    var later: [Int: [(start: Double, lowestLast: Int64)]] = [:]
    var earlier: [Int: [(end: Double, highestFirst: Int64)]] = [:]
    /// The saves (indexes in `writes`) matched to a refused change set.
    var refusedWrites: Set<Int> = []
    /// The tokens of those saves.
    var refusedTokens: Set<String> = []
    /// Refused change sets per life.
    var refusals: [Int: [SyncHistory.Upload]] = [:]

    static func key(_ object: UUID, _ property: String, _ value: String) -> String { "\(object)/\(property)/\(value)" }

    init(_ history: SyncHistory) {
        self.history = history
        for row in history.audit {
            switch row.operation {
            case "I": inserted.insert(row.object)
            case "D": deleted.insert(row.object)
            default: break
            }
            guard row.operation != "D" else { continue }
            for (property, value) in [("firstname", row.firstname), ("lastname", row.lastname), ("handle", row.handle)]
            {
                let key = Self.key(row.object, property, value)
                if position[key] == nil { position[key] = (row.sequence, row.transaction) }
            }
        }
        writes = history.operations.filter { $0.kind != .read && $0.acknowledged && $0.found && $0.object != nil }
        let lives: [(machine: Int, life: SyncHistory.Machine.Life)] = history.machines.enumerated().flatMap {
            machine, state in state.lives.map { (machine, $0) }
        }
        self.lives = lives
        livesOf = Dictionary(grouping: lives.indices, by: { lives[$0].machine })
        var index: [UUID: Int] = [:]
        for (life, entry) in lives.enumerated() { if let id = entry.life.id { index[id] = life } }
        for upload in history.uploads {
            guard let machine = index[upload.machine] else { continue }
            if upload.rejected != nil { refusals[machine, default: []].append(upload) }
            let range = batches[machine]?[upload.transaction]
            batches[machine, default: [:]][upload.transaction] =
                min(
                    range?.lowerBound ?? upload.number, upload.number)...max(
                    range?.upperBound ?? upload.number, upload.number)
        }
        for machine in refusals.keys { refusals[machine]!.sort { $0.number < $1.number } }
        var placed: [Int: [(start: Double, end: Double, batch: ClosedRange<Int64>)]] = [:]
        for write in writes {
            if let life = life(of: write), let batch = batch(of: write) {
                placed[life, default: []].append((write.start, write.end, batch))
            }
        }
        for (machine, saves) in placed {
            var lowest = Int64.max
            later[machine] = Array(
                saves.sorted { $0.start > $1.start }.map { save in
                    lowest = min(lowest, save.batch.upperBound)
                    return (save.start, lowest)
                }.reversed())
            var highest = Int64.min
            earlier[machine] = saves.sorted { $0.end < $1.end }.map { save in
                highest = max(highest, save.batch.lowerBound)
                return (save.end, highest)
            }
        }
        // Each save the server does not have, matched to a refused change set of its machine
        // that names exactly its object and may be its change set, each change set once.
        var used: Set<String> = []
        for (number, write) in writes.enumerated() where write.machine >= 0 && !onServer(write) {
            guard let object = write.object, let life = life(of: write),
                let refusal = refusals[life]?.first(where: {
                    !used.contains("\($0.machine)/\($0.number)") && $0.objects == [object]
                        && couldBeIn(write, $0.number...$0.number)
                })
            else { continue }
            used.insert("\(refusal.machine)/\(refusal.number)")
            refusedWrites.insert(number)
            if let value = write.value { refusedTokens.insert(value) }
        }
    }

    /// The life of its machine's store an operation of a client belongs to: the last one that
    /// began when it started, or before (nil: a `psql` write).
    func life(of operation: SyncHistory.Operation) -> Int? {
        guard operation.machine >= 0, let candidates = livesOf[operation.machine] else { return nil }
        return candidates.last { lives[$0].life.began <= operation.start } ?? candidates.first
    }

    func positionOf(_ object: UUID, _ property: String, _ value: String) -> Int64? {
        position[Self.key(object, property, value)]?.sequence
    }

    /// Whether the server has a save's effect somewhere in its history.
    func onServer(_ write: SyncHistory.Operation) -> Bool {
        guard let object = write.object else { return false }
        switch write.kind {
        case .insert: return inserted.contains(object)
        case .update: return positionOf(object, write.property ?? "", write.value ?? "") != nil
        case .delete: return history.serverRows[object] == nil
        case .read: return true
        }
    }

    /// The upload batch (numbers of its machine's life) that brought a save's value to the server.
    func batch(of write: SyncHistory.Operation) -> ClosedRange<Int64>? {
        guard let object = write.object, let property = write.property, let value = write.value,
            let transaction = position[Self.key(object, property, value)]?.transaction, let life = life(of: write)
        else { return nil }
        return batches[life]?[transaction]
    }

    /// Whether a save's change set may be among the numbers `range` of its machine's life: no
    /// save of the life committed after it went up in an earlier batch, and none committed
    /// before it in a later one (a machine numbers its change sets in commit order, and
    /// uploads them in order).
    func couldBeIn(_ write: SyncHistory.Operation, _ range: ClosedRange<Int64>) -> Bool {
        guard let life = life(of: write) else { return true }
        if let later = later[life] {
            // The first save that started when this one had ended, or later.
            var low = 0
            var high = later.count
            while low < high {
                let middle = (low + high) / 2
                if later[middle].start >= write.end { high = middle } else { low = middle + 1 }
            }
            if low < later.count && later[low].lowestLast < range.lowerBound { return false }
        }
        if let earlier = earlier[life] {
            // The last save that ended when this one started, or earlier.
            var low = 0
            var high = earlier.count
            while low < high {
                let middle = (low + high) / 2
                if earlier[middle].end <= write.start { low = middle + 1 } else { high = middle }
            }
            if low > 0 && earlier[low - 1].highestFirst > range.upperBound { return false }
        }
        return true
    }

    // MARK: - No lost write

    func lostWrites() -> SyncHistory.Verdict.Check {
        var lost: [String] = []
        var counts = (onServer: 0, deletedLater: 0, superseded: 0, concurrent: 0, madeAndDeleted: 0, refused: 0)
        let sameProperty = Dictionary(
            grouping: writes.filter { $0.kind == .update && $0.property != nil },
            by: { "\(life(of: $0) ?? -1)/\($0.object!)/\($0.property!)" })
        let deletions = Dictionary(
            grouping: history.operations.filter { $0.kind == .delete && $0.found && $0.object != nil },
            by: { $0.object! })
        // Updates whose save failed with its outcome unknown: the stack sends it again until
        // the daemon answers, so it may be committed at any moment after it started, after
        // saves that started later (a daemon restarted, then the resent save applied).
        let uncertainUpdates = Dictionary(
            grouping: history.operations.filter {
                $0.kind == .update && !$0.acknowledged && $0.error != nil && $0.object != nil && $0.property != nil
            },
            by: { "\(life(of: $0) ?? -1)/\($0.object!)/\($0.property!)" })
        // Deletes whose save failed with its outcome unknown (daemonUnavailable, outcome
        // unknown): applied or not, nobody was told.
        let uncertainDeletions = Dictionary(
            grouping: history.operations.filter {
                $0.kind == .delete && !$0.acknowledged && $0.error != nil && $0.object != nil
            },
            by: { $0.object! })
        func at(_ time: Double) -> String { String(format: "%.3f s", time) }
        for (number, write) in writes.enumerated() {
            let object = write.object!
            if refusedWrites.contains(number) {
                counts.refused += 1
                continue
            }
            switch write.kind {
            case .insert:
                let handle = write.value ?? ""
                if let row = history.serverRows[object] {
                    if row.hasPrefix(handle + "|") {
                        counts.onServer += 1
                    } else {
                        lost.append("client \(write.client) inserted \(object) (\(handle)): the server has \(row)")
                    }
                } else if inserted.contains(object) {
                    // On the server, and gone: one of its deletes (acknowledged or not) took it.
                    if deletions[object, default: []].contains(where: { $0.start >= write.end }) {
                        counts.deletedLater += 1
                    } else {
                        lost.append(
                            "client \(write.client) inserted \(object) (\(handle)) at \(at(write.end)): deleted on the server, by no delete of it"
                        )
                    }
                } else if !deleted.contains(object),
                    deletions[object, default: []].contains(where: {
                        $0.acknowledged && $0.machine == write.machine && $0.start >= write.end
                    })
                        || uncertainDeletions[object, default: []].contains(where: {
                            $0.machine == write.machine && $0.start >= write.end
                        })
                {
                    // Inserted and deleted within one upload batch: never sent. The delete may be
                    // one whose save failed with its outcome unknown: applied all the same.
                    counts.madeAndDeleted += 1
                } else {
                    lost.append(
                        "client \(write.client) (machine \(write.machine)) inserted \(object) (\(handle)) at \(at(write.end)): never on the server, not refused"
                    )
                }
            case .update:
                guard let property = write.property, let value = write.value else { continue }
                if positionOf(object, property, value) != nil {
                    counts.onServer += 1
                    continue
                }
                let others = sameProperty["\(life(of: write) ?? -1)/\(object)/\(property)", default: []]
                func replaces(_ other: SyncHistory.Operation) -> Bool {
                    guard let batch = batch(of: other) else { return false }
                    return couldBeIn(write, batch)
                }
                if others.contains(where: { $0.start >= write.end && replaces($0) }) {
                    counts.superseded += 1
                } else if others.contains(where: {
                    $0.client != write.client && $0.end > write.start && $0.start < write.end && replaces($0)
                }) {
                    // A save of another client of the machine, at the same time, in the same
                    // batch: which one the machine committed last is not known here.
                    counts.concurrent += 1
                } else if let uncertain = uncertainUpdates[
                    "\(life(of: write) ?? -1)/\(object)/\(property)", default: []
                ]
                .first(where: replaces) {
                    // A save whose outcome was unknown, committed after this one in the same batch:
                    // one that started later replaced it, as an acknowledged one would; one that
                    // started before was resent, and its order is not known either.
                    if uncertain.start >= write.end { counts.superseded += 1 } else { counts.concurrent += 1 }
                } else {
                    lost.append(
                        "client \(write.client) (machine \(write.machine)) wrote \(property) = \(value) on \(object) at \(at(write.end)): not on the server, not refused, not replaced within its upload batch"
                    )
                }
            case .delete:
                if history.serverRows[object] == nil {
                    counts.onServer += 1
                } else {
                    lost.append("client \(write.client) deleted \(object) at \(at(write.end)): the server still has it")
                }
            case .read: break
            }
        }
        // The machines' numbering first: a few lines that the saves' lines would crowd out.
        var machineLevel: [String] = []
        var numbered: Int64 = 0
        for (index, life) in lives {
            let name =
                history.machines[index].earlierLives.isEmpty
                ? "machine \(index)" : "machine \(index) as \(life.id.map { "\($0)" } ?? "no id")"
            guard let id = life.id else {
                machineLevel.append("machine \(index) has no machine id")
                continue
            }
            let given = life.numbers
            numbered += Int64(given.count)
            let numbers = Set(history.uploads.filter { $0.machine == id }.map(\.number))
            let missing = given.filter { !numbers.contains($0) }
            if !missing.isEmpty {
                machineLevel.append(
                    "\(name): numbered \(life.firstNumber)…\(life.lastNumber), \(missing.count) never recorded by the server: \(missing.prefix(10))"
                )
            }
            if life.queued != 0 {
                machineLevel.append(
                    "\(name) still has \(life.queued) change sets queued\(life.ended.map { String(format: " at its restore (%.3f s)", $0) } ?? "")"
                )
            }
        }
        lost = machineLevel + lost
        let ignored = history.operations.filter { $0.kind != .read && $0.acknowledged && !$0.found }.count
        return .init(
            guarantee: .noLostWrite, passed: lost.isEmpty,
            detail:
                "\(writes.count) acknowledged saves: \(counts.onServer) on the server, \(counts.deletedLater) inserts there until their delete, \(counts.superseded) replaced in their upload batch by a later save of the same machine, \(counts.concurrent) by a concurrent one (order unknown), \(counts.madeAndDeleted) inserts deleted within their upload batch, \(counts.refused) refused (each matched to its own refused change set); \(ignored) acknowledged saves that found no object to change; \(numbered) change sets numbered by the machines, \(history.uploads.count) recorded by the server",
            violations: Array(lost.prefix(10)))
    }

    // MARK: - Exactly once

    func exactlyOnce() -> SyncHistory.Verdict.Check {
        var twice: [String] = []
        for (index, life) in lives {
            guard let id = life.id else { continue }
            let extra = history.uploads.filter {
                $0.machine == id && ($0.number < life.firstNumber || $0.number > life.lastNumber)
            }
            .map(\.number).sorted()
            if !extra.isEmpty {
                twice.append(
                    "machine \(index) as \(id): the server recorded \(extra.count) change sets it never numbered under that id (it numbered \(life.firstNumber)…\(life.lastNumber)): \(extra.prefix(10))"
                )
            }
        }
        var insertedOnce: Set<UUID> = []
        for row in history.audit where row.operation == "I" && !insertedOnce.insert(row.object).inserted {
            twice.append("\(row.object) inserted twice on the server")
        }
        let byObject = Dictionary(grouping: history.audit.filter { $0.operation != "D" }, by: \.object)
        for (object, rows) in byObject {
            for property in ["firstname", "lastname"] {
                var seen: Set<String> = []
                var last: String?
                for row in rows.sorted(by: { $0.sequence < $1.sequence }) {
                    let value = property == "firstname" ? row.firstname : row.lastname
                    guard value != last else { continue }
                    if seen.contains(value) {
                        twice.append(
                            "server: \(object).\(property) went back to \(value) at audit row \(row.sequence) (a change set applied twice?)"
                        )
                    }
                    seen.insert(value)
                    last = value
                }
            }
        }
        var readSequences = 0
        for (client, operations) in Dictionary(grouping: history.operations.filter { $0.client >= 0 }, by: \.client) {
            // Per life of the machine's store: a restore from a backup takes the store back.
            // Each value with the time of the read that saw it first (the operation's end).
            var values: [String: [(value: String, at: Double)]] = [:]
            for operation in operations {
                let life = life(of: operation) ?? -1
                for read in operation.reads where read.property != "handle" {
                    guard let value = read.value else { continue }
                    let key = "\(read.object)/\(read.property)" + (life > 0 ? " (life \(life))" : "")
                    if values[key]?.last?.value != value { values[key, default: []].append((value, operation.end)) }
                }
            }
            for (key, reads) in values {
                readSequences += 1
                var seenAt: [String: Int] = [:]
                for (index, read) in reads.enumerated() {
                    if let earlier = seenAt[read.value] {
                        let between = reads[(earlier + 1)..<index]
                        if !between.allSatisfy({ refusedTokens.contains($0.value) }) {
                            let times = ([reads[earlier]] + Array(between.prefix(3)) + [read]).map {
                                "\($0.value) at \(String(format: "%.3f", $0.at)) s"
                            }
                            twice.append(
                                "client \(client) read \(key) = \(read.value) again after \(between.prefix(3).map(\.value)) (\(times.joined(separator: ", ")))"
                            )
                        }
                    }
                    seenAt[read.value] = index
                }
            }
        }
        return .init(
            guarantee: .exactlyOnce, passed: twice.isEmpty,
            detail:
                "\(history.uploads.count) upload records, each of a number its machine gave; \(history.audit.count) audit rows, no object inserted twice, no value coming back; \(readSequences) per-client read sequences with no value coming back",
            violations: Array(twice.prefix(10)))
    }

    // MARK: - Convergence

    func convergence() -> SyncHistory.Verdict.Check {
        let server = history.serverRows
        func difference(_ rows: SyncHistory.Rows) -> String? {
            guard rows != server else { return nil }
            let missing = server.keys.filter { rows[$0] == nil }
            let extra = rows.keys.filter { server[$0] == nil }
            let different = server.keys.filter { rows[$0] != nil && rows[$0] != server[$0] }
            var example = ""
            if let object = different.first {
                example = "\(object): \(rows[object] ?? "") here, \(server[object] ?? "") on the server"
            } else if let object = missing.first {
                example = "\(object) missing"
            } else if let object = extra.first {
                example = "\(object) extra"
            }
            return "\(missing.count) missing, \(extra.count) extra, \(different.count) different (e.g. \(example))"
        }
        var divergent: [String] = []
        var apps = 0
        for (index, machine) in history.machines.enumerated() {
            if let difference = difference(machine.rows) { divergent.append("machine \(index)'s store: \(difference)") }
            for (client, rows) in machine.appRows.sorted(by: { $0.key < $1.key }) {
                apps += 1
                if let difference = difference(rows) {
                    divergent.append("machine \(index), client \(client)'s main context: \(difference)")
                }
            }
        }
        return .init(
            guarantee: .convergence, passed: divergent.isEmpty,
            detail:
                "\(history.machines.count) machines' store files and \(apps) apps' main contexts against the server's \(server.count) objects",
            violations: Array(divergent.prefix(10)))
    }

    // MARK: - Sessions

    func sessions() -> SyncHistory.Verdict.Check {
        var violations: [String] = []
        var compared = 0
        var unknown = 0
        var meant = 0
        var failed = 0
        var own = 0
        let sharedValuesPerRead =
            history.operations.lazy.map { $0.reads.filter { $0.property != "handle" }.count }.max() ?? 0
        let refusedObjects = Set(
            refusedWrites.compactMap { writes[$0].kind == .insert ? writes[$0].object : nil })
        for (client, operations) in Dictionary(grouping: history.operations.filter { $0.client >= 0 }, by: \.client) {
            var floor: [String: (position: Int64, value: String, wrote: Bool)] = [:]
            var insertedAt: [UUID: (time: Double, handle: String)] = [:]
            var deletedAt: [UUID: Double] = [:]
            // Its deletes whose save failed with the outcome unknown: the object may be gone.
            var maybeDeleted: Set<UUID> = []
            var currentLife: Int?
            for operation in operations.sorted(by: { $0.start < $1.start }) {
                // A store restored from a backup goes back to it: the client's session starts
                // again with the store's new life.
                let life = life(of: operation)
                if life != currentLife {
                    if currentLife != nil {
                        floor = [:]
                        insertedAt = [:]
                        deletedAt = [:]
                        maybeDeleted = []
                    }
                    currentLife = life
                }
                if operation.acknowledged, operation.found, let object = operation.object {
                    switch operation.kind {
                    case .insert: insertedAt[object] = (operation.end, operation.value ?? "")
                    case .delete: deletedAt[object] = operation.end
                    default: break
                    }
                }
                if operation.kind == .delete, !operation.acknowledged, operation.error != nil,
                    let object = operation.object
                {
                    maybeDeleted.insert(object)
                }
                if operation.kind == .update, operation.acknowledged, operation.found, let object = operation.object,
                    let property = operation.property, let value = operation.value, !refusedTokens.contains(value),
                    let position = positionOf(object, property, value)
                {
                    let key = "\(object)/\(property)"
                    if (floor[key]?.position ?? -1) < position { floor[key] = (position, value, true) }
                }
                meant += sharedValuesPerRead
                if operation.readError != nil { failed += 1 }
                for read in operation.reads {
                    if read.property == "handle" {
                        // An object of the client's own: there from its insert to its delete.
                        own += 1
                        if deletedAt[read.object] != nil {
                            if read.value != nil {
                                violations.append(
                                    "client \(client) read \(read.object) at \(String(format: "%.3f", operation.end)) s after deleting it"
                                )
                            }
                        } else if let insert = insertedAt[read.object], !refusedObjects.contains(read.object) {
                            if read.value != insert.handle && !(read.value == nil && maybeDeleted.contains(read.object))
                            {
                                violations.append(
                                    "client \(client) read \(read.object) as \(read.value ?? "missing") at \(String(format: "%.3f", operation.end)) s after inserting it with handle \(insert.handle)"
                                )
                            }
                        }
                        continue
                    }
                    guard let value = read.value, !refusedTokens.contains(value) else { continue }
                    let key = "\(read.object)/\(read.property)"
                    guard let position = positionOf(read.object, read.property, value) else {
                        unknown += 1
                        continue
                    }
                    compared += 1
                    if let before = floor[key], position < before.position {
                        violations.append(
                            "client \(client) read \(key) = \(value) (server position \(position)) at \(String(format: "%.3f", operation.end)) s after \(before.wrote ? "writing" : "reading") \(before.value) (position \(before.position))"
                        )
                    }
                    if (floor[key]?.position ?? -1) < position { floor[key] = (position, value, false) }
                }
            }
        }
        // Reads that fail or compare nothing check nothing: at least a tenth of the values
        // meant to be read compared (values of saves replaced within their upload batch, and
        // of objects a machine has not received yet, are not), and at most half the reads failed.
        let attempts = history.operations.filter { $0.client >= 0 }.count
        if compared == 0 || compared * 10 < meant || failed * 2 > attempts {
            violations.insert(
                "only \(compared) of the \(meant) values the clients meant to read were compared (\(failed) of \(attempts) reads failed)",
                at: 0)
        }
        return .init(
            guarantee: .sessions, passed: violations.isEmpty,
            detail:
                "\(compared) of \(meant) values meant to be read compared in the server's order (\(failed) reads failed; \(unknown) values replaced within an upload batch, with no server position, skipped); \(own) reads of the clients' own inserted and deleted objects",
            violations: Array(violations.prefix(10)))
    }

    // MARK: - No value out of thin air

    func thinAir() -> SyncHistory.Verdict.Check {
        var written = history.initialTokens
        for operation in history.operations { if let value = operation.value { written.insert(value) } }
        var invented: [String] = []
        var readCount = 0
        for operation in history.operations {
            for read in operation.reads where read.property != "handle" {
                readCount += 1
                if let value = read.value, !written.contains(value) {
                    invented.append(
                        "client \(operation.client) read \(read.object).\(read.property) = \(value), which nobody wrote"
                    )
                }
            }
        }
        // What the server's audit shows the clients' objects taking: written values only
        // (an insert's firstname is its token too).
        for operation in history.operations where operation.kind == .insert {
            if let token = operation.value, token.hasPrefix("h-") { written.insert(String(token.dropFirst(2))) }
        }
        var serverValues = 0
        for row in history.audit where row.operation == "U" {
            for value in [row.firstname, row.lastname] {
                serverValues += 1
                if !written.contains(value) {
                    invented.append(
                        "server: \(row.object) took \(value) at audit row \(row.sequence), which nobody wrote")
                }
            }
        }
        return .init(
            guarantee: .noValueOutOfThinAir, passed: invented.isEmpty,
            detail:
                "\(readCount) values read and \(serverValues) values updated on the server, \(written.count) values written",
            violations: Array(invented.prefix(10)))
    }

    // MARK: - Refusals told

    func refusalsTold() -> SyncHistory.Verdict.Check {
        var untold: [String] = []
        var tellings = 0
        for (index, machine) in history.machines.enumerated() {
            // Each life's rejected log, at its end: what the server refused under its id, and
            // what its store held from its backup (earlier lives' refusals).
            var refused: [SyncHistory.Upload] = []
            for life in machine.lives {
                guard let id = life.id else { continue }
                let name = machine.earlierLives.isEmpty ? "machine \(index)" : "machine \(index) as \(id)"
                let ofLife = history.uploads.filter { $0.machine == id && $0.rejected != nil }
                refused += ofLife
                let onServer = Set(ofLife.map(\.number)).union(life.inherited)
                let local = Set(life.rejected.map(\.number))
                if onServer != local {
                    untold.append(
                        "\(name): server refused \(onServer.subtracting(life.inherited).sorted().prefix(10))\(life.inherited.isEmpty ? "" : " (and its backup's log held \(life.inherited.sorted().prefix(10)))"), its rejected log holds \(local.sorted().prefix(10))\(life.ended.map { String(format: " at its restore (%.3f s)", $0) } ?? "")"
                    )
                }
                let logged = Dictionary(life.rejected.map { ($0.number, $0.objects) }, uniquingKeysWith: { $1 })
                for upload in ofLife where logged[upload.number].map({ $0 != upload.objects }) == true {
                    untold.append(
                        "\(name): change set \(upload.number) refused for \(upload.objects.count) objects, the rejected log names \(logged[upload.number]!.count)"
                    )
                }
            }
            // Every app of the machine told of each refused change set (by its objects), and
            // of nothing else.
            var expected: [Set<UUID>: Int] = [:]
            for upload in refused { expected[upload.objects, default: 0] += 1 }
            for client in history.clients.filter({ $0.value == index }).map(\.key).sorted() {
                var told: [Set<UUID>: Int] = [:]
                for objects in history.told[client] ?? [] { told[objects, default: 0] += 1 }
                tellings += told.values.reduce(0, +)
                let missing = expected.filter { told[$0.key, default: 0] < $0.value }
                let unknown = told.keys.filter { expected[$0] == nil }
                if !missing.isEmpty {
                    untold.append(
                        "machine \(index), client \(client): told of \(told.values.reduce(0, +)) refusals, not of \(missing.values.reduce(0, +)) of the \(refused.count) (e.g. of \(missing.keys.first!.sorted(by: { $0.uuidString < $1.uuidString }).prefix(3)))"
                    )
                }
                if !unknown.isEmpty {
                    untold.append(
                        "machine \(index), client \(client): told of \(unknown.count) refusals the server never recorded (e.g. of \(unknown[0].sorted(by: { $0.uuidString < $1.uuidString }).prefix(3)))"
                    )
                }
            }
        }
        return .init(
            guarantee: .refusalsTold, passed: untold.isEmpty,
            detail:
                "\(history.uploads.filter { $0.rejected != nil }.count) change sets refused by the server, each in its machine's rejected log with its objects; \(tellings) refusals told to \(history.clients.count) apps",
            violations: Array(untold.prefix(10)))
    }
}
