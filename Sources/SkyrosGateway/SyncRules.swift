import Foundation
import Skyros
import Yams

/// A gateway's sync rules (`sync-rules.yaml`): named buckets, each parameterized by claims of
/// the machine's token, selecting the rows of entities whose column (reached through to-one
/// relationships) equals a parameter or a constant. A machine holds one instance of each bucket
/// per value of its parameters its token gives.
///
/// ```yaml
/// buckets:
///   own:                                  # one bucket per value of its parameters
///     parameters:
///       who: token.sub                    # a claim of the machine's token
///     entities:
///       TodoList: owner = bucket.who
///       TodoItem: list.owner = bucket.who   # through the to-one `list`
///   news:                                 # no parameters: every machine holds it
///     entities:
///       Announcement: true
/// ```
///
/// A condition is `true`, or comparisons `path = operand` joined by `and`; an operand is
/// `bucket.<parameter>`, a quoted text (`'open'` or `"open"`; the quote written twice inside
/// it, `'it''s'`), a whole number, `true` or `false`.
/// Parsing checks the form (``parse(_:file:)``); ``check(against:)`` checks the names against a
/// schema. Every problem names the file, the line and the column.
public struct SyncRules: Sendable, Equatable {
    /// The buckets, in the file's order.
    public var buckets: [Bucket]

    /// Rules of these buckets (``parse(_:file:)`` reads them from a file).
    public init(buckets: [Bucket]) {
        self.buckets = buckets
    }

    /// A named bucket.
    public struct Bucket: Sendable, Equatable {
        /// Its name.
        public var name: String
        /// Its parameters, in the file's order: each a name and the token claim it takes.
        public var parameters: [Parameter]
        /// The rows it selects, entity by entity, in the file's order.
        public var entities: [EntityRule]
        /// Where it is defined.
        public var location: Location
    }

    /// A bucket parameter: `who: token.sub`.
    public struct Parameter: Sendable, Equatable {
        public var name: String
        /// The claim (`sub`, or any other claim of the token).
        public var claim: String
        public var location: Location
    }

    /// An entity's rows in a bucket.
    public struct EntityRule: Sendable, Equatable {
        public var entity: String
        public var condition: Condition
        public var location: Location
    }

    /// Which rows of an entity a bucket holds.
    public enum Condition: Sendable, Equatable {
        /// Every row.
        case all
        /// The rows for which every comparison holds.
        case comparisons([Comparison])
    }

    /// `path = operand`: the value reached from the row through `path` (to-one relationships,
    /// then an attribute) equals the operand.
    public struct Comparison: Sendable, Equatable {
        /// To-one relationships, then an attribute.
        public var path: [String]
        /// What the value equals.
        public var operand: Operand

        public init(path: [String], operand: Operand) {
            self.path = path
            self.operand = operand
        }
    }

    /// The right side of a comparison.
    public enum Operand: Sendable, Equatable, CustomStringConvertible {
        /// `bucket.<name>`: the parameter's value.
        case parameter(String)
        /// A quoted text.
        case text(String)
        /// A whole number.
        case integer(Int64)
        /// `true` or `false`.
        case bool(Bool)

        /// As the rules write it.
        public var description: String {
            switch self {
            case .parameter(let name): "bucket.\(name)"
            case .text(let text): "'\(text)'"
            case .integer(let number): String(number)
            case .bool(let value): String(value)
            }
        }
    }

    /// A place in the rules file.
    public struct Location: Sendable, Equatable, CustomStringConvertible {
        public var file: String
        public var line: Int
        public var column: Int
        public var description: String { "\(file):\(line):\(column)" }
    }

    /// What is wrong with a rules file, where.
    public struct Problem: Error, Sendable, Equatable, CustomStringConvertible {
        public var location: Location
        public var message: String
        public var description: String { "\(location): \(message)" }
    }

