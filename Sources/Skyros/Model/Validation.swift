import Foundation

/// A managed object with validation rules of its own, checked at save: Core Data's
/// `validateValue(_:forKey:)`, `validateForInsert()`, `validateForUpdate()` and
/// `validateForDelete()`.
///
/// ```swift
/// extension Post: ValidatingObject {
///     func validateValue(forKey key: String) throws {
///         if key == "title" && title.count > 80 { throw PostError.titleTooLong }
///     }
///     func validateForDelete() throws {
///         if isPinned { throw PostError.pinned }
///     }
/// }
/// ```
///
/// Every rule has a default that accepts, so a class implements only the ones it needs.
///
/// When a context saves, for each object of a validating entity whose change was made in that
/// context (not one saved into it by a child context, which validated it), before anything
/// leaves it:
/// - an inserted object: ``validateValue(forKey:)`` for every property, then
///   ``validateForInsert()``;
/// - an updated object: ``validateValue(forKey:)`` for every property changed, then
///   ``validateForUpdate()``;
/// - a deleted object: ``validateForDelete()``.
///
/// The rules run on the context's queue, after the built-in checks (values that cannot be
/// stored, required relationships, `.deny` delete rules), and every rule runs: when any of
/// them throws, the save throws one ``SkyrosError`` with the code
/// ``SkyrosError/Code/validationFailed`` whose ``SkyrosError/validationFailures`` lists every
/// failure (the object, the property, the error thrown), and nothing is saved: the context
/// keeps its changes. On a shared stack the rules run in the saving process; the daemon never
/// sees a change set that failed them.
///
/// Where this differs from Core Data:
/// - A change is validated once, in the context where it was made; a parent context does not
///   run the rules again when a child saves into it (Core Data validates at every level). A
///   rule spanning several objects changed by different writes sees each write alone.
/// - ``validateValue(forKey:)`` reads the value from the object (there is no proposed value to
///   replace); an update checks the properties it changed, not every property; there is no
///   `super` to call.
/// - A to-many relationship is derived from the to-one on its other side: adding an object to
///   it changes that object (whose rules run), not the relationship's owner.
/// - ``validateForDelete()`` runs after the delete rules were applied: the object's to-many
///   relationships read empty by then. "Cannot be deleted while it has …" is a `.deny` delete
///   rule (``SkyrosError/Code/deleteDenied``).
/// - A built-in check that fails throws its own code before any rule runs.
/// - Batch operations (`batchUpdate`, `batchDelete`) change rows without objects: no rule runs.
///
/// Rules must not change, insert or delete objects: what they change is saved without being
/// checked (Core Data gives the same warning).
public protocol ValidatingObject: ManagedObject {
    /// Checks the value of one property (by name) as the object holds it now; throws to
    /// refuse the save.
    func validateValue(forKey key: String) throws
    /// Checks an inserted object as a whole, after its properties; throws to refuse the save.
    func validateForInsert() throws
    /// Checks an updated object as a whole, after its changed properties; throws to refuse the save.
    func validateForUpdate() throws
    /// Checks that a deleted object may go; throws to refuse the save.
    func validateForDelete() throws
}

extension ValidatingObject {
    /// Accepts every value.
    public func validateValue(forKey key: String) throws {}
    /// Accepts the insert.
    public func validateForInsert() throws {}
    /// Accepts the update.
    public func validateForUpdate() throws {}
    /// Accepts the deletion.
    public func validateForDelete() throws {}
}

/// One rule that refused a save (see ``ValidatingObject``): Core Data's detailed errors.
public struct ValidationFailure: Sendable, CustomStringConvertible {
    /// The object the rule refused.
    public var objectID: ObjectID
    /// The property whose value was refused; nil for a rule on the object as a whole
    /// (`validateForInsert`, `validateForUpdate`, `validateForDelete`).
    public var property: String?
    /// The error the rule threw.
    public var error: any Error

    /// A failure of `objectID`'s `property` (nil: the object as a whole), with the rule's error.
    public init(objectID: ObjectID, property: String?, error: any Error) {
        self.objectID = objectID
        self.property = property
        self.error = error
    }

    /// `Post/0190…, title: <the error>`.
    public var description: String {
        "\(objectID)\(property.map { ", \($0)" } ?? ""): \(error)"
    }
}

extension ObjectContext {
    /// Runs the rules of the validating entities' objects changed in this context (see
    /// ``ValidatingObject``), and throws ``SkyrosError/Code/validationFailed`` listing every
    /// failure.
    func runValidationRules() throws {
        var failures: [ValidationFailure] = []
        func check(_ object: any ManagedObject, _ property: String?, _ rule: () throws -> Void) {
            do { try rule() } catch {
                failures.append(ValidationFailure(objectID: object.objectID, property: property, error: error))
            }
        }
        /// The object's rules, when its entity has some and its change was made here.
        func rules(_ object: any ManagedObject) -> (any ValidatingObject)? {
            let storage = object.skyrosStorage
            guard storage.entity.isValidating, !storage.changesValidated else { return nil }
            return object as? any ValidatingObject
        }
        for object in inserted.values {
            guard let rules = rules(object) else { continue }
            let storage = object.skyrosStorage
            // An object of a hierarchy: its class's properties (not `_entity`, not its siblings').
            let member = storage.entity.hierarchy?.member(of: storage.values)
            for property in storage.entity.properties where member?.has(property.index) ?? true {
                check(object, property.name) { try rules.validateValue(forKey: property.name) }
            }
            check(object, nil) { try rules.validateForInsert() }
        }
        for object in updated.values {
            guard let rules = rules(object) else { continue }
            let storage = object.skyrosStorage
            for index in storage.changed.sorted() {
                let name = storage.entity.properties[index].name
                check(object, name) { try rules.validateValue(forKey: name) }
            }
            check(object, nil) { try rules.validateForUpdate() }
        }
        for object in deleted.values {
            guard let rules = rules(object) else { continue }
            check(object, nil) { try rules.validateForDelete() }
        }
        guard !failures.isEmpty else { return }
        var error = SkyrosError(
            .validationFailed,
            "\(failures.count) validation rule(s) refused the save: "
                + failures.map(\.description).joined(separator: "; "))
        error.validationFailures = failures
        throw error
    }
}
