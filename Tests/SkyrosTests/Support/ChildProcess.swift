import Foundation
import Testing

/// A child process of the test helper, started like a shell would (default signal
/// dispositions, nothing blocked) and reaped by pid, even when the test fails.
final class ChildProcess: @unchecked Sendable {
    let pid: pid_t
    private let outputFD: Int32
    private var buffer = Data()
    private var reaped = false

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
        outputFD = pipeFDs[0]
    }

    /// Reads stdout until a line equal to `line` arrives; false on timeout or end of file.
    func waitForLine(_ line: String, seconds: Double = 20) -> Bool {
        let deadline = Date().addingTimeInterval(seconds)
        while Date() < deadline {
            if String(decoding: buffer, as: UTF8.self).split(separator: "\n").contains(Substring(line)) { return true }
            var descriptor = pollfd(fd: outputFD, events: Int16(POLLIN), revents: 0)
            guard poll(&descriptor, 1, 100) >= 0 else { return false }
            if descriptor.revents != 0, !readChunk() { return false }
        }
        return false
    }

    private func readChunk() -> Bool {
        var bytes = [UInt8](repeating: 0, count: 4096)
        let count = read(outputFD, &bytes, bytes.count)
        guard count > 0 else { return false }
        buffer.append(contentsOf: bytes[0..<count])
        return true
    }

    /// All of stdout, once the process has closed it.
    func readAll() -> String {
        while readChunk() {}
        return String(decoding: buffer, as: UTF8.self)
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
    func wait(seconds: Double = 20) -> Ending? {
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
        close(outputFD)
    }
}
