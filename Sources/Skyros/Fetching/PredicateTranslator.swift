import Foundation

/// What a Foundation predicate sub-expression stands for during translation.
enum PredicateTerm {
    /// A value or a boolean.
    case node(PredicateNode)
    /// An object: the one bound to `scope`, or reached from it through to-one relationships.
    case object(scope: Int, path: [String], entity: EntityDescription)
    /// The objects of a to-many relationship.
    case toMany(scope: Int, path: [String], destination: EntityDescription)
}

/// Translates Foundation `Predicate`s into ``PredicateNode``s, one extension per expression
/// type, dispatched by a cast (the pattern of swift-foundation's `NSPredicateConversion`).
struct PredicateTranslator {
    let schema: Schema
    var bindings: [PredicateExpressions.VariableID: PredicateTerm] = [:]
    var nextScope = 1

    init(schema: Schema) { self.schema = schema }

    static func translate<T: ManagedObject>(_ predicate: Predicate<T>, schema: Schema) throws -> PredicateNode {
        let entity = try schema.storage(of: T.self).entity
        var translator = PredicateTranslator(schema: schema)
        translator.bindings[predicate.variable.key] = .object(scope: 0, path: [], entity: entity)
        return try translator.node(predicate.expression)
    }

    mutating func term(_ expression: Any) throws -> PredicateTerm {
        guard let translatable = expression as? any SkyrosPredicateTranslatable else {
            throw unsupported("the expression \(Self.shortName(of: expression)) has no SQL translation")
        }
        return try translatable.skyrosTerm(&self)
    }

    mutating func node(_ expression: Any) throws -> PredicateNode {
        try node(of: term(expression))
    }

    func node(of term: PredicateTerm) throws -> PredicateNode {
        switch term {
        case .node(let node): return node
        case .object(let scope, let path, _):
            return .property(scope: scope, path: path.isEmpty ? [PredicateNode.idProperty] : path)
        case .toMany(_, let path, _):
            throw unsupported(
                "the to-many relationship \(path.joined(separator: ".")) is used as a value; use contains(where:), isEmpty or count"
            )
        }
    }

    func unsupported(_ message: String) -> SkyrosError {
        SkyrosError(.unsupportedPredicate, "predicate not supported: \(message)")
    }

    static func shortName(of value: Any) -> String {
        let name = String(describing: type(of: value))
        return name.replacingOccurrences(of: "PredicateExpressions.", with: "")
    }

    /// Encodes a constant of a predicate.
    func constant(_ value: Any) throws -> StoredValue {
        // The most common constants first, as their codecs store them, without a conformance
        // lookup or a mirror: a predicate is translated on every fetch.
        switch value {
        case let value as Int: return value.storedValue
        case let value as String: return value.storedValue
        case let value as Bool: return value.storedValue
        case let value as Int64: return value.storedValue
        case let value as UUID: return value.storedValue
        case let value as Double where !value.isNaN: return value.storedValue  // NaN: the codec's error
        default: break
        }
        if let object = value as? any ManagedObject { return object.objectID.uuid.storedValue }
        let mirror = Mirror(reflecting: value)
        if mirror.displayStyle == .optional {
            guard let wrapped = mirror.children.first?.value else { return .null }
            return try constant(wrapped)
        }
        guard let codec = AttributeCodecs.anyCodec(for: type(of: value)) else {
            throw unsupported("the constant \(value) of type \(type(of: value)) cannot be stored")
        }
        return try codec.encodeAny(value)
    }
}

protocol SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm
}

extension PredicateExpressions.Variable: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        guard let bound = translator.bindings[key] else { throw translator.unsupported("an unbound variable") }
        return bound
    }
}

extension PredicateExpressions.Value: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        .node(.constant(try translator.constant(value)))
    }
}

extension PredicateExpressions.NilLiteral: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm { .node(.constant(.null)) }
}

