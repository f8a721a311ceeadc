import Foundation

/// The seam between a context and what it saves into: a parent context, a local store,
/// or (in the shared stack) the daemon.
///
/// Everything above it — contexts, faulting, merging fetches with pending changes — is the
/// same code whatever the parent is. Calls may block; they are made from the child's queue.
public protocol ObjectStore: AnyObject, Sendable {
    /// The schema the store holds.
    var schema: Schema { get }
    /// The rows matching a request, with all their values, sorted and sliced as it says.
    func fetchSnapshots(_ request: StoreRequest) throws -> [Snapshot]
    /// Calls `body` with each row matching a request (identifier, values, version), in
    /// order, without collecting them first. The default implementation iterates
    /// ``fetchSnapshots(_:)``.
    func forEachSnapshot(
        _ request: StoreRequest, _ body: (ObjectID, StoredValues, Int64) throws -> Void) throws
    /// The identifiers of the rows matching a request, sorted and sliced as it says.
    func fetchIdentifiers(_ request: StoreRequest) throws -> [ObjectID]
    /// The number of rows matching a request (limit and offset applied).
    func count(_ request: StoreRequest) throws -> Int
    /// The rows with these identifiers; missing ones are left out.
    func snapshots(for ids: [ObjectID]) throws -> [Snapshot]
    /// Applies a change set atomically: all of it, or nothing and a thrown error.
    func save(_ changes: ChangeSet) throws
}

extension ObjectStore {
    /// Calls `body` with each row of ``fetchSnapshots(_:)``, in order: the default for stores
    /// that cannot stream (a store that can, such as ``SQLiteStore``, reads row by row instead).
    public func forEachSnapshot(
        _ request: StoreRequest, _ body: (ObjectID, StoredValues, Int64) throws -> Void
    ) throws {
        for snapshot in try fetchSnapshots(request) { try body(snapshot.id, snapshot.values, snapshot.version) }
    }
}

/// A fetch as a store sees it: entity, predicate tree, sort, slice.
public struct StoreRequest: Sendable, Codable, Hashable {
    /// The entity fetched (no subentities: each entity is a table of its own).
    public var entityName: String
    /// Which objects, as the translated predicate tree; nil selects every object.
    public var predicate: PredicateNode?
    /// The order, first key first; ties are broken by object ID (creation order).
    public var sortKeys: [SortKey]
    /// At most this many objects (after `offset`); nil for no limit.
    public var limit: Int?
    /// How many of the sorted objects are skipped first.
    public var offset: Int

    /// A request for the objects of `entityName` that match `predicate`, sorted by
    /// `sortKeys`, `offset` skipped, at most `limit` of them.
    public init(
        entityName: String, predicate: PredicateNode? = nil, sortKeys: [SortKey] = [], limit: Int? = nil,
        offset: Int = 0
    ) {
        self.entityName = entityName
        self.predicate = predicate
        self.sortKeys = sortKeys
        self.limit = limit
        self.offset = offset
    }
}

/// One sort criterion: a property of the fetched entity and a direction. Strings sort
/// byte by byte ("#" < "1" < "A" < "a"); ties are broken by object ID (creation order).
public struct SortKey: Sendable, Codable, Hashable {
    /// The name of an attribute of the fetched entity.
    public var property: String
    /// Smallest first when true; largest first when false.
    public var ascending: Bool
    /// A sort by `property`, ascending or descending.
    public init(property: String, ascending: Bool) {
        self.property = property
        self.ascending = ascending
    }
}

/// An object's identity, values and version, as stored.
public struct Snapshot: Sendable, Codable, Hashable {
    /// The object's identifier (entity and UUID).
    public var id: ObjectID
    /// One value per property of the entity, in declaration order (NULL for to-many).
    public var values: StoredValues
    /// The object's version in the store: 1 when inserted, one more at each committed
    /// update; 0 when unknown (an object not saved yet).
    public var version: Int64
    /// A snapshot of the object `id` with one value per property, at `version` (0: unknown).
    public init(id: ObjectID, values: StoredValues, version: Int64 = 0) {
        self.id = id
        self.values = values
        self.version = version
    }
}

/// What a save does with an updated object that changed in the store since it was read
/// (another process, or another stack on the same file, saved it in between). Core Data's
/// merge policies, by property.
public enum MergePolicy: String, Sendable, Codable, CaseIterable {
    /// The properties the saver changed take the saver's values; the properties it did not
    /// change keep the store's values. The default (Core Data's
    /// `NSMergeByPropertyObjectTrumpMergePolicy`).
    case saverWins
    /// The store's values are kept for every conflicting object: its update is dropped (the
    /// rest of the change set is saved) and the saver's objects are refreshed from the store.
    case storeWins
    /// The whole change set is refused with ``SkyrosError/Code/mergeConflict``, listing each
    /// conflicting object in ``SkyrosError/conflicts``.
    case error
}

/// An updated object that changed in the store since it was read.
public struct MergeConflict: Sendable, Hashable, Codable, CustomStringConvertible {
    /// The object in conflict.
    public var objectID: ObjectID
    /// The properties the saver changed.
    public var properties: [String]
    /// The version the saver read.
    public var baseVersion: Int64
    /// The version in the store.
    public var storeVersion: Int64

    /// A conflict on `objectID`, whose `properties` the saver changed on `baseVersion` while
    /// the store holds `storeVersion`.
    public init(objectID: ObjectID, properties: [String], baseVersion: Int64, storeVersion: Int64) {
        self.objectID = objectID
        self.properties = properties
        self.baseVersion = baseVersion
        self.storeVersion = storeVersion
    }

    /// The object, the saver's properties and both versions, for an error message.
    public var description: String {
        "\(objectID) (\(properties.joined(separator: ", ")); read at version \(baseVersion), store has \(storeVersion))"
    }
}

/// What a save pushes one level toward the store.
public struct ChangeSet: Sendable, Codable, Hashable {
    /// A changed object: only its changed properties, by index.
    public struct Update: Sendable, Codable, Hashable {
        /// The object updated.
        public var id: ObjectID
        /// The new values of the changed properties, by property index (declaration order).
        public var changes: [Int: StoredValue]
        /// The version of the object the changes were made on; 0 when unknown (no check).
        public var baseVersion: Int64
        /// An update of `id`'s properties `changes`, made on `baseVersion` (0: no check).
        public init(id: ObjectID, changes: [Int: StoredValue], baseVersion: Int64 = 0) {
            self.id = id
            self.changes = changes
            self.baseVersion = baseVersion
        }
    }

    /// The objects inserted, with every value (their versions are ignored).
    public var inserted: [Snapshot] = []
    /// The objects updated, with their changed properties only.
    public var updated: [Update] = []
    /// The objects deleted (delete rules apply in the store).
    public var deleted: [ObjectID] = []
    /// What the store does with updates whose object changed since its base version.
    public var mergePolicy: MergePolicy = .saverWins

    /// A change set of these insertions, updates and deletions, saved under `mergePolicy`.
    public init(
        inserted: [Snapshot] = [], updated: [Update] = [], deleted: [ObjectID] = [],
        mergePolicy: MergePolicy = .saverWins
    ) {
        self.inserted = inserted
        self.updated = updated
        self.deleted = deleted
        self.mergePolicy = mergePolicy
    }

    /// Whether it inserts, updates and deletes nothing (an empty save still takes a sequence
    /// in the shared stack).
    public var isEmpty: Bool { inserted.isEmpty && updated.isEmpty && deleted.isEmpty }

    /// Every object the change set touches.
    public var allIDs: [ObjectID] { inserted.map(\.id) + updated.map(\.id) + deleted }
}
