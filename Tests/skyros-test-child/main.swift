// A child process for the tests: `skyros-test-child <mode> [arguments]`.
//
// - `fingerprint`: prints the test schema's fingerprint.
// - `write-and-wait <store.sqlite> <count>`: starts a writeAsync of <count> users, prints
//   "WRITING", then waits to be stopped by a signal.
// - `write-and-exit <store.sqlite> <count>`: starts a writeAsync and returns from main at once.
// - `shared-writer <container> <count> <tag> <others>`: a client of the group daemon that
//   saves <count> users (one write each) and waits (30 s at most) until it has seen the
//   <others> users the other clients insert; prints "SEEN <n>", exits 0 when all were seen.
import Foundation
import Skyros
import SkyrosShared
import SkyrosTestModels

func writeUsers(_ path: String, _ count: Int) throws -> Skyros {
    let store = try Skyros(sqliteStack: testSchema, at: URL(fileURLWithPath: path))
    store.writeAsync { context in
        for index in 0..<count {
            let user = User.create(in: context)
            user.handle = "child-\(index)"
        }
    }
    return store
}

let arguments = CommandLine.arguments
switch arguments.count > 1 ? arguments[1] : "" {
case "fingerprint":
    print(testSchema.fingerprint)
case "write-and-wait":
    let store = try writeUsers(arguments[2], Int(arguments[3])!)
    FileHandle.standardOutput.write(Data("WRITING\n".utf8))
    while true { sleep(1) }
    withExtendedLifetime(store) {}
case "write-and-exit":
    let store = try writeUsers(arguments[2], Int(arguments[3])!)
    withExtendedLifetime(store) {}
case "shared-open":
    // Opens a shared stack and prints the error code it fails with, or "OPENED".
    do {
        _ = try Skyros(sharedStack: testSchema, container: URL(fileURLWithPath: arguments[2]), timeout: 2)
        print("OPENED")
    } catch let error as SkyrosError {
        print("ERROR \(error.code.rawValue): \(error.message)")
    }
case "ping-pong":
    // `ping-pong <container> <parity>`: increments the counter Tag (label "counter") when
    // its value has this parity, acting only on the other player's change events (player 0
    // makes the first move), until it reaches 100.
    let store = try Skyros(sharedStack: testSchema, container: URL(fileURLWithPath: arguments[2]))
    let parity = Int(arguments[3])!
    let changes = store.changes
    print("READY")
    fflush(nil)
    let go = URL(fileURLWithPath: arguments[2]).appendingPathComponent("go").path
    let start = Date()
    while !FileManager.default.fileExists(atPath: go) && Date().timeIntervalSince(start) < 20 { usleep(5_000) }
    func move() async throws -> Int {
        try await store.write { context -> Int in
            let counter = try Tag.first(where: #Predicate { $0.label == "counter" }, in: context)!
            if counter.uses < 100 && counter.uses % 2 == parity { counter.uses += 1 }
            return counter.uses
        }
    }
    var value = parity == 0 ? try await move() : 0
    let deadline = Task {
        try? await Task.sleep(for: .seconds(40))
        print("TIMEOUT")
        exit(4)
    }
    if value < 100 {
        for await _ in changes {
            value = try await move()
            if value >= 100 { break }
        }
    }
    deadline.cancel()
    print("FINAL \(value)")
case "write-via-shared":
    // Inserts one user through the daemon and exits once it is durable.
    let store = try Skyros(sharedStack: testSchema, container: URL(fileURLWithPath: arguments[2]))
    try await store.write { context in User.create(in: context).handle = "control" }
case "shared-read":
    // Reads only: counts, fetches and faults, then exits.
    let store = try Skyros(sharedStack: testSchema, container: URL(fileURLWithPath: arguments[2]))
    var count = -1
    store.read { context in
        count = try User.count(in: context)
        _ = try User.all(where: #Predicate { $0.age > 0 }, in: context).map(\.firstname)
    }
    print("COUNT \(count)")
case "shared-writer":
    let store = try Skyros(sharedStack: testSchema, container: URL(fileURLWithPath: arguments[2]))
    let count = Int(arguments[3])!
    let tag = arguments[4]
    let others = Int(arguments[5])!
    let changes = store.changes
    let watcher = Task { () -> Int in
        var seen = 0
        for await change in changes {
            seen += change.inserted.count
            if seen >= others { break }
        }
        return seen
    }
    // Start together: every client has said hello before anyone writes.
    print("READY")
    fflush(nil)
    let go = URL(fileURLWithPath: arguments[2]).appendingPathComponent("go").path
    let start = Date()
    while !FileManager.default.fileExists(atPath: go) && Date().timeIntervalSince(start) < 20 { usleep(5_000) }
    for index in 0..<count {
        store.writeSync { context in User.create(in: context).handle = "\(tag)-\(index)" }
    }
    _ = store.flush(timeout: 30)
    let timeout = Task {
        try? await Task.sleep(for: .seconds(30))
        watcher.cancel()
    }
    let seen = await watcher.value
    timeout.cancel()
    print("SEEN \(seen)")
    exit(seen >= others ? 0 : 3)
default:
    FileHandle.standardError.write(
        Data("usage: skyros-test-child fingerprint|write-and-wait|write-and-exit|shared-writer …\n".utf8))
    exit(64)
}
