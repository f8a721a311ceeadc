import Foundation

/// The inferred (lightweight) step from one schema to the next, planned without touching a
/// database: which tables are created, renamed, dropped, altered or rebuilt, and where each
/// column of the new tables takes its values. Refused changes throw
/// ``SkyrosError/Code/migrationFailed`` naming the entity and the property.
struct SchemaStep {
    /// Where a column of the new table takes its values.
    enum ColumnSource {
        /// The old column of this name.
        case column(String)
        /// The old column of this name, its NULLs replaced by a value (optional → non-optional).
        case coalesce(String, StoredValue)
        /// One value for every row (a new attribute's default, NULL).
        case constant(StoredValue)
    }

    /// A table of the new schema.
    struct Table {
        let entity: EntityDescription
        /// The table it comes from in the old schema; nil for a new entity.
        let sourceName: String?
        /// For each column of the new table (properties with a column, in order): its source.
        var columns: [(property: PropertyDescription, source: ColumnSource)] = []
        /// The table is copied into a new one (SQLite cannot alter what changed).
        var rebuild = false
        /// Without a rebuild: columns renamed (old name, new name), dropped, added.
        var renamed: [(from: String, to: String)] = []
        var dropped: [String] = []
        var added: [(property: PropertyDescription, value: StoredValue)] = []
        /// Old columns whose values a stage may read (removed ones, ones whose type changed).
        var previous: [String] = []
        /// New required to-ones: every object must have one once the stages ran.
        var required: [PropertyDescription] = []
    }

    let source: Schema
    let target: Schema
    let version: Int
    var tables: [Table] = []
    /// Tables of the old schema that the new one does not have.
    var removedEntities: [String] = []

    /// Plans the step. `hasStages`: a stage of this version runs after it, so a type change
    /// is accepted (the attribute starts from its default, the stage sets it).
    init(from source: Schema, to target: Schema, version: Int, hasStages: Bool) throws {
        self.source = source
        self.target = target
        self.version = version
        // Entities: by name, then by originalName (tables: a subentity's name is not its table's).
        var sourceOf: [String: EntityDescription] = [:]
        var claimed = Set<String>()
        let entityMatches = RenameInference.match(
            newer: target.entities.map(\.name), originalNames: target.entities.map(\.originalName),
            older: source.entities.map(\.name))
        for (entity, previous) in zip(target.entities, entityMatches) {
            guard let previous else { continue }
            sourceOf[entity.name] = source.entities[previous]
            claimed.insert(source.entities[previous].name)
        }
        removedEntities = source.entities.map(\.name).filter { !claimed.contains($0) }
        // An entity with objects that becomes a subentity (or leaves a hierarchy to be an
        // entity of its own) would move them from one table to another: not inferred.
        for name in removedEntities {
            if let hierarchy = target.entity(named: name)?.hierarchy, hierarchy.root != name {
                throw SkyrosError(
                    .migrationFailed,
                    "cannot migrate the store to schema version \(version): \(name) becomes a subentity of \(hierarchy.root), and its objects would move to \(hierarchy.root)'s table, which is not inferred (keep \(name) an entity of its own, or copy its objects in a migration stage of an intermediate version); the store was left as it was"
                )
            }
        }
        for entity in target.entities where entity.hierarchy == nil && sourceOf[entity.name] == nil {
            if let hierarchy = source.entity(named: entity.name)?.hierarchy, hierarchy.root != entity.name {
                throw SkyrosError(
                    .migrationFailed,
                    "cannot migrate the store to schema version \(version): \(entity.name) leaves the hierarchy of \(hierarchy.root) to be an entity of its own, and its objects would move out of \(hierarchy.root)'s table, which is not inferred; the store was left as it was"
                )
            }
        }
        var newNameOf: [String: String] = [:]
        for (name, old) in sourceOf { newNameOf[old.name] = name }

        for entity in target.entities {
            var table = Table(entity: entity, sourceName: sourceOf[entity.name]?.name)
            guard let old = sourceOf[entity.name] else {
                tables.append(table)
                continue
            }
            let newColumns = entity.properties.filter(\.hasColumn)
            var matched: [String: PropertyDescription] = [:]  // new name → old property
            let propertyMatches = RenameInference.match(
                newer: newColumns.map(\.name), originalNames: newColumns.map(\.originalName),
                older: old.properties.map(\.name),
                isCandidate: { old.properties[$0].hasColumn })
            for (property, previous) in zip(newColumns, propertyMatches) {
                if let previous { matched[property.name] = old.properties[previous] }
            }
            let taken = Set(matched.values.map(\.name))
            for property in newColumns {
                let label = "\(entity.name).\(property.name)"
                guard let previous = matched[property.name] else {
                    // Added.
                    if property.kind == .toOne {
                        table.columns.append((property, .constant(.null)))
                        table.added.append((property, .null))
                        if property.isRequired { table.required.append(property) }
                    } else if property.isStoredOptional {
                        table.columns.append((property, .constant(.null)))
                        table.added.append((property, .null))
                    } else {
                        guard let value = Self.defaultValue(of: property) else {
                            throw refusal(
                                "\(label) is a new non-optional attribute without a default that can be stored")
                        }
                        table.columns.append((property, .constant(value)))
                        table.added.append((property, value))
                    }
                    continue
                }
                if previous.name != property.name { table.renamed.append((previous.name, property.name)) }
                if let change = Self.typeChange(from: previous, to: property, newNameOf: newNameOf) {
                    guard hasStages else {
                        throw refusal(
                            "\(label) changes \(change), which is not inferred; a migration stage for version \(version) (MigrationPlan.stage(to: \(version))) can set it from its previous value"
                        )
                    }
                    let value =
                        property.isStoredOptional || property.kind == .toOne
                        ? StoredValue.null : Self.defaultValue(of: property)
                    guard let value else {
                        throw refusal("\(label) changes \(change) and has no default that can be stored")
                    }
                    table.columns.append((property, .constant(value)))
                    table.previous.append(previous.name)
                    table.rebuild = true
                    continue
                }
                if property.kind == .attribute && !property.isStoredOptional && previous.isStoredOptional {
                    guard let value = Self.defaultValue(of: property) else {
                        throw refusal(
                            "\(label) becomes non-optional and has no default that can be stored for the objects that have none"
                        )
                    }
                    table.columns.append((property, .coalesce(previous.name, value)))
                    table.rebuild = true
                    continue
                }
                table.columns.append((property, .column(previous.name)))
                if property.kind == .attribute && property.isStoredOptional != previous.isStoredOptional {
                    table.rebuild = true
                }
                if property.kind == .toOne
                    && SQLiteStore.deleteAction(property, of: entity, in: target)
                        != SQLiteStore.deleteAction(previous, of: old, in: source)
                {
                    table.rebuild = true
                }
            }
            for previous in old.properties where previous.hasColumn && !taken.contains(previous.name) {
                table.dropped.append(previous.name)
                table.previous.append(previous.name)
                // SQLite cannot drop a foreign key's column; one rewrite for several columns.
                if previous.kind == .toOne { table.rebuild = true }
            }
            if table.dropped.count > 1 { table.rebuild = true }
            if !hasStages { table.previous = [] }
            tables.append(table)
        }
    }