extension PredicateExpressions.KeyPath: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        let base = try translator.term(root)
        switch base {
        case .object(let scope, let path, let entity):
            guard let property = entity.property(for: keyPath) else {
                throw translator.unsupported(
                    "the key path \(keyPath) (\(entity.name) → \(Output.self)) is not a persistent property of \(entity.name) (computed and @Transient properties cannot be fetched on)"
                )
            }
            switch property.kind {
            case .attribute:
                return .node(.property(scope: scope, path: path + [property.name]))
            case .toOne:
                let destination = try translator.schema.requireEntity(property.destinationName!)
                return .object(scope: scope, path: path + [property.name], entity: destination)
            case .toMany:
                guard path.isEmpty else {
                    throw translator.unsupported(
                        "the to-many \(property.name) is reached through a to-one relationship")
                }
                let destination = try translator.schema.requireEntity(property.destinationName!)
                return .toMany(scope: scope, path: [property.name], destination: destination)
            }
        case .toMany(let scope, let path, let destination):
            func isEmptyPath<D: ManagedObject>(_: D.Type) -> Bool { keyPath == \[D].isEmpty }
            func isCountPath<D: ManagedObject>(_: D.Type) -> Bool { keyPath == \[D].count }
            if isEmptyPath(destination.objectType) {
                return .node(.compare(.equal, .count(scope: scope, path: path), .constant(.integer(0))))
            }
            if isCountPath(destination.objectType) { return .node(.count(scope: scope, path: path)) }
            throw translator.unsupported("\(keyPath) on a to-many relationship (isEmpty and count are supported)")
        case .node(let node):
            if keyPath == \String.localizedLowercase { return .node(.lowercased(node)) }
            throw translator.unsupported("the key path \(keyPath) (\(Root.Output.self) → \(Output.self)) on a value")
        }
    }
}

extension PredicateExpressions.OptionalFlatMap: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        let base = try translator.term(wrapped)
        translator.bindings[variable.key] = base
        return try translator.term(transform)
    }
}

extension PredicateExpressions.ForcedUnwrap: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        try translator.term(inner)
    }
}

extension PredicateExpressions.Equal: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        .node(.compare(.equal, try translator.node(lhs), try translator.node(rhs)))
    }
}

extension PredicateExpressions.NotEqual: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        .node(.compare(.notEqual, try translator.node(lhs), try translator.node(rhs)))
    }
}

extension PredicateExpressions.Comparison: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        let operation: PredicateNode.ComparisonOperator =
            switch op {
            case .lessThan: .less
            case .lessThanOrEqual: .lessOrEqual
            case .greaterThan: .greater
            case .greaterThanOrEqual: .greaterOrEqual
            @unknown default: .equal
            }
        return .node(.compare(operation, try translator.node(lhs), try translator.node(rhs)))
    }
}

extension PredicateExpressions.Conjunction: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        .node(.and(try translator.node(lhs), try translator.node(rhs)))
    }
}

extension PredicateExpressions.Disjunction: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        .node(.or(try translator.node(lhs), try translator.node(rhs)))
    }
}

extension PredicateExpressions.Negation: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        .node(.not(try translator.node(wrapped)))
    }
}

extension PredicateExpressions.CollectionContainsCollection: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        .node(.contains(try translator.node(base), try translator.node(other), caseInsensitive: false))
    }
}

extension PredicateExpressions.SequenceStartsWith: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        .node(.startsWith(try translator.node(base), try translator.node(prefix)))
    }
}

