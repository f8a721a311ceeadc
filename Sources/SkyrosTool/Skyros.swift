// skyros: the command-line tool of Skyros.
//
//     swift run skyros demo      # a daemon and three processes sharing a todo list
//     skyros status --group com.example.todo [--json]
//     skyros dump User --store store.sqlite --filter 'age > 30'
//     (status, inspect, dump, watch, history, backup, import, check, metrics: docs/OPERATING.md)
import ArgumentParser
import Foundation
import Skyros
import SkyrosShared
import Synchronization
import TodoModel

@main
struct SkyrosTool: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "skyros",
        abstract: "Skyros' command-line tool: operate a group's daemon or a store file.",
        discussion: """
            Every operating command works through a group's running daemon (--group ID: an admin session, \
            for root, the daemon's user and its admin groups) or on a store file (--store FILE). Human output \
            by default, --json for scripts. Exit status: 0 ok; 1 the operation failed; 64 usage error; \
            65 the store is damaged; 69 the group's daemon is not running or not reachable; 77 not allowed.
            """,
        subcommands: [
            Status.self, Inspect.self, Dump.self, Watch.self, History.self, Backup.self, Import.self, Check.self,
            Metrics.self, Token.self, Demo.self, DemoClient.self,
        ])
}

/// Starts a daemon for a temporary group and three client processes that share a todo
/// list: two write, one watches; prints what each sees, shuts everything down, exits 0.
struct Demo: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run a daemon and three client processes sharing a todo list, then stop them.")

    func run() throws {
        try reportingFailures { try demo() }
    }

    private func demo() throws {
        // Output piped into `head` must not kill the demo before it stops its daemon.
        signal(SIGPIPE, SIG_IGN)
        let tool = Self.thisExecutable()
        let daemonExecutable = try Self.skyrosd(beside: tool)
        let groups = URL(fileURLWithPath: "/tmp/skyros-demo-\(getpid())")
        try FileManager.default.createDirectory(at: groups, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(at: groups) }
        let container = groups.appendingPathComponent("demo.todo")

        say("starting skyrosd for group demo.todo in \(groups.path)")
        let daemon = try launch(
            daemonExecutable, ["--group", "demo.todo", "--groups-dir", groups.path, "--log-level", "warning"])
        defer {
            if daemon.isRunning {
                kill(daemon.processIdentifier, SIGTERM)
                daemon.waitUntilExit()
            }
        }
        let watcher = try launch(tool, ["demo-client", "--container", container.path, "--role", "watcher"])
        let alice = try launch(
            tool,
            [
                "demo-client", "--container", container.path, "--role", "alice", "--items",
                "buy milk,call bob,write report",
            ])
        let bob = try launch(
            tool,
            [
                "demo-client", "--container", container.path, "--role", "bob", "--items",
                "fix bike,book flights,water plants",
            ])
        var failed = false
        for (name, process) in [("alice", alice), ("bob", bob), ("watcher", watcher)] {
            guard wait(process, seconds: 60) else {
                say("\(name) did not finish in time")
                process.terminate()
                failed = true
                continue
            }
            if process.terminationStatus != 0 {
                say("\(name) failed with status \(process.terminationStatus)")
                failed = true
            }
        }
        kill(daemon.processIdentifier, SIGTERM)
        daemon.waitUntilExit()
        say("skyrosd stopped with status \(daemon.terminationStatus)")
        if failed || daemon.terminationStatus != 0 { throw ExitCode.failure }
        say("demo finished: 3 processes shared 6 todos through one daemon")
    }

    /// This executable, wherever it was started from (a shell finds it on PATH, and
    /// `argv[0]` is then its bare name): the kernel's link to it.
    static func thisExecutable() -> URL {
        if let path = try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/exe") {
            return URL(fileURLWithPath: path)
        }
        return URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
    }

    /// `skyrosd` beside this executable (a build's products, an install's `bin`), else the
    /// first on PATH; a failure that says where it looked when there is none.
    static func skyrosd(beside tool: URL) throws -> URL {
        let beside = tool.deletingLastPathComponent().appendingPathComponent("skyrosd")
        var looked = [beside.path]
        if FileManager.default.isExecutableFile(atPath: beside.path) { return beside }
        for directory in (ProcessInfo.processInfo.environment["PATH"] ?? "").split(separator: ":") {
            let candidate = URL(fileURLWithPath: String(directory)).appendingPathComponent("skyrosd")
            if FileManager.default.isExecutableFile(atPath: candidate.path) { return candidate }
            looked.append(candidate.path)
        }
        throw ToolFailure(
            ToolExit.unavailable,
            "the demo needs skyrosd, which is neither beside skyros nor on PATH (looked at \(looked.joined(separator: ", "))): build it with `swift build --product skyrosd`, or put the directory that holds it on PATH"
        )
    }

    private func launch(_ executable: URL, _ arguments: [String]) throws -> Process {
        let process = Process()
        process.executableURL = executable
        process.arguments = arguments
        try process.run()
        return process
    }

    private func wait(_ process: Process, seconds: Double) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while process.isRunning && Date() < deadline { usleep(20_000) }
        return !process.isRunning
    }
}

