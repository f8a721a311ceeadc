import Foundation
import Skyros

// Encoding of Skyros' store types (docs/PROTOCOL.md, "Values").

extension WireWriter {
    /// A value: a tag (0 null, 1 integer, 2 real, 3 text, 4 blob) and its payload. Integers
    /// are zigzag varints on the wire; `fixedIntegers`: eight bytes little-endian instead (the
    /// upload queue's form, ``QueuedChangeSet``).
    package mutating func value(_ value: StoredValue, fixedIntegers: Bool = false) {
        switch value {
        case .null: byte(0)
        case .integer(let number):
            byte(1)
            if fixedIntegers { fixed64(UInt64(bitPattern: number)) } else { varint(number) }
        case .real(let number):
            byte(2)
            double(number)
        case .text(let text):
            byte(3)
            string(text)
        case .blob(let blob):
            byte(4)
            data(blob)
        }
    }

    package mutating func objectID(_ id: ObjectID) {
        string(id.entityName)
        uuid(id.uuid)
    }

    package mutating func predicate(_ node: PredicateNode) {
        switch node {
        case .constant(let constant):
            byte(1)
            value(constant)
        case .property(let scope, let path):
            byte(2)
            uvarint(UInt64(scope))
            uvarint(UInt64(path.count))
            for name in path { string(name) }
        case .compare(let op, let lhs, let rhs):
            byte(3)
            byte(Self.operatorCode(op))
            predicate(lhs)
            predicate(rhs)
        case .and(let lhs, let rhs):
            byte(4)
            predicate(lhs)
            predicate(rhs)
        case .or(let lhs, let rhs):
            byte(5)
            predicate(lhs)
            predicate(rhs)
        case .not(let inner):
            byte(6)
            predicate(inner)
        case .contains(let haystack, let needle, let caseInsensitive):
            byte(7)
            bool(caseInsensitive)
            predicate(haystack)
            predicate(needle)
        case .startsWith(let string, let prefix):
            byte(8)
            predicate(string)
            predicate(prefix)
        case .lowercased(let inner):
            byte(9)
            predicate(inner)
        case .isIn(let element, let list):
            byte(10)
            predicate(element)
            uvarint(UInt64(list.count))
            for item in list { value(item) }
        case .anyMatch(let scope, let path, let variable, let test):
            byte(11)
            uvarint(UInt64(scope))
            uvarint(UInt64(path.count))
            for name in path { string(name) }
            uvarint(UInt64(variable))
            predicate(test)
        case .count(let scope, let path):
            byte(12)
            uvarint(UInt64(scope))
            uvarint(UInt64(path.count))
            for name in path { string(name) }
        }
    }

    static func operatorCode(_ op: PredicateNode.ComparisonOperator) -> UInt8 {
        switch op {
        case .equal: 0
        case .notEqual: 1
        case .less: 2
        case .lessOrEqual: 3
        case .greater: 4
        case .greaterOrEqual: 5
        }
    }

    package mutating func request(_ request: StoreRequest) {
        string(request.entityName)
        if let node = request.predicate {
            bool(true)
            predicate(node)
        } else {
            bool(false)
        }
        uvarint(UInt64(request.sortKeys.count))
        for key in request.sortKeys {
            string(key.property)
            bool(key.ascending)
        }
        if let limit = request.limit {
            bool(true)
            uvarint(UInt64(limit))
        } else {
            bool(false)
        }
        uvarint(UInt64(request.offset))
    }

    package mutating func snapshot(_ snapshot: Snapshot) {
        objectID(snapshot.id)
        uvarint(UInt64(snapshot.values.count))
        for item in snapshot.values { value(item) }
        uvarint(UInt64(max(0, snapshot.version)))
    }

    package mutating func changeSet(_ changes: ChangeSet) {
        uvarint(UInt64(changes.inserted.count))
        for item in changes.inserted { snapshot(item) }
        uvarint(UInt64(changes.updated.count))
        for update in changes.updated {
            objectID(update.id)
            uvarint(UInt64(max(0, update.baseVersion)))
            propertyValues(update.changes)
        }
        uvarint(UInt64(changes.deleted.count))
        for id in changes.deleted { objectID(id) }
        byte(Self.policyCode(changes.mergePolicy))
    }

    static func policyCode(_ policy: MergePolicy) -> UInt8 {
        switch policy {
        case .saverWins: 0
        case .storeWins: 1
        case .error: 2
        }
    }

    package mutating func conflict(_ conflict: MergeConflict) {
        objectID(conflict.objectID)
        uvarint(UInt64(conflict.properties.count))
        for name in conflict.properties { string(name) }
        uvarint(UInt64(max(0, conflict.baseVersion)))
        uvarint(UInt64(max(0, conflict.storeVersion)))
    }
}

extension WireReader {
    /// A value written by ``WireWriter/value(_:fixedIntegers:)``.
    package mutating func value(fixedIntegers: Bool = false) throws(WireError) -> StoredValue {
        switch try byte() {
        case 0: return .null
        case 1: return .integer(fixedIntegers ? Int64(bitPattern: try fixed64()) : try varint())
        case 2: return .real(try double())
        case 3: return .text(try string(remembered: false))  // values rarely repeat: not looked for among recent strings
        case 4: return .blob(Data(try data()))
        case let tag: throw .invalidTag("value", tag)
        }
    }

    package mutating func objectID() throws(WireError) -> ObjectID {
        let entity = try string()
        guard !entity.isEmpty else { throw .refused("an entity name is empty") }
        return ObjectID(entityName: entity, uuid: try uuid())
    }

    mutating func path() throws(WireError) -> [String] {
        let count = try count()
        guard count > 0 else { throw .refused("a property path is empty") }
        var path: [String] = []
        for _ in 0..<count { path.append(try string()) }
        return path
    }

