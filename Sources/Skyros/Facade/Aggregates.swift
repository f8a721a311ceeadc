import Foundation
import GRDB
import GRDBSQLite

/// What an aggregate computes over one attribute of the objects a predicate selects.
enum AggregateFunction: String, Sendable {
    case sum, min, max, average
}

extension SQLiteStore {
    /// An aggregate of one column over the rows a request selects (its sort and slice
    /// ignored), computed by SQL: NULLs are left out; nil when no row has a value.
    func aggregate(_ function: AggregateFunction, column: String, request: StoreRequest) throws -> StoredValue {
        var unsorted = request
        unsorted.sortKeys = []
        let quoted = "t0.\(SQLBuilder.quote(column))"
        let integerColumn =
            schema.entity(named: request.entityName)?.property(named: column)?.codec.storageType == .integer
        let expression: String
        switch function {
        // An integer column's sum is exact (SUM); it falls back to TOTAL, a real, when it overflows.
        case .sum: expression = integerColumn ? "SUM(\(quoted))" : "TOTAL(\(quoted)), COUNT(\(quoted))"
        case .min: expression = "MIN(\(quoted))"
        case .max: expression = "MAX(\(quoted))"
        case .average: expression = "AVG(\(quoted))"
        }
        func run(_ expression: String) throws -> StoredValue {
            var builder = SQLBuilder(schema: schema)
            let sql = try builder.select(expression, for: unsorted, sorted: false, sliced: false)
            return try read { db in
                var result = StoredValue.null
                try Self.query(db, sql, builder.arguments) { statement in
                    let empty = sqlite3_column_count(statement) > 1 && sqlite3_column_int64(statement, 1) == 0
                    result = empty ? .null : Self.value(statement, 0)
                }
                return result
            }
        }
        do {
            return try run(expression)
        } catch let error as SkyrosError where function == .sum && integerColumn && error.message.contains("overflow") {
            return try run("TOTAL(\(quoted)), COUNT(\(quoted))")
        }
    }

    /// How many rows a request selects for each value of a column (NULL included).
    func groupCounts(column: String, request: StoreRequest) throws -> [(StoredValue, Int)] {
        var unsorted = request
        unsorted.sortKeys = []
        var builder = SQLBuilder(schema: schema)
        let quoted = "t0.\(SQLBuilder.quote(column))"
        let sql =
            try builder.select("\(quoted), COUNT(*)", for: unsorted, sorted: false, sliced: false)
            + " GROUP BY \(quoted)"
        return try read { db in
            var result: [(StoredValue, Int)] = []
            try Self.query(db, sql, builder.arguments) { statement in
                result.append((Self.value(statement, 0), Int(sqlite3_column_int64(statement, 1))))
            }
            return result
        }
    }

    /// The values of a column over the rows a request selects, each once, in the store's order.
    func distinctValues(column: String, request: StoreRequest) throws -> [StoredValue] {
        try groupCounts(column: column, request: request).map(\.0).sorted {
            StoredValue.compare($0, $1) == .orderedAscending
        }
    }

    /// The values of a column over the rows a request selects (for what SQL cannot add up: decimals).
    func columnValues(column: String, request: StoreRequest) throws -> [StoredValue] {
        var unsorted = request
        unsorted.sortKeys = []
        var builder = SQLBuilder(schema: schema)
        let sql = try builder.select("t0.\(SQLBuilder.quote(column))", for: unsorted, sorted: false, sliced: false)
        return try read { db in
            var result: [StoredValue] = []
            try Self.query(db, sql, builder.arguments) { result.append(Self.value($0, 0)) }
            return result
        }
    }
}

extension ObjectContext {
    /// The SQLite store under this context when neither it nor a context above it has pending
    /// changes of the entity: aggregates then run in SQL. Nil otherwise (they are computed
    /// from the rows as this context sees them).
    func aggregatingStore(for entityName: String) -> SQLiteStore? {
        var store: any ObjectStore = self
        while let context = store as? ObjectContext {
            if context.performAndWait({ context.hasPendingChanges(of: entityName) }) { return nil }
            store = context.parent
        }
        return store as? SQLiteStore
    }

    /// The values of one attribute over the objects a request selects, as this context sees
    /// them (pending changes included).
    func attributeValues(_ request: StoreRequest, index: Int) throws -> [StoredValue] {
        var values: [StoredValue] = []
        try forEachSnapshot(request) { _, row, _ in values.append(row[index]) }
        return values
    }
}

