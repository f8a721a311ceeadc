// What every operating command of `skyros` shares: where it works (a daemon's group, or a
// store file), how it prints (text or JSON) and how it exits (docs/OPERATING.md's exit codes).
import ArgumentParser
import Foundation
import Skyros
import SkyrosWire

/// The exit codes docs/OPERATING.md lists (sysexits.h): the contract for scripts.
enum ToolExit {
    /// The operation failed.
    static let failure: Int32 = 1
    /// A usage error (ArgumentParser exits with it too for bad arguments).
    static let usage: Int32 = 64
    /// The store is damaged (`check` found damage, or a store that cannot be read as one).
    static let damaged: Int32 = 65
    /// The group's daemon is not running or not reachable.
    static let unavailable: Int32 = 69
    /// Not allowed: not an admin of the group.
    static let notAllowed: Int32 = 77
}

/// A failure the tool reports on stderr (`skyros: …`) before exiting with its code.
struct ToolFailure: Error, CustomStringConvertible {
    var exitCode: Int32
    var message: String

    init(_ exitCode: Int32, _ message: String) {
        self.exitCode = exitCode
        self.message = message
    }

    var description: String { message }

    /// The failure of a `SkyrosError`, with the exit code its code calls for.
    init(_ error: SkyrosError) {
        let code: Int32 =
            switch error.code {
            case .permissionDenied: ToolExit.notAllowed
            case .stackUnavailable: ToolExit.unavailable
            default: ToolExit.failure
            }
        self.init(code, error.message)
    }
}

/// Runs a command's body: a ``ToolFailure`` (or a `SkyrosError`) is printed on stderr and
/// becomes the process's exit code.
func reportingFailures(_ body: () throws -> Void) throws {
    do {
        try body()
    } catch let failure as ToolFailure {
        printError("skyros: \(failure.message)")
        throw ExitCode(failure.exitCode)
    } catch let error as SkyrosError {
        let failure = ToolFailure(error)
        printError("skyros: \(failure.message)")
        throw ExitCode(failure.exitCode)
    }
}

/// Writes a line on stderr at once.
func printError(_ line: String) {
    FileHandle.standardError.write(Data((line + "\n").utf8))
}

/// Where an operating command works: through a group's daemon, or on a store file.
struct Target: ParsableArguments {
    @Option(
        help: ArgumentHelp(
            "The application group to work on, through its running daemon (an admin session).",
            valueName: "id"))
    var group: String?

    @Option(
        help: ArgumentHelp(
            "The directory holding group containers (default: $SKYROS_GROUPS_DIR, /var/lib/skyros, $XDG_DATA_HOME/skyros, as skyrosd resolves it).",
            valueName: "dir"))
    var groupsDir: String?

    @Option(
        help: ArgumentHelp(
            "A store file to work on directly: an embedded store, or a group's store.sqlite (writing commands refuse a store a daemon serves).",
            valueName: "file"))
    var store: String?

    @Flag(help: "Print JSON for scripts (one document, or one JSON line per item for lists and streams).")
    var json = false

    func validate() throws {
        switch (group, store) {
        case (nil, nil): throw ValidationError("say where to work: --group ID (through its daemon) or --store FILE")
        case (.some, .some): throw ValidationError("--group and --store cannot be used together")
        default: break
        }
        if groupsDir != nil && group == nil { throw ValidationError("--groups-dir goes with --group") }
    }

    /// The group's container.
    func container() throws -> GroupContainer {
        guard let group else { throw ToolFailure(ToolExit.usage, "no --group given") }
        do {
            try Skyros.validateApplicationGroup(group)
            if let groupsDir {
                return GroupContainer(url: URL(fileURLWithPath: groupsDir).appendingPathComponent(group))
            }
            return GroupContainer(url: try Skyros.containerURL(forApplicationGroup: group))
        } catch let error as SkyrosError {
            throw ToolFailure(ToolExit.usage, error.message)
        }
    }
}

/// Output: human text, or JSON with sorted keys and ISO 8601 dates.
enum Output {
    /// Prints a line on stdout (a closed stdout, as under `head`, ends the output quietly).
    static func line(_ text: String) {
        say(text)
    }

    /// ISO 8601 with fractional seconds, UTC.
    static func date(_ date: Date) -> String {
        Date.ISO8601FormatStyle(includingFractionalSeconds: true).format(date)
    }

    /// ISO 8601 of seconds since 1970.
    static func date(seconds: Double) -> String { date(Date(timeIntervalSince1970: seconds)) }

    /// A byte count for people: 1.2 MiB.
    static func bytes(_ count: Int64) -> String {
        let units = ["B", "KiB", "MiB", "GiB", "TiB"]
        var value = Double(count)
        var unit = 0
        while value >= 1024 && unit < units.count - 1 {
            value /= 1024
            unit += 1
        }
        return unit == 0 ? "\(count) B" : String(format: "%.1f %@", value, units[unit])
    }
}

/// A progress bar on stderr, drawn only when stderr is a terminal.
struct ProgressBar {
    let label: String
    private let visible = isatty(STDERR_FILENO) == 1
    private var lastDrawn = -1

    init(_ label: String) { self.label = label }

    mutating func update(done: Int64, total: Int64) {
        guard visible, total > 0 else { return }
        let percent = Int(min(100, done * 100 / total))
        guard percent != lastDrawn else { return }
        lastDrawn = percent
        let width = 30
        let filled = width * percent / 100
        let bar = String(repeating: "#", count: filled) + String(repeating: "-", count: width - filled)
        FileHandle.standardError.write(Data("\r\(label) [\(bar)] \(percent)%".utf8))
    }

    func finish() {
        guard visible, lastDrawn >= 0 else { return }
        FileHandle.standardError.write(Data("\n".utf8))
    }
}

/// The size of a file, 0 when it does not exist.
func fileSize(_ path: String) -> Int64 {
    var info = stat()
    return stat(path, &info) == 0 ? Int64(info.st_size) : 0
}

/// `count` and `noun`, in the plural unless `count` is 1: "1 object", "3 change sets".
func counted(_ count: Int, _ noun: String) -> String {
    "\(count) \(noun)\(count == 1 ? "" : "s")"
}
