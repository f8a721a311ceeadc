import Foundation
import Skyros

/// The upload's statements as values: what a batch of change sets becomes on the server (its
/// net effect, one multi-row statement per table and kind of change), built apart from the
/// connection that runs them, so that they are tested without a server.
extension ServerSession {
    /// Applies a batch of change sets as one statement (run in a transaction of its own by
    /// ``uploadTogether(_:machine:)``): data-modifying `WITH` clauses record every change set's
    /// (machine, number) (a plain INSERT: one recorded before fails the statement) and apply
    /// the batch's net effect, each object once (an insert with the values of the later
    /// updates, an update with the last value of each property changed, a delete), a table and
    /// kind of change at a time with its rows unnested from text arrays. The statement fails,
    /// and nothing is applied, when an updated object is missing on the server (its count is
    /// checked by a division by zero), when a constraint refuses a row (foreign keys are
    /// checked at its transaction's `COMMIT`), or when a value does not fit its column.
    ///
    /// - Returns: the statement (its last column is the id of the transaction that applies it)
    ///   and its parameters.
    /// - Throws: ``Refusal`` for a batch the statement cannot express (an object deleted and
    ///   inserted again, too many parameters, a value that does not fit its column).
    static func togetherStatement(
        _ batch: ArraySlice<QueuedEntry>, machine: UUID, schema: ServerSchema
    ) throws -> (sql: String, parameters: [String?]) {
        var net = NetEffect()
        for (_, changes) in batch {
            guard net.add(changes, schema: schema) else {
                throw Refusal(reason: "an object is deleted and then inserted again in the batch")
            }
        }
        var parameters: [String?] = [
            machine.uuidString.lowercased(), Self.arrayLiteral(batch.map { String($0.number) }),
            Self.arrayLiteral(batch.map { String($0.changes.digest) }),
        ]
        func parameter(_ value: String) -> String {
            parameters.append(value)
            return "($\(parameters.count)::text)"
        }
        var clauses = [
            "recorded AS (INSERT INTO \(ServerSchema.quote(schema.name))._skyros_uploads (machine, number, digest) SELECT ($1::text)::uuid, r.n, r.d FROM unnest(($2::text)::bigint[], ($3::text)::bigint[]) AS r(n, d))"
        ]
        var checks: [String] = []
        for group in net.groups(schema: schema) {
            let table = group.table
            let qualified = schema.qualified(table.name)
            var arrays = [parameter(Self.arrayLiteral(group.rows.map { $0.id.uuidString.lowercased() }))]
            for column in group.columns {
                var texts: [String?] = []
                texts.reserveCapacity(group.rows.count)
                for row in group.rows {
                    texts.append(try Self.text(row.values[column.name] ?? .null, column, row.entity, row.id))
                }
                arrays.append(parameter(Self.arrayLiteral(texts)))
            }
            let names = (0...group.columns.count).map { "c\($0)" }
            let source =
                "unnest(\(arrays.map { "\($0)::text[]" }.joined(separator: ", "))) AS u(\(names.joined(separator: ", ")))"
            let label = "\(group.kind.rawValue)\(clauses.count)"
            switch group.kind {
            case .insert:
                let columns = ["\"_id\""] + group.columns.map { ServerSchema.quote($0.name) }
                let inputs = ["u.c0::uuid"] + group.columns.enumerated().map { $1.type.input("u.c\($0 + 1)") }
                clauses.append(
                    "\(label) AS (INSERT INTO \(qualified) (\(columns.joined(separator: ", "))) SELECT \(inputs.joined(separator: ", ")) FROM \(source))"
                )
            case .update:
                if group.columns.isEmpty {
                    // Only to-manys changed: the object must still be there.
                    // Locked (FOR KEY SHARE), so that the rows are read as they are now, not
                    // as the statement's snapshot had them: an object another upload deleted
                    // while this one waited for the upload lock is not counted.
                    checks.append(
                        "(SELECT count(*) FROM (SELECT 1 FROM \(qualified) WHERE \"_id\" = ANY(\(arrays[0])::uuid[]) FOR KEY SHARE) AS present) = cardinality(\(arrays[0])::uuid[])"
                    )
                    continue
                }
                let assignments = group.columns.enumerated().map {
                    "\(ServerSchema.quote($1.name)) = \($1.type.input("u.c\($0 + 1)"))"
                }
                // The rows are locked first, in the order of their ids (a one-time filter,
                // evaluated before the update touches a row): two machines updating the same
                // objects take their locks in the same order instead of deadlocking.
                let lockInOrder = """
                    (SELECT count(*) FROM (SELECT 1 FROM \(qualified) WHERE "_id" = ANY(\(arrays[0])::uuid[]) \
                    ORDER BY "_id" FOR UPDATE) AS locked) >= 0
                    """
                clauses.append(
                    """
                    \(label) AS (UPDATE \(qualified) AS t SET \(assignments.joined(separator: ", ")) FROM \(source) \
                    WHERE t."_id" = u.c0::uuid AND \(lockInOrder) RETURNING 1)
                    """)
                checks.append("(SELECT count(*) FROM \(label)) = cardinality(\(arrays[0])::uuid[])")
            case .none:
                continue
            case .delete:
                clauses.append("\(label) AS (DELETE FROM \(qualified) WHERE \"_id\" = ANY(\(arrays[0])::uuid[]))")
            }
        }
        // The protocol counts a statement's parameters in 16 bits: a batch whose change sets
        // write too many kinds of rows is split (as a refused one is) before it gets there.
        guard parameters.count <= Self.maximumParameters else {
            throw Refusal(reason: "the batch needs \(parameters.count) parameters")
        }
        let verdict = checks.isEmpty ? "1" : "1 / (CASE WHEN \(checks.joined(separator: " AND ")) THEN 1 ELSE 0 END)"
        // Row counts are parameters too: batches of one shape share one prepared statement.
        // The group's upload lock comes first (the FROM clause is read before the verdict
        // runs the updates, and the other clauses run after it).
        return (
            "WITH \(clauses.joined(separator: ", ")) SELECT (\(verdict))::text, pg_current_xact_id()::text FROM (SELECT \(uploadLock(schema))) AS serialized",
            parameters
        )
    }

