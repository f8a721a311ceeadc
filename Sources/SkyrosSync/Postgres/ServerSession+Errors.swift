import Foundation
import PostgresNIO

/// What the server's refusals mean for an upload: sent again, split, recorded as rejected, or
/// thrown (the connection, the server). Pure: each reads an error, none talks to the server.
extension ServerSession {
    /// How many times an upload that deadlocked or failed to serialize is sent again before
    /// the error goes up (and the engine offline).
    static let conflictRetries = 8

    /// A deadlock (40P01), a serialization failure (40001) or a lock not had in time (55P03,
    /// ``limitWaits(statementTimeout:)``): nothing was applied, and the same statement may
    /// succeed at once.
    static func isTransientConflict(_ error: any Error) -> Bool {
        guard let state = serverReport(error)?.state else { return false }
        return state == "40P01" || state == "40001" || state == "55P03"
    }

    /// Whether the server refused a batch statement for something one of its change sets did
    /// (SQLSTATE classes 21, 22, 23 and 27: a cardinality, a data exception, including the
    /// count check's division by zero, a constraint, a change a cascade made twice): the batch
    /// is split to find it. Anything else is the server's or the connection's, and thrown.
    static func isBatchFault(_ error: any Error) -> Bool {
        guard let state = serverReport(error)?.state else { return false }
        return ["21", "22", "23", "27"].contains { state.hasPrefix($0) }
    }

    /// Whether a server error is the change set's fault (a constraint, a value the column
    /// refuses): SQLSTATE classes 22 (data exception) and 23 (integrity constraint violation).
    static func isChangeSetsFault(_ error: any Error) -> Bool {
        guard let state = serverReport(error)?.state else { return false }
        return state.hasPrefix("22") || state.hasPrefix("23")
    }

    /// The position in `batch` of the change set a unique violation names: the first that
    /// inserts or updates a row with the value the server's detail quotes
    /// (`Key (handle)=(dup-3) already exists.`) in a unique column of that name. Nil for
    /// anything else (another error, a key of several columns, a value not found): the batch
    /// is halved instead.
    package static func culprit(
        of error: any Error, in batch: ArraySlice<(number: Int64, changes: QueuedChangeSet)>, schema: ServerSchema
    ) -> Int? {
        guard let report = serverReport(error), report.state == "23505", let detail = report.detail,
            detail.hasPrefix("Key ("), let closing = detail.range(of: ")=("),
            let end = detail.range(of: ") already exists", options: .backwards), closing.upperBound <= end.lowerBound
        else { return nil }
        var column = String(detail[detail.index(detail.startIndex, offsetBy: 5)..<closing.lowerBound])
        let value = String(detail[closing.upperBound..<end.lowerBound])
        // A name PostgreSQL quotes (`Key ("firstName")=…`: capitals, a reserved word).
        if column.count >= 2, column.hasPrefix("\""), column.hasSuffix("\"") {
            column = String(column.dropFirst().dropLast()).replacingOccurrences(of: "\"\"", with: "\"")
        } else if column.contains(",") || column.contains("\"") {
            return nil  // several columns
        }
        let unique = schema.tables.compactMap { table in
            table.columns.first { $0.name == column && $0.isUnique }.map { (table.name, $0) }
        }
        guard !unique.isEmpty else { return nil }
        for (position, (_, changes)) in zip(batch.indices, batch) {
            for row in changes.inserted + changes.updated {
                for (table, key) in unique where row.entity == table {
                    guard let written = row.values[column] else { continue }
                    if (try? key.type.serverText(written, typeName: key.typeName)) == value { return position }
                }
            }
        }
        return nil
    }

    /// A server error in words: its message, detail and SQLSTATE.
    package static func describe(_ error: any Error) -> String {
        if let report = serverReport(error), let message = report.message {
            var text = message
            if let detail = report.detail { text += " (\(detail))" }
            return text + " [SQLSTATE \(report.state)]"
        }
        if let error = error as? PSQLError { return "\(error.code)" }
        return "\(error)"
    }

    /// The server's report of a failed statement (its SQLSTATE, message and detail), whichever
    /// of postgres-nio's interfaces ran it: a prepared statement's failure comes as a
    /// `PostgresError`, an unprepared one's as a `PSQLError`. Nil for anything but the
    /// server's refusal (a lost connection, a timeout).
    package static func serverReport(_ error: any Error) -> (state: String, message: String?, detail: String?)? {
        if let error = error as? PSQLError, error.code == .server, let info = error.serverInfo,
            let state = info[.sqlState]
        {
            return (state, info[.message], info[.detail])
        }
        if case .server(let report)? = error as? PostgresError, let state = report.fields[.sqlState] {
            return (state, report.fields[.message], report.fields[.detail])
        }
        return nil
    }
}
