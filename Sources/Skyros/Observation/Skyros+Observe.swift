import Foundation

extension Skyros {
    /// Observes a value computed from the main context (GRDB's `ValueObservation`): the
    /// stream gives the block's value at once, then a new value after every change the main
    /// context processes that touches an entity the block read (its own writes, other
    /// processes' saves, a reset).
    ///
    /// ```swift
    /// for try await count in store.observe({ context in try User.count(in: context) }) {
    ///     print("users:", count)
    /// }
    /// ```
    ///
    /// The block runs on the main context's queue; the entities it reads are tracked at each
    /// run. Changes that arrive together are coalesced into one new value. An error thrown
    /// by the block ends the stream with it. Ending the loop (or cancelling its task) stops
    /// the observation and frees it.
    public func observe<Value: Sendable>(
        _ block: @escaping @Sendable (ObjectContext) throws -> Value
    ) -> AsyncThrowingStream<Value, any Error> {
        ValueObserver.start(on: mainContext, block, isDuplicate: { _, _ in false })
    }

    /// Observes a value computed from the main context, as ``observe(_:)-1whfw``, without
    /// repeating a value equal to the previous one.
    public func observe<Value: Sendable & Equatable>(
        _ block: @escaping @Sendable (ObjectContext) throws -> Value
    ) -> AsyncThrowingStream<Value, any Error> {
        ValueObserver.start(on: mainContext, block, isDuplicate: ==)
    }
}

/// One `observe` stream's state, confined to the observed context's queue.
final class ValueObserver<Value: Sendable>: @unchecked Sendable {
    let context: ObjectContext
    let block: @Sendable (ObjectContext) throws -> Value
    let isDuplicate: @Sendable (Value, Value) -> Bool
    let continuation: AsyncThrowingStream<Value, any Error>.Continuation
    var entities: Set<String> = []
    var last: Value?
    var isScheduled = false
    var isFinished = false
    var observation: ContextChangeObservation?

    init(
        context: ObjectContext, block: @escaping @Sendable (ObjectContext) throws -> Value,
        isDuplicate: @escaping @Sendable (Value, Value) -> Bool,
        continuation: AsyncThrowingStream<Value, any Error>.Continuation
    ) {
        self.context = context
        self.block = block
        self.isDuplicate = isDuplicate
        self.continuation = continuation
    }

    static func start(
        on context: ObjectContext, _ block: @escaping @Sendable (ObjectContext) throws -> Value,
        isDuplicate: @escaping @Sendable (Value, Value) -> Bool
    ) -> AsyncThrowingStream<Value, any Error> {
        let (stream, continuation) = AsyncThrowingStream<Value, any Error>.makeStream()
        let observer = ValueObserver(
            context: context, block: block, isDuplicate: isDuplicate, continuation: continuation)
        continuation.onTermination = { _ in context.perform { observer.stop() } }
        context.perform {
            guard !observer.isFinished else { return }
            observer.observation = context.addChangeObserver { changes in observer.changed(changes) }
            observer.run()
        }
        return stream
    }

    /// A change reached the context: a new value is computed once the queue is free, for all
    /// the changes that arrived until then.
    func changed(_ changes: ContextChanges) {
        guard !isFinished, !isScheduled, changes.isNewToChangeObservers,
            entities.contains(where: changes.touches(entityNamed:))
        else { return }
        isScheduled = true
        context.perform { [self] in
            isScheduled = false
            run()
        }
    }

    func run() {
        guard !isFinished else { return }
        context.startTrackingReads()
        do {
            let value = try block(context)
            entities = context.stopTrackingReads()
            if let last, isDuplicate(last, value) { return }
            last = value
            continuation.yield(value)
        } catch {
            _ = context.stopTrackingReads()
            continuation.finish(throwing: error)
            stop()
        }
    }

    func stop() {
        isFinished = true
        observation?.cancel()
        observation = nil
    }
}
