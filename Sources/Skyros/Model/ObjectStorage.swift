import Foundation
import Synchronization

/// The state behind a managed object: identity, values and change tracking.
///
/// Generated accessors call ``value(at:)``, ``setValue(_:at:)`` and their relationship
/// counterparts with the property's position in ``EntityDescription/properties``.
/// Everything here must be used on the owning context's queue.
public final class ObjectStorage {
    /// The object's identity. (Set again only when a batched fetch reuses an object that
    /// nothing references any more for another row: see `reuse(for:values:version:)`.)
    @exclusivity(unchecked) public internal(set) var objectID: ObjectID
    /// The object's entity.
    public let entity: EntityDescription
    /// The context the object is registered in (nil once detached, or once the context is gone).
    public internal(set) var context: ObjectContext? {
        get { contextReference?.context }
        set { contextReference = newValue?.reference }
    }
    /// Storages point to their context through a shared box holding the weak reference,
    /// so that making an object never touches the context's own reference count.
    @exclusivity(unchecked) var contextReference: ContextReference?

    // Confined to the context's queue (checked under SKYROS_CONCURRENCY_DEBUG), so the
    // dynamic exclusivity checks of these hot properties are left out.
    @exclusivity(unchecked) @usableFromInline var values: StoredValues
    /// Whether the object's values are yet to be read from its parent (the first access fills them).
    @usableFromInline var isFault: Bool {
        @inline(__always) get { accessWork & Self.faultBit != 0 }
        @inline(__always) set { accessWork = newValue ? accessWork | Self.faultBit : accessWork & ~Self.faultBit }
    }
    /// What an access to a property must do first, one byte tested by every generated
    /// accessor (``willAccess(_:)``): fill a fault (``faultBit``), check the thread under
    /// `SKYROS_CONCURRENCY_DEBUG` (``checkBit``, set when the object is made: the check is
    /// on from the first context of a process that asks for it, before any object exists).
    @exclusivity(unchecked) @usableFromInline var accessWork: UInt8
    static var faultBit: UInt8 { 1 }
    static var checkBit: UInt8 { 2 }
    @exclusivity(unchecked) var isInserted = false
    @exclusivity(unchecked) var isDeleted = false
    /// Whether user code may hold the object (then it stays registered after a save).
    @exclusivity(unchecked) var isExposed = false
    /// Whether the object's pending change came from a child context's save (which ran its
    /// validation rules): this context does not run them again. A change made here clears it.
    @exclusivity(unchecked) var changesValidated = false
    /// A fault a child's save updated in a context that did not hold it (see
    /// `ObjectContext.apply(_:childValues:)`): its values are placeholders until it is read,
    /// and its version is the one its changes were made on, which filling it keeps (the store
    /// checks that version at save). Cleared once its changes are saved or discarded.
    @exclusivity(unchecked) var carriesChildChanges = false
    /// How many of ``version``'s steps this context counted itself, one per save of its own
    /// (`ObjectContext.didSave`), since the version was last read from the store or an event
    /// (``unknownCount``: not known). Another process's change made meanwhile may carry a
    /// counted number: only the version read (`version - countedSaves`) tells that an
    /// update is older (``ObjectContext/takeValues(_:of:)``).
    @exclusivity(unchecked) var countedSaves: UInt8 = 0
    static var unknownCount: UInt8 { .max }
    /// The version the object was last read at, from the store or an event (nil: not known).
    var versionRead: Int64? {
        countedSaves == Self.unknownCount ? nil : version - Int64(countedSaves)
    }
    /// The object's version in the store when its values were read (0: unknown, or not
    /// saved yet); updates carry it so that the store can detect conflicts.
    @exclusivity(unchecked) var version: Int64 = 0
    /// Properties changed since the last save (indexes).
    @exclusivity(unchecked) var changed = PropertySet()  // not `[]`: a literal goes through its initializer for every object made
    /// Values that could not be encoded, reported at save.
    @exclusivity(unchecked) @usableFromInline var valueErrors = [Int: SkyrosError]()  // not `[:]`, the same

    var isUpdated: Bool { !isInserted && !isDeleted && !changed.isEmpty }
    var hasChanges: Bool { isInserted || isDeleted || !changed.isEmpty }

