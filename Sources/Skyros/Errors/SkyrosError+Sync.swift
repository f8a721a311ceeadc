import Foundation

/// The codes of sync with PostgreSQL (docs/SYNC.md): what a group's daemon reports about its
/// configuration, and what its apps are told about their change sets.
extension SkyrosError.Code {
    /// How a daemon is told to sync is invalid: the sync URL (`--sync`, `SKYROS_SYNC_URL` or
    /// `url` in the container's `sync.conf`), the password's file, the schema name, a line of
    /// `sync.conf`. The message names the setting, where it came from and what to do; it never
    /// contains a password. `skyrosd` exits with status 64.
    public static let syncConfiguration = SkyrosError.Code(rawValue: "syncConfiguration")
    /// A change set this machine uploaded was refused by the PostgreSQL server (a unique value
    /// taken by another machine, a `.deny` rule, an object deleted on the server): the message
    /// names the objects and the reason; the machine converges to the server's state; nothing
    /// else is lost.
    public static let syncRejected = SkyrosError.Code(rawValue: "syncRejected")
}

/// A change set of this machine that the group's sync server refused (docs/SYNC.md): kept in the
/// daemon's rejected log until an app acknowledges it, so that an app that was not running
/// when the refusal came still learns of it.
///
/// A shared stack tells each refusal to ``Skyros/handleError(_:)`` (a ``SkyrosError`` of code
/// ``SkyrosError/Code/syncRejected`` whose ``SkyrosError/rejectionNumber`` is ``number``) when
/// it comes, and the outstanding ones again when the stack connects; `syncRejections()` (SkyrosShared)
/// lists them and `acknowledgeSyncRejections(_:)` removes them once the app has dealt
/// with them (told its user, made the change again).
public struct SyncRejection: Sendable, Hashable {
    /// The change set's number in this machine's upload queue: what acknowledging names.
    public var number: Int64
    /// When the machine learned of the refusal.
    public var date: Date
    /// Why the server refused it (the constraint or rule, in the server's words).
    public var reason: String
    /// The objects of the change set (back to the server's values on this machine).
    public var objectIDs: [ObjectID]

    /// A refusal, as the daemon reports it.
    public init(number: Int64, date: Date, reason: String, objectIDs: [ObjectID]) {
        self.number = number
        self.date = date
        self.reason = reason
        self.objectIDs = objectIDs
    }

    /// The refusal as the error a shared stack hands to ``Skyros/handleError(_:)``.
    public var error: SkyrosError {
        var error = SkyrosError(
            .syncRejected,
            "the sync server refused change set \(number) of this machine: \(reason); "
                + "\(objectIDs.count) object(s) are back to the server's values: "
                + objectIDs.prefix(10).map(\.description).joined(separator: ", "))
        error.objectIDs = objectIDs
        error.rejectionNumber = number
        return error
    }
}
