import Foundation
import Skyros
import SkyrosTestSupport
import Testing

/// The real `skyrosd` with a store it must refuse, and `skyrosd --check`.
@Suite("skyrosd refuses damaged stores", .timeLimit(.minutes(3)))
struct DamagedStoreProcessTests {
    /// A groups directory with the store path of group `g`, removed by the caller.
    func groups() throws -> (directory: String, store: URL) {
        let directory = "/tmp/skp-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        let container = URL(fileURLWithPath: directory).appendingPathComponent("g")
        try FileManager.default.createDirectory(at: container, withIntermediateDirectories: true)
        return (directory, container.appendingPathComponent("store.sqlite"))
    }

    func skyrosd(_ directory: String, _ arguments: [String] = []) throws -> (ChildProcess.Ending?, String) {
        let process = try ChildProcess(
            ["--group", "g", "--groups-dir", directory] + arguments, executable: DaemonProcessTests.skyrosd)
        let ending = process.wait(seconds: 20)
        return (ending, process.readAll())
    }

    @Test("a 0-byte store.sqlite: skyrosd exits 1 naming the file and the problem; the file stays 0 bytes")
    func emptyStore() throws {
        let (directory, store) = try groups()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        #expect(FileManager.default.createFile(atPath: store.path, contents: Data()))
        let (ending, output) = try skyrosd(directory)
        #expect(ending == .exited(1))
        #expect(output.contains("refusing to serve: the store at \(store.path) is empty (0 bytes)"), "\(output)")
        #expect(try FileManager.default.attributesOfItem(atPath: store.path)[.size] as? Int == 0)
        #expect(!FileManager.default.fileExists(atPath: store.path + "-wal"))
    }

    @Test("a text file as the store: skyrosd exits 1, the file unchanged")
    func textFile() throws {
        let (directory, store) = try groups()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        try StoreFiles.makeTextFile(at: store)
        let before = try Data(contentsOf: store)
        let (ending, output) = try skyrosd(directory)
        #expect(ending == .exited(1))
        #expect(output.contains("refusing to serve: the store at \(store.path) is not a Skyros store"), "\(output)")
        #expect(try Data(contentsOf: store) == before)
    }

    @Test(
        "skyrosd --check: 0 for a healthy store, 1 with the findings for a damaged one, which skyrosd then refuses to serve"
    )
    func check() throws {
        let (directory, store) = try groups()
        defer { try? FileManager.default.removeItem(atPath: directory) }
        var (ending, output) = try skyrosd(directory, ["--check"])
        #expect(ending == .exited(0))
        #expect(output.contains("no store at \(store.path)"), "\(output)")

        try StoreFiles.makeStore(at: store, users: 300)
        (ending, output) = try skyrosd(directory, ["--check"])
        #expect(ending == .exited(0))
        #expect(output.contains("ok: \(store.path)"), "\(output)")

        try StoreFiles.damage(store)
        let before = try Data(contentsOf: store)
        (ending, output) = try skyrosd(directory, ["--check"])
        #expect(ending == .exited(1))
        #expect(
            output.contains("the store at \(store.path) is damaged: PRAGMA integrity_check found: On tree page"),
            "\(output)")
        #expect(try Data(contentsOf: store) == before)

        (ending, output) = try skyrosd(directory)
        #expect(ending == .exited(1))
        #expect(
            output.contains(
                "refusing to serve: the store at \(store.path) is damaged: PRAGMA quick_check found: On tree page"),
            "\(output)")
        #expect(try Data(contentsOf: store) == before)
        #expect(!FileManager.default.fileExists(atPath: store.path + "-wal"))
    }
}
