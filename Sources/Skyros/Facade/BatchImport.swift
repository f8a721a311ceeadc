import Foundation

extension Skyros {
    /// Imports many records: BNR's batch operation context. `body` makes the objects of one
    /// record in a private context straight on the store (no main-context merge per save),
    /// which is saved every `chunkSize` records; the main context is merged once, at the end.
    ///
    /// ```swift
    /// let imported = try await store.importBatch(records, chunkSize: 1_000, progress: { done, total in
    ///     print("\(done)/\(total)")
    /// }) { record, context in
    ///     let user = User.create(in: context)
    ///     user.firstname = record.name
    /// }
    /// ```
    ///
    /// Each chunk is one save, as durable as any (through a group's daemon: one change set,
    /// exactly once, published to the other processes). `progress` is called after each chunk
    /// with the records done and the total. Cancelling the task stops the import after the
    /// current chunk: the records of the chunks saved so far stay, and their number is returned.
    /// Controllers and monitors of the main context are told once, at the end (a reload).
    ///
    /// - Returns: the number of records imported.
    /// - Throws: the error of the chunk that failed (a record's body threw, naming the record's
    ///   position; or the save failed, for instance ``SkyrosError/Code/uniqueConstraintViolation``):
    ///   that chunk is not saved, the chunks before it are.
    public func importBatch<Records: Collection & Sendable>(
        _ records: Records, chunkSize: Int = 1_000, progress: (@Sendable (Int, Int) -> Void)? = nil,
        _ body: @escaping @Sendable (Records.Element, ObjectContext) throws -> Void
    ) async throws -> Int {
        precondition(chunkSize > 0, "chunkSize must be positive")
        let total = records.count
        let context = ObjectContext(name: "import", parent: store)
        context.errorHandler = errorHandler
        var done = 0
        defer {
            if done > 0 {
                // Once for the whole import: held objects are refreshed, observers start over.
                merge([StoreChange(sequence: 0, author: "import", isRefresh: true)], publishing: false)
            }
        }
        while done < total {
            if Task.isCancelled { break }
            let start = done
            let count = Swift.min(chunkSize, total - done)
            do {
                try await context.perform {
                    defer { context.reset() }
                    var index = records.index(records.startIndex, offsetBy: start)
                    for position in start..<(start + count) {
                        do {
                            try body(records[index], context)
                        } catch {
                            let wrapped = SkyrosError.wrap(error)
                            throw SkyrosError(
                                wrapped.code, "record \(position) of the import: \(wrapped.message)", underlying: error)
                        }
                        records.formIndex(after: &index)
                    }
                    try context.save()
                }
            } catch {
                let failure = SkyrosError.wrap(error)
                completionQueue.async { [self] in handleError(failure) }
                throw SkyrosError(
                    failure.code,
                    "the import stopped at the chunk of records \(start)..<\(start + count) (\(done) imported before it): \(failure.message)",
                    underlying: error)
            }
            done += count
            progress?(done, total)
        }
        return done
    }
}