/// Prints a line at once (the children print to the same terminal).
/// A closed stdout (output piped into `head`) is not an error worth dying for.
func say(_ line: String) {
    try? FileHandle.standardOutput.write(contentsOf: Data((line + "\n").utf8))
}

/// One process of the demo (started by `skyros demo`).
struct DemoClient: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "demo-client", abstract: "A process of the demo (started by `skyros demo`).", shouldDisplay: false)

    @Option var container: String
    @Option var role: String
    @Option var items: String = ""

    func run() throws {
        let store = try Skyros(sharedStack: todoSchema, container: URL(fileURLWithPath: container), timeout: 10)
        if role == "watcher" {
            try watch(store)
        } else {
            try write(store)
        }
    }

    private func write(_ store: Skyros) throws {
        let titles = items.split(separator: ",").map(String.init)
        for title in titles {
            store.writeSync { context in
                let item = TodoItem.create(in: context)
                item.title = title
                item.author = role
            }
            say("[\(role)] added '\(title)'")
        }
        if let first = titles.first {
            store.writeSync { context in
                for item in try TodoItem.all(where: #Predicate { $0.title == first }, in: context) {
                    item.isDone = true
                }
            }
            say("[\(role)] marked '\(first)' done")
        }
        guard store.flush(timeout: 10) else { throw ExitCode.failure }
    }

    /// Prints the list at each change of the others, until it holds 6 items, 2 of them done.
    private func watch(_ store: Skyros) throws {
        let changes = store.changes
        let finished = DispatchSemaphore(value: 0)
        let task = Task { () async throws -> Bool in
            var last: [String] = []
            func check() async throws -> Bool {
                let lines: [String] = try await store.read { try describeTodos(in: $0) }
                if lines != last {
                    say("[watcher] sees \(lines.count) todos: " + lines.joined(separator: ", "))
                    last = lines
                }
                return lines.count == 6 && lines.filter { $0.hasPrefix("[x]") }.count == 2
            }
            if try await check() { return true }
            for await _ in changes where try await check() { return true }
            return false  // the changes ended first
        }
        let outcome = DemoOutcome()
        Task {
            outcome.result = await task.result
            finished.signal()
        }
        guard finished.wait(timeout: .now() + 45) == .success else {
            say("[watcher] did not see all the todos in time")
            throw ExitCode.failure
        }
        switch outcome.result {
        case .success(true):
            say("[watcher] saw everything")
        case .success(false), nil:
            say("[watcher] the changes ended before it saw all the todos")
            throw ExitCode.failure
        case .failure(let error):
            say("[watcher] could not read the todos: \(error)")
            throw ExitCode.failure
        }
    }
}

/// How the demo's watcher ended, handed from its task to the waiting thread.
private final class DemoOutcome: Sendable {
    private let stored = Mutex<Result<Bool, any Error>?>(nil)
    /// Set once by the task, read after it signalled.
    var result: Result<Bool, any Error>? {
        get { stored.withLock { $0 } }
        set { stored.withLock { $0 = newValue } }
    }
}