/// Aggregates over an attribute, computed by SQL, including the context's pending changes.
///
/// ```swift
/// let total = try Order.sum(\.amount, where: #Predicate { $0.paid }, in: context)
/// let oldest = try User.max(\.age, in: context)                       // Int?: nil when there is none
/// let byCity = try User.count(groupedBy: \.city, in: context)         // [String: Int]
/// let cities = try User.distinct(\.city, in: context)                 // [String], in the store's order
/// ```
///
/// NULLs are left out, as in SQL. When the context (or one above it) has unsaved changes of
/// the entity, or the store is a group's daemon, the aggregate is computed from the objects
/// as the context sees them instead: the same result, without SQL's speed. Decimals are
/// added up exactly, in Swift.
extension ManagedObject {
    /// The attribute `keyPath` leads to, for an aggregate.
    static func aggregated(_ keyPath: AnyKeyPath, _ function: String, in schema: Schema) throws -> PropertyDescription {
        // The schema's entity: for a class of a hierarchy, the property's place in its table.
        let entityDescription = schema.entity(for: Self.self) ?? Self.entityDescription
        guard let property = entityDescription.property(for: keyPath), property.kind == .attribute else {
            throw SkyrosError(
                .unsupportedPredicate,
                "\(function) needs a stored attribute of \(entityDescription.name), not \(keyPath)")
        }
        return property
    }

    static func aggregateRequest(_ predicate: Predicate<Self>?, _ context: ObjectContext) throws -> StoreRequest {
        try FetchDescriptor<Self>(predicate: predicate).storeRequest(schema: context.schema)
    }

    /// One aggregate of an attribute: by SQL when the store can, else over the values.
    static func aggregate(
        _ function: AggregateFunction, _ keyPath: AnyKeyPath, _ predicate: Predicate<Self>?, _ context: ObjectContext
    ) throws -> StoredValue {
        let property = try aggregated(keyPath, function.rawValue, in: context.schema)
        let request = try aggregateRequest(predicate, context)
        let isDecimal = SQLiteStore.isDecimal(property)
        do {
            if let store = context.aggregatingStore(for: request.entityName),
                !(isDecimal && (function == .sum || function == .average))
            {
                return try store.aggregate(function, column: property.name, request: request)
            }
            let values = try context.attributeValues(request, index: property.index).filter { !$0.isNull }
            return try fold(function, values, isDecimal: isDecimal)
        } catch {
            throw SkyrosError.wrap(error)
        }
    }

    static func fold(_ function: AggregateFunction, _ values: [StoredValue], isDecimal: Bool) throws -> StoredValue {
        guard let first = values.first else { return .null }
        switch function {
        case .min:
            return values.dropFirst().reduce(first) { StoredValue.compare($1, $0) == .orderedAscending ? $1 : $0 }
        case .max:
            return values.dropFirst().reduce(first) { StoredValue.compare($1, $0) == .orderedDescending ? $1 : $0 }
        case .sum, .average:
            if isDecimal {
                let decimals = values.compactMap { Decimal(storedValue: $0) }
                let total = decimals.reduce(Decimal(0), +)
                return (function == .sum ? total : total / Decimal(decimals.count)).storedValue
            }
            if function == .sum, values.allSatisfy({ if case .integer = $0 { true } else { false } }) {
                var total: Int64 = 0
                for case .integer(let value) in values {
                    let (sum, overflow) = total.addingReportingOverflow(value)
                    if overflow { return .real(values.reduce(0.0) { $0 + (Double(storedValue: $1) ?? 0) }) }
                    total = sum
                }
                return .integer(total)
            }
            let total = values.reduce(0.0) { $0 + (Double(storedValue: $1) ?? 0) }
            return .real(function == .sum ? total : total / Double(values.count))
        }
    }

    static func decode<V: AttributeValue>(_ value: StoredValue, as type: V.Type, _ function: String) throws -> V? {
        if value.isNull { return nil }
        guard let decoded = V(storedValue: value) else {
            throw SkyrosError(
                .valueNotStorable, "\(function) of \(entityDescription.name) gave \(value), which is not a \(V.self)")
        }
        return decoded
    }

    /// The sum of an attribute over the objects the predicate selects (zero when there is none).
    public static func sum<V: AttributeValue & AdditiveArithmetic>(
        _ keyPath: KeyPath<Self, V>, where predicate: Predicate<Self>? = nil, in context: ObjectContext
    ) throws -> V {
        try decode(aggregate(.sum, keyPath, predicate, context), as: V.self, "sum") ?? .zero
    }

    /// The sum of an optional attribute (nil values left out; zero when there is none).
    public static func sum<V: AttributeValue & AdditiveArithmetic>(
        _ keyPath: KeyPath<Self, V?>, where predicate: Predicate<Self>? = nil, in context: ObjectContext
    ) throws -> V {
        try decode(aggregate(.sum, keyPath, predicate, context), as: V.self, "sum") ?? .zero
    }

    /// The smallest value of an attribute, in the store's order; nil when no object is selected.
    public static func min<V: AttributeValue>(
        _ keyPath: KeyPath<Self, V>, where predicate: Predicate<Self>? = nil, in context: ObjectContext
    ) throws -> V? {
        try decode(aggregate(.min, keyPath, predicate, context), as: V.self, "min")
    }

