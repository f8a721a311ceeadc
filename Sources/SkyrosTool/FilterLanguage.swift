// `skyros dump --filter`: a small expression language, translated to Skyros' predicate tree
// (PredicateNode, which the store translates to SQL and the daemon accepts on the wire).
//
//     filter     = or
//     or         = and { "||" and }
//     and        = unary { "&&" unary }
//     unary      = "!" unary | "(" or ")" | test
//     test       = operand [ ( "==" | "!=" | "<" | "<=" | ">" | ">=" ) operand
//                            | "contains" operand | "startsWith" operand
//                            | "in" "[" literal { "," literal } "]" ]
//     operand    = path | literal
//     path       = name { "." name }          (to-ones, then an attribute; `_id` is the object's ID)
//     literal    = string | number | true | false | null
//     string     = '"' characters with \" \\ \n \t escapes '"'
//
// A literal compared with a property takes that property's type: `isDone == true` compares
// with 1, `due < "2026-01-01T00:00:00Z"` with seconds since 1970, `author == "User/…"` with
// the UUID. `==` and `!=` are null-safe (`email == null`).
import Foundation
import Skyros

struct FilterLanguage {
    /// A parse or translation error at a column (1-based) of the filter.
    struct Failure: Error {
        var column: Int
        var message: String

        /// The message with the filter and a caret under the column.
        func report(_ filter: String) -> String {
            "--filter: \(message) at column \(column)\n  \(filter)\n  \(String(repeating: " ", count: max(0, column - 1)))^"
        }
    }

    private enum Token: Equatable {
        case name(String)
        case string(String)
        case number(String)
        case symbol(String)
        case end
    }

    private var tokens: [(token: Token, column: Int)] = []
    private var position = 0
    private let entity: SchemaDescription.Entity
    private let schema: SchemaDescription

    /// Parses `filter` and translates it for `entity`.
    static func predicate(_ filter: String, entity: SchemaDescription.Entity, schema: SchemaDescription) throws(Failure)
        -> PredicateNode
    {
        var parser = FilterLanguage(entity: entity, schema: schema)
        try parser.tokenize(filter)
        let node = try parser.or()
        guard case .end = parser.current.token else {
            throw Failure(column: parser.current.column, message: "unexpected \(parser.describe(parser.current.token))")
        }
        return node.predicate
    }

    private init(entity: SchemaDescription.Entity, schema: SchemaDescription) {
        self.entity = entity
        self.schema = schema
    }

    // MARK: - Tokens

    private mutating func tokenize(_ text: String) throws(Failure) {
        let characters = Array(text)
        var index = 0
        while index < characters.count {
            let character = characters[index]
            let column = index + 1
            if character.isWhitespace {
                index += 1
            } else if character.isLetter || character == "_" {
                var name = ""
                while index < characters.count,
                    characters[index].isLetter || characters[index].isNumber || characters[index] == "_"
                {
                    name.append(characters[index])
                    index += 1
                }
                tokens.append((.name(name), column))
            } else if character.isNumber
                || (character == "-" && index + 1 < characters.count && characters[index + 1].isNumber)
            {
                var number = String(character)
                index += 1
                while index < characters.count,
                    characters[index].isNumber || "._eE".contains(characters[index])
                        || ((characters[index] == "-" || characters[index] == "+")
                            && "eE".contains(characters[index - 1]))
                {
                    if characters[index] != "_" { number.append(characters[index]) }
                    index += 1
                }
                guard Double(number) != nil else { throw Failure(column: column, message: "\(number) is not a number") }
                tokens.append((.number(number), column))
            } else if character == "\"" {
                var value = ""
                index += 1
                var closed = false
                while index < characters.count {
                    let next = characters[index]
                    index += 1
                    if next == "\"" {
                        closed = true
                        break
                    }
                    if next == "\\" {
                        guard index < characters.count else { break }
                        let escaped = characters[index]
                        index += 1
                        switch escaped {
                        case "n": value.append("\n")
                        case "t": value.append("\t")
                        case "\"", "\\": value.append(escaped)
                        default:
                            throw Failure(
                                column: index - 1, message: "unknown escape \\\(escaped) (use \\\" \\\\ \\n \\t)")
                        }
                    } else {
                        value.append(next)
                    }
                }
                guard closed else { throw Failure(column: column, message: "unterminated string") }
                tokens.append((.string(value), column))
            } else {
                let two = index + 1 < characters.count ? String(characters[index...index + 1]) : ""
                if ["==", "!=", "<=", ">=", "&&", "||"].contains(two) {
                    tokens.append((.symbol(two), column))
                    index += 2
                } else if "<>!()[],.".contains(character) {
                    tokens.append((.symbol(String(character)), column))
                    index += 1
                } else if character == "=" {
                    throw Failure(column: column, message: "unexpected '=' (compare with ==)")
                } else if character == "&" || character == "|" {
                    throw Failure(column: column, message: "unexpected '\(character)' (use && or ||)")
                } else {
                    throw Failure(column: column, message: "unexpected character '\(character)'")
                }
            }
        }
        tokens.append((.end, characters.count + 1))
    }

