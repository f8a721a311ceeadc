import Foundation

/// Custom work of a migration: stages that run with the full object API, in the migration's
/// transaction, after the inferred (lightweight) step to their version.
///
/// ```swift
/// let plan = MigrationPlan().stage(to: 3) { context in
///     for user in try User.all(in: context) { user.handle = user.email ?? "" }
/// }
/// let store = try Skyros(sqliteStack: Schema([User.self], version: 3), at: url, migrations: plan)
/// ```
///
/// Opening a store of version 1 with a schema of version 3 infers the step from the store's
/// recorded schema to the new one, then runs the stages whose version is above 1, in order;
/// anything they change is saved in the same transaction (a stage need not call `save()`).
/// When a stage, or anything else, fails, nothing of the migration is stored.
///
/// A stage runs in the schema of its version: the application's schema for the last one; for
/// an earlier version, the schema given to ``stage(to:schema:_:)`` (with that version's
/// classes, `@Entity(name:)` letting them keep the entity names), in which case the store is
/// first migrated to that schema. A stage of an earlier version without a schema runs in the
/// application's schema, before the stages of later versions.
///
/// With a stage for a version, a type change of an attribute is no longer refused: the
/// attribute starts from its default (or nil) and the stage sets it, reading the value of the
/// previous version with ``ObjectContext/previousValue(_:of:)``, which also gives the values of
/// removed attributes.
public struct MigrationPlan: Sendable {
    /// One stage: its version, the schema it runs in (nil for the application's), its work.
    public struct Stage: Sendable {
        /// The schema version the stage migrates to; it runs after that version's inferred step.
        public let version: Int
        /// The schema the stage's context sees: an intermediate version's, or nil for the application's.
        public let schema: Schema?
        /// The work.
        public let body: @Sendable (ObjectContext) throws -> Void
    }

    /// The stages, by version.
    public private(set) var stages: [Stage] = []

    /// A plan without stages: migrations are inferred.
    public init() {}

    /// The plan with one more stage.
    ///
    /// - Parameters:
    ///   - version: the schema version the stage migrates to (one stage per version).
    ///   - schema: the schema of that version, for a stage of an earlier version than the
    ///     application's; nil runs it in the application's schema.
    ///   - body: the work, on a context of the migration (its changes are saved with it).
    public func stage(
        to version: Int, schema: Schema? = nil, _ body: @escaping @Sendable (ObjectContext) throws -> Void
    ) -> MigrationPlan {
        var plan = self
        plan.stages.removeAll { $0.version == version }
        plan.stages.append(Stage(version: version, schema: schema, body: body))
        plan.stages.sort { $0.version < $1.version }
        return plan
    }
}

extension ObjectContext {
    /// During a migration stage: the value a property had in the store's previous version,
    /// for an attribute whose type changed or that was removed (other properties keep their
    /// values and are read as usual). Nil outside a stage, for an object the previous version
    /// did not have, or when the property had no such value.
    ///
    /// - Parameters:
    ///   - property: the property's name in the previous version.
    ///   - object: an object of the context.
    public func previousValue(_ property: String, of object: some ManagedObject) throws -> StoredValue? {
        guard let store = parent as? SQLiteStore else { return nil }
        return try store.previousValue(property, of: object.objectID)
    }

    /// The typed form of ``previousValue(_:of:)``: nil also when the value is not a `T`.
    public func previousValue<T: AttributeValue>(_ property: String, of object: some ManagedObject, as type: T.Type)
        throws -> T?
    {
        try previousValue(property, of: object).flatMap { T(storedValue: $0) }
    }

    /// During a migration stage: the objects of an entity the migration removed, each as its
    /// identifier's UUID and its values by property name. Empty outside a stage.
    public func previousObjects(ofEntity entity: String) throws -> [(id: UUID, values: [String: StoredValue])] {
        guard let store = parent as? SQLiteStore else { return [] }
        return try store.previousObjects(ofEntity: entity)
    }
}
