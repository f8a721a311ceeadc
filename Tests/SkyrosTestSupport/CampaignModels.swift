// The test schema's next version, as the fault campaign rolls it out machine by machine:
// `User.lastname` renamed `surname` (docs/SYNC.md, "Renames": the server keeps both names equal).
import Foundation
import Skyros

/// `User` with `lastname` renamed `surname`.
@Entity(name: "User") public final class RenamedUser {
    public var firstname: String = ""
    @Attribute(originalName: "lastname") public var surname: String = ""
    public var age: Int = 0
    public var email: String? = nil
    @Attribute(.unique) public var handle: String = ""
    @Relationship(deleteRule: .cascade, inverse: \RenamedPost.author) public var posts: [RenamedPost] = []
}

/// `Post`, whose author is a ``RenamedUser``.
@Entity(name: "Post") public final class RenamedPost {
    public var title: String = ""
    public var score: Double = 0
    public var author: RenamedUser? = nil
}

/// ``testSchema`` at version 2: `User.lastname` renamed `surname`.
public let renamedTestSchema = Schema(
    [
        RenamedUser.self, RenamedPost.self, Team.self, Player.self, Badge.self, Sample.self, Tag.self, Person.self,
        Passport.self,
    ], version: 2)

/// The fault campaign's users through either version of the schema (`renamed`: version 2,
/// whose `surname` is version 1's `lastname`; the campaign's history names it `lastname`).
enum CampaignUsers {
    /// A new user with `handle` and `firstname`; its id.
    static func insert(handle: String, firstname: String, renamed: Bool, in context: ObjectContext) -> UUID {
        if renamed {
            let user = RenamedUser.create(in: context)
            user.handle = handle
            user.firstname = firstname
            return user.objectID.uuid
        }
        let user = User.create(in: context)
        user.handle = handle
        user.firstname = firstname
        return user.objectID.uuid
    }

    /// The object `id` of the context, nil when it does not exist; an error reading it (the
    /// daemon unavailable) is thrown, not taken for a missing object as `object(with:)` does.
    static func existing<T: ManagedObject>(_ id: ObjectID, as type: T.Type, in context: ObjectContext) throws -> T? {
        do {
            return try context.existingObject(with: id) as? T
        } catch let error as SkyrosError where error.code == .objectNotFound {
            return nil
        }
    }

    /// Deletes the user `id`; false when it does not exist.
    static func delete(_ id: UUID, renamed: Bool, in context: ObjectContext) throws -> Bool {
        let objectID = ObjectID(entityName: "User", uuid: id)
        if renamed {
            guard let user = try existing(objectID, as: RenamedUser.self, in: context) else { return false }
            user.delete(in: context)
        } else {
            guard let user = try existing(objectID, as: User.self, in: context) else { return false }
            user.delete(in: context)
        }
        return true
    }

    /// Sets `firstname` or `lastname` of the user `id` to `value`; false when it does not exist.
    static func set(
        _ property: String, to value: String, of id: UUID, renamed: Bool, in context: ObjectContext
    ) throws -> Bool {
        let objectID = ObjectID(entityName: "User", uuid: id)
        if renamed {
            guard let user = try existing(objectID, as: RenamedUser.self, in: context) else { return false }
            if property == "firstname" { user.firstname = value } else { user.surname = value }
        } else {
            guard let user = try existing(objectID, as: User.self, in: context) else { return false }
            if property == "firstname" { user.firstname = value } else { user.lastname = value }
        }
        return true
    }

    /// The user `id`'s handle, firstname and lastname; nil when it does not exist.
    static func values(of id: UUID, renamed: Bool, in context: ObjectContext) throws -> (
        handle: String, firstname: String, lastname: String
    )? {
        let objectID = ObjectID(entityName: "User", uuid: id)
        if renamed {
            return try existing(objectID, as: RenamedUser.self, in: context).map {
                ($0.handle, $0.firstname, $0.surname)
            }
        }
        return try existing(objectID, as: User.self, in: context).map { ($0.handle, $0.firstname, $0.lastname) }
    }

    /// Every user, as `handle|firstname|lastname` by id.
    static func rows(renamed: Bool, in context: ObjectContext) throws -> [UUID: String] {
        var rows: [UUID: String] = [:]
        if renamed {
            for user in try RenamedUser.all(in: context) {
                rows[user.objectID.uuid] = "\(user.handle)|\(user.firstname)|\(user.surname)"
            }
        } else {
            for user in try User.all(in: context) {
                rows[user.objectID.uuid] = "\(user.handle)|\(user.firstname)|\(user.lastname)"
            }
        }
        return rows
    }
}
