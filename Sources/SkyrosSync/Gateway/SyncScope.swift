import Foundation
import Skyros

/// What one machine may read and write on the server, when a sync gateway works on its behalf
/// (its token's bucket instances under the gateway's sync rules, DESIGN §10). A
/// ``ServerSession`` with a scope reads only the machine's rows (a snapshot's pages, a
/// checkpoint's objects) and applies its uploads only where the rules allow; without one
/// (direct mode) it reads and writes every row.
package protocol SyncScope: Sendable {
    /// The SQL condition on `t` (a row of `entity`'s table) that selects the machine's rows,
    /// with its text parameters numbered from `firstParameter`; nil when it holds none of them.
    func condition(entity: String, firstParameter: Int) -> (sql: String, parameters: [String])?

    /// `checkpoint` (changes read for every machine) restricted to the machine's rows: the
    /// objects it holds, every other changed object as gone (a row that left its buckets is
    /// deleted there), and the objects whose membership changed with an object they reach.
    func restrict(_ checkpoint: Checkpoint, in session: ServerSession) async throws -> Checkpoint

    /// Why the rules refuse `changes` (nil: allowed), checked in the upload's transaction
    /// `before` they are applied (the objects they update or delete must be the machine's) and
    /// after (the objects they insert or update must still be).
    func refusal(of changes: [QueuedChangeSet], before: Bool, in session: ServerSession) async throws -> String?
}
