import Foundation
import Skyros

extension SkyrosError.Code {
    /// Another daemon already serves this application group.
    public static let groupLocked = SkyrosError.Code(rawValue: "groupLocked")
    /// A frame could not be decoded.
    public static let malformedMessage = SkyrosError.Code(rawValue: "malformedMessage")
    /// The peer speaks another protocol version.
    public static let unsupportedProtocolVersion = SkyrosError.Code(rawValue: "unsupportedProtocolVersion")
}

/// The files of an application group's container.
public struct GroupContainer: Sendable {
    public let url: URL

    public init(url: URL) { self.url = url }

    public var store: URL { url.appendingPathComponent("store.sqlite") }
    public var lockFile: URL { url.appendingPathComponent("daemon.lock") }
    public var requestsEndpoint: String { "ipc://" + url.appendingPathComponent("requests.ipc").path }
    public var eventsEndpoint: String { "ipc://" + url.appendingPathComponent("events.ipc").path }

    /// Socket paths of `ipc://` endpoints are limited by `sun_path` (107 bytes).
    public static let maximumSocketPathLength = 107

    /// Creates the container if missing (mode 0770) and checks that its socket paths fit.
    public func prepare() throws {
        if !FileManager.default.fileExists(atPath: url.path) {
            try FileManager.default.createDirectory(
                at: url, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o770])
        }
        for endpoint in [requestsEndpoint, eventsEndpoint] {
            let path = endpoint.dropFirst("ipc://".count)
            guard path.utf8.count <= Self.maximumSocketPathLength else {
                throw SkyrosError(
                    .invalidApplicationGroup,
                    "the socket path \(path) is longer than \(Self.maximumSocketPathLength) bytes: use a shorter groups directory"
                )
            }
        }
    }
}

/// An exclusive lock on a group's lock file, held for the daemon's life (released by the
/// kernel if the process dies).
public final class GroupLock: @unchecked Sendable {
    private let descriptor: Int32

    /// Takes the lock or throws ``SkyrosError/Code/groupLocked`` at once.
    public init(_ container: GroupContainer) throws {
        let fd = open(container.lockFile.path, O_RDWR | O_CREAT | O_CLOEXEC, 0o660)
        guard fd >= 0 else {
            throw SkyrosError(.storeFailure, "cannot open \(container.lockFile.path): \(String(cString: strerror(errno)))")
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

    deinit {
        flock(descriptor, LOCK_UN)
        close(descriptor)
    }
}