    /// The rules a file's problems (one or more) kept from being read.
    public struct Invalid: Error, Sendable, CustomStringConvertible {
        public var problems: [Problem]
        public var description: String { problems.map(\.description).joined(separator: "\n") }
        /// As a ``SkyrosError`` (``SkyrosError/Code/syncConfiguration``), every problem on a line.
        public var skyrosError: SkyrosError { SkyrosError(.syncConfiguration, "invalid sync rules:\n\(description)") }
    }

    // MARK: - Reading

    /// The rules of the file at `path`.
    ///
    /// - Throws: ``Invalid`` with every problem found; a `SkyrosError` when the file cannot be read.
    public static func load(_ path: String) throws -> SyncRules {
        guard let data = FileManager.default.contents(atPath: path), let text = String(data: data, encoding: .utf8)
        else {
            throw SkyrosError(.syncConfiguration, "cannot read the sync rules file \(path)")
        }
        return try parse(text, file: path)
    }

    /// The rules of a YAML text (`file` names it in problems).
    ///
    /// - Throws: ``Invalid`` with every problem found.
    public static func parse(_ yaml: String, file: String = "sync-rules.yaml") throws -> SyncRules {
        var problems: [Problem] = []
        func at(_ node: Node?) -> Location {
            // Yams' marks count from 1.
            Location(file: file, line: node?.mark?.line ?? 1, column: node?.mark?.column ?? 1)
        }
        let root: Node?
        do {
            root = try Yams.compose(yaml: yaml)
        } catch let error as YamlError {
            throw Invalid(problems: [
                Problem(location: Self.location(of: error, file: file), message: "not YAML: \(error)")
            ])
        }
        guard let mapping = root?.mapping, let bucketsNode = mapping["buckets"] else {
            throw Invalid(problems: [
                Problem(location: at(root), message: "the rules need a `buckets:` mapping at the top")
            ])
        }
        for (key, _) in mapping where key.string != "buckets" {
            problems.append(Problem(location: at(key), message: "unknown key `\(key.string ?? "?")` (only `buckets`)"))
        }
        guard let bucketNodes = bucketsNode.mapping else {
            throw Invalid(problems: [Problem(location: at(bucketsNode), message: "`buckets` must map names to buckets")]
            )
        }
        var buckets: [Bucket] = []
        for (nameNode, body) in bucketNodes {
            guard let name = nameNode.string, Self.isName(name) else {
                problems.append(Problem(location: at(nameNode), message: "a bucket's name is letters, digits and _"))
                continue
            }
            guard let fields = body.mapping else {
                problems.append(Problem(location: at(body), message: "bucket `\(name)` must be a mapping"))
                continue
            }
            if buckets.contains(where: { $0.name == name }) {
                problems.append(Problem(location: at(nameNode), message: "bucket `\(name)` is defined twice"))
                continue
            }
            var bucket = Bucket(name: name, parameters: [], entities: [], location: at(nameNode))
            for (key, _) in fields where key.string != "parameters" && key.string != "entities" {
                problems.append(
                    Problem(location: at(key), message: "unknown key `\(key.string ?? "?")` in bucket `\(name)`"))
            }
            if let parameters = fields["parameters"] {
                if let pairs = parameters.mapping {
                    for (parameterName, source) in pairs {
                        guard let parameter = parameterName.string, Self.isName(parameter) else {
                            problems.append(
                                Problem(
                                    location: at(parameterName), message: "a parameter's name is letters, digits and _")
                            )
                            continue
                        }
                        guard let text = source.string, text.hasPrefix("token."), Self.isName(String(text.dropFirst(6)))
                        else {
                            problems.append(
                                Problem(
                                    location: at(source),
                                    message:
                                        "parameter `\(parameter)` must take a claim of the token: `token.<claim>` (token.sub)"
                                ))
                            continue
                        }
                        guard !bucket.parameters.contains(where: { $0.name == parameter }) else {
                            problems.append(
                                Problem(
                                    location: at(parameterName), message: "parameter `\(parameter)` is defined twice"))
                            continue
                        }
                        bucket.parameters.append(
                            Parameter(name: parameter, claim: String(text.dropFirst(6)), location: at(parameterName)))
                    }
                } else {
                    problems.append(
                        Problem(location: at(parameters), message: "`parameters` must map names to `token.<claim>`"))
                }
            }
            guard let entities = fields["entities"]?.mapping, !entities.isEmpty else {
                problems.append(
                    Problem(location: at(nameNode), message: "bucket `\(name)` selects no entity (`entities:`)"))
                continue
            }
            for (entityNode, conditionNode) in entities {
                guard let entity = entityNode.string else {
                    problems.append(Problem(location: at(entityNode), message: "an entity's name is expected"))
                    continue
                }
                guard !bucket.entities.contains(where: { $0.entity == entity }) else {
                    problems.append(
                        Problem(
                            location: at(entityNode),
                            message: "`\(entity)` is named twice in bucket `\(name)` (join conditions with `and`)"))
                    continue
                }
                let text = conditionNode.string ?? ""
                switch Self.condition(text, parameters: Set(bucket.parameters.map(\.name))) {
                case .success(let condition):
                    bucket.entities.append(
                        EntityRule(entity: entity, condition: condition, location: at(conditionNode)))
                case .failure(let reason):
                    problems.append(Problem(location: at(conditionNode), message: "\(entity): \(reason.message)"))
                }
            }
            buckets.append(bucket)
        }
        guard problems.isEmpty else { throw Invalid(problems: problems) }
        return SyncRules(buckets: buckets)
    }