    init(
        objectID: ObjectID, entity: EntityDescription, values: StoredValues?,
        reference: ContextReference
    ) {
        self.objectID = objectID
        self.entity = entity
        self.values = values ?? StoredValues(repeating: .null, count: entity.properties.count)
        self.accessWork = (values == nil ? Self.faultBit : 0) | (ConcurrencyDebug.isEnabled ? Self.checkBit : 0)
        self.contextReference = reference
    }

    /// Makes this storage another row's: a batched fetch reuses the object of a released
    /// batch that nothing references at all (no strong, weak or unowned reference but the
    /// context's, see ``ObjectReuse``) for a row of its next batch, instead of freeing one
    /// object and making another. Only for an object with no change (not inserted, deleted
    /// or updated).
    /// The new identifier and values are swapped in: `id` and `values` hold the previous
    /// ones on return (the caller lets go of them, with no copy made here).
    @inline(__always)
    func reuse(for id: inout ObjectID, values: inout StoredValues, version: Int64) {
        swap(&objectID, &id)
        swap(&self.values, &values)
        self.version = version
        countedSaves = 0
        isFault = false
        isExposed = true
        changesValidated = false
    }

    // MARK: - Attributes

    /// Reads an attribute.
    @inlinable @inline(__always)  // a few instructions in the accessor; the codec's path is a call
    public func value<Value>(at index: Int) -> Value {
        willAccess(index)
        // The common types, read without the codec: once this is specialised for a concrete
        // type (as the accessors `@Entity` writes are), only that type's line is left.
        // Anything unexpected in the column goes through the codec, which has the last word.
        switch values[index] {
        case .integer(let value) where Value.self == Int.self: return unsafeBitCast(Int(value), to: Value.self)
        case .integer(let value) where Value.self == Bool.self: return unsafeBitCast(value != 0, to: Value.self)
        case .real(let value) where Value.self == Double.self: return unsafeBitCast(value, to: Value.self)
        case .real(let value) where Value.self == Date.self:
            return unsafeBitCast(Date(timeIntervalSince1970: value), to: Value.self)
        case .text(let value) where Value.self == String.self: return unsafeBitCast(value, to: Value.self)
        default: return decodedValue(at: index)
        }
    }

    /// An attribute's value through its codec (any type, and anything unexpected in a column).
    @inlinable @inline(never)
    func decodedValue<Value>(at index: Int) -> Value {
        let codec = unsafeDowncast(entity.codecs[index], to: AttributeCodec<Value>.self)
        return codec.decode(values[index])
    }

    /// Writes an attribute; the change is reported at save if the value cannot be stored.
    @inlinable
    public func setValue<Value>(_ value: Value, at index: Int) {
        willAccess(index)
        let codec = unsafeDowncast(entity.codecs[index], to: AttributeCodec<Value>.self)
        do {
            setStored(try codec.encode(value), at: index)  // which clears the index's value error
        } catch {
            recordValueError(error, at: index)
        }
    }

    @usableFromInline
    func recordValueError(_ error: any Error, at index: Int) {
        if let reference = contextReference, reference.isUndoable, !isDeleted {
            reference.context?.recordValueChange(self, index: index, newValue: values[index])
        }
        valueErrors[index] = entity.valueError(error, at: index)
        markChanged(index)
    }

    // MARK: - Relationships

    /// Reads a to-one relationship.
    public func object<Destination: ManagedObject>(at index: Int) -> Destination? {
        willAccess(index)
        return relatedObject(at: index) as? Destination
    }

    /// The destination of a to-one, untyped.
    func relatedObject(at index: Int) -> (any ManagedObject)? {
        guard case .blob = values[index], let uuid = UUID(storedValue: values[index]), let context else { return nil }
        let id = ObjectID(entityName: entity.properties[index].destinationName!, uuid: uuid)
        return context.registeredOrFault(id)
    }

    /// Writes a to-one relationship, keeping a to-one inverse in sync (to-many inverses are
    /// derived, so they see the change at once).
    public func setObject<Destination: ManagedObject>(_ destination: Destination?, at index: Int) {
        willAccess(index)
        guard let context else { return }
        context.setToOne(self, index: index, to: destination?.skyrosStorage)
    }

