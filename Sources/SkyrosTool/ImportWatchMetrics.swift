// import, watch and metrics.
import ArgumentParser
import Foundation
import Skyros
import SkyrosDaemon
import SkyrosWire
import SkyrosZeroMQ

struct Import: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "import",
        abstract: "Read objects from JSON lines (the format of `skyros dump`) into the store.",
        discussion: """
            Each line: {"entity": NAME, "id": UUID, "values": {PROPERTY: VALUE}}, values as `skyros dump` \
            prints them; a property left out is null. "entity" and "id" are required: the id is the object's \
            identifier (any UUID for a new object, e.g. from `uuidgen`; `skyros dump` prints each object's). Objects are saved in change sets of --chunk objects. With \
            --store, in one transaction (relationships may point to objects later in the file), recorded in \
            the store's history when it has one, and queued for upload when the store has synced (docs/SYNC.md); \
            refused while a daemon serves the store. With --group, \
            through the daemon (one save per chunk; a relationship to an object later in the file is set by \
            an update at the end). An object whose id exists is refused (uniqueConstraintViolation) unless \
            --upsert is given, which updates it instead. --json prints {"objects", "inserted", "updated", \
            "changeSets", "sequence"}. \(exitCodesHelp)
            """)

    @Argument(help: "The JSON-lines file ('-' for standard input).")
    var file: String

    @Flag(help: "Update objects whose id exists instead of refusing them.")
    var upsert = false

    @Option(help: "Objects per change set.")
    var chunk: Int = 1_000

    @OptionGroup var target: Target

    func validate() throws {
        guard chunk > 0 else { throw ValidationError("--chunk is a number of objects, 1 or more") }
    }

    func run() throws {
        try reportingFailures {
            let data: Data
            do {
                data =
                    file == "-"
                    ? FileHandle.standardInput.readDataToEndOfFile() : try Data(contentsOf: URL(fileURLWithPath: file))
            } catch {
                throw ToolFailure(ToolExit.failure, "cannot read \(file): \(error.localizedDescription)")
            }
            let store = try operatedStore(target, writing: true)
            let description = try store.schema().description
            let objects = Self.ordered(try Self.parse(data, description: description))
            var chunks: [ChangeSet] = []
            var inserted = 0
            var updated = 0
            var deferred: [ChangeSet.Update] = []
            var seen = Set<UUID>()
            let inFile = Set(objects.map(\.snapshot.id.uuid))
            let throughDaemon = store is AdminClient
            // Each change set must be complete when it is applied: a to-one to an object of a
            // later change set is set by an update at the end (a required one was ordered after
            // its destination by `ordered`).
            for start in stride(from: 0, to: objects.count, by: chunk) {
                var slice = Array(objects[start..<min(start + chunk, objects.count)])
                let existing = upsert ? try store.existing(slice.map(\.snapshot.id)) : []
                var changes = ChangeSet()
                let inChunk = Set(slice.map(\.snapshot.id.uuid))
                for index in slice.indices {
                    for (property, value) in slice[index].toOnes {
                        guard case .blob(let bytes) = value, let uuid = UUID(bytes: bytes), !seen.contains(uuid),
                            !inChunk.contains(uuid), inFile.contains(uuid), !slice[index].required.contains(property)
                        else { continue }
                        slice[index].snapshot.values[property] = .null
                        deferred.append(ChangeSet.Update(id: slice[index].snapshot.id, changes: [property: value]))
                    }
                    let snapshot = slice[index].snapshot
                    if existing.contains(snapshot.id) {
                        var values: [Int: StoredValue] = [:]
                        for index in slice[index].stored { values[index] = snapshot.values[index] }
                        changes.updated.append(ChangeSet.Update(id: snapshot.id, changes: values))
                        updated += 1
                    } else {
                        changes.inserted.append(snapshot)
                        inserted += 1
                    }
                }
                seen.formUnion(inChunk)
                chunks.append(changes)
            }
            for start in stride(from: 0, to: deferred.count, by: chunk) {
                chunks.append(ChangeSet(updated: Array(deferred[start..<min(start + chunk, deferred.count)])))
            }
            var bar = ProgressBar("import")
            let sequence: UInt64
            do {
                sequence = try store.importChanges(chunks) { done in
                    bar.update(done: Int64(done), total: Int64(chunks.count))
                }
            } catch let error as SkyrosError where error.code == .uniqueConstraintViolation && !upsert {
                throw ToolFailure(
                    ToolExit.failure,
                    "\(error.message): an object of the file exists already (\(throughDaemon ? "the change sets before it were saved" : "nothing was imported")); --upsert updates such objects"
                )
            }
            bar.finish()
            if target.json {
                Output.line(
                    JSONValue.object([
                        "objects": .integer(Int64(objects.count)), "inserted": .integer(Int64(inserted)),
                        "updated": .integer(Int64(updated)), "changeSets": .integer(Int64(chunks.count)),
                        "sequence": .integer(Int64(clamping: sequence)),
                    ]).text)
            } else {
                Output.line(
                    "imported \(counted(objects.count, "object")) (\(inserted) inserted, \(updated) updated) in \(counted(chunks.count, "change set"))"
                        + (sequence > 0 ? ", sequence \(sequence)" : ""))
            }
        }
    }

    /// An object read from a line.
    struct Parsed {
        var snapshot: Snapshot
        /// Indexes of the properties with a column (attributes and to-ones).
        var stored: [Int]
        /// Its to-one values, by property index.
        var toOnes: [(Int, StoredValue)]
        /// Indexes of its required to-ones.
        var required: Set<Int>
    }

    /// The objects in file order, except that an object whose required to-one points to an
    /// object later in the file goes after it (cycles of required to-ones stay as they are).
    static func ordered(_ objects: [Parsed]) -> [Parsed] {
        let inFile = Set(objects.map(\.snapshot.id.uuid))
        func targets(_ object: Parsed) -> [UUID] {
            object.toOnes.compactMap { index, value in
                guard object.required.contains(index), case .blob(let bytes) = value, let uuid = UUID(bytes: bytes),
                    inFile.contains(uuid)
                else { return nil }
                return uuid
            }
        }
        var placed = Set<UUID>()
        var ordered: [Parsed] = []
        var pending = objects
        var progress = true
        while !pending.isEmpty && progress {
            progress = false
            var rest: [Parsed] = []
            for object in pending {
                if targets(object).allSatisfy(placed.contains) {
                    ordered.append(object)
                    placed.insert(object.snapshot.id.uuid)
                    progress = true
                } else {
                    rest.append(object)
                }
            }
            pending = rest
        }
        return ordered + pending
    }

    static func parse(_ data: Data, description: SchemaDescription) throws -> [Parsed] {
        var objects: [Parsed] = []
        let entities = Dictionary(description.entities.map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        for (offset, line) in data.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false).enumerated() {
            let number = offset + 1
            guard !line.allSatisfy({ $0 == UInt8(ascii: " ") || $0 == UInt8(ascii: "\r") || $0 == UInt8(ascii: "\t") })
            else { continue }
            func refuse(_ message: String) -> ToolFailure {
                ToolFailure(ToolExit.failure, "line \(number): \(message)")
            }
            guard let json = try? JSONValue.parse(Data(line)), case .object = json else {
                throw refuse("not a JSON object")
            }
            guard let name = json["entity"]?.stringValue else { throw refuse("no \"entity\"") }
            guard let entity = entities[name] else {
                throw refuse(
                    "the store has no entity \(name) (it has: \(description.userEntityNames.joined(separator: ", ")))"
                )
            }
            guard let idText = json["id"]?.stringValue, let uuid = UUID(uuidString: idText) else {
                throw refuse("no UUID \"id\"")
            }
            guard case .object(let values)? = json["values"] ?? .object([:]) else {
                throw refuse("\"values\" is not an object")
            }
            for key in values.keys where !entity.properties.contains(where: { $0.name == key }) {
                throw refuse("\(name) has no property \(key)")
            }
            var stored: [StoredValue] = []
            var parsed = Parsed(
                snapshot: Snapshot(id: ObjectID(entityName: name, uuid: uuid), values: []), stored: [], toOnes: [],
                required: [])
            for (index, property) in entity.properties.enumerated() {
                let value: StoredValue
                do {
                    value = try ValueJSON.stored(values[property.name] ?? .null, of: property)
                } catch {
                    throw refuse("\(name).\(error.message)")
                }
                if value == .null && property.kind == "attribute" && !property.isOptional {
                    throw refuse("\(name).\(property.name) is missing (it is not optional)")
                }
                stored.append(value)
                if property.kind != "toMany" { parsed.stored.append(index) }
                if property.kind == "toOne" {
                    if value != .null { parsed.toOnes.append((index, value)) }
                    if property.isRequired { parsed.required.insert(index) }
                }
            }
            parsed.snapshot.values = StoredValues(stored)
            objects.append(parsed)
        }
        return objects
    }
}