    /// The most parameters one batch statement binds (PostgreSQL's limit is 65,535).
    static let maximumParameters = 30_000

    /// The net effect of consecutive change sets of one machine: each object once, as
    /// inserted, updated or deleted, with the last value of every property the change sets
    /// wrote (the same as applying them one after the other, since no other writer comes
    /// between them in one statement).
    struct NetEffect {
        enum Kind: String {
            case insert = "i"
            case update = "u"
            case delete = "d"
            /// Inserted and deleted in the batch: the server never sees it.
            case none = "n"
        }
        struct Object {
            var entity: String
            var id: UUID
            var kind: Kind
            var values: [String: StoredValue]
        }
        private(set) var objects: [Object] = []
        private var positions: [Reference: Int] = [:]
        private typealias Reference = QueuedChangeSet.Reference

        /// Adds a change set; false for a sequence the net effect cannot express (an object
        /// deleted, then inserted or updated again; inserted twice).
        mutating func add(_ changes: QueuedChangeSet, schema: ServerSchema) -> Bool {
            let changes = schema.current(changes)
            for row in changes.inserted where schema.table(row.entity) != nil {
                let key = Reference(entity: row.entity, id: row.id)
                guard positions[key] == nil else { return false }
                positions[key] = objects.count
                objects.append(Object(entity: row.entity, id: row.id, kind: .insert, values: row.values))
            }
            for row in changes.updated where schema.table(row.entity) != nil {
                let key = Reference(entity: row.entity, id: row.id)
                if let position = positions[key] {
                    guard objects[position].kind == .insert || objects[position].kind == .update else { return false }
                    objects[position].values.merge(row.values) { $1 }
                } else {
                    positions[key] = objects.count
                    objects.append(Object(entity: row.entity, id: row.id, kind: .update, values: row.values))
                }
            }
            for reference in changes.deleted where schema.table(reference.entity) != nil {
                if let position = positions[reference] {
                    switch objects[position].kind {
                    case .insert, .none: objects[position].kind = .none  // never reaches the server
                    case .update, .delete: objects[position].kind = .delete
                    }
                    objects[position].values = [:]
                } else {
                    positions[reference] = objects.count
                    objects.append(Object(entity: reference.entity, id: reference.id, kind: .delete, values: [:]))
                }
            }
            return true
        }

        /// One statement's worth of rows: a table, a kind of change, the columns written.
        struct Group {
            var table: ServerSchema.Table
            var kind: Kind
            var columns: [ServerSchema.Column]
            var rows: [Object]
        }

        /// The objects grouped by table, kind and the columns they write (in the table's
        /// column order), inserts first, then updates, then deletes.
        func groups(schema: ServerSchema) -> [Group] {
            var groups: [Group] = []
            var index: [String: Int] = [:]
            for kind in [Kind.insert, .update, .delete] {
                for object in objects where object.kind == kind {
                    guard let table = schema.table(object.entity) else { continue }
                    let columns = kind == .delete ? [] : table.columns.filter { object.values[$0.name] != nil }
                    let key = "\(kind.rawValue)\u{1}\(table.name)\u{1}" + columns.map(\.name).joined(separator: "\u{1}")
                    if let position = index[key] {
                        groups[position].rows.append(object)
                    } else {
                        index[key] = groups.count
                        groups.append(Group(table: table, kind: kind, columns: columns, rows: [object]))
                    }
                }
            }
            return groups
        }
    }

    /// A PostgreSQL array literal of text elements (`{"a",NULL,"b\"c"}`), for a `$n::text[]`
    /// parameter: one parameter carries a column of any number of rows.
    package static func arrayLiteral(_ elements: [String?]) -> String {
        var literal: [UInt8] = [UInt8(ascii: "{")]
        literal.reserveCapacity(elements.count * 24)
        for (position, element) in elements.enumerated() {
            if position > 0 { literal.append(UInt8(ascii: ",")) }
            guard var element else {
                literal.append(contentsOf: "NULL".utf8)
                continue
            }
            literal.append(UInt8(ascii: "\""))
            element.withUTF8 { utf8 in
                for byte in utf8 {
                    if byte == UInt8(ascii: "\"") || byte == UInt8(ascii: "\\") { literal.append(UInt8(ascii: "\\")) }
                    literal.append(byte)
                }
            }
            literal.append(UInt8(ascii: "\""))
        }
        literal.append(UInt8(ascii: "}"))
        return String(decoding: literal, as: UTF8.self)
    }
}