    /// Reads a to-many relationship: the objects whose inverse to-one points here, as this
    /// context sees them (pending changes included), ordered by creation.
    public func objects<Destination: ManagedObject>(at index: Int) -> [Destination] {
        willAccess(index)
        guard let context else { return [] }
        do {
            return try context.relatedObjects(of: self, index: index).compactMap { $0 as? Destination }
        } catch {
            context.report(
                SkyrosError(
                    SkyrosError.wrap(error).code,
                    "could not load \(entity.name).\(entity.properties[index].name): \(SkyrosError.wrap(error).message)",
                    underlying: error))
            return []
        }
    }

    /// Writes a to-many relationship by setting the inverse to-one of the objects added and removed.
    public func setObjects<Destination: ManagedObject>(_ destinations: [Destination], at index: Int) {
        willAccess(index)
        guard let context else { return }
        do {
            try context.setToMany(self, index: index, to: destinations.map(\.skyrosStorage))
        } catch {
            context.report(
                SkyrosError(
                    SkyrosError.wrap(error).code,
                    "could not set \(entity.name).\(entity.properties[index].name): \(SkyrosError.wrap(error).message)",
                    underlying: error))
        }
    }

    // MARK: - Internals

    /// Gives the object the values and version of its row, read from the parent: a fault
    /// is fulfilled, a refreshed object is up to date again.
    /// A fault can carry pending changes (a to-one set or cleared on it by the other side of a
    /// one-to-one, or by a delete's nullify, without its values being read): they stay over
    /// the row's values.
    func fill(_ values: StoredValues, version: Int64) {
        if changed.isEmpty {
            self.values = values
        } else {
            var merged = values
            for index in changed { merged[index] = self.values[index] }
            self.values = merged
        }
        // A child's changes carried here were made on the version this fault has.
        if !(carriesChildChanges && !changed.isEmpty) {
            self.version = version
            countedSaves = 0
        }
        isFault = false
    }

    @inlinable
    func willAccess(_ index: Int) {
        if accessWork != 0 { prepareAccess() }
    }

    /// The thread checked (under `SKYROS_CONCURRENCY_DEBUG`), then the fault filled.
    @usableFromInline
    func prepareAccess() {
        if accessWork & Self.checkBit != 0 { ConcurrencyDebug.check(self) }
        if isFault { fulfillFault() }
    }

    @usableFromInline
    func fulfillFault() {
        guard let context else {
            // Its context is gone: nothing can fill it (nobody to report to either).
            makeInaccessible()
            return
        }
        context.fulfill(self)
    }

    /// No longer a fault and deleted, with its last known values, or its defaults when it
    /// never had any (a fault made from an identifier holds nulls, which a non-optional
    /// attribute cannot read as).
    func makeInaccessible() {
        if isFault && (version == 0 || carriesChildChanges) { values = entity.defaultValues().0 }
        isFault = false
        isDeleted = true
    }

    @usableFromInline
    func setStored(_ stored: StoredValue, at index: Int) {
        if let reference = contextReference, reference.isUndoable, !isDeleted {
            reference.context?.recordValueChange(self, index: index, newValue: stored)
        }
        if !valueErrors.isEmpty { valueErrors[index] = nil }
        values[index] = stored
        markChanged(index)
    }

    /// Records a change. Inserted objects are saved whole, so only updates track properties.
    func markChanged(_ index: Int) {
        guard !isDeleted else { return }
        changesValidated = false
        if let reference = contextReference, reference.isObserved { reference.context?.noteEdit(self, property: index) }
        guard !isInserted else { return }
        if changed.insert(index).inserted, changed.count == 1 { context?.didUpdate(self) }
    }
}

@available(*, unavailable)
extension ObjectStorage: Sendable {}

/// Whether an object of a batched fetch can be reused for another row without anyone
/// seeing it, read from the Swift runtime's reference count words (64-bit platforms: the
/// word after an object's metadata pointer). A word holds no extra strong reference, one
/// unowned reference (the strong references' own) and no side table (which a weak reference
/// makes, and keeps) exactly when nothing but the one strong reference its holder checked
/// refers to the object. Any other word (another layout, a weak reference ever made, an
/// unowned one) says no: the object is then freed, as always.
enum ObjectReuse {
    /// Where an instance's first stored property lies: after its metadata pointer and its
    /// reference count word.
    private static let firstFieldOffset = 16

