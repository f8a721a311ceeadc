import Foundation

/// The codes of sync with PostgreSQL (DESIGN §9): what a group's daemon reports about its
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
