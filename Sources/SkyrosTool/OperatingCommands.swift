// The operating commands (docs/OPERATING.md): status, inspect, dump, watch, history, backup,
// import, check, metrics. Each works through a group's daemon (--group ID, an admin
// session) or on a store file (--store FILE), prints text or --json, and exits with
// the codes docs/OPERATING.md lists.
import ArgumentParser
import Foundation
import Skyros
import SkyrosDaemon
import SkyrosWire

/// Opens what `target` names.
func operatedStore(_ target: Target, writing: Bool = false) throws -> any OperatedStore {
    if let store = target.store { return try StoreFile(store, writing: writing) }
    return try AdminClient(container: try target.container())
}

let exitCodesHelp = """
    Exit status: 0 ok; 1 the operation failed; 64 usage error; 65 the store is damaged; \
    69 the group's daemon is not running or not reachable; 77 not allowed (not an admin of the group).
    """

struct Status: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the daemon's pid, uptime, sequence, connected clients, save rate and latency, file sizes.",
        discussion: """
            With --group: what the running daemon reports (saves/s and p50/p99 save latency are over the last \
            minute). With --store: what the file says (the daemon's pid when one serves it, sequence, sizes, \
            objects per entity). \(exitCodesHelp)
            """)

    @OptionGroup var target: Target

    func run() throws {
        try reportingFailures {
            let status = try operatedStore(target).status()
            if target.json {
                Output.line(status.text)
                return
            }
            Output.line(Self.human(status))
        }
    }

    static func human(_ status: JSONValue) -> String {
        func number(_ key: String) -> Double? { status[key]?.doubleValue }
        var lines: [String] = []
        if let path = status["path"]?.stringValue { lines.append("store      \(path)") }
        if let container = status["container"]?.stringValue { lines.append("group      \(container)") }
        let store = Int64(number("storeBytes") ?? 0)
        let wal = Int64(number("walBytes") ?? 0)
        var sizes = "files      store \(Output.bytes(store)), WAL \(Output.bytes(wal))"
        if let history = number("historyBytes") { sizes += ", history \(Output.bytes(Int64(history)))" }
        lines.append(sizes)
        if let pid = number("pid") {
            var daemon = "daemon     pid \(Int(pid))"
            if let uptime = number("uptimeSeconds") { daemon += ", up \(duration(uptime))" }
            lines.append(daemon)
        } else {
            lines.append("daemon     none serves this store")
        }
        lines.append(
            "protocol   \(Int(number("protocolVersion") ?? 0)), schema version \(Int(number("schemaVersion") ?? 0))"
                + (status["fingerprint"]?.stringValue.map { " (\($0))" } ?? ""))
        lines.append("sequence   \(Int64(number("sequence") ?? 0))")
        if let rate = number("savesPerSecond") {
            let p50 = number("saveLatencyP50Micros").map { String(format: "%.2f ms", $0 / 1000) } ?? "-"
            let p99 = number("saveLatencyP99Micros").map { String(format: "%.2f ms", $0 / 1000) } ?? "-"
            lines.append(
                String(format: "saves      %.1f/s over the last minute, latency p50 %@, p99 %@", rate, p50, p99))
        }
        if case .object(let objects)? = status["objects"] {
            lines.append(
                "objects    "
                    + objects.keys.sorted().map { "\($0) \(Int64(objects[$0]?.doubleValue ?? 0))" }.joined(
                        separator: ", "))
        }
        if case .object(let sync)? = status["sync"] {
            // A daemon that syncs with PostgreSQL (docs/SYNC.md).
            var line = "sync       \(sync["state"]?.stringValue ?? "?")"
            if let server = sync["server"]?.stringValue { line += " with \(server)" }
            if let message = sync["message"]?.stringValue { line += ": \(message)" }
            lines.append(line)
            let queued = Int64(sync["uploadQueue"]?.doubleValue ?? 0)
            var detail = "           \(queued) change set\(queued == 1 ? "" : "s") queued"
            if queued > 0, let oldest = sync["oldestQueuedSeconds"]?.doubleValue {
                detail += " (oldest \(duration(oldest)))"
            }
            detail += ", checkpoint \(Int64(sync["checkpoint"]?.doubleValue ?? 0))"
            detail += ", lag \(Int64(sync["lagMilliseconds"]?.doubleValue ?? 0)) ms"
            detail += ", \(Int64(sync["rejected"]?.doubleValue ?? 0)) rejected (each one named in the daemon's log)"
            lines.append(detail)
        }
        if status["path"] != nil, status["pid"] != .null {
            lines.append("clients    ask the daemon: skyros status --group ID")
        }
        if case .array(let clients)? = status["clients"], status["path"] == nil {
            lines.append("clients    \(clients.count)")
            if !clients.isEmpty {
                let rows = clients.map { client -> [String] in
                    [
                        client["name"]?.stringValue ?? "", client["pid"]?.doubleValue.map { String(Int($0)) } ?? "",
                        client["uid"]?.doubleValue.map { String(Int($0)) } ?? "",
                        client["connectedAt"]?.stringValue ?? "", client["lastSeenAt"]?.stringValue ?? "",
                        client["saves"]?.doubleValue.map { String(Int($0)) } ?? "0",
                    ]
                }
                lines.append(
                    contentsOf: table(["NAME", "PID", "UID", "CONNECTED", "LAST SEEN", "SAVES"], rows).map { "  " + $0 }
                )
            }
        }
        return lines.joined(separator: "\n")
    }

    static func duration(_ seconds: Double) -> String {
        let total = Int(seconds)
        if total < 60 { return "\(total)s" }
        if total < 3600 { return "\(total / 60)m \(total % 60)s" }
        return "\(total / 3600)h \(total % 3600 / 60)m"
    }
}