    /// Whether instances of `sample`'s class hold nothing but their storage (a class of its
    /// own, no superclass, one stored property: `skyrosStorage`), which is then their first
    /// field. A class with other stored properties (`@Transient` ones) keeps its instances:
    /// their values belong to one object.
    static func holdsOnlyStorage(_ sample: any ManagedObject) -> Bool {
        #if arch(x86_64) || arch(arm64)
            // A custom mirror could hide stored properties.
            guard !(sample is any CustomReflectable) else { return false }
            let mirror = Mirror(reflecting: sample)
            guard mirror.superclassMirror == nil, mirror.children.count == 1,
                let field = mirror.children.first?.value as AnyObject?, field === sample.skyrosStorage
            else { return false }
            let instance = UnsafeRawPointer(Unmanaged.passUnretained(sample as AnyObject).toOpaque())
            return instance.load(fromByteOffset: firstFieldOffset, as: UnsafeRawPointer?.self)
                == UnsafeRawPointer(Unmanaged.passUnretained(sample.skyrosStorage).toOpaque())
        #else
            return false
        #endif
    }

    /// The class of the instance at `instance`: its metadata, the instance's first word.
    @inline(__always)
    static func objectClass(ofInstance instance: UnsafeRawPointer) -> UnsafeRawPointer {
        instance.load(as: UnsafeRawPointer.self)
    }

    /// The class of `object` (its metadata).
    @inline(__always)
    static func objectClass(of object: AnyObject) -> UnsafeRawPointer {
        objectClass(ofInstance: UnsafeRawPointer(Unmanaged.passUnretained(object).toOpaque()))
    }

    /// `body` given the storage of the instance at `instance` (of a class
    /// ``holdsOnlyStorage(_:)`` accepted) without a reference count operation: the instance
    /// holds it for as long as `body` runs.
    @inline(__always)
    static func withStorage<Result>(ofInstance instance: UnsafeRawPointer, _ body: (ObjectStorage) -> Result) -> Result
    {
        Unmanaged<ObjectStorage>.fromOpaque(instance.load(fromByteOffset: firstFieldOffset, as: UnsafeRawPointer.self))
            ._withUnsafeGuaranteedRef(body)
    }

    /// Makes an unreferenced object of a class ``holdsOnlyStorage(_:)`` accepted another
    /// row's (``ObjectStorage/reuse(for:values:version:)``), reaching its storage without a
    /// reference count operation.
    @inline(__always)
    static func reuse(_ object: AnyObject, for id: consuming ObjectID, values: consuming StoredValues, version: Int64) {
        var id = consume id
        var values = consume values
        withStorage(ofInstance: UnsafeRawPointer(Unmanaged.passUnretained(object).toOpaque())) { storage in
            storage.reuse(for: &id, values: &values, version: version)
        }
        // `id` and `values` are now the object's previous ones (its previous row's), released here.
    }

    /// Whether the object whose reference is at `field` (of a class ``holdsOnlyStorage(_:)``
    /// accepted), held by that reference, and its storage, held by it, are referenced by
    /// nothing else at all. The reference is read where it is, as bits: copying it would
    /// count as another reference (a debug build copies what a release build borrows).
    @inline(__always)
    static func isUnreferenced(referenceAt field: UnsafeRawPointer) -> Bool {
        guard isSoleReference(at: field), let object = field.load(as: UnsafeRawPointer?.self) else { return false }
        return isSoleReference(at: object + firstFieldOffset)  // its storage
    }

    /// Whether the reference at `field` is the only one to its object: no other strong
    /// reference, no unowned one, no weak one ever made.
    @inline(__always)
    static func isSoleReference(at field: UnsafeRawPointer) -> Bool {
        #if arch(x86_64) || arch(arm64)
            guard let object = field.load(as: UnsafeRawPointer?.self) else { return false }
            // Strong extra count 0, unowned count 1, no flag but bit 0 (pure Swift deallocation).
            return object.load(fromByteOffset: 8, as: UInt64.self) | 1 == 3
        #else
            return false
        #endif
    }
}

/// A context's weak self-reference, shared by all its objects' storages.
final class ContextReference {
    weak var context: ObjectContext?
    /// Whether the context has did-change observers (then edits are recorded for them).
    var isObserved = false
    /// Whether the context has an undo manager (then changes are recorded for it; the context
    /// holds the manager, whose steps hold objects, which hold this: no reference back).
    var isUndoable = false
}

/// `SKYROS_CONCURRENCY_DEBUG=1`: trap when a managed object is touched off its context's queue.
enum ConcurrencyDebug {
    /// Set when a context is made (every object belongs to one), and only ever to true.
    static let enabled = Atomic<Bool>(false)