    package mutating func predicate(depth: Int = 0) throws(WireError) -> PredicateNode {
        guard depth < WireProtocol.maximumPredicateDepth else { throw .tooDeep }
        let next = depth + 1
        switch try byte() {
        case 1: return .constant(try value())
        case 2:
            let scope = try int()
            return .property(scope: scope, path: try path())
        case 3:
            let op: PredicateNode.ComparisonOperator
            switch try byte() {
            case 0: op = .equal
            case 1: op = .notEqual
            case 2: op = .less
            case 3: op = .lessOrEqual
            case 4: op = .greater
            case 5: op = .greaterOrEqual
            case let tag: throw .invalidTag("comparison", tag)
            }
            let lhs = try predicate(depth: next)
            return .compare(op, lhs, try predicate(depth: next))
        case 4:
            let lhs = try predicate(depth: next)
            return .and(lhs, try predicate(depth: next))
        case 5:
            let lhs = try predicate(depth: next)
            return .or(lhs, try predicate(depth: next))
        case 6: return .not(try predicate(depth: next))
        case 7:
            let caseInsensitive = try bool()
            let haystack = try predicate(depth: next)
            return .contains(haystack, try predicate(depth: next), caseInsensitive: caseInsensitive)
        case 8:
            let string = try predicate(depth: next)
            return .startsWith(string, try predicate(depth: next))
        case 9: return .lowercased(try predicate(depth: next))
        case 10:
            let element = try predicate(depth: next)
            let count = try count()
            var list: [StoredValue] = []
            for _ in 0..<count { list.append(try value()) }
            return .isIn(element, list)
        case 11:
            let scope = try int()
            let path = try path()
            let variable = try int()
            return .anyMatch(scope: scope, path: path, variable: variable, try predicate(depth: next))
        case 12:
            let scope = try int()
            return .count(scope: scope, path: try path())
        case let tag: throw .invalidTag("predicate", tag)
        }
    }

    package mutating func request() throws(WireError) -> StoreRequest {
        let entity = try string()
        let node = try bool() ? try predicate() : nil
        let count = try count(minimumSize: 2)
        var keys: [SortKey] = []
        for _ in 0..<count {
            let property = try string()
            keys.append(SortKey(property: property, ascending: try bool()))
        }
        let limit = try bool() ? try int() : nil
        return StoreRequest(entityName: entity, predicate: node, sortKeys: keys, limit: limit, offset: try int())
    }

    package mutating func snapshot() throws(WireError) -> Snapshot {
        let id = try objectID()
        let values = try values(count: try count())  // the count fits in what is left of the message
        return Snapshot(id: id, values: values, version: try version())
    }

    /// A snapshot as a change event's inserted object, its values not decoded, added to
    /// `source`: its identifier, version, and where its values are (each value checked as
    /// decoding it would: a malformed one refuses the message, as eagerly).
    mutating func encodedSnapshot(into source: EncodedRows.Source) throws(WireError) {
        let id = try objectID()
        let count = try count()
        let offset = position
        for _ in 0..<count { try skipValue() }
        source.append(id: id, version: try version(), offset: offset, count: count)
    }

    /// Goes past one `Value`, refusing what ``value()`` refuses (a tag that is no value,
    /// bytes past the end, text that is not UTF-8), without making it.
    mutating func skipValue() throws(WireError) {
        switch try byte() {
        case 0: return
        case 1: _ = try uvarint()
        case 2:
            guard remaining >= 8 else { throw .truncated }
            position += 8
        case 3: try skipString()
        case 4: position += try count()
        case let tag: throw .invalidTag("value", tag)
        }
    }

    /// `count` values, in one buffer.
    package mutating func values(count: Int) throws(WireError) -> StoredValues {
        // Decoded in place (no buffer of nulls overwritten value by value); after a malformed
        // value the rest are nulls, and the error is thrown once the buffer is whole.
        var failure: WireError?
        let values = StoredValues(unsafeUninitializedCount: count) { target in
            for index in 0..<count {
                guard failure == nil else {
                    (target + index).initialize(to: .null)
                    continue
                }
                do throws(WireError) {
                    (target + index).initialize(to: try value())
                } catch {
                    failure = error
                    (target + index).initialize(to: .null)
                }
            }
        }
        if let failure { throw failure }
        return values
    }

    /// An object version: a uvarint no larger than `Int64.max`.
    mutating func version() throws(WireError) -> Int64 {
        let value = try uvarint()
        guard value <= UInt64(Int64.max) else { throw .invalidValue("version \(value)") }
        return Int64(value)
    }

    package mutating func conflict() throws(WireError) -> MergeConflict {
        let id = try objectID()
        var names: [String] = []
        for _ in 0..<(try count()) { names.append(try string()) }
        return MergeConflict(objectID: id, properties: names, baseVersion: try version(), storeVersion: try version())
    }

    package mutating func changeSet() throws(WireError) -> ChangeSet {
        var changes = ChangeSet()
        for _ in 0..<(try count(minimumSize: 18)) { changes.inserted.append(try snapshot()) }
        for _ in 0..<(try count(minimumSize: 18)) {
            let id = try objectID()
            let base = try version()
            changes.updated.append(ChangeSet.Update(id: id, changes: try propertyValues(), baseVersion: base))
        }
        for _ in 0..<(try count(minimumSize: 17)) { changes.deleted.append(try objectID()) }
        switch try byte() {
        case 0: changes.mergePolicy = .saverWins
        case 1: changes.mergePolicy = .storeWins
        case 2: changes.mergePolicy = .error
        case let code: throw .invalidValue("merge policy \(code)")
        }
        return changes
    }
}