/// Columns padded to their widest cell.
func table(_ header: [String], _ rows: [[String]]) -> [String] {
    let all = [header] + rows
    let widths = header.indices.map { column in all.map { $0[column].count }.max() ?? 0 }
    return all.map { row in
        row.enumerated().map { $1.padding(toLength: widths[$0], withPad: " ", startingAt: 0) }.joined(separator: "  ")
            .trimmingCharacters(in: .whitespaces)
    }
}

struct Inspect: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Show the store's schema: entities, attributes and their types, relationships, indexes, version.",
        discussion: exitCodesHelp)

    @OptionGroup var target: Target

    func run() throws {
        try reportingFailures {
            let info = try operatedStore(target).schema()
            if target.json {
                let json = (try? JSONValue.parse(try info.description.canonicalJSON())) ?? .null
                Output.line(
                    JSONValue.object([
                        "fingerprint": .string(info.fingerprint), "schemaVersion": .integer(Int64(info.version)),
                        "entities": json["entities"] ?? [],
                        "versions": .array(
                            info.versions.map { recorded in
                                JSONValue.object([
                                    "version": .integer(recorded.version), "fingerprint": .string(recorded.fingerprint),
                                    "date": .string(recorded.date),
                                ])
                            }),
                    ]).text)
                return
            }
            Output.line("schema version \(info.version), fingerprint \(info.fingerprint)")
            for recorded in info.versions {
                Output.line("  recorded version \(recorded.version): \(recorded.fingerprint) since \(recorded.date)")
            }
            for entity in info.description.entities {
                Output.line("")
                Output.line("entity \(entity.name)")
                let rows = entity.properties.map { property -> [String] in
                    var traits: [String] = []
                    if property.isOptional && property.kind == "attribute" { traits.append("optional") }
                    if property.isUnique { traits.append("unique") }
                    if property.isIndexed { traits.append("indexed") }
                    if property.isRequired { traits.append("required") }
                    if property.kind != "attribute" {
                        traits.append("delete rule \(property.deleteRule.rawValue)")
                        if let inverse = property.inverse { traits.append("inverse \(inverse)") }
                    }
                    let type =
                        switch property.kind {
                        case "toOne": "-> \(property.destination ?? "?")"
                        case "toMany": "->> [\(property.destination ?? "?")]"
                        default: "\(property.typeName) (\(property.storageType.rawValue))"
                        }
                    return [property.name, type, traits.joined(separator: ", ")]
                }
                for line in table(["PROPERTY", "TYPE", ""], rows) { Output.line("  " + line) }
                for index in entity.indexes { Output.line("  index (\(index.joined(separator: ", ")))") }
            }
        }
    }
}

