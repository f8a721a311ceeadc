import Foundation
import Skyros

/// The files of an application group's container.
package struct GroupContainer: Sendable {
    /// The container directory.
    package let url: URL

    /// The container at `url` (nothing is created until ``prepare()``).
    package init(url: URL) { self.url = url }

    /// The group's store, owned by its daemon.
    package var store: URL { url.appendingPathComponent("store.sqlite") }
    /// The file whose lock a serving daemon holds (one daemon per group).
    package var lockFile: URL { url.appendingPathComponent("daemon.lock") }
    /// The socket file of requests and replies.
    package var requestsSocket: String { url.appendingPathComponent("requests.ipc").path }
    /// The socket file of published change events.
    package var eventsSocket: String { url.appendingPathComponent("events.ipc").path }
    /// Both socket files.
    package var sockets: [String] { [requestsSocket, eventsSocket] }
    /// The ZeroMQ endpoint of requests and replies.
    package var requestsEndpoint: String { "ipc://" + requestsSocket }
    /// The ZeroMQ endpoint of published change events.
    package var eventsEndpoint: String { "ipc://" + eventsSocket }

    /// Socket paths of `ipc://` endpoints are limited by `sun_path` (107 bytes).
    package static let maximumSocketPathLength = 107

    /// Checks that this process may use the group's sockets: the container must be
    /// searchable and, when the daemon's sockets exist, readable and writable. Access is Unix
    /// permissions: the container is mode 0770, owned by the group's Unix group.
    package func checkAccess() throws {
        for (index, path) in ([url.path] + sockets).enumerated() {
            let mode = index == 0 ? X_OK : (R_OK | W_OK)
            if access(path, mode) != 0 && errno == EACCES {
                throw SkyrosError(
                    .permissionDenied,
                    "user \(getuid()) may not use the application group at \(url.path): ask to be added to the Unix group that owns it"
                )
            }
        }
    }

    /// Creates the container if missing (mode 0770) and checks that its socket paths fit.
    package func prepare() throws {
        if !FileManager.default.fileExists(atPath: url.path) {
            try FileManager.default.createDirectory(
                at: url, withIntermediateDirectories: true, attributes: [.posixPermissions: 0o770])
        }
        for path in sockets {
            guard path.utf8.count <= Self.maximumSocketPathLength else {
                throw SkyrosError(
                    .invalidApplicationGroup,
                    "the socket path \(path) is longer than \(Self.maximumSocketPathLength) bytes: use a shorter groups directory"
                )
            }
        }
    }
}
