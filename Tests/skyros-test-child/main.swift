// A child process for the tests: `skyros-test-child <mode> [arguments]`.
//
// - `fingerprint`: prints the test schema's fingerprint.
// - `write-and-wait <store.sqlite> <count>`: starts a writeAsync of <count> users, prints
//   "WRITING", then waits to be stopped by a signal.
// - `write-and-exit <store.sqlite> <count>`: starts a writeAsync and returns from main at once.
// - `shared-writer <container> <count> <tag> <others>`: a client of the group daemon that
//   saves <count> users (one write each) and waits (30 s at most) until it has seen the
//   <others> users the other clients insert; prints "SEEN <n>", exits 0 when all were seen.
// - `storm-writer <container> <index> <count>`: writes <count> change sets (a user and two
//   posts, and an update of the board of the next writer), printing "ACK <label>" for each
//   one acknowledged and retrying a failed one under a new label; then "DONE". Then waits
//   for the file `check` (the sequence to reach) and writes what its main context holds to
//   `digest-<index>`.
// - `watcher <container> <name>`: holds every Tag in its main context, prints "READY", waits
//   for `check-<name>` and writes what it holds to `digest-<name>`.
// - `rename-user <container> <handle> <firstname>`: sets that user's firstname through the
//   daemon, prints "RENAMED" once it is durable.
// - `link-keywords <container> <article> [+keyword|-keyword]…`: links and unlinks keywords
//   of an article of `linkSchema` in one write through the daemon; prints "LINKED".
// - `add-vehicles <container>`: adds a car and a tow truck (entity inheritance).
// - `move-step <container> <checklist> <step> <index>`: moves a step of a checklist of
//   `orderSchema` to that index in one write through the daemon; prints "MOVED".
// - `big-save <container> <count>`: prints "SAVING" and saves <count> users in one change set.
// - `read-flood <container>`: prints "READY", then fetches every user in a loop until the
//   file `stop-flood` appears in the container (60 s at most); prints "READS <n>".
// - `raw-subscribe <container> <seconds>`: subscribes to every message of the events socket
//   with a plain ZeroMQ SUB socket (no hello), prints "SUBSCRIBED", counts what arrives for
//   <seconds> and prints "RECEIVED <n>".
// - `service-write <store.sqlite> <count>`: a stack made with `savesOnStop: false` run by a
//   ServiceLifecycle ServiceGroup (SIGTERM: graceful shutdown) through a SkyrosService; a
//   writeAsync of <count> users that takes a second, and a user left unsaved in the main
//   context; prints "WRITING" once the group runs, "STOPPED" when it returns.
// - `ack-writer <container> <name>`: saves one user (firstname "ack", lastname
//   "<name>-<n>") per write, forever, printing (and flushing) "ACK <n>" once each is
//   acknowledged and "FAIL <n>" when one fails.
// - `handler-state <store.sqlite> <true|false>`: a stack made with that `savesOnStop`, a
//   user left unsaved in the main context; prints "HANDLER default" or "HANDLER installed"
//   (SIGTERM's disposition), then waits to be stopped by a signal.
// - `migrate-and-hang <store.sqlite>`: opens a version-1 store of MigrationModels with
//   version 2; its stage updates every author, prints "MIGRATING" and waits to be killed,
//   inside the migration's transaction.
import Foundation
import Logging
import ServiceLifecycle
import Skyros
import SkyrosServiceLifecycle
import SkyrosShared
import SkyrosTestSupport
import SkyrosWire
import SkyrosZeroMQ
import ZeroMQReference

/// Waits (30 s at most) for a file and returns its contents.
func waitForFile(_ path: String) -> String? {
    let deadline = Date().addingTimeInterval(30)
    while Date() < deadline {
        if let text = try? String(contentsOfFile: path, encoding: .utf8), text.hasSuffix("\n") { return text }
        usleep(5_000)
    }
    return nil
}

