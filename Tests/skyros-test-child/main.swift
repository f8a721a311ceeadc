// A child process for the tests: `skyros-test-child <mode> [arguments]`.
//
// - `fingerprint`: prints the test schema's fingerprint.
// - `write-and-wait <store.sqlite> <count>`: starts a writeAsync of <count> users, prints
//   "WRITING", then waits to be stopped by a signal.
// - `write-and-exit <store.sqlite> <count>`: starts a writeAsync and returns from main at once.
import Foundation
import Skyros
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
default:
    FileHandle.standardError.write(Data("usage: skyros-test-child fingerprint|write-and-wait|write-and-exit …\n".utf8))
    exit(64)
}
