import Foundation
import SkyrosZeroMQ
import Testing
import ZeroMQReference

/// Real ZeroMQ sockets over ipc:// files in a temporary directory.
@Suite("ZeroMQ sockets", .timeLimit(.minutes(1)))
struct ZeroMQTests {
    final class Directory: @unchecked Sendable {
        let path: String
        init() throws {
            // ipc:// paths must stay under 107 bytes: keep the directory name short.
            path = "/tmp/skz-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
            try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        }
        func endpoint(_ name: String) -> String { "ipc://\(path)/\(name)" }
        deinit { try? FileManager.default.removeItem(atPath: path) }
    }

    @Test("the linked libzmq is version 4")
    func version() {
        #expect(zeroMQVersion.hasPrefix("4."))
    }

    @Test("request and reply carry multipart messages, empty frames included")
    func requestReply() throws {
        let directory = try Directory()
        let context = try ZeroMQContext()
        let server = try ZeroMQSocket(context: context, kind: .reply)
        try server.bind(directory.endpoint("rr"))
        let client = try ZeroMQSocket(context: context, kind: .request)
        try client.setReceiveTimeout(milliseconds: 5_000)
        try server.setReceiveTimeout(milliseconds: 5_000)
        try client.connect(directory.endpoint("rr"))
        try client.send([Data("hello".utf8), Data(), Data([0, 255])])
        #expect(try server.receive() == [Data("hello".utf8), Data(), Data([0, 255])])
        try server.send([Data("world".utf8)])
        #expect(try client.receive() == [Data("world".utf8)])
    }

    @Test("a receive with a timeout fails with a timeout error instead of hanging")
    func receiveTimeout() throws {
        let directory = try Directory()
        let context = try ZeroMQContext()
        let socket = try ZeroMQSocket(context: context, kind: .pull)
        try socket.bind(directory.endpoint("idle"))
        try socket.setReceiveTimeout(milliseconds: 50)
        #expect {
            _ = try socket.receive()
        } throws: { error in
            (error as? ZeroMQError)?.isTimeout == true
        }
        #expect(try socket.waitForInput(milliseconds: 10) == false)
    }

    @Test("a router sees each dealer's identity frame and answers it")
    func routerDealer() throws {
        let directory = try Directory()
        let context = try ZeroMQContext()
        let router = try ZeroMQSocket(context: context, kind: .router)
        try router.setReceiveTimeout(milliseconds: 5_000)
        try router.bind(directory.endpoint("router"))
        let dealer = try ZeroMQSocket(context: context, kind: .dealer)
        try dealer.setReceiveTimeout(milliseconds: 5_000)
        try dealer.connect(directory.endpoint("router"))
        try dealer.send([Data("ping".utf8)])
        let request = try router.receive()
        #expect(request.count == 2)
        #expect(request.last == Data("ping".utf8))
        try router.send([request[0], Data("pong".utf8)])
        #expect(try dealer.receive() == [Data("pong".utf8)])
        #expect(try ZeroMQSocket.poll([router, dealer], milliseconds: 0).isEmpty)
    }

    @Test("a subscriber receives what is published after it subscribed")
    func publishSubscribe() throws {
        let directory = try Directory()
        let context = try ZeroMQContext()
        let publisher = try ZeroMQSocket(context: context, kind: .publisher)
        try publisher.bind(directory.endpoint("events"))
        let subscriber = try ZeroMQSocket(context: context, kind: .subscriber)
        try subscriber.subscribe()
        try subscriber.connect(directory.endpoint("events"))
        // A subscription takes effect asynchronously (ZeroMQ's slow joiner): publish until
        // the first message arrives, bounded in time, then check the next ones arrive in order.
        var first: [Data]?
        let deadline = Date().addingTimeInterval(5)
        while first == nil && Date() < deadline {
            try publisher.send([Data("warmup".utf8)])
            if try subscriber.waitForInput(milliseconds: 20) { first = try subscriber.receive() }
        }
        #expect(first == [Data("warmup".utf8)])
        while try subscriber.waitForInput(milliseconds: 50) { _ = try subscriber.receive() }
        for number in 1...3 { try publisher.send([Data("event".utf8), Data([UInt8(number)])]) }
        try subscriber.setReceiveTimeout(milliseconds: 5_000)
        for number in 1...3 { #expect(try subscriber.receive() == [Data("event".utf8), Data([UInt8(number)])]) }
    }

    @Test("a message over the maximum size is dropped by the receiver")
    func maximumMessageSize() throws {
        let directory = try Directory()
        let context = try ZeroMQContext()
        let pull = try ZeroMQSocket(context: context, kind: .pull)
        try pull.setMaximumMessageSize(1_024)
        try pull.setReceiveTimeout(milliseconds: 300)
        try pull.bind(directory.endpoint("max"))
        let push = try ZeroMQSocket(context: context, kind: .push)
        try push.connect(directory.endpoint("max"))
        try push.send([Data(count: 4_096)])
        #expect(throws: ZeroMQError.self) { _ = try pull.receive() }
        let small = try ZeroMQSocket(context: context, kind: .push)
        try small.connect(directory.endpoint("max"))
        try small.send([Data(count: 16)])
        try pull.setReceiveTimeout(milliseconds: 5_000)
        #expect(try pull.receive() == [Data(count: 16)])
    }
}
