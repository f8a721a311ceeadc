import Foundation

// The DDL of a schema: tables, columns, foreign keys and indexes, as CREATE statements.
extension SQLiteStore {
    /// The DDL of a schema: one STRICT, WITHOUT ROWID table per entity, foreign keys with
    /// the inverse's delete rule (deferred to commit), and indexes.
    static func schemaSQL(_ schema: Schema) -> [String] {
        var statements: [String] = []
        for entity in schema.entities {
            statements.append(tableSQL(entity, in: schema))
            statements += indexDefinitions(entity).map(\.sql)
        }
        return statements
    }

    /// The CREATE TABLE statement of an entity, for a table named `table` (the entity name by default).
    static func tableSQL(_ entity: EntityDescription, in schema: Schema, table: String? = nil) -> String {
        var columns = ["\"_id\" BLOB PRIMARY KEY NOT NULL", "\"_version\" INTEGER NOT NULL DEFAULT 1"]
        for property in entity.properties where property.hasColumn {
            columns.append(columnDefinition(property, of: entity, in: schema))
        }
        return
            "CREATE TABLE \(SQLBuilder.quote(table ?? entity.name)) (\(columns.joined(separator: ", "))) STRICT, WITHOUT ROWID"
    }

    /// The definition of a property's column: its type and NOT NULL, or for a to-one the
    /// foreign key with the inverse's delete rule.
    static func columnDefinition(_ property: PropertyDescription, of entity: EntityDescription, in schema: Schema)
        -> String
    {
        let name = SQLBuilder.quote(property.name)
        if property.kind == .toOne {
            return
                "\(name) BLOB REFERENCES \(SQLBuilder.quote(property.destinationName!))(\"_id\") ON DELETE \(deleteAction(property, of: entity, in: schema)) DEFERRABLE INITIALLY DEFERRED"
        }
        return "\(name) \(property.codec.storageType.rawValue)\(property.isStoredOptional ? "" : " NOT NULL")"
    }

    /// The ON DELETE action of a to-one's foreign key: its inverse's delete rule.
    static func deleteAction(_ property: PropertyDescription, of entity: EntityDescription, in schema: Schema) -> String
    {
        // A link of a many-to-many relationship goes with either of its objects.
        if schema.isLinkEntity(entity.name) { return "CASCADE" }
        return switch schema.inverse(of: property, in: entity)?.deleteRule {
        case .cascade: "CASCADE"
        case .deny: "NO ACTION"
        default: "SET NULL"
        }
    }

    /// An index of a table as the schema declares it.
    struct IndexDefinition {
        let name: String
        let sql: String
        /// The property of a single-property index (unique or indexed attribute, to-one).
        let property: PropertyDescription?
    }

    /// The indexes of an entity's table: unique and indexed properties, declared indexes.
    ///
    /// In an entity hierarchy's table, an index that is not unique ends with `_entity`: a fetch
    /// of a subentity through it tells the other entities' rows from the index entries, without
    /// reading them (SQLite evaluates a term on indexed columns before it reads the row).
    static func indexDefinitions(_ entity: EntityDescription) -> [IndexDefinition] {
        let table = SQLBuilder.quote(entity.name)
        var indexes: [IndexDefinition] = []
        let entitySuffix =
            entity.hierarchy.map { ", " + SQLBuilder.quote(entity.properties[$0.entityIndex].name) } ?? ""
        for property in entity.properties where property.hasColumn && (property.isUnique || property.isIndexed) {
            let name = "\(entity.name)_\(property.name)"
            let kind = property.isUnique ? "UNIQUE INDEX" : "INDEX"
            let suffix = property.isUnique || property.index == entity.hierarchy?.entityIndex ? "" : entitySuffix
            indexes.append(
                IndexDefinition(
                    name: name,
                    sql:
                        "CREATE \(kind) \(SQLBuilder.quote(name)) ON \(table) (\(SQLBuilder.quote(property.name))\(suffix))",
                    property: property))
        }
        for (number, index) in entity.indexes.enumerated() {
            let name = "\(entity.name)_index\(number)"
            indexes.append(
                IndexDefinition(
                    name: name,
                    sql:
                        "CREATE INDEX \(SQLBuilder.quote(name)) ON \(table) (\(index.map(SQLBuilder.quote).joined(separator: ", "))\(entitySuffix))",
                    property: nil))
        }
        return indexes
    }
}
