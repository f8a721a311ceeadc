import Foundation
import Skyros
import SkyrosDaemon
import SkyrosTestSupport
import SkyrosWire
import SkyrosZeroMQ
import Testing

/// Admin sessions on the wire (docs/PROTOCOL.md, "Admin sessions"), against a daemon over
/// real ZeroMQ sockets.
@Suite("Admin sessions", .timeLimit(.minutes(3)))
struct AdminSessionTests {
    /// Sends an admin request and decodes the reply (an admin message or a client-protocol one).
    func admin(_ client: RawClient, _ message: AdminMessage) throws -> (admin: AdminMessage?, wire: WireMessage.Body?) {
        let id = client.nextID
        client.nextID += 1
        try client.dealer.send([Data(message.encoded(requestID: id))])
        let bytes = [UInt8](try client.dealer.receive().last!)
        let header = try #require(WireHeader(bytes))
        #expect(header.requestID == id)
        if AdminMessage.isAdmin(header) { return (try AdminMessage.decode(bytes).message, nil) }
        return (nil, try WireMessage.decode(bytes).body)
    }

    @Test("every admin message round-trips through its encoding")
    func roundTrip() throws {
        let messages: [AdminMessage] = [
            .hello(clientName: "skyros status", pid: 42), .status, .history(since: 7, limit: 100),
            .backup(path: "/tmp/copy.sqlite", pagesPerStep: 1_024), .describeSchema, .metrics,
            .statusReply(json: "{\"pid\":1}"),
            .historyReply(
                [
                    .init(
                        sequence: 3, kind: .reset, authorID: UUID(), author: "a", timestamp: 1.5, inserted: 1,
                        updated: 2, deleted: 3)
                ],
                more: true),
            .backupProgress(.init(copied: 5, total: 9, done: true, bytes: 4_096, sequence: 12)),
            .schemaReply(description: "{}", fingerprint: "ab", version: 2), .metricsReply("# TYPE x counter\nx 1\n"),
        ]
        for message in messages {
            let bytes = message.encoded(requestID: 9)
            let decoded = try AdminMessage.decode(bytes)
            #expect(decoded.requestID == 9 && decoded.message == message)
            for cut in 0..<bytes.count {
                #expect(throws: WireError.self) { try AdminMessage.decode(Array(bytes[0..<cut])) }
            }
        }
    }

