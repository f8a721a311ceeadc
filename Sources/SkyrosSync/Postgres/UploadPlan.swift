/// How one upload of a batch of change sets is split when the server refuses it, as a value:
/// which part goes next, together (one statement, ``ServerSession/togetherStatement(_:machine:schema:)``)
/// or one by one (each change set in a savepoint, a refused one recorded as rejected); it does
/// no I/O, so that the halving is tested as a transcript (`Tests/SkyrosSyncTests`).
///
/// The rules:
/// - The batch goes together when it can (no change set in it empties the store).
/// - A part the server refuses for something a change set did is split: when the server named
///   the change set at fault (a unique violation whose value only one change set wrote), that
///   change set goes alone, one by one, between what comes before and after it, each tried
///   together again; otherwise the part is halved, each half tried the same way; a single
///   change set goes one by one.
/// - Parts are done in order, so the outcomes come in the batch's order.
/// - The ids of the server transactions that applied the batch are known only when every part
///   went together (one by one, a part's transaction is not known).
package struct UploadPlan: Sendable {
    /// What to do next.
    package enum Step: Sendable, Equatable {
        /// Send these change sets (positions in the batch) as one statement, then tell
        /// ``appliedTogether(_:transaction:)`` or ``refusedTogether(_:culprit:)``.
        case together(Range<Int>)
        /// Send these change sets one by one, then tell ``uploadedOneByOne(_:outcomes:)``.
        case oneByOne(Range<Int>)
        /// Every change set has its outcome (``outcomes``, ``transactions``).
        case done
    }

    private enum Part: Sendable {
        case attempt(Range<Int>)
        case alone(Range<Int>)
    }

    /// The parts left, the next one last.
    private var parts: [Part]
    /// Which change sets empty the store first (they never go together).
    private let resets: [Bool]
    /// The outcomes so far, in the batch's order.
    package private(set) var outcomes: [ServerSession.UploadOutcome] = []
    /// The server transactions that applied the parts so far (nil: a part went one by one, or
    /// its transaction is not known).
    package private(set) var transactions: [UInt64]? = []

    /// A plan for a batch whose change sets empty the store or not, in order.
    package init(resets: [Bool]) {
        self.resets = resets
        parts = resets.isEmpty ? [] : [.attempt(0..<resets.count)]
    }

    /// The next step.
    package mutating func next() -> Step {
        while let part = parts.popLast() {
            switch part {
            case .alone(let range):
                return .oneByOne(range)
            case .attempt(let range) where range.isEmpty:
                continue
            case .attempt(let range):
                if !resets[range].contains(true) { return .together(range) }
                // A reset goes alone, found by halving.
                if range.count == 1 { return .oneByOne(range) }
                halve(range)
            }
        }
        return .done
    }

    /// The part went together, in the server transaction `transaction` (nil: not known).
    package mutating func appliedTogether(_ range: Range<Int>, transaction: UInt64?) {
        outcomes += Array(repeating: .applied, count: range.count)
        if let transaction { transactions?.append(transaction) } else { transactions = nil }
    }

    /// The server refused the part for something one of its change sets did; `culprit`: the
    /// position of the change set it named (nil: not known).
    package mutating func refusedTogether(_ range: Range<Int>, culprit: Int?) {
        if range.count == 1 {
            parts.append(.alone(range))
        } else if let culprit, range.contains(culprit) {
            parts.append(.attempt((culprit + 1)..<range.upperBound))
            parts.append(.alone(culprit..<(culprit + 1)))
            parts.append(.attempt(range.lowerBound..<culprit))
        } else {
            halve(range)
        }
    }

    /// The part went one by one, with these outcomes.
    package mutating func uploadedOneByOne(_ range: Range<Int>, outcomes: [ServerSession.UploadOutcome]) {
        self.outcomes += outcomes
        transactions = nil
    }

    private mutating func halve(_ range: Range<Int>) {
        let middle = range.lowerBound + range.count / 2
        parts.append(.attempt(middle..<range.upperBound))
        parts.append(.attempt(range.lowerBound..<middle))
    }
}
