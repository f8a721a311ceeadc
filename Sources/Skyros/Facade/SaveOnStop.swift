import Foundation

/// Saves in-flight writes when the process is asked to stop (SIGTERM, SIGINT) and at a
/// normal exit: the Linux counterpart of Skopelos' AppStateReactor.
///
/// Installed when the first stack is made, unless ``Skyros/savesOnStop`` was set to false
/// before. On SIGTERM or SIGINT every live stack is flushed (bounded by a timeout), then the
/// signal's default action runs, so the process still ends as signalled.
enum SaveOnStop {
    private final class State: @unchecked Sendable {
        let lock = NSLock()
        var stacks: [ObjectIdentifier: WeakStack] = [:]
        var installed = false
        var enabled = true
        var sources: [any DispatchSourceSignal] = []
    }

    private struct WeakStack {
        weak var stack: Skyros?
    }

    private static let state = State()
    private static let signalQueue = DispatchQueue(label: "skyros.save-on-stop")

    static var isEnabled: Bool {
        get { state.lock.withLock { state.enabled } }
        set { state.lock.withLock { state.enabled = newValue } }
    }

    static func register(_ stack: Skyros) {
        state.lock.lock()
        state.stacks = state.stacks.filter { $0.value.stack != nil }
        state.stacks[ObjectIdentifier(stack)] = WeakStack(stack: stack)
        let mustInstall = state.enabled && !state.installed
        if mustInstall { state.installed = true }
        state.lock.unlock()
        if mustInstall { install() }
    }

    static func flushAll(timeout: TimeInterval = 10) {
        let stacks = state.lock.withLock { state.stacks.values.compactMap(\.stack) }
        for stack in stacks { stack.flush(timeout: timeout) }
    }

    private static func install() {
        atexit { SaveOnStop.flushAll(timeout: 10) }
        var sources: [any DispatchSourceSignal] = []
        for signalNumber in [SIGTERM, SIGINT] {
            signal(signalNumber, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: signalNumber, queue: signalQueue)
            source.setEventHandler {
                SaveOnStop.flushAll(timeout: 10)
                signal(signalNumber, SIG_DFL)
                raise(signalNumber)
            }
            source.resume()
            sources.append(source)
        }
        state.lock.withLock { state.sources = sources }
    }
}

extension Skyros {
    /// Whether stacks save in-flight writes on SIGTERM, SIGINT and normal exit (default
    /// true). Set it to false before making the first stack when the application handles
    /// those signals itself (then call ``flush(timeout:)`` when stopping).
    public static var savesOnStop: Bool {
        get { SaveOnStop.isEnabled }
        set { SaveOnStop.isEnabled = newValue }
    }
}
