import Foundation
import Skyros
import SkyrosWire

/// An exclusive lock on a group's lock file, held for the daemon's life (released by the
/// kernel if the process dies).
package final class GroupLock: @unchecked Sendable {
    private var descriptor: Int32

    /// Takes the lock or throws ``SkyrosError/Code/groupLocked`` at once.
    package init(_ container: GroupContainer) throws {
        let fd = open(container.lockFile.path, O_RDWR | O_CREAT | O_CLOEXEC, 0o660)
        guard fd >= 0 else {
            throw SkyrosError(
                .storeFailure, "cannot open \(container.lockFile.path): \(String(cString: strerror(errno)))")
        }
        guard flock(fd, LOCK_EX | LOCK_NB) == 0 else {
            close(fd)
            throw SkyrosError(
                .groupLocked, "another skyrosd already serves the group at \(container.url.path)")
        }
        descriptor = fd
        _ = ftruncate(fd, 0)
        let pid = "\(getpid())\n"
        _ = pid.withCString { write(fd, $0, strlen($0)) }
    }

    /// Releases the lock (once; the deinitializer does it too).
    package func release() {
        guard descriptor >= 0 else { return }
        flock(descriptor, LOCK_UN)
        close(descriptor)
        descriptor = -1
    }

    deinit { release() }
}
