import Foundation

/// What the clients of a sync fault campaign did and saw, and what the machines and the
/// server hold at its end: the input of ``SyncHistory/check()``.
///
/// Every value a campaign writes is a token no other write uses (`c3.17`: client 3's 17th
/// operation; `psql-5`), so each value read names the write that made it. The server's order
/// of the writes comes from an audit table the campaign adds to the server (a row trigger on
/// `User`: one row per insert, update and delete, numbered in the order they happened; a
/// row's updates are serialized by its lock, so the numbers follow their commits).
public struct SyncHistory: Sendable {
    /// One operation of a client: a save (with what it wrote) or a read.
    public struct Operation: Sendable {
        public enum Kind: String, Sendable {
            case insert, update, delete, read
        }

        /// The client (an app's stack), numbered from 0; `psql` writes have client -1.
        public var client: Int
        /// The machine whose daemon the client used (-1: psql, on the server).
        public var machine: Int
        public var kind: Kind
        /// The object written (an update, a delete, an insert's new object).
        public var object: UUID?
        /// The property written (`firstname`, `lastname`; `handle` for an insert).
        public var property: String?
        /// The token written.
        public var value: String?
        /// Whether the save was acknowledged (returned without an error).
        public var acknowledged: Bool
        /// Why the save failed, when it did (its outcome is then unknown: it may be saved).
        public var error: String?
        /// Whether an update or a delete found its object (false: it changed nothing, and is
        /// no write; a machine's writers update the shared objects before its first checkpoint
        /// brought them, say).
        public var found = true
        /// When the operation started and ended, in seconds since the campaign started.
        public var start: Double
        public var end: Double
        /// What the client read after the operation (a read, or the check after a save).
        public var reads: [Read] = []
        /// Why that read failed, when it did (its values are then missing, and counted so).
        public var readError: String?

        /// An operation; an update of `property` to `value` when they are given.
        public init(
            client: Int, machine: Int, kind: Kind, object: UUID? = nil, property: String? = nil, value: String? = nil,
            acknowledged: Bool, error: String? = nil, start: Double, end: Double
        ) {
            self.client = client
            self.machine = machine
            self.kind = kind
            self.object = object
            self.property = property
            self.value = value
            self.acknowledged = acknowledged
            self.error = error
            self.start = start
            self.end = end
        }
    }

    /// One value read by a client: a property of a shared object, or the `handle` of an
    /// object the client inserted (nil: missing) or deleted.
    public struct Read: Sendable {
        public var object: UUID
        public var property: String
        /// The value read; nil when the object was missing.
        public var value: String?
        /// The machine's sync checkpoint (the server snapshot it last applied) when the value
        /// was read, read from its store just before the read: the value is at this checkpoint
        /// or a later one.
        public var checkpoint: String?
    }

    /// One row of the server's audit table.
    public struct AuditRow: Sendable {
        public var sequence: Int64
        /// The server transaction that made the change (`pg_current_xact_id()`).
        public var transaction: String = ""
        /// `I`, `U` or `D`.
        public var operation: Character
        public var object: UUID
        public var handle: String
        public var firstname: String
        public var lastname: String

        public init(
            sequence: Int64, transaction: String = "", operation: Character, object: UUID, handle: String,
            firstname: String, lastname: String
        ) {
            self.sequence = sequence
            self.transaction = transaction
            self.operation = operation
            self.object = object
            self.handle = handle
            self.firstname = firstname
            self.lastname = lastname
        }
    }

    /// An object's stored values: `handle|firstname|lastname`.
    public typealias Rows = [UUID: String]

    /// What one machine holds at the end.
    public struct Machine: Sendable {
        /// Its machine id (`syncMachine`).
        public var id: UUID?
        /// Its `User` objects, read from its daemon's store file.
        public var rows: Rows
        /// The `User` objects each of its apps (by client) reads through its main context.
        public var appRows: [Int: Rows] = [:]
        /// Change sets still queued.
        public var queued: Int
        /// The highest queue number it ever gave (its change sets are 1 … this).
        public var lastNumber: Int64
        /// Its rejected log: number, reason, and the objects of the change set.
        public var rejected: [(number: Int64, reason: String, objects: Set<UUID>)]
        /// Its checkpoint.
        public var checkpoint: String?
        /// Its first change set number under its last machine id: 1, or the highest number of
        /// the backup its store was last restored from, plus one (the restored store numbers
        /// on from there).
        public var firstNumber: Int64 = 1
        /// The numbers of its rejected log that its store holds from the backup it was last
        /// restored from (refusals of earlier lives, under earlier machine ids).
        public var inherited: Set<Int64> = []
        /// When its store's last life began: 0, or when its daemon started on the restored store.
        public var began: Double = 0
        /// Its store's earlier lives, oldest first, each ended by a restore from a backup
        /// (``SyncFaultCampaign/FaultKind/restoreBackup``): the daemon goes on under a new
        /// machine id.
        public var earlierLives: [Life] = []

