import Foundation
import SkyrosTestSupport
import Testing

/// The documented output is the real output (issue 59, item 5): the `console` samples of
/// `skyros` in docs/OPERATING.md, and the sync status lines of the README's walk-through, are
/// compared with what the same commands print against a group set up as the documents set
/// theirs up (a real `skyrosd`, two `todo watch` clients, the `todo` commands the document
/// lists; for the README, a private PostgreSQL the daemon syncs with).
///
/// What varies from run to run (times, identifiers, sizes, durations, counts, paths) is
/// compared as its kind: a line's *template* keeps every word, label and punctuation mark, so a
/// label renamed, a phrase reworded or a key added without its sample fails here. A JSON
/// line is compared by its keys. Samples that need what a test cannot make (another user, a
/// systemd unit, a file written beforehand, a pipe to another program) are left out, and named in
/// ``skipped(_:)``.
@Suite("Documented samples", .serialized, .timeLimit(.minutes(3)))
struct DocumentedSamplesTests {
    /// The repository (this file is Tests/SkyrosTests/Tool/DocumentedSamplesTests.swift).
    static let repository = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
        .deletingLastPathComponent().deletingLastPathComponent()

    /// The group of the documents' samples, and the directory they run it in.
    static let group = "com.example.todo"
    static let documentedDirectory = "/tmp/ops"

    /// A command of a `console` block and the lines printed after it.
    struct Sample: CustomStringConvertible {
        var command: String
        var output: [String]
        var line: Int  // in the document
        var description: String { "line \(line): $ \(command)" }
    }

    /// The `$ ` commands of the `console` blocks of `document`, each with the lines after it.
    static func samples(in document: String) throws -> [Sample] {
        let text = try String(contentsOf: repository.appendingPathComponent(document), encoding: .utf8)
        var samples: [Sample] = []
        var inBlock = false
        for (index, line) in text.split(separator: "\n", omittingEmptySubsequences: false).enumerated() {
            if line.hasPrefix("```") {
                inBlock = line == "```console"
                continue
            }
            guard inBlock else { continue }
            if line.hasPrefix("$ ") {
                samples.append(Sample(command: String(line.dropFirst(2)), output: [], line: index + 1))
            } else if !samples.isEmpty {
                samples[samples.count - 1].output.append(String(line))
            }
        }
        return samples
    }

    /// Why a sample is not run here (nil: it is).
    static func skipped(_ sample: Sample) -> String? {
        let command = sample.command
        if !command.hasPrefix("skyros ") { return "not a skyros command" }
        if command.contains("|") || command.contains(">") { return "a pipe or a redirection" }
        if command.hasPrefix("skyros watch") { return "waits for another process's change" }
        if command.hasPrefix("skyros import") { return "reads a file written beforehand" }
        if sample.output.contains(where: { $0.contains("not an admin") || $0.contains("may not use") }) {
            return "another user's refusal"
        }
        return nil
    }