    private var current: (token: Token, column: Int) { tokens[position] }

    private func describe(_ token: Token) -> String {
        switch token {
        case .name(let name): "'\(name)'"
        case .string(let value): "the string \"\(value)\""
        case .number(let number): "the number \(number)"
        case .symbol(let symbol): "'\(symbol)'"
        case .end: "end of the filter"
        }
    }

    private mutating func take(_ symbol: String) -> Bool {
        if current.token == .symbol(symbol) {
            position += 1
            return true
        }
        return false
    }

    private mutating func expect(_ symbol: String) throws(Failure) {
        guard take(symbol) else {
            throw Failure(column: current.column, message: "expected '\(symbol)', found \(describe(current.token))")
        }
    }

    // MARK: - Grammar

    /// A parsed operand or test: its predicate node, and the property it names, if any.
    private struct Parsed {
        var predicate: PredicateNode
        var property: SchemaDescription.Property?
        var literal: (json: JSONValue, column: Int)?
    }

    private mutating func or() throws(Failure) -> Parsed {
        var left = try and()
        while take("||") { left = Parsed(predicate: .or(left.predicate, try and().predicate)) }
        return left
    }

    private mutating func and() throws(Failure) -> Parsed {
        var left = try unary()
        while take("&&") { left = Parsed(predicate: .and(left.predicate, try unary().predicate)) }
        return left
    }

    private mutating func unary() throws(Failure) -> Parsed {
        if take("!") { return Parsed(predicate: .not(try unary().predicate)) }
        if take("(") {
            let inner = try or()
            try expect(")")
            return Parsed(predicate: inner.predicate)
        }
        return try test()
    }

    private static let comparisons: [String: PredicateNode.ComparisonOperator] = [
        "==": .equal, "!=": .notEqual, "<": .less, "<=": .lessOrEqual, ">": .greater, ">=": .greaterOrEqual,
    ]

    private mutating func test() throws(Failure) -> Parsed {
        let left = try operand()
        if case .symbol(let symbol) = current.token, let comparison = Self.comparisons[symbol] {
            position += 1
            let right = try operand()
            let (l, r) = try typed(left, right)
            return Parsed(predicate: .compare(comparison, l, r))
        }
        if case .name(let word) = current.token, ["contains", "startsWith", "in"].contains(word) {
            position += 1
            if word == "in" {
                try expect("[")
                var values: [StoredValue] = []
                repeat {
                    let item = try operand()
                    guard let literal = item.literal else {
                        throw Failure(column: current.column, message: "the list of 'in' holds literals only")
                    }
                    values.append(try convert(literal, for: left.property))
                } while take(",")
                try expect("]")
                return Parsed(predicate: .isIn(left.predicate, values))
            }
            let right = try operand()
            let (l, r) = try typed(left, right)
            return Parsed(predicate: word == "contains" ? .contains(l, r, caseInsensitive: false) : .startsWith(l, r))
        }
        // A lone property or literal (`isDone`, `true`): taken as SQLite takes a value in WHERE.
        return left
    }