struct Dump: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print objects as JSON lines: {\"entity\", \"id\", \"values\"}.",
        discussion: """
            Every object of ENTITY (or of every entity), in identifier order, one JSON line each (the format \
            `skyros import` reads). Values by type: strings, numbers, true/false, dates in ISO 8601, data in \
            base64, UUIDs and decimals as strings, to-one relationships as object-ID strings (Entity/UUID); \
            to-many relationships are the inverse of to-ones and are not repeated.

            --filter selects objects with an expression on ENTITY's properties:
              comparisons  == != < <= > >=   (null-safe: email == null)
              text         name contains "an", name startsWith "A"
              lists        status in ["todo", "done"]
              logic        && || ! and parentheses
              values       "text" (\\" \\\\ \\n \\t), -1.5, 42, true, false, null
              paths        author.name follows to-ones; _id is the UUID
            A value compared with a property takes its type:
              due < "2026-01-01T00:00:00Z" compares dates.
            Example: --filter 'age > 30 && (name == "x" || !isAdmin)'

            The same output with or without --json (JSON lines are the format). \(exitCodesHelp)
            """)

    @Argument(help: "The entity to dump (default: every entity).")
    var entity: String?

    @Option(help: "Only the objects this expression selects (see above); needs ENTITY.")
    var filter: String?

    @OptionGroup var target: Target

    func validate() throws {
        if filter != nil && entity == nil {
            throw ValidationError("--filter needs an ENTITY: the expression names its properties")
        }
    }

    func run() throws {
        try reportingFailures {
            let store = try operatedStore(target)
            let description = try store.schema().description
            let entities = try entity.map { [try StoreFile.entity($0, in: description)] } ?? description.entities
            var predicate: PredicateNode?
            if let filter, let first = entities.first {
                do {
                    predicate = try FilterLanguage.predicate(filter, entity: first, schema: description)
                } catch let failure as FilterLanguage.Failure {
                    throw ToolFailure(ToolExit.usage, failure.report(filter))
                }
            }
            for entity in entities {
                try store.forEachObject(entity.name, predicate: predicate) { snapshot in
                    Output.line(Self.line(snapshot, entity: entity).text)
                }
            }
        }
    }

    static func line(_ snapshot: Snapshot, entity: SchemaDescription.Entity) -> JSONValue {
        var values: [String: JSONValue] = [:]
        for (index, property) in entity.properties.enumerated()
        where property.kind != "toMany" && index < snapshot.values.count {
            values[property.name] = ValueJSON.json(snapshot.values[index], of: property)
        }
        return ["entity": .string(entity.name), "id": .string(snapshot.id.uuid.uuidString), "values": .object(values)]
    }
}

struct History: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "List the change log: one line per committed change set, oldest first.",
        discussion: """
            Each change set: its sequence, author (process name), date, and how many objects it inserted, \
            updated and deleted. The history keeps what skyrosd's --history-count and --history-age allow. \
            --json prints JSON lines {"sequence", "author", "date", "inserted", "updated", "deleted"}. \(exitCodesHelp)
            """)

    @Option(help: "Only the change sets after this sequence.")
    var since: UInt64 = 0

    @Option(help: "At most this many change sets (0: all).")
    var limit: UInt64 = 100

    @OptionGroup var target: Target

    func run() throws {
        try reportingFailures {
            let store = try operatedStore(target)
            var after = since
            var left = limit == 0 ? UInt64.max : limit
            var rows: [[String]] = []
            while left > 0 {
                let page = try store.history(since: after, limit: min(left, 1_000))
                for entry in page.entries {
                    if target.json {
                        Output.line(Self.json(entry).text)
                    } else {
                        rows.append([
                            String(entry.sequence), entry.author.isEmpty ? "-" : entry.author,
                            Output.date(seconds: entry.timestamp),
                            entry.kind == .reset ? "reset" : "+\(entry.inserted) ~\(entry.updated) -\(entry.deleted)",
                        ])
                    }
                }
                left -= min(left, UInt64(page.entries.count))
                guard page.more, let last = page.entries.last else { break }
                after = last.sequence
            }
            if !target.json {
                if rows.isEmpty {
                    Output.line("no change sets after \(since)")
                } else {
                    for line in table(["SEQUENCE", "AUTHOR", "DATE", "CHANGES"], rows) { Output.line(line) }
                }
            }
        }
    }

    static func json(_ entry: AdminMessage.HistoryEntry) -> JSONValue {
        [
            "sequence": .integer(Int64(clamping: entry.sequence)), "author": .string(entry.author),
            "authorID": .string(entry.authorID.uuidString), "kind": .string(Self.kind(entry.kind)),
            "date": .string(Output.date(seconds: entry.timestamp)), "inserted": .integer(Int64(entry.inserted)),
            "updated": .integer(Int64(entry.updated)), "deleted": .integer(Int64(entry.deleted)),
        ]
    }

    static func kind(_ kind: ChangeEvent.Kind) -> String {
        switch kind {
        case .changes: "changes"
        case .reset: "reset"
        case .heartbeat: "heartbeat"
        case .schemaChanged: "schemaChanged"
        case .batch: "batch"
        }
    }
}

