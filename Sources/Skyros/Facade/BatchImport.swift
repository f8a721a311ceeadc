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
    /// To update the objects of records that are already in the store instead of inserting
    /// them again, use ``importBatch(_:upserting:by:key:chunkSize:progress:_:)``.
    ///
    /// - Returns: the number of records imported.
    /// - Throws: the error of the chunk that failed, naming the chunk and the record's position
    ///   (a record's body threw; or the chunk's save failed for an object a record made, for
    ///   instance ``SkyrosError/Code/uniqueConstraintViolation`` or
    ///   ``SkyrosError/Code/valueNotStorable``): that chunk is not saved, the chunks before it are.
    public func importBatch<Records: Collection & Sendable>(
        _ records: Records, chunkSize: Int = 1_000, progress: (@Sendable (Int, Int) -> Void)? = nil,
        _ body: @escaping @Sendable (Records.Element, ObjectContext) throws -> Void
    ) async throws -> Int {
        try await importChunks(records, chunkSize: chunkSize, progress: progress) { chunk, context, marks in
            try Self.eachRecord(of: chunk, in: records, context, &marks) { record in try body(record, context) }
        }
    }

    /// Imports many records, inserting an object for each record whose key is not in the store
    /// yet and updating the object that has it otherwise (an *upsert*): importing the same
    /// file twice, or a file that overlaps what is stored, never fails with
    /// ``SkyrosError/Code/uniqueConstraintViolation``.
    ///
    /// ```swift
    /// let imported = try await store.importBatch(records, upserting: User.self, by: \.handle,
    ///                                            key: { $0.handle }) { record, user, context in
    ///     user.firstname = record.name   // `user` is the stored object, or a new one with the handle set
    /// }
    /// ```
    ///
    /// `attribute` must be a unique attribute (`@Attribute(.unique)`): the objects that already
    /// have one of a chunk's keys are fetched with one query per chunk; a new object gets the
    /// record's key before `body` runs. Two records with the same key update the same object,
    /// the later one last. Everything else is as in ``importBatch(_:chunkSize:progress:_:)``:
    /// one save per chunk, progress, cancellation after the current chunk, one merge into the
    /// main context at the end.
    ///
    /// Through a group's daemon, another process that inserts one of a chunk's keys between the
    /// chunk's query and its save makes that chunk fail with
    /// ``SkyrosError/Code/uniqueConstraintViolation`` (nothing of it is kept): import again to
    /// update that object.
    ///
    /// - Returns: the number of records imported (inserted or updated).
    /// - Throws: ``SkyrosError/Code/unsupportedPredicate`` when `attribute` is not a unique
    ///   stored attribute of `T`; otherwise as ``importBatch(_:chunkSize:progress:_:)``.
    public func importBatch<Records: Collection & Sendable, T: ManagedObject, Key: Hashable & Sendable>(
        _ records: Records, upserting type: T.Type, by attribute: ReferenceWritableKeyPath<T, Key> & Sendable,
        key: @escaping @Sendable (Records.Element) -> Key,
        chunkSize: Int = 1_000, progress: (@Sendable (Int, Int) -> Void)? = nil,
        _ body: @escaping @Sendable (Records.Element, T, ObjectContext) throws -> Void
    ) async throws -> Int {
        let entity = T.entityDescription
        guard let property = entity.property(for: attribute), property.kind == .attribute, property.isUnique else {
            throw SkyrosError(
                .unsupportedPredicate,
                "an upserting import is keyed by a unique attribute of \(entity.name) (@Attribute(.unique)), not \(attribute)"
            )
        }
        return try await importChunks(records, chunkSize: chunkSize, progress: progress) { chunk, context, marks in
            var objects = try Self.existingObjects(
                attribute, property: property, keys: Self.keys(of: chunk, in: records, key), in: context)
            try Self.eachRecord(of: chunk, in: records, context, &marks) { record in
                let recordKey = key(record)
                let object: T
                if let existing = objects[recordKey] {
                    object = existing
                } else {
                    object = T.create(in: context)
                    object[keyPath: attribute] = recordKey
                    objects[recordKey] = object
                }
                try body(record, object, context)
            }
        }
    }

    // MARK: - The chunk loop

    /// Runs `chunk` for each `chunkSize` positions of `records` in a private context straight on
    /// the store, saving after each; the main context is merged once at the end. `chunk` notes
    /// the context's insertion mark after each record (``eachRecord(of:in:_:_:_:)``), so that a
    /// save that fails for an object names the record that made it.
    private func importChunks<Records: Collection & Sendable>(
        _ records: Records, chunkSize: Int, progress: (@Sendable (Int, Int) -> Void)?,
        _ chunk: @escaping @Sendable (Range<Int>, ObjectContext, inout [Int]) throws -> Void
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
            let positions = done..<(done + Swift.min(chunkSize, total - done))
            do {
                try await context.perform {
                    defer { context.reset() }
                    var marks: [Int] = []
                    marks.reserveCapacity(positions.count + 1)
                    marks.append(context.inserted.mark)
                    try chunk(positions, context, &marks)
                    do {
                        try context.save(keepingObjects: false)  // reset next: nothing to register
                    } catch {
                        throw Self.naming(error, positions: positions, marks: marks, context: context)
                    }
                }
            } catch {
                let failure = SkyrosError.wrap(error)
                completionQueue.async { [self] in handleError(failure) }
                throw SkyrosError(
                    failure.code,
                    "the import stopped at the chunk of records \(positions) (\(done) imported before it): \(failure.message)",
                    underlying: error)
            }
            done = positions.upperBound
            progress?(done, total)
        }
        return done
    }

    /// Calls `body` for the records at `positions`, naming the position in the error of a
    /// record whose body threw; appends the context's insertion mark to `marks` after each.
    private static func eachRecord<Records: Collection>(
        of positions: Range<Int>, in records: Records, _ context: ObjectContext, _ marks: inout [Int],
        _ body: (Records.Element) throws -> Void
    ) throws {
        var index = records.index(records.startIndex, offsetBy: positions.lowerBound)
        for position in positions {
            do {
                try body(records[index])
            } catch {
                let wrapped = SkyrosError.wrap(error)
                throw SkyrosError(
                    wrapped.code, "record \(position) of the import: \(wrapped.message)", underlying: error)
            }
            marks.append(context.inserted.mark)
            records.formIndex(after: &index)
        }
    }

    /// The error of a chunk's failed save, naming the record that made the object it is about:
    /// the last record whose new object the message names (of two objects that both hold a
    /// unique value, the later one is the duplicate), or whose object holds a value that
    /// cannot be stored. The error as it is when no record's object is concerned.
    private static func naming(_ error: any Error, positions: Range<Int>, marks: [Int], context: ObjectContext)
        -> SkyrosError
    {
        let failure = SkyrosError.wrap(error)
        for record in stride(from: marks.count - 2, through: 0, by: -1) {
            let objects = context.inserted.values(since: marks[record], upTo: marks[record + 1])
            let concerned = objects.contains { object in
                let storage = object.skyrosStorage
                return !storage.valueErrors.isEmpty || failure.message.contains(storage.objectID.description)
            }
            if concerned {
                return SkyrosError(
                    failure.code, "record \(positions.lowerBound + record) of the import: \(failure.message)",
                    underlying: error, conflicts: failure.conflicts)
            }
        }
        return failure
    }

    /// The distinct keys of the records at `positions`.
    private static func keys<Records: Collection, Key: Hashable>(
        of positions: Range<Int>, in records: Records, _ key: (Records.Element) -> Key
    ) -> [Key] {
        var seen = Set<Key>()
        var index = records.index(records.startIndex, offsetBy: positions.lowerBound)
        for _ in positions {
            seen.insert(key(records[index]))
            records.formIndex(after: &index)
        }
        return Array(seen)
    }

    /// The objects of `T` whose unique `property` has one of `keys`, by key: one `IN` query per
    /// 500 keys (SQLite's limit on a statement's parameters stays far away).
    private static func existingObjects<T: ManagedObject, Key: Hashable>(
        _ attribute: KeyPath<T, Key>, property: PropertyDescription, keys: [Key], in context: ObjectContext
    ) throws -> [Key: T] {
        var objects: [Key: T] = [:]
        objects.reserveCapacity(keys.count)
        let values = try keys.map { try property.codec.encodeAny($0) }
        for start in stride(from: 0, to: values.count, by: 500) {
            let slice = Array(values[start..<Swift.min(start + 500, values.count)])
            let request = StoreRequest(
                entityName: try context.schema.storage(of: T.self).entity.name,
                predicate: .isIn(.property(scope: 0, path: [property.name]), slice))
            for object in try context.fetchObjects(request) {
                guard let object = object as? T else { continue }
                objects[object[keyPath: attribute]] = object
            }
        }
        return objects
    }
}
