import Foundation

/// Skopelos-style helpers, always explicit about the context.
extension ManagedObject {
    /// Inserts a new object with its default values into `context`.
    public static func create(in context: ObjectContext) -> Self {
        context.insert(Self.self)
    }

    /// Deletes this object, as seen from `context` (it may come from another context),
    /// applying delete rules. Does nothing if the object does not exist in `context`.
    public func delete(in context: ObjectContext) {
        guard let object = inContext(context) else { return }
        context.delete(object)
    }

    /// Deletes every object of the entity in `context`, applying delete rules; the deletions are
    /// pending in `context` until it is saved, like any other.
    ///
    /// The objects are found by their identifiers alone (one query): their values are not
    /// read, and those `context` does not hold are deleted as faults. Only an entity with
    /// relationships has its objects read, for its delete rules (cascade, nullify), and so are
    /// objects a controller or monitor on `context` follows. To delete many rows in one
    /// statement, durably, without a context, use ``Skyros/batchDelete(_:where:)``.
    ///
    /// The objects of an entity hierarchy (`@Entity class Vehicle` and its subentities) are
    /// read in one fetch: their classes are in their rows.
    public static func deleteAll(in context: ObjectContext) throws {
        if context.schema.entity(for: Self.self)?.hierarchy != nil {
            for object in try context.fetch(FetchDescriptor<Self>()) where !object.isDeleted { context.delete(object) }
            return
        }
        for id in try context.fetchIdentifiers(FetchDescriptor<Self>()) {
            guard let object = context.registeredOrFault(id), !object.isDeleted else { continue }
            context.delete(object)
        }
    }

    /// The number of objects of the entity in `context`.
    public static func count(in context: ObjectContext) throws -> Int {
        try context.fetchCount(FetchDescriptor<Self>())
    }

    /// The number of objects matching `predicate` in `context`.
    public static func count(where predicate: Predicate<Self>, in context: ObjectContext) throws -> Int {
        try context.fetchCount(FetchDescriptor(predicate: predicate))
    }

    /// All objects of the entity in `context`, in creation order.
    public static func all(in context: ObjectContext) throws -> [Self] {
        try context.fetch(FetchDescriptor<Self>())
    }

    /// The objects matching `predicate`, sorted.
    public static func all(
        where predicate: Predicate<Self>? = nil, sortedBy sortDescriptors: [SortDescriptor<Self>] = [],
        in context: ObjectContext
    ) throws -> [Self] {
        try context.fetch(FetchDescriptor(predicate: predicate, sortBy: sortDescriptors))
    }

    /// The first object of the entity (in creation order), or nil.
    public static func first(in context: ObjectContext) throws -> Self? {
        try context.fetch(FetchDescriptor<Self>(fetchLimit: 1)).first
    }

    /// The first object matching `predicate` in the given order, or nil.
    public static func first(
        where predicate: Predicate<Self>? = nil, sortedBy sortDescriptors: [SortDescriptor<Self>] = [],
        in context: ObjectContext
    ) throws -> Self? {
        try context.fetch(FetchDescriptor(predicate: predicate, sortBy: sortDescriptors, fetchLimit: 1)).first
    }

    /// The same object seen from another context, or nil when it does not exist there
    /// (not yet saved to it, or deleted). Works for objects saved to the store or not.
    /// Call it on `context`'s queue.
    public func inContext(_ context: ObjectContext) -> Self? {
        if skyrosStorage.context === context { return skyrosStorage.isDeleted ? nil : self }
        return context.object(with: objectID) as? Self
    }
}