    /// Whether the step changes nothing in the database.
    var isEmpty: Bool {
        removedEntities.isEmpty
            && tables.allSatisfy {
                $0.sourceName == $0.entity.name && !$0.rebuild && $0.renamed.isEmpty && $0.dropped.isEmpty
                    && $0.added.isEmpty
            }
    }

    func refusal(_ message: String) -> SkyrosError {
        SkyrosError(
            .migrationFailed,
            "cannot migrate the store to schema version \(version): \(message); the store was left as it was")
    }

    /// The value every existing object takes for a new or newly non-optional attribute: its
    /// declared default, evaluated once; nil when it has none (a schema rebuilt from a
    /// description) or it cannot be stored.
    static func defaultValue(of property: PropertyDescription) -> StoredValue? {
        guard let value = try? property.makeDefault(), !value.isNull, SQLiteStore.fits(value, property) else {
            return nil
        }
        return value
    }

    /// What makes a property's values unusable as they are, as words; nil when they carry over.
    static func typeChange(from old: PropertyDescription, to new: PropertyDescription, newNameOf: [String: String])
        -> String?
    {
        if old.kind != new.kind {
            return "from \(kindName(old)) to \(kindName(new))"
        }
        switch new.kind {
        case .toOne:
            let destination = old.destinationName.map { newNameOf[$0] ?? $0 }
            return destination == new.destinationName
                ? nil : "its destination from \(old.destinationName ?? "?") to \(new.destinationName ?? "?")"
        case .toMany:
            return nil
        case .attribute:
            let (a, b) = (old.codec, new.codec)
            if a.storageType == b.storageType
                && (a.typeName == b.typeName
                    || compatible.contains { $0.contains(a.typeName) && $0.contains(b.typeName) })
            {
                return nil
            }
            return "type from \(a.typeName) to \(b.typeName)"
        }
    }

    /// Type names whose stored values are the same.
    private static let compatible: [Set<String>] = [["int", "int64"], ["double", "float"]]

    private static func kindName(_ property: PropertyDescription) -> String {
        switch property.kind {
        case .attribute: "an attribute of type \(property.codec.typeName)"
        case .toOne: "a to-one relationship"
        case .toMany: "a to-many relationship"
        }
    }
}

/// The versions a migration goes through: each with the schema the store takes and the
/// stages that run after the inferred step to it.
struct MigrationMilestone {
    let version: Int
    let schema: Schema
    let stages: [MigrationPlan.Stage]

    /// The milestones from `storedVersion` to `schema`'s version: one per stage of an earlier
    /// version that has a schema, and the last one.
    static func list(from storedVersion: Int, to schema: Schema, plan: MigrationPlan) -> [MigrationMilestone] {
        var result: [MigrationMilestone] = []
        var pending: [MigrationPlan.Stage] = []
        for stage in plan.stages where stage.version > storedVersion && stage.version <= schema.version {
            pending.append(stage)
            if let intermediate = stage.schema, stage.version < schema.version {
                result.append(MigrationMilestone(version: stage.version, schema: intermediate, stages: pending))
                pending = []
            }
        }
        result.append(MigrationMilestone(version: schema.version, schema: schema, stages: pending))
        return result
    }

    /// Plans every step, throwing the first refusal.
    static func plan(from stored: Schema, milestones: [MigrationMilestone]) throws -> [SchemaStep] {
        var source = stored
        var steps: [SchemaStep] = []
        for milestone in milestones {
            try milestone.schema.validate()
            steps.append(
                try SchemaStep(
                    from: source, to: milestone.schema, version: milestone.version, hasStages: !milestone.stages.isEmpty
                ))
            source = milestone.schema
        }
        return steps
    }
}
