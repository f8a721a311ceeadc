import Foundation

/// Saves in-flight writes when the process is asked to stop (SIGTERM, SIGINT) and at a
/// normal exit: the Linux counterpart of Skopelos' AppStateReactor.
///
/// Installed when the first stack made with `savesOnStop: true` (the default) is made;
/// stacks made with `savesOnStop: false` neither install nor join it, and a process whose
/// stacks all say false has no handler and no `atexit` hook of Skyros. On SIGTERM or SIGINT
/// every registered live stack is flushed (bounded by a timeout), then the signal's default
/// action runs, so the process still ends as signalled.
///
/// Under swift-service-lifecycle the application owns the signals: its `ServiceGroup`
/// triggers graceful shutdown, and a `SkyrosService` (product `SkyrosServiceLifecycle`)
/// flushes its stacks then; those stacks are made with `savesOnStop: false`.
enum SaveOnStop {
    private final class State: @unchecked Sendable {
        let lock = NSLock()
        var stacks: [ObjectIdentifier: WeakStack] = [:]
        var installed = false
        var enabled = true
    }

    private struct WeakStack {
        weak var stack: Skyros?
    }

    private static let state = State()

    static var isEnabled: Bool {
        get { state.lock.withLock { state.enabled } }
        set { state.lock.withLock { state.enabled = newValue } }
    }

    static func isRegistered(_ stack: Skyros) -> Bool {
        state.lock.withLock { state.stacks[ObjectIdentifier(stack)]?.stack === stack }
    }

    /// Puts a stack in the handlers' care, installing them the first time; does nothing
    /// when the deprecated `Skyros.savesOnStop` is false.
    static func register(_ stack: Skyros) {
        state.lock.lock()
        guard state.enabled else {
            state.lock.unlock()
            return
        }
        state.stacks = state.stacks.filter { $0.value.stack != nil }
        state.stacks[ObjectIdentifier(stack)] = WeakStack(stack: stack)
        let mustInstall = state.enabled && !state.installed
        if mustInstall { state.installed = true }
        state.lock.unlock()
        if mustInstall { install() }
    }

    /// Takes a stack out of the handlers' care (its owner stops it, e.g. a `SkyrosService`).
    /// Handlers already installed stay, for the other stacks.
    static func unregister(_ stack: Skyros) {
        state.lock.withLock { _ = state.stacks.removeValue(forKey: ObjectIdentifier(stack)) }
    }

    static func flushAll(timeout: TimeInterval = 10) {
        let stacks = state.lock.withLock { state.stacks.values.compactMap(\.stack) }
        for stack in stacks { stack.flush(timeout: timeout) }
    }

    /// Installs the handlers synchronously (a signal arriving right after the first stack
    /// is made is not missed): a `sigaction` handler writes the signal number to a pipe, and
    /// a dedicated thread flushes the stacks, restores the default action and re-sends the
    /// signal to the process.
    private static func install() {
        atexit { SaveOnStop.flushAll(timeout: 10) }
        var fds: [Int32] = [0, 0]
        guard pipe(&fds) == 0 else { return }
        signalPipeWriteFD = fds[1]
        let readFD = fds[0]
        let thread = Thread {
            while true {
                var number: UInt8 = 0
                let count = read(readFD, &number, 1)
                if count < 0 && errno == EINTR { continue }
                guard count == 1 else { return }
                SaveOnStop.flushAll(timeout: 10)
                signal(Int32(number), SIG_DFL)
                kill(getpid(), Int32(number))
            }
        }
        thread.name = "skyros.save-on-stop"
        thread.start()
        for signalNumber in [SIGTERM, SIGINT] {
            var action = sigaction()
            #if canImport(Glibc)
                action.__sigaction_handler.sa_handler = skyrosSignalHandler
            #else
                action.__sigaction_u.__sa_handler = skyrosSignalHandler
            #endif
            sigemptyset(&action.sa_mask)
            action.sa_flags = SA_RESTART
            sigaction(signalNumber, &action, nil)
        }
    }
}

nonisolated(unsafe) private var signalPipeWriteFD: Int32 = -1

/// Async-signal-safe: only writes one byte to a pipe.
private func skyrosSignalHandler(_ number: Int32) {
    var byte = UInt8(truncatingIfNeeded: number)
    _ = write(signalPipeWriteFD, &byte, 1)
}

extension Skyros {
    /// The process-wide default of saving on stop (true): false before making a stack keeps
    /// every stack made afterwards from installing or joining the SIGTERM, SIGINT and exit
    /// handlers, whatever its initialiser's `savesOnStop` says.
    @available(
        *, deprecated,
        message:
            "pass savesOnStop: false to the stack's initialiser (and stop it with flush(timeout:) or a SkyrosService)"
    )
    public static var savesOnStop: Bool {
        get { SaveOnStop.isEnabled }
        set { SaveOnStop.isEnabled = newValue }
    }

    /// Takes this stack out of the care of the process-wide SIGTERM, SIGINT and exit
    /// handlers (see ``savesOnStop-swift.property``): its owner flushes it when stopping.
    /// Handlers already installed for other stacks stay. `SkyrosService` calls it for the
    /// stacks it is given.
    public func leaveSaveOnStop() {
        SaveOnStop.unregister(self)
    }
}
