import Foundation
import Skyros

extension SkyrosError.Code {
    /// Another daemon already serves this application group.
    public static let groupLocked = SkyrosError.Code(rawValue: "groupLocked")
    /// A frame could not be decoded.
    public static let malformedMessage = SkyrosError.Code(rawValue: "malformedMessage")
    /// The peer speaks another protocol version.
    public static let unsupportedProtocolVersion = SkyrosError.Code(rawValue: "unsupportedProtocolVersion")
    /// The change history asked for is no longer kept: refresh completely.
    public static let historyExpired = SkyrosError.Code(rawValue: "historyExpired")
    /// The group's daemon did not answer in time. For a save: it was not applied (it was
    /// never sent, see ``outcomeUnknown``).
    public static let daemonUnavailable = SkyrosError.Code(rawValue: "daemonUnavailable")
    /// A save went out but its acknowledgement did not come in time: the daemon may or may
    /// not have applied it. It is never reported as failed: the client resends it (same
    /// client ID and save number, so it is applied at most once) until the daemon answers,
    /// and `RemoteStore.onSaveResolved` tells the truth.
    public static let outcomeUnknown = SkyrosError.Code(rawValue: "outcomeUnknown")
    /// The daemon does not know this client (it restarted): say hello again.
    public static let helloRequired = SkyrosError.Code(rawValue: "helloRequired")
    /// This process's user may not use the group (it is not in the group's Unix group).
    public static let permissionDenied = SkyrosError.Code(rawValue: "permissionDenied")
}

/// The files of an application group's container.
public struct GroupContainer: Sendable {
    /// The container directory.
    public let url: URL

    /// The container at `url` (nothing is created until ``prepare()``).
    public init(url: URL) { self.url = url }

    /// The group's store, owned by its daemon.
    public var store: URL { url.appendingPathComponent("store.sqlite") }
    /// The file whose lock a serving daemon holds (one daemon per group).
    public var lockFile: URL { url.appendingPathComponent("daemon.lock") }
    /// The socket file of requests and replies.
    public var requestsSocket: String { url.appendingPathComponent("requests.ipc").path }
    /// The socket file of published change events.
    public var eventsSocket: String { url.appendingPathComponent("events.ipc").path }
    /// Both socket files.
    public var sockets: [String] { [requestsSocket, eventsSocket] }
    /// The ZeroMQ endpoint of requests and replies.
    public var requestsEndpoint: String { "ipc://" + requestsSocket }
    /// The ZeroMQ endpoint of published change events.
    public var eventsEndpoint: String { "ipc://" + eventsSocket }

    /// Socket paths of `ipc://` endpoints are limited by `sun_path` (107 bytes).
    public static let maximumSocketPathLength = 107

    /// Checks that this process may use the group's sockets: the container must be
    /// searchable and, when the daemon's sockets exist, readable and writable. Access is Unix
    /// permissions: the container is mode 0770, owned by the group's Unix group.
    public func checkAccess() throws {
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
    public func prepare() throws {
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