    @Test("status lists the clients whose connection is open; those that left are counted, not listed")
    func statusListsConnectedClientsOnly() throws {
        let daemon = try RunningDaemon()
        let staying = try RawClient(daemon)
        _ = try staying.call(RawClient.hello(name: "staying"))
        let leaving = try RawClient(daemon)
        _ = try leaving.call(RawClient.hello(name: "leaving"))
        let ops = try RawClient(daemon)
        guard case .welcome? = try admin(ops, .hello(clientName: "ops", pid: 1)).wire else {
            Issue.record("no welcome")
            return
        }
        func status() throws -> [String: Any] {
            guard case .statusReply(let json)? = try admin(ops, .status).admin else { return [:] }
            return try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any] ?? [:]
        }
        func names(_ status: [String: Any]) -> [String] {
            (status["clients"] as? [[String: Any]] ?? []).compactMap { $0["name"] as? String }.sorted()
        }
        var current = try status()
        #expect(names(current) == ["leaving", "staying"])
        #expect(current["clientsDisconnected"] as? Int == 0)
        for client in (current["clients"] as? [[String: Any]] ?? []) {
            #expect(client["connectedAt"] is String && client["lastSeenAt"] is String, "\(client)")
        }
        // The client exits: its connection closes, and the daemon hears of it on its loop.
        leaving.dealer.close()
        leaving.subscriber.close()
        let deadline = Date().addingTimeInterval(5)
        while current["clientsDisconnected"] as? Int != 1 && Date() < deadline { current = try status() }
        #expect(names(current) == ["staying"])
        #expect(current["clientsDisconnected"] as? Int == 1)
    }

    @Test("an admin session needs no schema: welcome with topic 0, then status, history, schema and metrics")
    func session() throws {
        let daemon = try RunningDaemon()
        let member = try RawClient(daemon)
        _ = try member.hello()
        #expect(
            try member.call(
                .save(
                    clientID: .named("m"), saveNumber: 1,
                    changes: ChangeSet(inserted: [
                        Snapshot(
                            id: .make(entityName: "User"),
                            values: [.text("A"), .text("B"), .integer(3), .null, .text("h"), .null])
                    ]))) == .saved(sequence: 1))
        // A client session may not ask admin questions without opening an admin session.
        #expect(errorCode(try admin(member, .status).wire!) == "helloRequired")

        let client = try RawClient(daemon)
        #expect(errorCode(try admin(client, .status).wire!) == "helloRequired")
        guard case .welcome(let welcome)? = try admin(client, .hello(clientName: "ops", pid: 1)).wire else {
            Issue.record("no welcome")
            return
        }
        #expect(welcome.eventTopic == WireProtocol.broadcastTopic && welcome.sequence == 1)
        guard case .statusReply(let json)? = try admin(client, .status).admin,
            let status = try JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any]
        else {
            Issue.record("no status")
            return
        }
        #expect(status["sequence"] as? Int == 1 && status["pid"] as? Int == Int(getpid()))
        #expect((status["clients"] as? [[String: Any]])?.first?["name"] as? String == "test")
        guard case .historyReply(let entries, let more)? = try admin(client, .history(since: 0, limit: 0)).admin else {
            Issue.record("no history")
            return
        }
        #expect(entries.map(\.sequence) == [1] && entries.first?.inserted == 1 && !more)
        guard case .schemaReply(_, let fingerprint, _)? = try admin(client, .describeSchema).admin else {
            Issue.record("no schema")
            return
        }
        #expect(fingerprint == testSchema.fingerprint)
        guard case .metricsReply(let text)? = try admin(client, .metrics).admin else {
            Issue.record("no metrics")
            return
        }
        #expect(text.contains("skyros_saves_total 1"))
        // Client requests to read and catch up are allowed; a reset is not.
        #expect(try client.call(.count(StoreRequest(entityName: "User"))) == .countReply(1))
        #expect(errorCode(try client.call(.deleteAll(clientID: .named("ops"), saveNumber: 1))) == "malformedMessage")
    }

    @Test("a backup through an admin session reports progress, then the copy's size and sequence")
    func backup() throws {
        let daemon = try RunningDaemon()
        let member = try RawClient(daemon)
        _ = try member.hello()
        for number in 1...3 {
            _ = try member.call(
                .save(
                    clientID: .named("m"), saveNumber: UInt64(number),
                    changes: ChangeSet(inserted: [
                        Snapshot(
                            id: .make(entityName: "User"),
                            values: [.text("A"), .text("B"), .integer(3), .null, .text("h\(number)"), .null])
                    ])))
        }
        let client = try RawClient(daemon)
        _ = try admin(client, .hello(clientName: "ops", pid: 1))
        let path = daemon.directory + "/copy.sqlite"
        var reply = try admin(client, .backup(path: path, pagesPerStep: 1))
        while case .backupProgress(let progress)? = reply.admin, !progress.done {
            reply = (try AdminMessage.decode([UInt8](try client.dealer.receive().last!)).message, nil)
        }
        guard case .backupProgress(let done)? = reply.admin else {
            Issue.record("no end of backup: \(reply)")
            return
        }
        #expect(done.done && done.sequence == 3 && done.bytes > 0 && done.copied == done.total)
        #expect(
            FileManager.default.fileExists(atPath: path) && !FileManager.default.fileExists(atPath: path + ".partial"))
        #expect(errorCode(try admin(client, .backup(path: path, pagesPerStep: 0)).wire!) == "storeFailure")
        // A partial copy left by an interrupted backup is neither used nor removed.
        let other = daemon.directory + "/other.sqlite"
        _ = FileManager.default.createFile(atPath: other + ".partial", contents: Data("mine".utf8))
        #expect(errorCode(try admin(client, .backup(path: other, pagesPerStep: 0)).wire!) == "storeFailure")
        #expect(FileManager.default.contents(atPath: other + ".partial") == Data("mine".utf8))
        #expect(!FileManager.default.fileExists(atPath: other))
    }
}