struct Watch: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print change sets as they are committed, until interrupted.",
        discussion: """
            With --group: the daemon's change events, as its clients receive them (gaps are filled from the \
            history). With --store: the store's history, read every 200 ms (a group's store; an embedded store \
            has no history). One line per change set: sequence, author, and the objects inserted, updated \
            (with the new values) and deleted. --json prints JSON lines {"sequence", "kind", "author", "date", \
            "inserted": [{"entity", "id", "values"}], "updated": [{"entity", "id", "version", "values"}], \
            "deleted": [{"entity", "id"}]}. \(exitCodesHelp)
            """)

    @Option(help: "Start after this sequence (default: the current one: only what comes next).")
    var since: UInt64?

    @Option(help: "Stop after this many change sets (default: until interrupted).")
    var count: Int?

    @OptionGroup var target: Target

    func run() throws {
        try reportingFailures {
            signal(SIGPIPE, SIG_IGN)
            if let path = target.store {
                try watchFile(StoreFile(path))
            } else {
                try watchDaemon(AdminClient(container: try target.container()))
            }
        }
    }

    private func watchFile(_ file: StoreFile) throws {
        guard file.hasJournal else {
            throw ToolFailure(
                ToolExit.failure,
                "the store at \(file.url.path) has no history to watch (an embedded store): watch a group with --group")
        }
        var last = try since ?? JournalAccess.sequence(of: file.store)
        var printed = 0
        while true {
            let rows = try file.store.rows(
                "SELECT sequence, timestamp, event FROM skyros_history WHERE sequence > ? ORDER BY sequence LIMIT 1000",
                [.integer(Int64(clamping: last))])
            for row in rows {
                guard case .blob(let bytes) = row[2],
                    case .event(let event)? = try? WireMessage.decode([UInt8](bytes)).body
                else { continue }
                var date = Date()
                if case .real(let seconds) = row[1] { date = Date(timeIntervalSince1970: seconds) }
                try show(event, date: date, schema: file.description)
                last = event.sequence
                printed += 1
                if let count, printed >= count { return }
            }
            if rows.isEmpty { usleep(200_000) }
        }
    }

    private func watchDaemon(_ client: AdminClient) throws {
        let description = try client.schema().description
        let subscriber = try client.eventSubscriber()
        defer { subscriber.close() }
        var last = since ?? client.welcome.sequence
        var printed = 0
        func deliver(_ event: ChangeEvent) throws -> Bool {
            guard event.isChangeSet, event.sequence > last else { return false }
            try show(event, date: Date(), schema: description)
            last = event.sequence
            printed += 1
            return count.map { printed >= $0 } ?? false
        }
        /// Fetches what the events did not bring (a late subscription, dropped events).
        func catchUp(to sequence: UInt64) throws -> Bool {
            while last < sequence {
                let reply = try client.wire(.changesSince(last, limit: 0))
                guard case .changes(let events, let more) = reply else { throw AdminClient.unexpected(.wire(reply)) }
                for event in events where try deliver(event) { return true }
                if !more || events.isEmpty { break }
            }
            return false
        }
        if try catchUp(to: UInt64.max) { return }
        while true {
            guard subscriber.waitForInput(milliseconds: 2_000), let frames = subscriber.receive() else {
                throw ToolFailure(
                    ToolExit.unavailable,
                    "the daemon of \(client.container.url.path) went silent (no heartbeat for 2 s)")
            }
            // A topic followed by a schema version: a copy for clients of an earlier version.
            guard frames.first?.count == 1, let bytes = frames.last,
                let message = try? WireMessage.decode([UInt8](bytes))
            else { continue }
            let events: [ChangeEvent] =
                switch message.body {
                case .event(let event): [event]
                case .changes(let events, _): events
                default: []
                }
            for event in events {
                if event.sequence > last + 1, try catchUp(to: event.sequence - (event.isChangeSet ? 1 : 0)) { return }
                if try deliver(event) { return }
            }
        }
    }

    private func show(_ event: ChangeEvent, date: Date, schema: SchemaDescription) throws {
        func entity(_ id: ObjectID) -> SchemaDescription.Entity? { schema.entities.first { $0.name == id.entityName } }
        if target.json {
            let inserted: [JSONValue] = event.inserted.compactMap { snapshot in
                entity(snapshot.id).map { Dump.line(snapshot, entity: $0) }
            }
            let updated: [JSONValue] = event.updated.map { update in
                var values: [String: JSONValue] = [:]
                if let entity = entity(update.id) {
                    for (index, value) in update.values where index < entity.properties.count {
                        values[entity.properties[index].name] = ValueJSON.json(value, of: entity.properties[index])
                    }
                }
                return [
                    "entity": .string(update.id.entityName), "id": .string(update.id.uuid.uuidString),
                    "version": .integer(update.version), "values": .object(values),
                ]
            }
            let deleted: [JSONValue] = event.deleted.map {
                ["entity": .string($0.entityName), "id": .string($0.uuid.uuidString)]
            }
            Output.line(
                JSONValue.object([
                    "sequence": .integer(Int64(clamping: event.sequence)), "kind": .string(History.kind(event.kind)),
                    "author": .string(event.author), "date": .string(Output.date(date)), "inserted": .array(inserted),
                    "updated": .array(updated), "deleted": .array(deleted),
                ]).text)
            return
        }
        var line = "#\(event.sequence) \(Output.date(date)) \(event.author.isEmpty ? "-" : event.author):"
        if event.kind == .reset { line += " reset (every object deleted)" }
        line += " +\(event.inserted.count) ~\(event.updated.count) -\(event.deleted.count)"
        Output.line(line)
        for snapshot in event.inserted.prefix(20) {
            let values = entity(snapshot.id).map { Dump.line(snapshot, entity: $0)["values"]?.text ?? "" } ?? ""
            Output.line("  + \(snapshot.id) \(values)")
        }
        for update in event.updated.prefix(20) {
            var values: [String: JSONValue] = [:]
            if let entity = entity(update.id) {
                for (index, value) in update.values where index < entity.properties.count {
                    values[entity.properties[index].name] = ValueJSON.json(value, of: entity.properties[index])
                }
            }
            Output.line("  ~ \(update.id) \(JSONValue.object(values).text)")
        }
        for id in event.deleted.prefix(20) { Output.line("  - \(id)") }
        let listed = min(20, event.inserted.count) + min(20, event.updated.count) + min(20, event.deleted.count)
        let total = event.inserted.count + event.updated.count + event.deleted.count
        if total > listed { Output.line("  … and \(total - listed) more") }
    }
}

struct Metrics: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print the daemon's metrics in Prometheus' text format.",
        discussion: """
            Counters and histograms recorded since the daemon started: saves, save latency, clients, events \
            published, catch-ups, errors by code, store size. Needs --group (a running daemon). \(exitCodesHelp)
            """)

    @OptionGroup var target: Target

    func run() throws {
        try reportingFailures {
            guard target.store == nil else {
                throw ToolFailure(ToolExit.usage, "metrics come from a running daemon: use --group ID")
            }
            let client = try AdminClient(container: try target.container())
            let reply = try client.admin(.metrics)
            guard case .admin(.metricsReply(let text)) = reply else { throw AdminClient.unexpected(reply) }
            FileHandle.standardOutput.write(Data(text.utf8))
        }
    }
}
