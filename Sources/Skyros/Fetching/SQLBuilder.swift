import Foundation

/// Builds the SQL of a ``StoreRequest`` for the SQLite store.
///
/// Tables are named after entities, columns after properties; `_id` is the primary key.
/// To-one key paths become correlated scalar subqueries, to-many tests `EXISTS` and
/// `COUNT(*)` subqueries, so that every form keeps SQL's row count (no join fan-out).
struct SQLBuilder {
    let schema: Schema
    private(set) var arguments: [StoredValue] = []
    private var scopes: [Int: (alias: String, entity: EntityDescription)] = [:]
    private var aliasCounter = 0

    init(schema: Schema) { self.schema = schema }

    static func quote(_ identifier: String) -> String { SQLIdentifier.quote(identifier) }

    /// `SELECT <columns> FROM "Entity" t0 WHERE … ORDER BY … LIMIT … OFFSET …`.
    mutating func select(_ columns: String, for request: StoreRequest, sorted: Bool = true, sliced: Bool = true)
        throws -> String
    {
        let entity = try schema.requireEntity(request.entityName)
        scopes = [0: ("t0", entity)]
        aliasCounter = 0
        var sql = "SELECT \(columns) FROM \(Self.quote(entity.name)) t0"
        if let predicate = request.predicate {
            sql += " WHERE " + (try expression(predicate))
        }
        if sorted {
            var terms: [String] = []
            for key in request.sortKeys {
                guard let property = entity.property(named: key.property), property.hasColumn else {
                    throw SkyrosError(.unsupportedPredicate, "cannot sort \(entity.name) by \(key.property)")
                }
                terms.append("t0.\(Self.quote(property.name)) \(key.ascending ? "ASC" : "DESC")")
            }
            terms.append("t0.\"_id\" ASC")
            sql += " ORDER BY " + terms.joined(separator: ", ")
        }
        if sliced, request.limit != nil || request.offset > 0 {
            sql += " LIMIT \(request.limit ?? -1) OFFSET \(request.offset)"
        }
        return sql
    }

    /// The WHERE condition of a request on its entity's table aliased `t0` (nil: every row),
    /// for statements other than SELECT (`UPDATE "Entity" AS t0 SET … WHERE …`).
    mutating func condition(for request: StoreRequest) throws -> String? {
        let entity = try schema.requireEntity(request.entityName)
        scopes = [0: ("t0", entity)]
        aliasCounter = 0
        return try request.predicate.map { try expression($0) }
    }

