/// How a migration pairs a newer schema's entities (or an entity's properties) with an older
/// one's: by name first, then by the newer one's `originalName` (a rename), each older one
/// taken once. The one rule, shared by the store's migration (`SchemaStep`) and the daemon's
/// projection of a client's schema version onto the store's (`SchemaProjection`), so that a
/// client and the store never disagree on what a rename means.
package enum RenameInference {
    /// For each newer element, the position of the older one it continues (nil: added).
    ///
    /// - Parameters:
    ///   - newer: the newer elements' names.
    ///   - originalNames: each newer element's `originalName` (nil: none), in the same order.
    ///   - older: the older elements' names (the first of two equal names wins).
    ///   - isCandidate: whether the older element at a position may continue in the newer
    ///     schema (the store's migration: only properties with a column).
    package static func match(
        newer: [String], originalNames: [String?], older: [String], isCandidate: (Int) -> Bool = { _ in true }
    ) -> [Int?] {
        var olderPositions: [String: Int] = [:]
        for (position, name) in older.enumerated() where olderPositions[name] == nil { olderPositions[name] = position }
        var result = [Int?](repeating: nil, count: newer.count)
        var taken = Set<Int>()
        for (position, name) in newer.enumerated() {
            if let previous = olderPositions[name], isCandidate(previous) {
                result[position] = previous
                taken.insert(previous)
            }
        }
        for (position, original) in originalNames.enumerated() where result[position] == nil {
            if let original, let previous = olderPositions[original], isCandidate(previous), !taken.contains(previous) {
                result[position] = previous
                taken.insert(previous)
            }
        }
        return result
    }
}