struct Backup: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Copy the store to a new file while clients keep writing (SQLite's online backup).",
        discussion: """
            The copy is a consistent snapshot: it holds every change set up to the sequence printed, and \
            nothing after. Pages are copied a few at a time beside the writers (in WAL mode a reader never \
            blocks them); the copy is checked with PRAGMA integrity_check before it is moved to TO. With \
            --group the daemon writes the file (TO is resolved here, written as the daemon's user). \
            A progress bar is drawn on stderr when it is a terminal. To restore: stop the daemon, replace \
            store.sqlite with the copy (and remove store.sqlite-wal and -shm), start the daemon. \
            --json prints {"path", "bytes", "sequence"}. \(exitCodesHelp)
            """)

    @Argument(help: "The copy's path (must not exist).")
    var destination: String

    @OptionGroup var target: Target

    func run() throws {
        try reportingFailures {
            let store = try operatedStore(target)
            let url = URL(fileURLWithPath: destination).standardizedFileURL
            var bar = ProgressBar("backup")
            let result = try store.backup(to: url) { copied, total in
                bar.update(done: Int64(copied), total: Int64(total))
            }
            bar.finish()
            if target.json {
                Output.line(
                    JSONValue.object([
                        "path": .string(url.path), "bytes": .integer(Int64(result.bytes)),
                        "sequence": .integer(Int64(clamping: result.sequence)),
                    ]).text)
            } else {
                Output.line(
                    "backed up to \(url.path): \(Output.bytes(Int64(result.bytes))), sequence \(result.sequence), integrity check ok"
                )
            }
        }
    }
}

struct Check: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check the store: SQLite's integrity check and Skyros' own invariants.",
        discussion: """
            PRAGMA integrity_check, then: the history is gap-free, every object's row is well-formed \
            (identifier, version, each value of its property's type, required relationships set), and no \
            relationship points to an object that does not exist. Works on the file (--store, or the group's \
            store.sqlite with --group; the check only reads). Exits 65 with the findings when it finds damage. \
            --json prints {"ok", "findings"}. \(exitCodesHelp)
            """)

    @OptionGroup var target: Target

    func run() throws {
        try reportingFailures {
            let url = try target.store.map { URL(fileURLWithPath: $0) } ?? target.container().store
            guard FileManager.default.fileExists(atPath: url.path) else {
                throw ToolFailure(ToolExit.failure, "there is no store at \(url.path)")
            }
            var findings: [String] = []
            do {
                try StoreCheck.verify(url, depth: .full)
                let file = try StoreFile(url.path)
                findings = try StoreInvariants.findings(in: file.store, description: file.description)
                file.close()
            } catch let error as SkyrosError {
                findings.append(error.message)
            } catch let failure as ToolFailure {
                findings.append(failure.message)
            }
            if target.json {
                Output.line(
                    JSONValue.object(["ok": .bool(findings.isEmpty), "findings": .array(findings.map { .string($0) })])
                        .text)
            } else if findings.isEmpty {
                Output.line("ok: \(url.path) passes PRAGMA integrity_check and Skyros' invariants")
            } else {
                Output.line("damaged: \(url.path)")
                for finding in findings { Output.line("  - \(finding)") }
            }
            if !findings.isEmpty { throw ExitCode(ToolExit.damaged) }
        }
    }
}
