// The async forms of `read` and `write` in top-level code: `swift run skyros-toplevel`.
//
// Swift ranks the overloads of top-level code as in synchronous code, where an async function
// always loses to a synchronous one. `read` therefore has a synchronous value-returning form
// beside the chaining one, so `names` is `[String]` here too (not the stack, as the chaining
// `read` would give); the compiler notes that the `await` of that line is not needed. `write`
// has no synchronous form of that name: its line runs the async `write`.
import Foundation
import Skyros

@Entity final class User {
    var firstname: String = ""
}

let directory = FileManager.default.temporaryDirectory.appendingPathComponent("skyros-toplevel-\(getpid())")
try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
defer { try? FileManager.default.removeItem(at: directory) }
let store = try Skyros(sqliteStack: Schema([User.self]), at: directory.appendingPathComponent("store.sqlite"))
try store.writeAndWait { context in
    for name in ["Ann", "John"] { User.create(in: context).firstname = name }
}

let names = try await store.read { context in try User.all(in: context).map(\.firstname) }
let id = try await store.write { context in User.create(in: context).objectID }

let sorted: [String] = names.sorted()  // compiles only if `names` is [String]
print("names:", sorted.joined(separator: ", "))
print("created:", id.uriRepresentation)
