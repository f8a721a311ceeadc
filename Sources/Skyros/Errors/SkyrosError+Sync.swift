import Foundation

/// The codes of sync with PostgreSQL (DESIGN §9).
extension SkyrosError.Code {
    /// A change set this machine uploaded was refused by the PostgreSQL server (a unique value
    /// taken by another machine, a `.deny` rule, an object deleted on the server): the message
    /// names the objects and the reason, ``SkyrosError/objectIDs`` lists them. The machine
    /// converges to the server's state; nothing else is lost.
    public static let syncRejected = SkyrosError.Code(rawValue: "syncRejected")
}
