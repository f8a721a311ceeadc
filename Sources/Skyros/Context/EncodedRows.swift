import Foundation

/// The rows of objects another process inserted, as its change event carried them: their
/// identifiers and versions read, their values left encoded until someone reads them.
///
/// A shared stack's event thread merges every other process's inserts into its main
/// context, which keeps them as rows (``MergedRows``) and usually never reads them: decoding
/// each value, and freeing it when the rows turn over, was most of the event thread's work
/// per change set. The change events of one message share one ``Source``; a change's rows
/// are a range of it. The decoder checks the values as it skips them (a malformed one
/// refuses the message, as decoding it would), so a row always decodes; should one not, it
/// is simply not there (read from the store when asked for, as a row dropped by
/// ``MergedRows`` is).
///
/// A row kept encoded keeps its whole message alive: only messages of at most
/// ``maximumMessageBytes`` are read this way (a larger one is decoded whole), which bounds
/// what ``MergedRows``' 512 rows can hold at 4 MiB, however large the other changes of a
/// message were.
package struct EncodedRows: Sendable, Hashable {
    /// The largest message whose inserts are kept encoded (8 KiB: the daemon's messages of
    /// one-object saves, 15–20 change sets each under load, are 2–3 KiB).
    package static let maximumMessageBytes = 8 * 1_024

    /// The rows of one message of change events, and the message's bytes. Built by the wire
    /// decoder while it reads the message, immutable afterwards.
    package final class Source: @unchecked Sendable {
        /// One row: where its values start in the message, and how many there are.
        struct Row {
            var id: ObjectID
            var version: Int64
            var offset: Int
            var count: Int
        }

        /// Decodes `count` values at `offset` of the message; nil when they are malformed.
        package typealias Decoder = @Sendable (_ bytes: [UInt8], _ offset: Int, _ count: Int) -> StoredValues?

        let bytes: [UInt8]
        // Appended to by the one thread decoding the message, read-only afterwards.
        @exclusivity(unchecked) private var rows: [Row] = []
        let decoder: Decoder

        package init(bytes: [UInt8], decoder: @escaping Decoder) {
            self.bytes = bytes
            self.decoder = decoder
            rows.reserveCapacity(16)
        }

        /// Adds a row (while the message is read).
        package func append(id: ObjectID, version: Int64, offset: Int, count: Int) {
            rows.append(Row(id: id, version: version, offset: offset, count: count))
        }

        /// How many rows there are (read from the wire decoder's module through this: a
        /// property of a class is checked for exclusive access from another module).
        package var rowCount: Int { rows.count }

        /// The identifier of the row at `index`.
        func id(at index: Int) -> ObjectID { rows[index].id }

        /// The version of the row at `index`.
        func version(at index: Int) -> Int64 { rows[index].version }

        /// The values of the row at `index`, decoded; nil when they are malformed.
        func values(at index: Int) -> StoredValues? {
            decoder(bytes, rows[index].offset, rows[index].count)
        }
    }

    package let source: Source
    /// The rows of this change in ``source``.
    package let range: Range<Int>

    package init(source: Source, range: Range<Int>) {
        self.source = source
        self.range = range
    }

    package var isEmpty: Bool { range.isEmpty }

    /// Every row decoded, in order (a row that does not decode is left out).
    package var snapshots: [Snapshot] {
        range.compactMap { index in
            source.values(at: index).map {
                Snapshot(id: source.id(at: index), values: $0, version: source.version(at: index))
            }
        }
    }

    package static func == (lhs: EncodedRows, rhs: EncodedRows) -> Bool {
        lhs.source === rhs.source && lhs.range == rhs.range
    }

    package func hash(into hasher: inout Hasher) {
        hasher.combine(ObjectIdentifier(source))
        hasher.combine(range)
    }
}

extension StoreChange {
    /// This change with its inserted objects' values decoded (``inserted``), for whoever
    /// reads them: a stream of ``Skyros/changes``, an observed context.
    package var decoded: StoreChange {
        guard let encodedInserted else { return self }
        var change = self
        change.inserted += encodedInserted.snapshots
        change.encodedInserted = nil
        return change
    }
}