extension PredicateExpressions.SequenceContains: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        let collection = try translator.term(sequence)
        switch collection {
        case .toMany(let scope, let path, _):
            let variable = translator.nextScope
            translator.nextScope += 1
            let id = PredicateNode.property(scope: variable, path: [PredicateNode.idProperty])
            return .node(
                .anyMatch(
                    scope: scope, path: path, variable: variable,
                    .compare(.equal, id, try translator.node(element))))
        case .node(.constant):
            guard let constant = sequence as? any SkyrosConstantSequence else {
                throw translator.unsupported("contains on \(PredicateTranslator.shortName(of: sequence))")
            }
            let values = try constant.skyrosElements().map { try translator.constant($0) }
            return .node(.isIn(try translator.node(element), values))
        default:
            throw translator.unsupported(
                "contains on \(PredicateTranslator.shortName(of: sequence)) (a constant array or a to-many relationship is needed)"
            )
        }
    }
}

/// A constant array in a predicate.
protocol SkyrosConstantSequence {
    func skyrosElements() -> [Any]
}

extension PredicateExpressions.Value: SkyrosConstantSequence where Output: Sequence {
    func skyrosElements() -> [Any] { value.map { $0 as Any } }
}

extension PredicateExpressions.SequenceContainsWhere: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        guard case .toMany(let scope, let path, let destination) = try translator.term(sequence) else {
            throw translator.unsupported("contains(where:) on something else than a to-many relationship")
        }
        let scopeOfVariable = translator.nextScope
        translator.nextScope += 1
        translator.bindings[variable.key] = .object(scope: scopeOfVariable, path: [], entity: destination)
        return .node(.anyMatch(scope: scope, path: path, variable: scopeOfVariable, try translator.node(test)))
    }
}

extension PredicateExpressions.SequenceAllSatisfy: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        guard case .toMany(let scope, let path, let destination) = try translator.term(sequence) else {
            throw translator.unsupported("allSatisfy on something else than a to-many relationship")
        }
        let scopeOfVariable = translator.nextScope
        translator.nextScope += 1
        translator.bindings[variable.key] = .object(scope: scopeOfVariable, path: [], entity: destination)
        return .node(
            .not(.anyMatch(scope: scope, path: path, variable: scopeOfVariable, .not(try translator.node(test)))))
    }
}

extension PredicateExpressions {
    /// Case-insensitive string containment, written `$0.name.localizedStandardContains("doe")`
    /// in a `#Predicate` (Foundation on Linux lacks it; Skyros provides it, translated to SQL
    /// as an ASCII case-insensitive match).
    public struct SkyrosCaseInsensitiveContains<Base: PredicateExpression, Other: PredicateExpression>:
        PredicateExpression
    where Base.Output == String, Other.Output == String {
        /// The string searched.
        public let base: Base
        /// The string searched for.
        public let other: Other
        /// The expression `base.localizedStandardContains(other)`.
        public init(base: Base, other: Other) {
            self.base = base
            self.other = other
        }
        /// Whether `base` contains `other`, ignoring case (always true for an empty `other`): the
        /// evaluation of pending changes in memory; the store's SQL ignores the case of ASCII letters.
        public func evaluate(_ bindings: PredicateBindings) throws -> Bool {
            let haystack = try base.evaluate(bindings).lowercased()
            let needle = try other.evaluate(bindings).lowercased()
            return needle.isEmpty || haystack.contains(needle)
        }
    }

    /// Used by `#Predicate` for `localizedStandardContains`.
    public static func build_localizedStandardContains<Base, Other>(_ base: Base, _ other: Other)
        -> SkyrosCaseInsensitiveContains<Base, Other>
    {
        SkyrosCaseInsensitiveContains(base: base, other: other)
    }
}

extension PredicateExpressions.SkyrosCaseInsensitiveContains: StandardPredicateExpression, Codable
where Base: StandardPredicateExpression, Other: StandardPredicateExpression {}

extension PredicateExpressions.SkyrosCaseInsensitiveContains: Sendable where Base: Sendable, Other: Sendable {}

extension PredicateExpressions.SkyrosCaseInsensitiveContains: SkyrosPredicateTranslatable {
    func skyrosTerm(_ translator: inout PredicateTranslator) throws -> PredicateTerm {
        .node(.contains(try translator.node(base), try translator.node(other), caseInsensitive: true))
    }
}