/// Waits until the shared stack has merged change set `target`, then writes what the main
/// context holds — the held tags (read from their registered instances) and the storm users
/// with their post counts — to `digest-<name>`, one sorted line each.
func writeDigest(_ store: Skyros, held: [Tag], container: String, name: String) throws {
    guard let text = waitForFile(container + "/check-" + name),
        let target = UInt64(text.trimmingCharacters(in: .whitespacesAndNewlines))
    else {
        print("NO CHECK FILE")
        exit(5)
    }
    let remote = store.store as! RemoteStore
    let deadline = Date().addingTimeInterval(30)
    while remote.sequence < target && Date() < deadline { usleep(5_000) }
    guard remote.sequence >= target else {
        print("STUCK AT \(remote.sequence) OF \(target)")
        exit(6)
    }
    let start = Date()
    let lines: [String]
    do {
        // Two fetches: the users, then the posts, each post's author one of the users fetched
        // (no round trip). Counting `user.posts` would fault each user's to-many (4,000 round
        // trips a writer, 11 s for the eight on a quiet machine: past their timeout on a busy one).
        lines = try store.read { context in
            let users = try User.all(where: #Predicate { $0.firstname == "storm" }, in: context)
            var posts = Dictionary(uniqueKeysWithValues: users.map { (ObjectIdentifier($0), 0) })
            for post in try Post.all(in: context) {
                if let author = post.author { posts[ObjectIdentifier(author)]? += 1 }
            }
            return held.filter { !$0.isDeleted }.map { "tag \($0.label)=\($0.uses)" }
                + users.map { "user \($0.lastname) posts=\(posts[ObjectIdentifier($0)] ?? 0)" }
        }
    } catch {
        print("READ FAILED after \(Date().timeIntervalSince(start)) s: \(error)")
        exit(8)
    }
    try (lines.sorted().joined(separator: "\n") + "\n").write(
        toFile: container + "/digest-" + name, atomically: true, encoding: .utf8)
    print("DIGEST \(lines.count) in \(Date().timeIntervalSince(start)) s")
}

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
case "rename-user":
    // `rename-user <container> <handle> <firstname>`: sets the firstname of the user with that
    // handle through the daemon and exits once it is durable.
    let store = try Skyros(sharedStack: testSchema, container: URL(fileURLWithPath: arguments[2]))
    let handle = arguments[3]
    let firstname = arguments[4]
    try store.writeAndWait { context in
        try User.first(where: #Predicate { $0.handle == handle }, in: context)?.firstname = firstname
    }
    print("RENAMED")
case "link-keywords":
    // `link-keywords <container> <article> [+keyword|-keyword]…`: links (+) and unlinks (-)
    // keywords of the article with that title (linkSchema) in one write through the daemon.
    let store = try Skyros(sharedStack: linkSchema, container: URL(fileURLWithPath: arguments[2]))
    let title = arguments[3]
    try store.writeAndWait { context in
        guard let article = try Article.first(where: #Predicate { $0.title == title }, in: context) else { return }
        var keywords = article.keywords
        for edit in arguments.dropFirst(4) {
            let name = String(edit.dropFirst())
            guard let keyword = try Keyword.first(where: #Predicate { $0.name == name }, in: context) else { continue }
            if edit.hasPrefix("+") { keywords.append(keyword) } else { keywords.removeAll { $0 === keyword } }
        }
        article.keywords = keywords
    }
    print("LINKED")
case "move-step":
    // `move-step <container> <checklist> <step> <index>`: moves the step with that title to
    // that index of the checklist's steps (orderSchema) in one write through the daemon.
    let store = try Skyros(sharedStack: orderSchema, container: URL(fileURLWithPath: arguments[2]))
    let (name, title, index) = (arguments[3], arguments[4], Int(arguments[5])!)
    try store.writeAndWait { context in
        guard let list = try Checklist.first(where: #Predicate { $0.name == name }, in: context) else { return }
        var steps = list.steps
        guard let from = steps.firstIndex(where: { $0.title == title }) else { return }
        steps.insert(steps.remove(at: from), at: min(index, steps.count - 1))
        list.steps = steps
    }
    print("MOVED")
case "add-vehicles":
    // `add-vehicles <container>`: a car C9 and a tow truck W9 (vehicleSchema), through the daemon.
    let store = try Skyros(sharedStack: vehicleSchema, container: URL(fileURLWithPath: arguments[2]))
    try store.writeAndWait { context in
        let car = Car.create(in: context)
        car.plate = "C9"
        car.doors = 3
        let tow = TowTruck.create(in: context)
        tow.plate = "W9"
        tow.hookRating = 4
        tow.garage = try Garage.first(in: context)
    }
    print("ADDED")
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
case "storm-writer":
    let container = arguments[2]
    let index = Int(arguments[3])!
    let count = Int(arguments[4])!
    let store = try Skyros(sharedStack: testSchema, container: URL(fileURLWithPath: container), timeout: 30)
    var held: [Tag] = []
    store.read { context in
        held = try Tag.all(in: context)
        _ = held.map(\.uses)  // fire the faults: from now on they hold values, kept fresh only by merges
    }
    print("READY")
    fflush(nil)
    _ = waitForFile(container + "/go")
    let board = "board-\((index + 1) % 8)"
    for number in 0..<count {
        var attempt = 0
        while true {
            let label = "\(index)-\(number)-\(attempt)"
            do {
                try await store.write { context in
                    let user = User.create(in: context)
                    user.firstname = "storm"
                    user.lastname = label
                    user.handle = UUID().uuidString
                    for part in 0..<2 {
                        let post = Post.create(in: context)
                        post.title = "\(label)/\(part)"
                        post.author = user
                    }
                    try Tag.first(where: #Predicate { $0.label == board }, in: context)?.uses = number
                }
                print("ACK \(label)")
                break
            } catch {
                print("FAIL \(label) \(error)")
                attempt += 1
                guard attempt < 20 else { exit(7) }
            }
        }
    }
    print("DONE")
    fflush(nil)
    try writeDigest(store, held: held, container: container, name: "\(index)")
case "watcher":
    // A subscriber with a tiny event queue: events are dropped as soon as it falls behind.
    let container = arguments[2]
    let store = Skyros(
        sharedStack: try RemoteStore(
            schema: testSchema, container: GroupContainer(url: URL(fileURLWithPath: container)), timeout: 30,
            eventQueueLimit: 1, eventSocketBufferBytes: 4_096))
    var held: [Tag] = []
    store.read { context in
        held = try Tag.all(in: context)
        _ = held.map(\.uses)  // fire the faults: from now on they hold values, kept fresh only by merges
    }
    print("READY \(held.count)")
    fflush(nil)
    try writeDigest(store, held: held, container: container, name: arguments[3])
case "observed-writer":
    // Random inserts, updates and deletes of users through the daemon (seeded), for a
    // fetched-results controller in another process to follow.
    let store = try Skyros(sharedStack: testSchema, container: URL(fileURLWithPath: arguments[2]), timeout: 30)
    var state = UInt64(arguments[3])!
    func random(_ bound: Int) -> Int {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return Int((z ^ (z >> 31)) % UInt64(bound))
    }
    let lastnames = ["Adams", "Baker", "Clark", "Doe", "Evans"]
    for step in 0..<Int(arguments[4])! {
        let (kind, pick, age, last) = (random(10), random(1_000), random(70), lastnames[random(lastnames.count)])
        try store.writeAndWait { context in
            let users = try User.all(in: context)
            if kind < 5 || users.isEmpty {
                let user = User.create(in: context)
                user.firstname = "P\(arguments[3])-\(step)"
                user.lastname = last
                user.age = age
                user.handle = "observed-\(arguments[3])-\(step)"
            } else if kind < 8 {
                let user = users[pick % users.count]
                if kind == 5 { user.age = age } else { user.lastname = last }
            } else {
                context.delete(users[pick % users.count])
            }
        }
    }
    print("DONE")
case "batch":
    // A batch update or delete through the daemon: users of at least the given age.
    let store = try Skyros(
        sharedStack: testSchema, container: URL(fileURLWithPath: arguments[2]), timeout: 30, savesOnStop: false)
    let age = Int(arguments[4])!
    let count =
        if arguments[3] == "delete" {
            try await store.batchDelete(User.self, where: #Predicate { $0.age >= age })
        } else {
            try await store.batchUpdate(User.self, where: #Predicate { $0.age >= age }, .set(\.lastname, to: "Batch"))
        }
    print("DONE \(count)")
case "batch-storm":
    // Batches through a daemon that is SIGKILLed meanwhile: tag s<k> is updated (uses = k + 1,
    // k even) or deleted (k odd), one batch each; each must count exactly one object.
    let container = arguments[2]
    let count = Int(arguments[3])!
    let store = try Skyros(
        sharedStack: testSchema, container: URL(fileURLWithPath: container), timeout: 30, savesOnStop: false)
    print("READY")
    fflush(nil)
    _ = waitForFile(container + "/go")
    for k in 0..<count {
        let label = "s\(k)"
        do {
            let affected =
                if k % 2 == 0 {
                    try await store.batchUpdate(
                        Tag.self, where: #Predicate { $0.label == label }, .set(\.uses, to: k + 1))
                } else {
                    try await store.batchDelete(Tag.self, where: #Predicate { $0.label == label })
                }
            guard affected == 1 else {
                print("FAIL \(k) counted \(affected)")
                exit(3)
            }
            print("ACK \(k)")
            fflush(nil)
        } catch {
            print("FAIL \(k) \(error)")
            exit(4)
        }
    }
    print("DONE")
case "big-save":
    let store = try Skyros(sharedStack: testSchema, container: URL(fileURLWithPath: arguments[2]), timeout: 30)
    let count = Int(arguments[3])!
    print("SAVING")
    fflush(nil)
    try await store.write { context in
        for index in 0..<count {
            let user = User.create(in: context)
            user.firstname = "big"
            user.handle = "big-\(index)"
        }
    }
    print("SAVED")
case "read-flood":
    let store = try Skyros(sharedStack: testSchema, container: URL(fileURLWithPath: arguments[2]), timeout: 30)
    let stop = arguments[2] + "/stop-flood"
    print("READY")
    fflush(nil)
    var reads = 0
    let deadline = Date().addingTimeInterval(60)
    while !FileManager.default.fileExists(atPath: stop) && Date() < deadline {
        reads += try store.read { context in try User.all(in: context).count } > 0 ? 1 : 0
    }
    print("READS \(reads)")
case "raw-subscribe":
    let zmq = try ZeroMQContext()
    let events = try ZeroMQSocket(context: zmq, kind: .subscriber)
    try events.subscribe()
    try events.setReceiveTimeout(milliseconds: 100)
    try events.connect(GroupContainer(url: URL(fileURLWithPath: arguments[2])).eventsEndpoint)
    print("SUBSCRIBED")
    fflush(nil)
    var received = 0
    let until = Date().addingTimeInterval(Double(arguments[3])!)
    while Date() < until {
        if (try? events.receive()) != nil { received += 1 }
    }
    print("RECEIVED \(received)")
    events.close()
case "service-write":
    let store = try Skyros(sqliteStack: testSchema, at: URL(fileURLWithPath: arguments[2]), savesOnStop: false)
    let count = Int(arguments[3])!
    store.writeAsync { context in
        usleep(1_000_000)  // still in flight when SIGTERM comes
        for index in 0..<count { User.create(in: context).handle = "service-\(index)" }
    }
    store.read { context in User.create(in: context).handle = "unsaved-main" }
    /// Says when the group runs (its signal handlers are in place), then waits for shutdown.
    struct Ready: Service {
        func run() async throws {
            print("WRITING")
            fflush(nil)
            try? await gracefulShutdown()
        }
    }
    let group = ServiceGroup(
        configuration: .init(
            services: [SkyrosService(store), Ready()], gracefulShutdownSignals: [.sigterm],
            logger: Logger(label: "skyros-test-child")))
    try await group.run()
    print("STOPPED")
case "ack-writer":
    let store = try Skyros(
        sharedStack: testSchema, container: URL(fileURLWithPath: arguments[2]), timeout: 2, savesOnStop: false)
    let name = arguments[3]
    for number in 1... {
        do {
            try await store.write { context in
                let user = User.create(in: context)
                user.firstname = "ack"
                user.lastname = "\(name)-\(number)"
                user.handle = "\(name)-\(number)"
            }
            print("ACK \(number)")
        } catch {
            print("FAIL \(number)")
        }
        fflush(nil)
    }
case "handler-state":
    let store = try Skyros(
        sqliteStack: testSchema, at: URL(fileURLWithPath: arguments[2]), savesOnStop: arguments[3] == "true")
    store.read { context in User.create(in: context).handle = "unsaved-main" }
    var action = sigaction()
    sigaction(SIGTERM, nil, &action)
    print(action.__sigaction_handler.sa_handler == nil ? "HANDLER default" : "HANDLER installed")
    fflush(nil)
    while true { sleep(1) }
    withExtendedLifetime(store) {}
case "mixed-v1-writer":
    // Schema version 1: writes tasks one at a time, reading the count after each, until told to stop
    // (the file `stop-v1` in the container) and at least `count` are written; then prints what it sees.
    let container = URL(fileURLWithPath: arguments[2])
    let store = try Skyros(sharedStack: MixedVersionModels.v1, container: container, timeout: 20)
    let count = Int(arguments[3])!
    print("READY")
    fflush(nil)
    var written = 0
    let stop = container.appendingPathComponent("stop-v1").path
    let started = Date()
    while (written < count || !FileManager.default.fileExists(atPath: stop)) && Date().timeIntervalSince(started) < 60 {
        let index = written
        store.writeSync { context in TaskV1.create(in: context).title = "w1-\(index)" }
        guard store.flush(timeout: 20) else {
            print("NOT DURABLE")
            exit(4)
        }
        written += 1
        var seen = -1
        store.read { context in seen = try TaskV1.count(where: #Predicate { $0.title.starts(with: "w1-") }, in: context)
        }
        guard seen == written else {
            print("LOST \(seen) < \(written)")
            exit(3)
        }
        if written == count / 2 {
            print("HALF")
            fflush(nil)
        }
    }
    var titles: [String] = []
    store.read { context in titles = try TaskV1.all(in: context).map(\.title) }
    print("WROTE \(written) SEES \(titles.count) V2 \(titles.count { $0.hasPrefix("v2-") })")
case "mixed-v2":
    // Schema version 2: connects (the daemon migrates the store), writes `count` tasks with a due
    // date and a priority, and prints what it reads of everyone's.
    let store = try Skyros(
        sharedStack: MixedVersionModels.v2, container: URL(fileURLWithPath: arguments[2]), timeout: 20)
    let count = Int(arguments[3])!
    store.writeSync { context in
        for index in 0..<count {
            let task = TaskV2.create(in: context)
            task.name = "v2-\(index)"
            task.dueDate = Date(timeIntervalSince1970: 86_400)
            task.priority = 7
        }
    }
    guard store.flush(timeout: 20) else {
        print("NOT DURABLE")
        exit(4)
    }
    var summary = ""
    store.read { context in
        let tasks = try TaskV2.all(in: context)
        let v1 = tasks.filter { $0.name.hasPrefix("w1-") || $0.name.hasPrefix("a-") }
        let v2 = tasks.filter { $0.name.hasPrefix("v2-") }
        summary = """
            TOTAL \(tasks.count) V1 \(v1.count) V1DEFAULTS \(v1.count { $0.priority == 3 && $0.dueDate == nil }) \
            V2 \(v2.count) V2VALUES \(v2.count { $0.priority == 7 && $0.dueDate == Date(timeIntervalSince1970: 86_400) }) \
            DONE \(tasks.count { $0.done })
            """
    }
    print(summary)
case "migrate-and-hang":
    let plan = MigrationPlan().stage(to: 2) { context in
        for author in try AuthorV2.all(in: context) { author.bio = "migrated" }
        try context.save()
        print("MIGRATING")
        fflush(nil)
        while true { sleep(1) }
    }
    _ = try SQLiteStore(schema: MigrationModels.v2, url: URL(fileURLWithPath: arguments[2]), migrations: plan)
default:
    FileHandle.standardError.write(
        Data("usage: skyros-test-child fingerprint|write-and-wait|write-and-exit|shared-writer …\n".utf8))
    exit(64)
}
