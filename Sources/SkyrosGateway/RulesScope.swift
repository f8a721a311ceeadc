import Foundation
import Skyros
import SkyrosSync

/// A machine's rows and writes under a gateway's sync rules: the bucket instances its token
/// holds (``SyncRules/instances(for:)``), as the ``SyncScope`` of the sessions a gateway runs on
/// its behalf.
package struct RulesScope: SyncScope {
    /// The rules, their relationships' destinations resolved.
    package let rules: SyncRules
    /// The machine's bucket instances.
    package let instances: [SyncRules.Instance]
    /// The PostgreSQL schema of the group's tables.
    package let schemaName: String

    /// The scope of a machine holding `instances` of `rules`, on the tables of `schemaName`.
    package init(rules: SyncRules, instances: [SyncRules.Instance], schemaName: String) {
        self.rules = rules
        self.instances = instances
        self.schemaName = schemaName
    }

    private func qualify(_ entity: String) -> String {
        ServerSchema.quote(schemaName) + "." + ServerSchema.quote(entity)
    }

    package func condition(entity: String, firstParameter: Int) -> (sql: String, parameters: [String])? {
        rules.sqlCondition(entity: entity, instances: instances, qualify: qualify, firstParameter: firstParameter)
    }

    /// A uuid[] parameter's text.
    static func list(_ ids: some Sequence<UUID>) -> String {
        "{" + ids.map { $0.uuidString.lowercased() }.joined(separator: ",") + "}"
    }

    package func restrict(_ checkpoint: Checkpoint, in session: ServerSession) async throws -> Checkpoint {
        var restricted = checkpoint
        // The rows it cannot read are named with a part of their values: only its own are
        // told (below, with the reached ones), never another bucket's.
        restricted.unreadable = []
        var present: [String: [UUID]] = [:]
        for (id, values) in checkpoint.objects where values != nil {
            present[id.entityName, default: []].append(id.uuid)
        }
        // The changed objects the machine holds keep their rows; every other one is gone for it
        // (it may have held it before the change: a row that left its buckets is deleted there).
        for (entity, ids) in present {
            guard let condition = condition(entity: entity, firstParameter: 2) else {
                for uuid in ids { restricted.objects[ObjectID(entityName: entity, uuid: uuid)] = .some(nil) }
                continue
            }
            let rows = try await session.run(
                "SELECT t.\"_id\"::text FROM \(qualify(entity)) AS t WHERE t.\"_id\" = ANY($1::text::uuid[]) AND (\(condition.sql))",
                [Self.list(ids)] + condition.parameters)
            let held = Set(rows.compactMap { $0.first??.lowercased() })
            for uuid in ids where !held.contains(uuid.uuidString.lowercased()) {
                restricted.objects[ObjectID(entityName: entity, uuid: uuid)] = .some(nil)
            }
        }
        let reached = try await Self.reached(
            from: present, besides: checkpoint.objects, rules: rules, qualify: qualify, in: session)
        for (entity, ids) in reached {
            guard let table = session.schema.table(entity) else { continue }
            let held = try await session.rows(
                of: table, ids: Array(ids), condition: condition(entity: entity, firstParameter: 2))
            for uuid in ids { restricted.objects[ObjectID(entityName: entity, uuid: uuid)] = .some(nil) }
            for row in held.rows { restricted.objects[ObjectID(entityName: entity, uuid: row.id)] = .some(row.values) }
            restricted.unreadable += held.unreadable
        }
        return restricted
    }

    /// The objects reaching the `present` ones (changed objects by entity) through the
    /// rules' relationships, by entity, those `besides` names left out: their buckets may have
    /// changed with them although the log does not name them (a to-do list moved to another
    /// owner takes its items along).
    static func reached(
        from present: [String: [UUID]], besides named: [ObjectID: StoredValues?], rules: SyncRules,
        qualify: (String) -> String, in session: ServerSession
    ) async throws -> [String: Set<UUID>] {
        var reached: [String: Set<UUID>] = [:]
        for statement in rules.reachingStatements(qualify: qualify) {
            guard let changed = present[statement.through], !changed.isEmpty,
                session.schema.table(statement.entity) != nil
            else { continue }
            for row in try await session.run(statement.sql, [list(changed)]) {
                guard let text = row.first ?? nil, let uuid = UUID(uuidString: text),
                    named[ObjectID(entityName: statement.entity, uuid: uuid)] == nil
                else { continue }
                reached[statement.entity, default: []].insert(uuid)
            }
        }
        return reached
    }

    package func refusal(of changes: [QueuedChangeSet], before: Bool, in session: ServerSession) async throws
        -> String?
    {
        if changes.contains(where: \.reset) {
            return
                "not permitted by the sync rules: a reset of the store would delete rows outside this machine's buckets"
        }
        var named: [String: Set<UUID>] = [:]
        for set in changes {
            // An entity the machine's schema has no table of is written by nothing: refused,
            // never left unchecked.
            for reference in set.objects where session.schema.table(reference.entity) == nil {
                return "not permitted by the sync rules: \(reference.entity) is not an entity of the group's tables"
            }
            let rows = before ? set.updated : set.inserted + set.updated
            for row in rows { named[row.entity, default: []].insert(row.id) }
            if before { for reference in set.deleted { named[reference.entity, default: []].insert(reference.id) } }
        }
        for (entity, ids) in named.sorted(by: { $0.key < $1.key }) {
            let (sql, parameters) = rules.outsideStatement(entity: entity, instances: instances, qualify: qualify)
            let outside = try await session.run(sql, [Self.list(ids)] + parameters)
            if let first = outside.first?.first ?? nil {
                let own = instances.filter { instance in
                    rules.buckets.first { $0.name == instance.bucket }.map { !$0.parameters.isEmpty } ?? false
                }
                let holds = own.isEmpty ? "no bucket of its own" : own.map(\.description).joined(separator: ", ")
                return before
                    ? "not permitted by the sync rules: \(entity) \(first) is outside this machine's buckets (it holds \(holds))"
                    : "not permitted by the sync rules: the change would put \(entity) \(first) outside this machine's buckets (it holds \(holds))"
            }
        }
        return nil
    }
}
