import Foundation

/// Helpers of the controller that do not depend on its type.
enum PredicateReads {
    /// The positions (in `paths`) of a longest strictly increasing subsequence.
    static func longestIncreasingRun(_ paths: [IndexPath]) -> Set<Int> {
        longestIncreasingRun(paths.count) { paths[$0] < paths[$1] }
    }

    /// The positions (of `0..<count`) of a longest subsequence strictly increasing by `less`.
    static func longestIncreasingRun(_ count: Int, less: (Int, Int) -> Bool) -> Set<Int> {
        var tails: [Int] = []  // positions, by run length - 1
        var previous = [Int](repeating: -1, count: count)
        for position in 0..<count {
            var low = 0
            var high = tails.count
            while low < high {
                let middle = (low + high) / 2
                if less(tails[middle], position) { low = middle + 1 } else { high = middle }
            }
            if low > 0 { previous[position] = tails[low - 1] }
            if low == tails.count { tails.append(position) } else { tails[low] = position }
        }
        var result = Set<Int>()
        var position = tails.last ?? -1
        while position >= 0 {
            result.insert(position)
            position = previous[position]
        }
        return result
    }

    /// The properties a predicate reads on the fetched object, or nil when it reaches further
    /// (relationships, nested scopes): then any change may make an object start matching.
    static func properties(_ node: PredicateNode) -> Set<String>? {
        switch node {
        case .constant: return []
        case .property(let scope, let path):
            return scope == 0 && path.count == 1 ? [path[0]] : nil
        case .compare(_, let a, let b), .and(let a, let b), .or(let a, let b), .contains(let a, let b, _),
            .startsWith(let a, let b):
            guard let x = properties(a), let y = properties(b) else { return nil }
            return x.union(y)
        case .not(let inner), .lowercased(let inner), .isIn(let inner, _):
            return properties(inner)
        case .anyMatch, .count:
            return nil
        }
    }
}
