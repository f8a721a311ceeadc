import Foundation
import Testing

/// A child process of the test helper, started like a shell would (default signal
/// dispositions, nothing blocked) and reaped by pid, even when the test fails.
///
/// Its stdout and stderr (one pipe) are read all the time by a thread of their own, whether
/// or not the test looks at them: a child that writes more than a pipe holds (64 KiB; a
/// skyrosd logging every reconnection of eight clients through eight restarts does) would
/// otherwise block in `write` and stop answering, even to SIGTERM.
final class ChildProcess: @unchecked Sendable {
    let pid: pid_t
    private let output: Output
    private var reaped = false

    /// What the child wrote so far, filled by the reading thread until end of file.
    private final class Output: @unchecked Sendable {
        let condition = NSCondition()
        var data = Data()  // guarded by condition
        var ended = false  // guarded by condition

        /// Reads `descriptor` until end of file on a thread of its own, then closes it.
        func drain(_ descriptor: Int32) {
            let thread = Thread { [self] in
                var bytes = [UInt8](repeating: 0, count: 65_536)
                while true {
                    let count = read(descriptor, &bytes, bytes.count)
                    if count < 0 && errno == EINTR { continue }
                    condition.lock()
                    if count > 0 { data.append(contentsOf: bytes[0..<count]) } else { ended = true }
                    condition.broadcast()
                    condition.unlock()
                    if count <= 0 { break }
                }
                close(descriptor)
            }
            thread.name = "ChildProcess output"
            thread.start()
        }

        /// Waits until `satisfied` holds of the text so far and whether the output ended, or
        /// `deadline` passes (none: no limit; Foundation's `wait(until: .distantFuture)` traps);
        /// whether it held.
        func wait(until deadline: Date?, for satisfied: (String, Bool) -> Bool) -> Bool {
            condition.lock()
            defer { condition.unlock() }
            while true {
                if satisfied(String(decoding: data, as: UTF8.self), ended) { return true }
                if ended { return false }
                if let deadline {
                    if !condition.wait(until: deadline) { return false }
                } else {
                    condition.wait()
                }
            }
        }
    }

    /// The helper executable, next to the test binary in the build folder.
    static var helperURL: URL {
        let testBinary = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        return testBinary.deletingLastPathComponent().appendingPathComponent("skyros-test-child")
    }

    /// An executable built with the tests (same folder as the test binary).
    static func builtExecutable(_ name: String) -> URL {
        helperURL.deletingLastPathComponent().appendingPathComponent(name)
    }

