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