    private static func location(of error: YamlError, file: String) -> Location {
        switch error {
        case .scanner(_, _, let mark, _), .parser(_, _, let mark, _):
            Location(file: file, line: mark.line, column: mark.column)
        default:
            Location(file: file, line: 1, column: 1)
        }
    }

    /// Why a condition or a path is refused.
    struct Reason: Error {
        var message: String
        init(_ message: String) { self.message = message }
    }

    private static func isName(_ text: String) -> Bool {
        guard let first = text.unicodeScalars.first, first == "_" || CharacterSet.letters.contains(first) else {
            return false
        }
        return text.unicodeScalars.allSatisfy { $0 == "_" || CharacterSet.alphanumerics.contains($0) }
    }

    /// A condition's text: `true`, or `path = operand [and path = operand]…`.
    static func condition(_ text: String, parameters: Set<String>) -> Result<Condition, Reason> {
        let trimmed = text.trimmingCharacters(in: .whitespaces)
        if trimmed == "true" { return .success(.all) }
        if trimmed.isEmpty {
            return .failure(Reason("a condition is expected (`true`, or `column = bucket.parameter`)"))
        }
        var comparisons: [Comparison] = []
        for part in splitOutsideQuotes(trimmed, on: " and ") {
            let sides = part.split(separator: "=", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
            guard sides.count == 2, !sides[0].isEmpty, !sides[1].isEmpty else {
                return .failure(Reason("`\(part.trimmingCharacters(in: .whitespaces))` is not `path = operand`"))
            }
            let path = sides[0].split(separator: ".", omittingEmptySubsequences: false).map(String.init)
            guard path.allSatisfy(isName) else {
                return .failure(Reason("`\(sides[0])` is not a property path (`list.owner`)"))
            }
            let operandText = sides[1]
            let operand: Operand
            if operandText.hasPrefix("bucket.") {
                let name = String(operandText.dropFirst(7))
                guard parameters.contains(name) else {
                    return .failure(Reason("`\(operandText)`: the bucket has no parameter `\(name)`"))
                }
                operand = .parameter(name)
            } else if operandText.count >= 2,
                let quote = operandText.first, quote == "'" || quote == "\"", operandText.last == quote
            {
                // A quote inside is written twice, as in SQL (`'it''s'`).
                let inner = String(operandText.dropFirst().dropLast())
                operand = .text(inner.replacingOccurrences(of: "\(quote)\(quote)", with: "\(quote)"))
            } else if let number = Int64(operandText) {
                operand = .integer(number)
            } else if operandText == "true" || operandText == "false" {
                operand = .bool(operandText == "true")
            } else {
                return .failure(
                    Reason(
                        "`\(operandText)` is not an operand: `bucket.<parameter>`, a quoted text, a whole number, true or false"
                    ))
            }
            comparisons.append(Comparison(path: path, operand: operand))
        }
        return .success(.comparisons(comparisons))
    }

    /// `text` cut at each `separator` that is not inside a quoted text (`'…'` or `"…"`).
    static func splitOutsideQuotes(_ text: String, on separator: String) -> [String] {
        var parts: [String] = []
        var current = ""
        var quote: Character?
        var index = text.startIndex
        while index < text.endIndex {
            let character = text[index]
            if let open = quote {
                if character == open { quote = nil }
            } else if character == "'" || character == "\"" {
                quote = character
            } else if text[index...].hasPrefix(separator) {
                parts.append(current)
                current = ""
                index = text.index(index, offsetBy: separator.count)
                continue
            }
            current.append(character)
            index = text.index(after: index)
        }
        parts.append(current)
        return parts
    }

    // MARK: - Against a schema

    /// What the rules are checked against: each entity's properties, as a model's schema or
    /// the server's tables have them.
    public typealias Catalog = [String: [String: CatalogProperty]]

    /// A property of a ``Catalog``.
    public enum CatalogProperty: Sendable, Equatable {
        /// A value: its kind (`text`, `integer`, `real`, `boolean`, `blob`, or another name).
        case attribute(kind: String)
        /// A to-one relationship to the entity named.
        case toOne(destination: String)
        /// A to-many relationship (none of the server's columns is one).
        case toMany
    }

    /// The catalog of a model's schema.
    public static func catalog(of schema: Schema) -> Catalog {
        var catalog: Catalog = [:]
        for entity in schema.entities {
            var properties: [String: CatalogProperty] = [:]
            for property in entity.properties {
                switch property.kind {
                case .attribute:
                    let kind =
                        switch property.codec.typeName {
                        case "bool": "boolean"
                        case "date": "timestamp"
                        default: "\(property.codec.storageType)"
                        }
                    properties[property.name] = .attribute(kind: kind)
                case .toOne: properties[property.name] = .toOne(destination: property.destinationName ?? "")
                case .toMany: properties[property.name] = .toMany
                }
            }
            catalog[entity.name] = properties
        }
        return catalog
    }

    /// The problems of the rules against a model's `schema` (``check(against:)-(Catalog)``).
    public func check(against schema: Schema) -> [Problem] {
        check(against: Self.catalog(of: schema))
    }

    /// The problems of the rules against `catalog`: an entity it does not have, a path whose
    /// steps are not to-one relationships ending at an attribute, a constant of the wrong
    /// kind for its attribute. Empty when the rules fit.
    public func check(against catalog: Catalog) -> [Problem] {
        var problems: [Problem] = []
        for bucket in buckets {
            for rule in bucket.entities {
                guard catalog[rule.entity] != nil else {
                    problems.append(
                        Problem(
                            location: rule.location,
                            message: "the schema has no entity `\(rule.entity)` (bucket `\(bucket.name)`)"))
                    continue
                }
                guard case .comparisons(let comparisons) = rule.condition else { continue }
                for comparison in comparisons {
                    switch Self.resolve(comparison.path, from: rule.entity, in: catalog) {
                    case .failure(let reason):
                        problems.append(Problem(location: rule.location, message: "\(rule.entity): \(reason.message)"))
                    case .success(let (name, kind)):
                        if let message = Self.mismatch(comparison.operand, name: name, kind: kind) {
                            problems.append(Problem(location: rule.location, message: "\(rule.entity): \(message)"))
                        }
                    }
                }
            }
        }
        return problems
    }

    /// The attribute (its name and kind) a path ends at, through to-one relationships; why not.
    static func resolve(_ path: [String], from entity: String, in catalog: Catalog) -> Result<(String, String), Reason>
    {
        var current = entity
        for (position, name) in path.enumerated() {
            guard let property = catalog[current]?[name] else {
                return .failure(Reason("`\(current)` has no property `\(name)`"))
            }
            let last = position == path.count - 1
            switch property {
            case .attribute(let kind):
                return last
                    ? .success((name, kind))
                    : .failure(Reason("`\(name)` is an attribute: the path cannot go on past it"))
            case .toOne(let destination):
                if last {
                    return .failure(
                        Reason("`\(name)` is a relationship: compare one of its destination's attributes (`\(name).…`)")
                    )
                }
                guard catalog[destination] != nil else {
                    return .failure(Reason("`\(name)`'s destination is not in the schema"))
                }
                current = destination
            case .toMany:
                return .failure(Reason("`\(name)` is a to-many relationship: a path goes through to-ones only"))
            }
        }
        return .failure(Reason("an empty path"))
    }

    private static func mismatch(_ operand: Operand, name: String, kind: String) -> String? {
        switch (operand, kind) {
        case (.parameter, _), (.text, "text"), (.integer, "integer"), (.integer, "real"), (.bool, "boolean"):
            return nil
        default: return "`\(name)` (\(kind)) cannot equal \(operand)"
        }
    }

    // MARK: - A machine's buckets

    /// One bucket held by a machine: the bucket and its parameters' values (from its token).
    public struct Instance: Sendable, Hashable, CustomStringConvertible {
        /// The bucket's name.
        public var bucket: String
        /// Each parameter's value.
        public var values: [String: String]

        public init(bucket: String, values: [String: String]) {
            self.bucket = bucket
            self.values = values
        }
        /// `own[who=kiosk-7]`, `news[]`.
        public var description: String {
            "\(bucket)[" + values.keys.sorted().map { "\($0)=\(values[$0]!)" }.joined(separator: ",") + "]"
        }
    }

    /// The bucket instances a token holds: one per bucket whose every parameter's claim the
    /// token has (a bucket with no parameter: every machine holds it).
    public func instances(for claims: SyncTokenClaims) -> [Instance] {
        buckets.compactMap { bucket in
            var values: [String: String] = [:]
            for parameter in bucket.parameters {
                let value: String? =
                    parameter.claim == "sub"
                    ? claims.subject
                    : claims.claims[parameter.claim].flatMap { claim in
                        switch claim {
                        case .string, .integer, .number, .bool: claim.description
                        default: nil
                        }
                    }
                guard let value else { return nil }
                values[parameter.name] = value
            }
            return Instance(bucket: bucket.name, values: values)
        }
    }

    /// The SQL condition selecting the rows of `entity` (aliased `t`) in a bucket `instance`,
    /// on the server's tables of schema `qualify` names (`"g"."Entity"`), with its parameters
    /// as text (`$n::text` cast to the column's type by the caller's statement); nil when the
    /// bucket holds no row of the entity.
    ///
    /// A path through to-one relationships becomes nested `EXISTS` subqueries on the
    /// destinations' ids (each relationship's column holds its destination's id).
    public func sqlCondition(
        entity: String, instance: Instance, qualify: (String) -> String, firstParameter: Int = 1
    ) -> (sql: String, parameters: [String])? {
        guard let bucket = buckets.first(where: { $0.name == instance.bucket }),
            let rule = bucket.entities.first(where: { $0.entity == entity })
        else { return nil }
        guard case .comparisons(let comparisons) = rule.condition else { return ("true", []) }
        var parameters: [String] = []
        var clauses: [String] = []
        var aliasCount = 0
        for comparison in comparisons {
            let right: String
            switch comparison.operand {
            case .parameter(let name):
                // An instance without the parameter's value holds nothing (never compared to '').
                guard let value = instance.values[name] else { return nil }
                parameters.append(value)
                right = "$\(firstParameter + parameters.count - 1)"
            case .text(let text):
                parameters.append(text)
                right = "$\(firstParameter + parameters.count - 1)"
            case .integer(let number): right = String(number)
            case .bool(let value): right = value ? "true" : "false"
            }
            // t.list → EXISTS (SELECT 1 FROM "g"."TodoList" AS p1 WHERE p1."_id" = t."list" AND p1."owner" = $1)
            var source = "t"
            var opened = 0
            var sql = ""
            var entityName = entity
            for step in comparison.path.dropLast() {
                aliasCount += 1
                let alias = "p\(aliasCount)"
                // A destination not known (rules not resolved against a schema or the server's
                // tables): no SQL, rather than a table guessed from the relationship's name.
                guard let destination = destination(of: step, from: entityName) else { return nil }
                entityName = destination
                sql +=
                    "EXISTS (SELECT 1 FROM \(qualify(entityName)) AS \(alias) WHERE \(alias).\"_id\" = \(source).\(Self.quote(step)) AND "
                source = alias
                opened += 1
            }
            let column = "\(source).\(Self.quote(comparison.path.last ?? ""))"
            let compare: String =
                switch comparison.operand {
                case .parameter, .text: "\(column)::text = \(right)::text"
                case .integer, .bool: "\(column) = \(right)"
                }
            sql += compare + String(repeating: ")", count: opened)
            clauses.append(sql)
        }
        return (clauses.joined(separator: " AND "), parameters)
    }

    /// The SQL condition selecting the rows of `entity` (aliased `t`) that any of `instances`
    /// holds — a machine's rows of the entity — with its parameters; nil when none holds any
    /// row of it.
    public func sqlCondition(
        entity: String, instances: [Instance], qualify: (String) -> String, firstParameter: Int = 1
    ) -> (sql: String, parameters: [String])? {
        var clauses: [String] = []
        var parameters: [String] = []
        for instance in instances {
            guard
                let (sql, more) = sqlCondition(
                    entity: entity, instance: instance, qualify: qualify,
                    firstParameter: firstParameter + parameters.count)
            else { continue }
            if sql == "true" { return ("true", []) }
            clauses.append("(\(sql))")
            parameters += more
        }
        return clauses.isEmpty ? nil : (clauses.joined(separator: " OR "), parameters)
    }

    /// A statement listing which of the objects of `entity` whose ids are its first parameter
    /// (`$1`, a `uuid[]` as text) are outside the machine's own buckets (those with parameters;
    /// a bucket every machine holds is read-only) — the check of a write: run
    /// before an upload is applied on the objects it updates or deletes (they must be the
    /// machine's), and after, in the same transaction, on those it inserts or updates (they
    /// must still be: no row moved into a bucket the machine does not hold). Every id it
    /// returns refuses the write. With no bucket holding rows of the entity, every id is outside.
    public func outsideStatement(entity: String, instances: [Instance], qualify: (String) -> String) -> (
        sql: String, parameters: [String]
    ) {
        // Only buckets of the machine's own (with parameters) grant writes: a bucket every
        // machine holds (`Checklist: true`) is read-only, or any machine could rewrite any of
        // its rows, and through them move other entities' rows into its own buckets.
        let instances = instances.filter { instance in
            buckets.first { $0.name == instance.bucket }.map { !$0.parameters.isEmpty } ?? false
        }
        let select = "SELECT t.\"_id\"::text FROM \(qualify(entity)) AS t WHERE t.\"_id\" = ANY($1::text::uuid[])"
        guard
            let (condition, parameters) = sqlCondition(
                entity: entity, instances: instances, qualify: qualify, firstParameter: 2)
        else {
            return (select, [])
        }
        return ("\(select) AND NOT coalesce((\(condition)), false)", parameters)
    }

    /// How a row's bucket instances are found, for one bucket's rule of one entity: a
    /// statement selecting, for the rows whose ids are `$1` (a `uuid[]` as text) and that hold
    /// the rule's constant comparisons, `t."_id"` and the value of each of the bucket's
    /// parameters as the row reaches it (through to-ones); a row whose parameters disagree or
    /// are NULL is in no instance of the bucket. A gateway runs it once per change for every
    /// machine (``instanceKey(bucket:values:)``).
    public struct Membership: Sendable {
        /// The bucket.
        public var bucket: String
        /// The entity.
        public var entity: String
        /// The statement.
        public var sql: String
        /// Its parameters after `$1` (the constants compared).
        public var parameters: [String]
        /// The bucket parameter each selected value after the id is, in order.
        public var parameterNames: [String]
    }

    /// The ``Membership`` statements of every bucket's rules (nil destinations: skipped).
    public func memberships(qualify: (String) -> String) -> [Membership] {
        var statements: [Membership] = []
        for bucket in buckets {
            for rule in bucket.entities {
                var values: [String] = []
                var names: [String] = []
                var conditions: [String] = []
                var parameters: [String] = []
                var resolved = true
                if case .comparisons(let comparisons) = rule.condition {
                    for comparison in comparisons {
                        // The value at the end of the path, through nested scalar subqueries.
                        var entityName = rule.entity
                        var expression = ""
                        var steps: [(destination: String, relationship: String)] = []
                        for step in comparison.path.dropLast() {
                            guard let destination = destination(of: step, from: entityName) else {
                                resolved = false
                                break
                            }
                            steps.append((destination, step))
                            entityName = destination
                        }
                        guard resolved else { break }
                        let column = Self.quote(comparison.path.last ?? "")
                        if steps.isEmpty {
                            expression = "t.\(column)"
                        } else {
                            // (SELECT (SELECT p2.col FROM D2 p2 WHERE p2._id = p1.r2) FROM D1 p1 WHERE p1._id = t.r1)
                            var inner = "p\(steps.count).\(column)"
                            for index in stride(from: steps.count - 1, through: 0, by: -1) {
                                let alias = "p\(index + 1)"
                                let source = index == 0 ? "t" : "p\(index)"
                                inner =
                                    "(SELECT \(inner) FROM \(qualify(steps[index].destination)) AS \(alias) WHERE \(alias).\"_id\" = \(source).\(Self.quote(steps[index].relationship)))"
                            }
                            expression = inner
                        }
                        switch comparison.operand {
                        case .parameter(let name):
                            values.append("(\(expression))::text")
                            names.append(name)
                        case .text(let text):
                            parameters.append(text)
                            conditions.append("(\(expression))::text = $\(parameters.count + 1)::text")
                        case .integer(let number):
                            conditions.append("(\(expression)) = \(number)")
                        case .bool(let value):
                            conditions.append("(\(expression)) = \(value ? "true" : "false")")
                        }
                    }
                }
                guard resolved else { continue }
                let select = (["t.\"_id\"::text"] + values).joined(separator: ", ")
                let sql =
                    "SELECT \(select) FROM \(qualify(rule.entity)) AS t WHERE t.\"_id\" = ANY($1::text::uuid[])"
                    + conditions.map { " AND coalesce(\($0), false)" }.joined()
                statements.append(
                    Membership(
                        bucket: bucket.name, entity: rule.entity, sql: sql, parameters: parameters,
                        parameterNames: names))
            }
        }
        return statements
    }

    /// The name of one bucket instance, or of the instances a row is in: the bucket's name and
    /// the parameters' values in the parameters' name order. A row's names only the parameters
    /// its rule compares (none for `Entity: true`: every instance of the bucket holds it); a
    /// machine holds every name of its instances' parameters' subsets (``instanceKeys(of:)``),
    /// so that it has a row when the values the row names are its own.
    public static func instanceKey(bucket: String, values: [String: String]) -> String {
        // Each part with its length: a value holding the separator cannot pass for another key.
        ([bucket] + values.sorted { $0.key < $1.key }.map { "\($0.key)=\($0.value)" })
            .map { "\($0.utf8.count):\($0)" }.joined(separator: "\u{1F}")
    }

    /// Every name (``instanceKey(bucket:values:)``) of the rows `instances` hold: each
    /// instance's with every subset of its parameters' values.
    public static func instanceKeys(of instances: [Instance]) -> Set<String> {
        var keys = Set<String>()
        for instance in instances {
            let values = instance.values.sorted { $0.key < $1.key }
            for mask in 0..<(1 << values.count) {
                var subset: [String: String] = [:]
                for (bit, pair) in values.enumerated() where mask & (1 << bit) != 0 { subset[pair.key] = pair.value }
                keys.insert(instanceKey(bucket: instance.bucket, values: subset))
            }
        }
        return keys
    }

    /// For each entity whose rows a bucket selects through to-one relationships, the
    /// statements that find its rows reaching changed objects of an entity on the way: when a
    /// to-do list moves to another owner, its items (which the change log does not name) change
    /// buckets with it. Each statement selects `t."_id"` as text, its `$1` the changed objects'
    /// ids (a `uuid[]` as text). Nil destinations (rules not resolved) give nothing.
    public func reachingStatements(qualify: (String) -> String) -> [(entity: String, through: String, sql: String)] {
        var seen = Set<String>()
        var statements: [(entity: String, through: String, sql: String)] = []
        for bucket in buckets {
            for rule in bucket.entities {
                guard case .comparisons(let comparisons) = rule.condition else { continue }
                for comparison in comparisons {
                    let steps = Array(comparison.path.dropLast())
                    var entityName = rule.entity
                    var destinations: [String] = []
                    for step in steps {
                        guard let destination = destination(of: step, from: entityName) else { break }
                        destinations.append(destination)
                        entityName = destination
                    }
                    guard destinations.count == steps.count else { continue }
                    for length in 1...max(1, steps.count) where length <= steps.count {
                        // t.list = ANY($1) for one hop; EXISTS (… p1."_id" = t.list AND p1.board = ANY($1)) for two.
                        var condition = "t.\(Self.quote(steps[length - 1])) = ANY($1::text::uuid[])"
                        if length > 1 {
                            var source = "t"
                            var sql = ""
                            for index in 0..<(length - 1) {
                                let alias = "r\(index + 1)"
                                sql +=
                                    "EXISTS (SELECT 1 FROM \(qualify(destinations[index])) AS \(alias) WHERE \(alias).\"_id\" = \(source).\(Self.quote(steps[index])) AND "
                                source = alias
                            }
                            condition =
                                sql + "\(source).\(Self.quote(steps[length - 1])) = ANY($1::text::uuid[])"
                                + String(repeating: ")", count: length - 1)
                        }
                        let key = "\(rule.entity)|\(destinations[length - 1])|\(condition)"
                        guard seen.insert(key).inserted else { continue }
                        statements.append(
                            (
                                rule.entity, destinations[length - 1],
                                "SELECT t.\"_id\"::text FROM \(qualify(rule.entity)) AS t WHERE \(condition)"
                            ))
                    }
                }
            }
        }
        return statements
    }

    /// The destinations of to-one relationships, learned from a schema (``destinations``).
    public var destinations: [String: [String: String]] = [:]

    private func destination(of relationship: String, from entity: String) -> String? {
        destinations[entity]?[relationship]
    }

    /// The rules with the destinations of their paths' relationships taken from `catalog` (the
    /// server's tables, for a gateway).
    public func resolvingDestinations(in catalog: Catalog) -> SyncRules {
        var copy = self
        for (entity, properties) in catalog {
            for (name, property) in properties {
                if case .toOne(let destination) = property {
                    copy.destinations[entity, default: [:]][name] = destination
                }
            }
        }
        return copy
    }

    /// The rules with the destinations of their paths' relationships taken from `schema` (for
    /// ``sqlCondition(entity:instance:qualify:firstParameter:)``).
    public func resolvingDestinations(in schema: Schema) -> SyncRules {
        var copy = self
        for entity in schema.entities {
            for property in entity.properties where property.kind == .toOne {
                if let destination = property.destinationName {
                    copy.destinations[entity.name, default: [:]][property.name] = destination
                }
            }
        }
        return copy
    }

    private static func quote(_ name: String) -> String {
        "\"" + name.replacingOccurrences(of: "\"", with: "\"\"") + "\""
    }
}