    /// The smallest value of an optional attribute (nil values left out).
    public static func min<V: AttributeValue>(
        _ keyPath: KeyPath<Self, V?>, where predicate: Predicate<Self>? = nil, in context: ObjectContext
    ) throws -> V? {
        try decode(aggregate(.min, keyPath, predicate, context), as: V.self, "min")
    }

    /// The largest value of an attribute, in the store's order; nil when no object is selected.
    public static func max<V: AttributeValue>(
        _ keyPath: KeyPath<Self, V>, where predicate: Predicate<Self>? = nil, in context: ObjectContext
    ) throws -> V? {
        try decode(aggregate(.max, keyPath, predicate, context), as: V.self, "max")
    }

    /// The largest value of an optional attribute (nil values left out).
    public static func max<V: AttributeValue>(
        _ keyPath: KeyPath<Self, V?>, where predicate: Predicate<Self>? = nil, in context: ObjectContext
    ) throws -> V? {
        try decode(aggregate(.max, keyPath, predicate, context), as: V.self, "max")
    }

    /// The mean of a numeric attribute; nil when no object is selected.
    public static func average<V: AttributeValue & Numeric>(
        _ keyPath: KeyPath<Self, V>, where predicate: Predicate<Self>? = nil, in context: ObjectContext
    ) throws -> Double? {
        try decode(aggregate(.average, keyPath, predicate, context), as: Double.self, "average")
    }

    /// The mean of an optional numeric attribute (nil values left out); nil when none has a value.
    public static func average<V: AttributeValue & Numeric>(
        _ keyPath: KeyPath<Self, V?>, where predicate: Predicate<Self>? = nil, in context: ObjectContext
    ) throws -> Double? {
        try decode(aggregate(.average, keyPath, predicate, context), as: Double.self, "average")
    }

    /// The exact mean of a decimal attribute; nil when no object is selected.
    public static func average(
        _ keyPath: KeyPath<Self, Decimal>, where predicate: Predicate<Self>? = nil, in context: ObjectContext
    ) throws -> Decimal? {
        try decode(aggregate(.average, keyPath, predicate, context), as: Decimal.self, "average")
    }

    /// How many objects the predicate selects for each value of an attribute.
    public static func count<V: AttributeValue & Hashable>(
        groupedBy keyPath: KeyPath<Self, V>, where predicate: Predicate<Self>? = nil, in context: ObjectContext
    ) throws -> [V: Int] {
        var result: [V: Int] = [:]
        for (value, count) in try groups(keyPath, predicate, context) {
            guard let key = try decode(value, as: V.self, "count(groupedBy:)") else { continue }
            result[key, default: 0] += count
        }
        return result
    }

    /// How many objects the predicate selects for each value of an optional attribute (nil: those without one).
    public static func count<V: AttributeValue & Hashable>(
        groupedBy keyPath: KeyPath<Self, V?>, where predicate: Predicate<Self>? = nil, in context: ObjectContext
    ) throws -> [V?: Int] {
        var result: [V?: Int] = [:]
        for (value, count) in try groups(keyPath, predicate, context) {
            result[try decode(value, as: V.self, "count(groupedBy:)"), default: 0] += count
        }
        return result
    }

    /// The values an attribute takes over the objects the predicate selects, each once, in the
    /// store's order (strings byte by byte).
    public static func distinct<V: AttributeValue & Hashable>(
        _ keyPath: KeyPath<Self, V>, where predicate: Predicate<Self>? = nil, in context: ObjectContext
    ) throws -> [V] {
        try groups(keyPath, predicate, context).map(\.0).sorted { StoredValue.compare($0, $1) == .orderedAscending }
            .compactMap { try decode($0, as: V.self, "distinct") }
    }

    /// The values an optional attribute takes (nil left out), each once, in the store's order.
    public static func distinct<V: AttributeValue & Hashable>(
        _ keyPath: KeyPath<Self, V?>, where predicate: Predicate<Self>? = nil, in context: ObjectContext
    ) throws -> [V] {
        try groups(keyPath, predicate, context).map(\.0).filter { !$0.isNull }
            .sorted { StoredValue.compare($0, $1) == .orderedAscending }
            .compactMap { try decode($0, as: V.self, "distinct") }
    }

    static func groups(_ keyPath: AnyKeyPath, _ predicate: Predicate<Self>?, _ context: ObjectContext) throws -> [(
        StoredValue, Int
    )] {
        let property = try aggregated(keyPath, "count(groupedBy:)", in: context.schema)
        let request = try aggregateRequest(predicate, context)
        do {
            if let store = context.aggregatingStore(for: request.entityName) {
                return try store.groupCounts(column: property.name, request: request)
            }
            var counts: [StoredValue: Int] = [:]
            for value in try context.attributeValues(request, index: property.index) { counts[value, default: 0] += 1 }
            return Array(counts)
        } catch {
            throw SkyrosError.wrap(error)
        }
    }
}
