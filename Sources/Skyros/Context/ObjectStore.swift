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
    public func forEachSnapshot(
        _ request: StoreRequest, _ body: (ObjectID, StoredValues, Int64) throws -> Void
    ) throws {
        for snapshot in try fetchSnapshots(request) { try body(snapshot.id, snapshot.values, snapshot.version) }
    }
}

/// A fetch as a store sees it: entity, predicate tree, sort, slice.
public struct StoreRequest: Sendable, Codable, Hashable {
    public var entityName: String
    public var predicate: PredicateNode?
    public var sortKeys: [SortKey]
    public var limit: Int?
    public var offset: Int

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
    public var property: String
    public var ascending: Bool
    public init(property: String, ascending: Bool) {
        self.property = property
        self.ascending = ascending
    }
}

/// An object's identity, values and version, as stored.
public struct Snapshot: Sendable, Codable, Hashable {
    public var id: ObjectID
    /// One value per property of the entity, in declaration order (NULL for to-many).
    public var values: StoredValues
    /// The object's version in the store: 1 when inserted, one more at each committed
    /// update; 0 when unknown (an object not saved yet).
    public var version: Int64
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
    public var objectID: ObjectID
    /// The properties the saver changed.
    public var properties: [String]
    /// The version the saver read.
    public var baseVersion: Int64
    /// The version in the store.
    public var storeVersion: Int64

    public init(objectID: ObjectID, properties: [String], baseVersion: Int64, storeVersion: Int64) {
        self.objectID = objectID
        self.properties = properties
        self.baseVersion = baseVersion
        self.storeVersion = storeVersion
    }

    public var description: String {
        "\(objectID) (\(properties.joined(separator: ", ")); read at version \(baseVersion), store has \(storeVersion))"
    }
}

/// What a save pushes one level toward the store.
public struct ChangeSet: Sendable, Codable, Hashable {
    /// A changed object: only its changed properties, by index.
    public struct Update: Sendable, Codable, Hashable {
        public var id: ObjectID
        public var changes: [Int: StoredValue]
        /// The version of the object the changes were made on; 0 when unknown (no check).
        public var baseVersion: Int64
        public init(id: ObjectID, changes: [Int: StoredValue], baseVersion: Int64 = 0) {
            self.id = id
            self.changes = changes
            self.baseVersion = baseVersion
        }
    }

    public var inserted: [Snapshot] = []
    public var updated: [Update] = []
    public var deleted: [ObjectID] = []
    /// What the store does with updates whose object changed since its base version.
    public var mergePolicy: MergePolicy = .saverWins

    public init(
        inserted: [Snapshot] = [], updated: [Update] = [], deleted: [ObjectID] = [], mergePolicy: MergePolicy = .saverWins
    ) {
        self.inserted = inserted
        self.updated = updated
        self.deleted = deleted
        self.mergePolicy = mergePolicy
    }

    public var isEmpty: Bool { inserted.isEmpty && updated.isEmpty && deleted.isEmpty }

    /// Every object the change set touches.
    public var allIDs: [ObjectID] { inserted.map(\.id) + updated.map(\.id) + deleted }
}
