// The README's quick start: `swift run skyros-quickstart`.
import Foundation
import Skyros

@Entity final class User {
    var firstname: String = ""
    var lastname: String = ""
    var age: Int = 0
    @Attribute(.unique) var handle: String = ""
    @Relationship(deleteRule: .cascade, inverse: \Post.author) var posts: [Post] = []
}

@Entity final class Post {
    var title: String = ""
    var author: User? = nil
}

let directory = FileManager.default.temporaryDirectory.appendingPathComponent("skyros-quickstart-\(getpid())")
try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
defer { try? FileManager.default.removeItem(at: directory) }

let store = try Skyros(
    sqliteStack: Schema([User.self, Post.self]), at: directory.appendingPathComponent("store.sqlite"))

// Skopelos style: synchronous, chainable; the completion runs once the write is on disk.
let durable = DispatchSemaphore(value: 0)
store.writeSync(
    { context in
        for (first, last) in [("John", "Doe"), ("Jane", "Doe"), ("Mark", "Smith")] {
            let user = User.create(in: context)
            user.firstname = first
            user.lastname = last
            user.handle = first.lowercased()
            let post = Post.create(in: context)
            post.title = "Hello from \(first)"
            post.author = user  // user.posts contains post at once
        }
    },
    completion: { error in
        print("durable:", error == nil)
        durable.signal()
    }
).read { context in
    let does = try User.all(
        where: #Predicate { $0.lastname == "Doe" }, sortedBy: [SortDescriptor(\.firstname)], in: context)
    print("Does:", does.map(\.firstname))
    print("posts by Jane:", does[0].posts.map(\.title))
}
durable.wait()

// Swift concurrency: values out, errors thrown, `write` returns once durable.
let count = try await store.write { context -> Int in
    try User.first(where: #Predicate { $0.handle == "mark" }, in: context)?.delete(in: context)
    return try User.count(in: context)
}
print("users left:", count)
// Top-level code like this file is ranked by Swift as synchronous code: `read` here is the
// synchronous form, which also returns the value (in an async function, `try await store.read`).
let posts: Int = try store.read { context in try Post.count(in: context) }
print("posts left:", posts)

// A tool that wants its write on disk before it goes on: no completion, no semaphore.
try store.writeAndWait { context in
    let user = User.create(in: context)
    user.firstname = "Ann"
    user.handle = "ann"
}
let users: Int = try store.read { context in try User.count(in: context) }
print("users now:", users)
