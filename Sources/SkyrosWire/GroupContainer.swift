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
    /// The group's daemon did not answer in time.
    public static let daemonUnavailable = SkyrosError.Code(rawValue: "daemonUnavailable")
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