    mutating func expression(_ node: PredicateNode) throws -> String {
        switch node {
        case .constant(let value):
            if value.isNull { return "NULL" }
            arguments.append(value)
            return "?"
        case .property(let scope, let path):
            guard let (alias, entity) = scopes[scope] else { throw invalid("unknown scope \(scope)") }
            return try column(alias: alias, entity: entity, path: path[...])
        case .compare(let op, let lhs, let rhs):
            return "(\(try expression(lhs)) \(op.rawValue) \(try expression(rhs)))"
        case .and(let lhs, let rhs):
            // A subentity's filter beside the fetch's own predicate (``Schema/restricting(_:to:)``):
            // `+` keeps SQLite from choosing the `_entity` index, which selects all the
            // subentity's rows, over an index of the predicate's (a range of an indexed
            // attribute would otherwise be read through every row of the subentity).
            if EntityHierarchy.filteredNames(lhs) != nil {
                return "(+\(try expression(lhs)) AND \(try expression(rhs)))"
            }
            return "(\(try expression(lhs)) AND \(try expression(rhs)))"
        case .or(let lhs, let rhs):
            return "(\(try expression(lhs)) OR \(try expression(rhs)))"
        case .not(let inner):
            return "(NOT \(try expression(inner)))"
        case .contains(let haystack, let needle, let caseInsensitive):
            if caseInsensitive {
                return "(instr(lower(\(try expression(haystack))), lower(\(try expression(needle)))) > 0)"
            }
            return "(instr(\(try expression(haystack)), \(try expression(needle))) > 0)"
        case .startsWith(let string, let prefix):
            let s = try expression(string)
            let p1 = try expression(prefix)
            let p2 = try expression(prefix)
            return "(substr(\(s), 1, length(\(p1))) = \(p2))"
        case .lowercased(let inner):
            return "lower(\(try expression(inner)))"
        case .isIn(let value, let list):
            let lhs = try expression(value)
            if list.isEmpty { return "0" }
            let placeholders = list.map { value -> String in
                if value.isNull { return "NULL" }
                arguments.append(value)
                return "?"
            }
            return "(\(lhs) IN (\(placeholders.joined(separator: ","))))"
        case .anyMatch(let scope, let path, let variable, let test):
            if let (outer, route, destination) = try manyToMany(scope: scope, path: path) {
                // Driven from the link table: the destination's condition (its indexes), then the
                // links by their index on that side, then this side's ids.
                let (link, inner) = (newAlias(), newAlias())
                scopes[variable] = (inner, destination)
                let own = Self.quote(route.entity.properties[route.own].name)
                let other = Self.quote(route.entity.properties[route.other].name)
                return
                    "\(outer).\"_id\" IN (SELECT \(link).\(own) FROM \(Self.quote(route.entity.name)) \(link) JOIN \(Self.quote(destination.name)) \(inner) ON \(inner).\"_id\" = \(link).\(other) WHERE \(link).\(own) IS NOT NULL AND (\(try expression(test))))"
            }
            let (alias, destination, join) = try toMany(scope: scope, path: path)
            scopes[variable] = (alias, destination)
            return
                "EXISTS (SELECT 1 FROM \(Self.quote(destination.name)) \(alias) WHERE \(join) AND \(try expression(test)))"
        case .count(let scope, let path):
            if let (outer, route, _) = try manyToMany(scope: scope, path: path) {
                // One link per object at the other end (deleting either object deletes the link).
                let own = Self.quote(route.entity.properties[route.own].name)
                return "(SELECT COUNT(*) FROM \(Self.quote(route.entity.name)) WHERE \(own) = \(outer).\"_id\")"
            }
            let (alias, destination, join) = try toMany(scope: scope, path: path)
            return "(SELECT COUNT(*) FROM \(Self.quote(destination.name)) \(alias) WHERE \(join))"
        }
    }

    private mutating func newAlias() -> String {
        aliasCounter += 1
        return "t\(aliasCounter)"
    }

    private mutating func column(alias: String, entity: EntityDescription, path: ArraySlice<String>) throws -> String {
        guard let first = path.first else { throw invalid("empty property path") }
        if first == PredicateNode.idProperty, path.count == 1 { return "\(alias).\"_id\"" }
        guard let property = entity.property(named: first), property.hasColumn else {
            throw invalid("\(entity.name) has no attribute or to-one named \(first)")
        }
        if path.count == 1 { return "\(alias).\(Self.quote(property.name))" }
        guard property.kind == .toOne, let destination = schema.entity(named: property.destinationName!) else {
            throw invalid("\(entity.name).\(first) is not a to-one relationship")
        }
        let inner = newAlias()
        let value = try column(alias: inner, entity: destination, path: path.dropFirst())
        return
            "(SELECT \(value) FROM \(Self.quote(destination.name)) \(inner) WHERE \(inner).\"_id\" = \(alias).\(Self.quote(property.name)))"
    }

    /// A many-to-many path: this side's alias, where the links are, and the destination.
    private func manyToMany(scope: Int, path: [String]) throws -> (String, Schema.LinkRoute, EntityDescription)? {
        guard let (alias, entity) = scopes[scope], path.count == 1, let property = entity.property(named: path[0]),
            let route = schema.linkRoute(of: property, in: entity)
        else { return nil }
        guard let destination = schema.entity(named: property.destinationName!) else {
            throw invalid("\(path.joined(separator: ".")) is not a to-many relationship")
        }
        return (alias, route, destination)
    }

    private mutating func toMany(scope: Int, path: [String]) throws -> (String, EntityDescription, String) {
        guard let (alias, entity) = scopes[scope], path.count == 1, let property = entity.property(named: path[0]),
            property.kind == .toMany, let destination = schema.entity(named: property.destinationName!),
            let inverse = schema.inverse(of: property, in: entity)
        else { throw invalid("\(path.joined(separator: ".")) is not a to-many relationship") }
        let inner = newAlias()
        return (inner, destination, "\(inner).\(Self.quote(inverse.name)) = \(alias).\"_id\"")
    }

    private func invalid(_ message: String) -> SkyrosError {
        SkyrosError(.unsupportedPredicate, "invalid predicate: \(message)")
    }
}
