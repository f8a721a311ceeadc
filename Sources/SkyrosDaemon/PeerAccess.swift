import Foundation
import SkyrosWire
import SkyrosZeroMQ

/// Who may use a group's daemon: root, the user the daemon runs as, the owner of the
/// container, and members of the container's Unix group (primary or supplementary). The
/// container's 0770 mode already keeps others away from the socket files; this check holds
/// even when the mode was loosened by mistake.
final class PeerAccess {
    private let owner: uid_t
    private let group: gid_t
    private var decisions: [PeerCredentials: String?] = [:]

    init(container: GroupContainer) {
        var info = stat()
        if stat(container.url.path, &info) == 0 {
            owner = info.st_uid
            group = info.st_gid
        } else {
            owner = geteuid()
            group = getegid()
        }
    }

    /// The users always allowed: root, the daemon's own user and the container's owner.
    var users: [uid_t] { [0, geteuid(), owner] }
    /// The container's Unix group, whose members may use the group.
    var groups: [gid_t] { [group] }

    /// Why `peer` is refused, or nil when it may use the group.
    func refusal(of peer: PeerCredentials?) -> String? {
        guard let peer else { return "the daemon could not read the credentials of this connection" }
        let key = PeerCredentials(uid: peer.uid, gid: peer.gid, pid: 0)
        if let decision = decisions[key] { return decision }
        let decision: String? =
            if isAllowed(uid: peer.uid, gid: peer.gid) {
                nil
            } else {
                "user \(peer.uid) is neither the owner of the group nor a member of its Unix group \(group)"
            }
        if decisions.count > 1024 { decisions.removeAll() }
        decisions[key] = decision
        return decision
    }

    private func isAllowed(uid: uid_t, gid: gid_t) -> Bool {
        if uid == 0 || uid == geteuid() || uid == owner || gid == group { return true }
        guard let entry = getpwuid(uid) else { return false }
        var count: Int32 = 64
        var groups = [gid_t](repeating: 0, count: Int(count))
        while getgrouplist(entry.pointee.pw_name, entry.pointee.pw_gid, &groups, &count) < 0 {
            groups = [gid_t](repeating: 0, count: Int(count) * 2)
            count = Int32(groups.count)
        }
        return groups.prefix(Int(count)).contains(group)
    }
}