    init(_ arguments: [String], executable: URL = ChildProcess.helperURL, environment: [String: String] = [:]) throws {
        var pipeFDs: [Int32] = [0, 0]
        guard pipe(&pipeFDs) == 0 else { throw POSIXError(.EMFILE) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        posix_spawn_file_actions_adddup2(&actions, pipeFDs[1], 1)
        posix_spawn_file_actions_adddup2(&actions, pipeFDs[1], 2)
        posix_spawn_file_actions_addclose(&actions, pipeFDs[0])
        var attributes = posix_spawnattr_t()
        posix_spawnattr_init(&attributes)
        var empty = sigset_t()
        sigemptyset(&empty)
        var defaults = sigset_t()
        sigemptyset(&defaults)
        for signal in [SIGTERM, SIGINT, SIGPIPE] { sigaddset(&defaults, signal) }
        posix_spawnattr_setsigmask(&attributes, &empty)
        posix_spawnattr_setsigdefault(&attributes, &defaults)
        posix_spawnattr_setflags(&attributes, Int16(POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF))
        defer {
            posix_spawn_file_actions_destroy(&actions)
            posix_spawnattr_destroy(&attributes)
        }
        let path = executable.path
        let argv = ([path] + arguments).map { strdup($0) } + [nil]
        let env = ProcessInfo.processInfo.environment.merging(environment) { $1 }.map { strdup("\($0)=\($1)") } + [nil]
        defer {
            argv.forEach { free($0) }
            env.forEach { free($0) }
        }
        var child: pid_t = 0
        let status = posix_spawn(&child, path, &actions, &attributes, argv, env)
        close(pipeFDs[1])
        guard status == 0 else {
            close(pipeFDs[0])
            throw POSIXError(POSIXErrorCode(rawValue: status) ?? .ENOENT)
        }
        pid = child
        output = Output()
        output.drain(pipeFDs[0])
    }

    /// Waits until a line equal to `line` has been written (at any time since the start);
    /// false on timeout or end of file.
    func waitForLine(_ line: String, seconds: Double = 20) -> Bool { blockingWaitForLine(line, seconds: seconds) }

    private func blockingWaitForLine(_ line: String, seconds: Double) -> Bool {
        output.wait(until: Date().addingTimeInterval(seconds)) { text, _ in
            text.split(separator: "\n").contains(Substring(line))
        }
    }

    /// Waits until `text` has been written anywhere in the output; false on timeout or end of file.
    func waitForOutput(containing text: String, seconds: Double = 20) -> Bool {
        output.wait(until: Date().addingTimeInterval(seconds)) { written, _ in written.contains(text) }
    }

    /// What the child wrote so far.
    var outputSoFar: String {
        var all = ""
        _ = output.wait(until: Date()) { text, _ in
            all = text
            return true
        }
        return all
    }

    /// All of stdout and stderr, once the process has closed them (that is, ended).
    func readAll() -> String {
        var all = ""
        _ = output.wait(until: nil) { text, ended in
            all = text
            return ended
        }
        return all
    }

    enum Ending: Equatable {
        case exited(Int32)
        case signalled(Int32)
    }

    /// How the process ended, once reaped (by ``wait(seconds:)`` or ``pause(seconds:)``).
    private var ending: Ending?

    private func reap(_ status: Int32) -> Ending {
        reaped = true
        let signal = status & 0x7f
        let ended: Ending = signal == 0 ? .exited((status >> 8) & 0xff) : .signalled(signal)
        ending = ended
        return ended
    }

    /// Waits for the process to end; kills it (SIGKILL, by pid) after `seconds` and returns nil.
    @discardableResult
    func wait(seconds: Double = 20) -> Ending? { blockingWait(seconds: seconds) }

    private func blockingWait(seconds: Double) -> Ending? {
        if reaped { return ending }
        let deadline = Date().addingTimeInterval(seconds)
        var status: Int32 = 0
        while Date() < deadline {
            let result = waitpid(pid, &status, WNOHANG)
            if result == pid { return reap(status) }
            usleep(10_000)
        }
        kill(pid, SIGKILL)
        waitpid(pid, &status, 0)
        reaped = true
        return nil
    }

    /// ``wait(seconds:)`` for async tests: it polls between sleeps of the task instead of
    /// `usleep`, so that the wait does not hold one of Swift's cooperative threads (one per
    /// core: two tests waiting for their children for a minute each left no thread to every
    /// other async test of the process, and a sync test's saves took seconds each).
    @discardableResult
    func wait(seconds: Double = 20) async -> Ending? {
        if reaped { return ending }
        let deadline = Date().addingTimeInterval(seconds)
        var status: Int32 = 0
        while Date() < deadline {
            let result = waitpid(pid, &status, WNOHANG)
            if result == pid { return reap(status) }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return blockingWait(seconds: 0)
    }

    /// ``waitForLine(_:seconds:)`` for async tests, without holding a cooperative thread
    /// (see ``wait(seconds:)-(Double)async``).
    func waitForLine(_ line: String, seconds: Double = 20) async -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        let satisfied = { (text: String) in text.split(separator: "\n").contains(Substring(line)) }
        while Date() < deadline {
            var ended = false
            let found = output.wait(until: Date()) { text, done in
                ended = done
                return satisfied(text)
            }
            if found { return true }
            if ended { return false }
            try? await Task.sleep(for: .milliseconds(10))
        }
        return blockingWaitForLine(line, seconds: 0)
    }

    /// Stops the child with SIGSTOP and returns once it is stopped, as `waitpid` reports it
    /// (WUNTRACED, once the whole thread group stopped), within `seconds`. `kill` returns
    /// before that: one of the child's threads takes the signal and then stops the others, so
    /// under load the others may go on for a while (a request sent right away could still be
    /// answered). False when it was not seen stopped in time, or ended (its ending is kept for
    /// ``wait(seconds:)``).
    @discardableResult
    func pause(seconds: Double = 5) -> Bool {
        guard !reaped, kill(pid, SIGSTOP) == 0 else { return false }
        let deadline = Date().addingTimeInterval(seconds)
        var status: Int32 = 0
        while Date() < deadline {
            let result = waitpid(pid, &status, WNOHANG | WUNTRACED)
            if result == pid {
                if status & 0xff == 0x7f { return true }  // WIFSTOPPED
                _ = reap(status)  // it ended instead
                return false
            }
            usleep(1_000)
        }
        return false
    }

    /// Lets a child stopped by ``pause(seconds:)`` go on.
    func resume() {
        guard !reaped else { return }
        kill(pid, SIGCONT)
    }

    deinit {
        if !reaped {
            kill(pid, SIGKILL)
            var status: Int32 = 0
            waitpid(pid, &status, 0)
        }
    }
}
