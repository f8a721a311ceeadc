import Foundation

/// A class whose instances are managed objects: the `@Entity` macro makes a final class one.
///
/// A managed object belongs to one ``ObjectContext`` and must only be touched on that
/// context's queue (inside `read`/`write` blocks or `perform`). Run with
/// `SKYROS_CONCURRENCY_DEBUG=1` to trap any access from elsewhere.
///
/// The macro generates nothing that could not be written by hand. This is `Tag` without it:
///
/// ```swift
/// final class Tag: ManagedObject {
///     static let entityDescription = EntityDescription(Tag.self, properties: [
///         .attribute("label", \Tag.label, default: { "" }),
///     ])
///     let skyrosStorage: ObjectStorage
///     init(skyrosStorage: ObjectStorage) { self.skyrosStorage = skyrosStorage }
///     var label: String {
///         get { skyrosStorage.value(at: 0) }
///         set { skyrosStorage.setValue(newValue, at: 0) }
///     }
/// }
/// ```
public protocol ManagedObject: AnyObject, SendableMetatype {
    /// The description of the entity: name, properties, indexes.
    static var entityDescription: EntityDescription { get }
    /// The entity name: the class name unless `@Entity(name:)` gives another. Relationships
    /// name their destination with it (it never reads ``entityDescription``).
    static var entityName: String { get }
    /// The object's state: identity, values, context. Accessors of persistent properties go through it.
    var skyrosStorage: ObjectStorage { get }
    /// Makes an instance around its storage; only contexts call it.
    init(skyrosStorage: ObjectStorage)
}

extension ManagedObject {
    /// The entity's name: the class name unless the class declares another one (`@Entity(name:)`).
    public static var entityName: String { String(describing: Self.self) }

    /// The object's identity, assigned at creation and never changed. Readable from any thread.
    public var objectID: ObjectID { skyrosStorage.objectID }
    /// The context the object belongs to (nil once the context is gone).
    public var objectContext: ObjectContext? { skyrosStorage.context }
    /// Whether the object was inserted in its context and not yet saved.
    public var isInserted: Bool { skyrosStorage.isInserted }
    /// Whether the object has unsaved changes to existing values.
    public var isUpdated: Bool { skyrosStorage.isUpdated }
    /// Whether the object was deleted in its context.
    public var isDeleted: Bool { skyrosStorage.isDeleted }
    /// Whether the object's values have not been loaded yet.
    public var isFault: Bool { skyrosStorage.isFault }
    /// Whether the object has unsaved changes of any kind.
    public var hasChanges: Bool { skyrosStorage.isInserted || skyrosStorage.isUpdated || skyrosStorage.isDeleted }
    /// The names of the properties changed since the last save (empty for an inserted object,
    /// which is saved whole).
    public var changedPropertyNames: [String] {
        skyrosStorage.changed.sorted().map { skyrosStorage.entity.properties[$0].name }
    }
}

/// `@Entity` marks a final class as a managed object: stored properties become persistent
/// attributes (with their declared defaults), properties of entity types become relationships.
///
/// ```swift
/// @Entity final class User {
///     var firstname: String = ""
///     @Attribute(.unique) var handle: String = ""
///     @Relationship(deleteRule: .cascade, inverse: \Post.author) var posts: [Post] = []
/// }
/// ```
///
/// - Parameters:
///   - name: the entity name, by default the class name. Two classes may describe the same
///     entity in two versions of a model (`@Entity(name: "User") final class UserV1`), each
///     in its own ``Schema``.
///   - originalName: the entity's name in an earlier version of the schema: a migration
///     renames its table instead of dropping it and creating a new one.
///   - indexes: indexes over one or more properties, by name:
///     `@Entity(indexes: ["lastname", "firstname"], ["age"])`.
@attached(
    member, names: named(entityDescription), named(entityName), named(skyrosStorage), named(init(skyrosStorage:)),
    arbitrary)
@attached(memberAttribute)
@attached(extension, conformances: ManagedObject)
public macro Entity(name: String? = nil, originalName: String? = nil, indexes: [String]...) =
    #externalMacro(module: "SkyrosMacros", type: "EntityMacro")

/// Options of a persistent attribute: `@Attribute(.unique)`, `@Attribute(.indexed)`,
/// `@Attribute(originalName: "name")` (the attribute was called `name` in an earlier version
/// of the schema: a migration renames its column and keeps its values). Read by `@Entity`.
@attached(peer)
public macro Attribute(_ options: AttributeOption..., originalName: String? = nil) =
    #externalMacro(module: "SkyrosMacros", type: "MarkerMacro")

/// Options of a relationship: delete rule (`.nullify` by default), inverse, `.required`, and
/// the name it had in an earlier version of the schema (`originalName:`, for migrations).
/// Read by `@Entity`.
@attached(peer)
public macro Relationship(
    _ options: RelationshipOption..., deleteRule: DeleteRule = .nullify, inverse: AnyKeyPath? = nil,
    originalName: String? = nil
) = #externalMacro(module: "SkyrosMacros", type: "MarkerMacro")

/// A stored property that is not persisted: it keeps its value in the instance only.
@attached(peer)
public macro Transient() = #externalMacro(module: "SkyrosMacros", type: "MarkerMacro")

/// Added by `@Entity` to each persistent property: turns it into accessors of the
/// object's storage at position `index`.
@attached(accessor, names: named(init), named(get), named(set))
public macro _Persisted(_ index: Int) = #externalMacro(module: "SkyrosMacros", type: "PersistedPropertyMacro")

/// Added by `@Entity` to each persistent property of a subentity: accessors of the object's
/// storage at the `index`-th of the class's own properties, whose first position the store's
/// entity of the hierarchy gives (``EntityDescription/propertyBase(of:)``).
@attached(accessor, names: named(init), named(get), named(set))
public macro _Persisted(_ index: Int, _ type: AnyObject.Type) =
    #externalMacro(module: "SkyrosMacros", type: "PersistedPropertyMacro")