    /// Whether the check is on: read when an object is made (its storage's
    /// ``ObjectStorage/checkBit``), not at every access.
    static var isEnabled: Bool { enabled.load(ordering: .relaxed) }

    /// Turns the check on when the environment asks for it (called for each new context).
    static func enableIfRequested() {
        if isRequested { enabled.store(true, ordering: .relaxed) }
    }

    /// What the environment asks for, read once.
    static let isRequested: Bool = {
        guard let value = ProcessInfo.processInfo.environment["SKYROS_CONCURRENCY_DEBUG"] else { return false }
        return value == "1" || value.lowercased() == "yes" || value.lowercased() == "true"
    }()

    static func check(_ storage: ObjectStorage) {
        guard let context = storage.context else { return }
        if !context.isPerformingOnCurrentThread {
            let message =
                "Skyros concurrency violation: an object of entity \(storage.entity.name) (\(storage.objectID)) was touched off the queue of its context '\(context.name)'"
            FileHandle.standardError.write(Data((message + "\n").utf8))
            preconditionFailure(message)
        }
    }
}

// MARK: - Accessors used by the @Entity macro

extension ObjectStorage {
    /// Reads a persistent property whose kind is chosen by its type: an attribute.
    @inlinable
    public func persistentValue<Value>(at index: Int) -> Value { value(at: index) }
    /// Reads a persistent property: a to-one relationship.
    public func persistentValue<Destination: ManagedObject>(at index: Int) -> Destination? { object(at: index) }
    /// Reads a persistent property: a to-many relationship.
    public func persistentValue<Destination: ManagedObject>(at index: Int) -> [Destination] { objects(at: index) }
    /// Writes a persistent property: an attribute.
    @inlinable
    public func setPersistentValue<Value>(_ value: Value, at index: Int) { setValue(value, at: index) }
    /// Writes a persistent property: a to-one relationship.
    public func setPersistentValue<Destination: ManagedObject>(_ value: Destination?, at index: Int) {
        setObject(value, at: index)
    }
    /// Writes a persistent property: a to-many relationship.
    public func setPersistentValue<Destination: ManagedObject>(_ value: [Destination], at index: Int) {
        setObjects(value, at: index)
    }
}

extension PropertyDescription {
    /// Describes a persistent property whose kind is chosen by its type: an attribute.
    /// The form the `@Entity` macro writes.
    public static func persistent<Root: ManagedObject, Value>(
        _ name: String, _ keyPath: KeyPath<Root, Value>, default makeDefault: @escaping @Sendable () -> Value,
        attributeOptions: [AttributeOption] = [], originalName: String? = nil,
        relationshipOptions: [RelationshipOption] = [], deleteRule: DeleteRule = .nullify, inverse: AnyKeyPath? = nil
    ) -> PropertyDescription {
        attribute(name, keyPath, default: makeDefault, options: attributeOptions, originalName: originalName)
    }

    /// Describes a persistent property: a to-one relationship.
    public static func persistent<Root: ManagedObject, Destination: ManagedObject>(
        _ name: String, _ keyPath: KeyPath<Root, Destination?>,
        default makeDefault: @escaping @Sendable () -> Destination?,
        attributeOptions: [AttributeOption] = [], originalName: String? = nil,
        relationshipOptions: [RelationshipOption] = [], deleteRule: DeleteRule = .nullify,
        inverse: PartialKeyPath<Destination>? = nil
    ) -> PropertyDescription {
        toOne(
            name, keyPath, deleteRule: deleteRule, inverse: inverse, options: relationshipOptions,
            originalName: originalName)
    }

    /// Describes a persistent property: a to-many relationship.
    public static func persistent<Root: ManagedObject, Destination: ManagedObject>(
        _ name: String, _ keyPath: KeyPath<Root, [Destination]>,
        default makeDefault: @escaping @Sendable () -> [Destination],
        attributeOptions: [AttributeOption] = [], originalName: String? = nil,
        relationshipOptions: [RelationshipOption] = [], deleteRule: DeleteRule = .nullify,
        inverse: PartialKeyPath<Destination>? = nil
    ) -> PropertyDescription {
        toMany(
            name, keyPath, deleteRule: deleteRule, inverse: inverse, options: relationshipOptions,
            originalName: originalName)
    }
}