        /// A machine as the campaign reads it at the end: one life, its change sets 1 … `lastNumber`.
        public init(
            id: UUID?, rows: Rows, queued: Int = 0, lastNumber: Int64,
            rejected: [(number: Int64, reason: String, objects: Set<UUID>)] = [], checkpoint: String? = nil
        ) {
            self.id = id
            self.rows = rows
            self.queued = queued
            self.lastNumber = lastNumber
            self.rejected = rejected
            self.checkpoint = checkpoint
        }

        /// Its store's lives, oldest first: the earlier ones and the last one (``id`` …).
        public var lives: [Life] {
            earlierLives + [
                Life(
                    id: id, firstNumber: firstNumber, lastNumber: lastNumber, queued: queued, rejected: rejected,
                    inherited: inherited, began: began, ended: nil)
            ]
        }

        /// One life of a machine's store under one machine id, from the campaign's start or a
        /// restore from a backup to the next restore or the end: the change sets it numbered
        /// and the server recorded under that id, and its rejected log.
        public struct Life: Sendable {
            /// Its machine id (nil: none yet, the store never synced).
            public var id: UUID?
            /// It numbered its change sets `firstNumber … lastNumber`.
            public var firstNumber: Int64
            public var lastNumber: Int64
            /// Change sets queued at its end (a restore waits for none).
            public var queued: Int
            /// Its rejected log at its end.
            public var rejected: [(number: Int64, reason: String, objects: Set<UUID>)]
            /// The numbers of that log it began with (from its backup: earlier lives' refusals).
            public var inherited: Set<Int64>
            /// When it began and ended (nil: the last), in seconds since the campaign started.
            /// No save of the machine was in flight at either moment (the campaign pauses the
            /// machine's writers around a restore), so each save belongs to one life.
            public var began: Double
            public var ended: Double?

            public init(
                id: UUID?, firstNumber: Int64, lastNumber: Int64, queued: Int,
                rejected: [(number: Int64, reason: String, objects: Set<UUID>)], inherited: Set<Int64>,
                began: Double, ended: Double?
            ) {
                self.id = id
                self.firstNumber = firstNumber
                self.lastNumber = lastNumber
                self.queued = queued
                self.rejected = rejected
                self.inherited = inherited
                self.began = began
                self.ended = ended
            }

            /// The numbers it gave.
            public var numbers: [Int64] { firstNumber <= lastNumber ? Array(firstNumber...lastNumber) : [] }
        }
    }

    /// One `_skyros_uploads` row.
    public struct Upload: Sendable {
        public var machine: UUID
        public var number: Int64
        public var rejected: String?
        /// The server transaction that recorded it: the change sets of a machine recorded in
        /// one transaction went up in one upload.
        public var transaction: String = ""
        /// The objects of a refused change set, as the server recorded them.
        public var objects: Set<UUID> = []

        public init(
            machine: UUID, number: Int64, rejected: String? = nil, transaction: String = "", objects: Set<UUID> = []
        ) {
            self.machine = machine
            self.number = number
            self.rejected = rejected
            self.transaction = transaction
            self.objects = objects
        }
    }

    public var operations: [Operation] = []
    /// The values of the shared objects before the campaign (tokens `init-…`).
    public var initialTokens: Set<String> = []
    public var audit: [AuditRow] = []
    public var serverRows: Rows = [:]
    public var uploads: [Upload] = []
    public var machines: [Machine] = []
    /// The machine of each client (an app's stack).
    public var clients: [Int: Int] = [:]
    /// The refusals each client's app was told (``Skyros/handleError(_:)`` with
    /// `syncRejected`): the objects each named, in the order told.
    public var told: [Int: [Set<UUID>]] = [:]

    public init() {}

    /// The guarantees the checker verifies, each a check of the verdict.
    public enum Guarantee: String, Sendable, CaseIterable {
        case noLostWrite = "no lost write"
        case exactlyOnce = "exactly once"
        case convergence = "convergence"
        case sessions = "read-your-writes and monotonic reads"
        case noValueOutOfThinAir = "no value out of thin air"
        case refusalsTold = "refusals told"
    }

    /// What the checker found: each guarantee's verdict with its counts and first violations.
    public struct Verdict: Sendable, CustomStringConvertible {
        public struct Check: Sendable {
            public var guarantee: Guarantee
            public var name: String { guarantee.rawValue }
            public var passed: Bool
            /// What was checked (counts).
            public var detail: String
            /// The first violations (at most 10).
            public var violations: [String]
        }

        public var checks: [Check]
        public var passed: Bool { checks.allSatisfy(\.passed) }
        /// The guarantees whose check failed.
        public var failed: Set<Guarantee> { Set(checks.filter { !$0.passed }.map(\.guarantee)) }

        /// The check of a guarantee.
        public subscript(_ guarantee: Guarantee) -> Check? { checks.first { $0.guarantee == guarantee } }

        public var description: String {
            checks.map { check in
                let head = "\(check.passed ? "PASS" : "FAIL") \(check.name): \(check.detail)"
                return ([head] + check.violations.map { "    \($0)" }).joined(separator: "\n")
            }.joined(separator: "\n")
        }
    }

}