    /// Both sides of a comparison, literals converted to the type of the property on the other side.
    private func typed(_ left: Parsed, _ right: Parsed) throws(Failure) -> (PredicateNode, PredicateNode) {
        let l = try left.literal.map { literal throws(Failure) in
            PredicateNode.constant(try convert(literal, for: right.property))
        }
        let r = try right.literal.map { literal throws(Failure) in
            PredicateNode.constant(try convert(literal, for: left.property))
        }
        return (l ?? left.predicate, r ?? right.predicate)
    }

    private mutating func operand() throws(Failure) -> Parsed {
        let (token, column) = current
        switch token {
        case .string(let value):
            position += 1
            return Parsed(predicate: .constant(.text(value)), literal: (.string(value), column))
        case .number(let text):
            position += 1
            let number: JSONValue = Int64(text).map { .integer($0) } ?? .number(Double(text) ?? 0)
            return Parsed(predicate: .constant(Self.plainStored(number)), literal: (number, column))
        case .name("true"), .name("false"):
            position += 1
            let flag = token == .name("true")
            return Parsed(predicate: .constant(.integer(flag ? 1 : 0)), literal: (.bool(flag), column))
        case .name("null"):
            position += 1
            return Parsed(predicate: .constant(.null), literal: (.null, column))
        case .name(let first):
            position += 1
            var path = [first]
            while take(".") {
                guard case .name(let next) = current.token else {
                    throw Failure(column: current.column, message: "expected a property name after '.'")
                }
                path.append(next)
                position += 1
            }
            let property = try resolve(path, column: column)
            return Parsed(predicate: .property(scope: 0, path: path), property: property)
        default:
            throw Failure(column: column, message: "expected a property or a value, found \(describe(token))")
        }
    }

    /// The property at the end of `path` (to-ones on the way); nil for `_id`.
    private func resolve(_ path: [String], column: Int) throws(Failure) -> SchemaDescription.Property? {
        var entity = entity
        for (index, name) in path.enumerated() {
            if name == PredicateNode.idProperty && index == path.count - 1 { return nil }
            guard let property = entity.properties.first(where: { $0.name == name }) else {
                let known = entity.properties.filter { $0.kind != "toMany" }.map(\.name).joined(separator: ", ")
                throw Failure(
                    column: column, message: "\(entity.name) has no property '\(name)' (it has: \(known), _id)")
            }
            if index == path.count - 1 {
                guard property.kind != "toMany" else {
                    throw Failure(
                        column: column,
                        message: "'\(name)' is a to-many relationship: the filter compares attributes and to-ones")
                }
                return property
            }
            guard property.kind == "toOne",
                let destination = schema.entities.first(where: { $0.name == property.destination })
            else {
                throw Failure(
                    column: column, message: "'\(name)' is not a to-one relationship: it cannot be followed by '.'")
            }
            entity = destination
        }
        return nil
    }

    /// A literal as a stored value of `property` (or as its own storage class when there is none).
    private func convert(_ literal: (json: JSONValue, column: Int), for property: SchemaDescription.Property?)
        throws(Failure)
        -> StoredValue
    {
        guard let property else {
            if let text = literal.json.stringValue, let uuid = UUID(uuidString: text) {  // _id == "…"
                return uuid.stored
            }
            return Self.plainStored(literal.json)
        }
        do {
            return try ValueJSON.stored(literal.json, of: property)
        } catch {
            throw Failure(column: literal.column, message: error.message)
        }
    }

    private static func plainStored(_ json: JSONValue) -> StoredValue {
        switch json {
        case .string(let text): .text(text)
        case .bool(let flag): .integer(flag ? 1 : 0)
        case .integer(let integer): .integer(integer)
        case .number(let number): .real(number)
        default: .null
        }
    }
}
