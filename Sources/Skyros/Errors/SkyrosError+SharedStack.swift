import Foundation

/// The codes of a shared stack's errors: what a client of a group's daemon can be told (and
/// what the daemon reports).
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
    /// A save number past the client's last applied one + 1: an earlier save was never
    /// applied. The save is refused, not applied; send the missing ones first.
    public static let saveNumberSkipped = SkyrosError.Code(rawValue: "saveNumberSkipped")
    /// This process's user may not use the group (it is not in the group's Unix group).
    public static let permissionDenied = SkyrosError.Code(rawValue: "permissionDenied")
}
