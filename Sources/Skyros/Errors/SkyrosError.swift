import Foundation

/// The error every Skyros API throws or reports.
///
/// `SkyrosError` is a struct with an extensible ``Code``, like GRDB's `DatabaseError`:
/// match the code in a `catch` pattern, read ``message`` for a human explanation, and
/// ``underlyingError`` for the cause (an SQLite error, a decoding error, …).
///
/// ```swift
/// do {
///     try context.save()
/// } catch let error as SkyrosError where error.code == .uniqueConstraintViolation {
///     print("Already taken:", error.message)
/// }
/// ```
public struct SkyrosError: Error, Sendable, CustomStringConvertible {
    /// A code a caller can match. New codes may be added in any release.
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        /// The code's name, as `uniqueConstraintViolation`; also its name on the wire.
        public let rawValue: String
        /// A code with this name: the daemon's error replies carry codes by name, so a code this
        /// version does not know survives the trip.
        public init(rawValue: String) { self.rawValue = rawValue }
        /// The code's name.
        public var description: String { rawValue }

        /// A unique attribute would hold the same value in two objects.
        public static let uniqueConstraintViolation = Code(rawValue: "uniqueConstraintViolation")
        /// Deleting an object is refused by a `.deny` delete rule.
        public static let deleteDenied = Code(rawValue: "deleteDenied")
        /// A relationship declared as required has no destination.
        public static let missingRequiredRelationship = Code(rawValue: "missingRequiredRelationship")
        /// A value cannot be stored in its column (NaN, an encoding failure, …).
        public static let valueNotStorable = Code(rawValue: "valueNotStorable")
        /// A value of a change set does not have the type its property declares (an integer
        /// where a string is declared); the message names the entity and the property.
        public static let typeMismatch = Code(rawValue: "typeMismatch")
        /// The schema is invalid (a relationship without a valid inverse, duplicate entity names, …).
        public static let invalidSchema = Code(rawValue: "invalidSchema")
        /// The store file was created with another schema (its fingerprint differs).
        public static let schemaMismatch = Code(rawValue: "schemaMismatch")
        /// Migrating the store to the schema's version failed or is refused: a type change
        /// without a migration stage, a new unique constraint that existing objects violate, a
        /// new non-optional attribute without a default, a stage that threw. The message names
        /// the entity and the property; the store file was left as it was.
        public static let migrationFailed = Code(rawValue: "migrationFailed")
        /// The store has a newer schema version than the one it is opened with (an older
        /// version of the application): it is never downgraded, and the file was left as it was.
        public static let schemaTooNew = Code(rawValue: "schemaTooNew")
        /// A predicate, sort or key path cannot be translated to the store's query language.
        public static let unsupportedPredicate = Code(rawValue: "unsupportedPredicate")
        /// The object does not exist in the context's view of the store.
        public static let objectNotFound = Code(rawValue: "objectNotFound")
        /// An entity that is not part of the schema was used.
        public static let unknownEntity = Code(rawValue: "unknownEntity")
        /// The underlying store failed (I/O, SQLite error, …).
        public static let storeFailure = Code(rawValue: "storeFailure")
        /// The stack was closed or nuked while the operation was pending.
        public static let stackUnavailable = Code(rawValue: "stackUnavailable")
        /// An error thrown by user code inside a `read` or `write` block.
        public static let blockFailed = Code(rawValue: "blockFailed")
        /// A save under the ``MergePolicy/error`` policy updated objects that changed in the
        /// store since they were read; ``SkyrosError/conflicts`` lists them. Nothing was saved.
        public static let mergeConflict = Code(rawValue: "mergeConflict")
        /// A validation rule of the model refused the save (see ``ValidatingObject``);
        /// ``SkyrosError/validationFailures`` lists every failure. Nothing was saved.
        public static let validationFailed = Code(rawValue: "validationFailed")
    }

    /// What went wrong, as a matchable code.
    public var code: Code
    /// A human-readable explanation.
    public var message: String
    /// The error that caused this one, if any.
    public var underlyingError: (any Error)?
    /// For ``Code/mergeConflict``: each object whose update was refused.
    public var conflicts: [MergeConflict]
    /// The objects the error is about, when it names some: for ``Code/syncRejected``, the
    /// objects of the change set the sync server refused.
    public var objectIDs: [ObjectID] = []
    /// For ``Code/syncRejected``: the refused change set's number, which
    /// `Skyros.acknowledgeSyncRejections(_:)` (SkyrosShared) takes once the app has dealt with it (nil for
    /// a refusal told by a daemon older than this field).
    public var rejectionNumber: Int64? = nil
    /// For ``Code/validationFailed``: every rule that refused the save, with its object and
    /// property (Core Data's detailed errors).
    public var validationFailures: [ValidationFailure] = []

    /// An error with a code, a message for people, the error that caused it, and for
    /// ``Code/mergeConflict`` the conflicting objects.
    public init(_ code: Code, _ message: String, underlying: (any Error)? = nil, conflicts: [MergeConflict] = []) {
        self.code = code
        self.message = message
        self.underlyingError = underlying
        self.conflicts = conflicts
    }

    /// `SkyrosError.<code>: <message>`, followed by the underlying error when there is one.
    public var description: String {
        var text = "SkyrosError.\(code): \(message)"
        if let underlyingError { text += " (caused by: \(underlyingError))" }
        return text
    }

    /// Wraps any error into a `SkyrosError`, keeping a `SkyrosError` as it is.
    public static func wrap(_ error: any Error) -> SkyrosError {
        if let error = error as? SkyrosError { return error }
        return SkyrosError(.blockFailed, "\(error)", underlying: error)
    }
}

/// Matches a `SkyrosError` by code: `catch SkyrosError.Code.deleteDenied`.
public func ~= (code: SkyrosError.Code, error: any Error) -> Bool {
    (error as? SkyrosError)?.code == code
}