    /// `line` with what varies from run to run replaced by its kind.
    static func template(_ line: String) -> String {
        var text = line
        let kinds: [(String, String)] = [
            (#"[0-9A-Fa-f]{8}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{4}-[0-9A-Fa-f]{12}"#, "<id>"),
            (#"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z"#, "<time>"),
            (#"\b[0-9a-f]{32}\b"#, "<hex>"),
            (#"/[^\s,():]+"#, "<path>"),
            (#"\d+(\.\d+)? (B|KiB|MiB|GiB)\b"#, "<size>"),
            (#"\b(\d+[dhms] ?)+\b"#, "<duration>"),
            (#"\d+(\.\d+)?"#, "<n>"),
            (#"\s+"#, " "),
        ]
        for (pattern, kind) in kinds {
            text = text.replacing(try! Regex(pattern), with: kind)
        }
        return text.trimmingCharacters(in: .whitespaces)
    }

    /// The keys of a JSON object line, nested objects' and the first array element's as
    /// `parent.key` (nil: not a JSON object).
    static func keys(_ line: String) -> Set<String>? {
        guard let object = (try? JSONSerialization.jsonObject(with: Data(line.utf8))) as? [String: Any] else {
            return nil
        }
        func collect(_ value: Any, _ prefix: String, into keys: inout Set<String>) {
            if let object = value as? [String: Any] {
                for (key, inner) in object {
                    keys.insert(prefix + key)
                    collect(inner, prefix + key + ".", into: &keys)
                }
            } else if let array = value as? [Any], let first = array.first {
                collect(first, prefix, into: &keys)
            }
        }
        var keys: Set<String> = []
        collect(object, "", into: &keys)
        return keys
    }

    /// The words of a command, as a shell splits them ('…' and "…" quote).
    static func words(_ command: String) -> [String] {
        var words: [String] = []
        var current = ""
        var quote: Character?
        var inWord = false
        for character in command {
            if let open = quote {
                if character == open { quote = nil } else { current.append(character) }
            } else if character == "'" || character == "\"" {
                quote = character
                inWord = true
            } else if character == " " {
                if inWord { words.append(current) }
                current = ""
                inWord = false
            } else {
                current.append(character)
                inWord = true
            }
        }
        if inWord { words.append(current) }
        return words
    }

    /// Compares what a sample documents with what its command printed; the issues name the
    /// sample.
    static func compare(_ sample: Sample, _ printed: String) {
        let documented = sample.output.filter { !$0.isEmpty }
        let real = printed.split(separator: "\n").map(String.init).filter { !$0.isEmpty }
        let documentedKeys = documented.compactMap(keys)
        if !documentedKeys.isEmpty {
            #expect(
                Set(documentedKeys) == Set(real.compactMap(keys)),
                "\(sample): the documented keys are not the printed ones:\n\(printed)")
            return
        }
        // "…" in a sample stands for lines left out: the rest must be printed.
        let elided = documented.contains("…")
        let expected = Set(documented.filter { $0 != "…" }.map(template))
        let got = Set(real.map(template))
        let missing = expected.subtracting(got)
        let undocumented = got.subtracting(expected)
        #expect(missing.isEmpty, "\(sample): documented but not printed: \(missing.sorted())\nprinted:\n\(printed)")
        if !elided {
            #expect(
                undocumented.isEmpty,
                "\(sample): printed but not documented: \(undocumented.sorted())\nprinted:\n\(printed)")
        }
    }

    /// The fixture's processes, held until the test ends: each ``ChildProcess`` a test lets
    /// go of is killed by pid and reaped (its deinit), on every path.
    final class Processes {
        var all: [ChildProcess] = []
        let environment: [String: String]

        init(environment: [String: String]) { self.environment = environment }

        func start(_ arguments: [String], _ executable: String, environment extra: [String: String] = [:]) throws
            -> ChildProcess
        {
            let process = try ChildProcess(
                arguments, executable: ChildProcess.builtExecutable(executable),
                environment: environment.merging(extra) { $1 })
            all.append(process)
            return process
        }

        /// Starts `skyrosd` with `arguments` and waits for its READY=1 (bounded).
        func startDaemon(_ arguments: [String]) throws {
            let notify = try NotifySocket()
            _ = try start(arguments, "skyrosd", environment: ["NOTIFY_SOCKET": notify.path])
            try #require(notify.waitFor("READY=1"), "skyrosd did not get ready")
        }

        /// Runs `todo` with `arguments` to its end, expecting it to succeed.
        func todo(_ arguments: [String]) throws {
            let todo = try start(arguments, "todo")
            #expect(todo.wait() == .exited(0), "todo \(arguments.joined(separator: " ")): \(todo.readAll())")
        }
    }

    @Test("docs/OPERATING.md: every skyros sample a test can run prints what the document shows")
    func operating() throws {
        let samples = try Self.samples(in: "docs/OPERATING.md")
        let runnable = samples.filter { Self.skipped($0) == nil }
        #expect(runnable.count >= 10, "only \(runnable.count) runnable samples in docs/OPERATING.md")
        let directory = OperatingToolTests.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let empty = OperatingToolTests.directory()
        defer { try? FileManager.default.removeItem(atPath: empty) }
        let processes = Processes(environment: ["SKYROS_GROUPS_DIR": directory])
        let user = getpwuid(getuid()).map { String(cString: $0.pointee.pw_name) } ?? "root"

        // The samples of a group nobody serves come first, against a directory with no daemon.
        var started = false
        /// The document's setup: the daemon, two `todo watch` clients, then its todo commands.
        func setUp() throws {
            try processes.startDaemon(["--group", Self.group])
            for _ in 0..<2 {
                let watcher = try processes.start(["watch"], "todo")
                // Its first drawing: connected.
                #expect(watcher.waitForOutput(containing: "watching \(Self.group)"), "todo watch never drew its list")
            }
            for arguments in [
                ["add", "buy milk"], ["add", "call bob"], ["add", "book flights"], ["done", "1"],
                ["add", "write report"], ["done", "3"],
            ] {
                try processes.todo(arguments)
            }
            started = true
        }

        var ran = 0
        var lastStatus: Int32?
        for sample in samples {
            if sample.command == "echo $?", let documented = sample.output.first.flatMap({ Int32($0) }),
                let status = lastStatus
            {
                #expect(status == documented, "\(sample): the exit status")
                continue
            }
            lastStatus = nil
            guard Self.skipped(sample) == nil else { continue }
            let nobodyServes = sample.output.first?.contains("no daemon serves") == true
            if !nobodyServes && !started { try setUp() }
            var arguments = Array(Self.words(sample.command).dropFirst()).map { word in
                word.replacingOccurrences(of: Self.documentedDirectory, with: nobodyServes ? empty : directory)
                    .replacingOccurrences(of: "\"alice\"", with: "\"\(user)\"")
            }
            if arguments.contains("--group") { arguments += ["--groups-dir", nobodyServes ? empty : directory] }
            let run = try OperatingToolTests.run(arguments)
            lastStatus = run.status
            let printed = (run.stdout + run.stderr).replacingOccurrences(
                of: nobodyServes ? empty : directory, with: Self.documentedDirectory)
            Self.compare(sample, printed)
            ran += 1
        }
        #expect(ran == runnable.count && ran >= 10, "ran \(ran) of \(runnable.count) samples")
    }

    @Test("the README's walk-through: the sync lines of `skyros status`, online and offline, as documented")
    func readmeSyncStatus() async throws {
        let samples = try Self.samples(in: "README.md").filter { $0.command.hasPrefix("skyros status") }
        // The first sync sample online, the first offline.
        func syncLines(_ sample: Sample) -> [String]? {
            guard let index = sample.output.firstIndex(where: { $0.hasPrefix("sync ") }),
                index + 1 < sample.output.count
            else { return nil }
            return Array(sample.output[index...(index + 1)])
        }
        let online = try #require(samples.first { syncLines($0)?.first?.contains("sync       online") == true })
        let offline = try #require(samples.first { syncLines($0)?.first?.contains("sync       offline") == true })

        let postgres = try await PostgresServer.started()
        let directory = OperatingToolTests.directory()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        let processes = Processes(environment: ["SKYROS_GROUPS_DIR": directory])
        try processes.startDaemon(["--group", Self.group, "--sync", postgres.url()])
        /// The status's sync line and the one after it, once the first says `state` (and, when
        /// given, `reason`: offline, the engine first says the connection was closed, then, once
        /// it tried again, that it cannot reach the server, as the README's sample shows).
        func status(_ state: String, reason: String? = nil) -> [String] {
            let deadline = Date().addingTimeInterval(60)
            var lines: [String] = []
            repeat {
                let run = try? OperatingToolTests.run(["status", "--group", Self.group, "--groups-dir", directory])
                let printed = (run?.stdout ?? "").split(separator: "\n").map(String.init)
                if let index = printed.firstIndex(where: { $0.hasPrefix("sync ") }), index + 1 < printed.count {
                    lines = Array(printed[index...(index + 1)])
                    if lines[0].contains(" \(state) with ")
                        && (state != "online" || lines[1].contains(" 0 change sets"))
                        && reason.map({ lines[0].contains($0) }) != false
                    {
                        return lines
                    }
                }
                usleep(200_000)
            } while Date() < deadline
            Issue.record("the status never said \(state): \(lines)")
            return lines
        }

        try processes.todo(["add", "buy milk"])
        let onlineLines = status("online")
        let documentedOnline = try #require(syncLines(online))
        #expect(onlineLines.map(Self.template) == documentedOnline.map(Self.template), "\(online)")

        try postgres.stop(mode: .fast)
        try processes.todo(["add", "water plants"])
        let offlineLines = status("offline", reason: "cannot reach the server")
        let documentedOffline = try #require(syncLines(offline))
        // The first line ends with the network library's own words for the failure: its
        // beginning is ours, up to the reason's first words.
        func ours(_ line: String) -> String {
            let template = Self.template(line)
            return template.range(of: "cannot reach the server").map { String(template[..<$0.upperBound]) } ?? template
        }
        #expect(ours(offlineLines[0]) == ours(documentedOffline[0]), "\(offline): \(offlineLines[0])")
        #expect(Self.template(offlineLines[1]) == Self.template(documentedOffline[1]), "\(offline): \(offlineLines[1])")
    }
}
