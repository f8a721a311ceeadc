import Foundation
import NIOSSL
import PostgresNIO
import Skyros

// MARK: - sync.conf

extension SyncConfiguration {
    /// The file in a group container that configures its sync: `sync.conf`.
    package static let fileName = "sync.conf"

    /// A `sync.conf`: `key = value` lines, blank lines and whole-line `#` comments. The keys
    /// are `url`, `schema`, `password-file` (relative to the container unless absolute) and
    /// `retention` (seconds); it holds no secret itself.
    ///
    /// ```
    /// # The group's PostgreSQL server
    /// url = postgresql://skyros@db.example.com/skyros?sslmode=verify-full
    /// password-file = /etc/skyros/todo.password
    /// ```
    ///
    /// Several servers (a primary and its standbys) go in the URL, as libpq writes them:
    /// `url = postgresql://skyros@db1.example.com,db2.example.com/skyros?target_session_attrs=read-write`.
    package struct File: Sendable, Equatable {
        /// The keys a `sync.conf` may have.
        package static let keys = ["url", "schema", "password-file", "retention", "token-file"]

        /// The path the file was read from, which messages name.
        package var path: String
        /// `url`: the sync URL.
        package var url: String?
        /// `schema`: the server schema, checked.
        package var schema: String?
        /// `password-file`: the file holding the role's password, as written.
        package var passwordFile: String?
        /// `retention`: how long the server keeps its change log, in seconds.
        package var retention: TimeInterval?
        /// `token-file`: the file holding the machine's token for a gateway (`wss://` url),
        /// relative to the container unless absolute.
        package var tokenFile: String?

        /// Parses the text of a `sync.conf` read from `path`.
        ///
        /// A value may be in double or single quotes (`url = "postgresql://…"`): the quotes are
        /// dropped.
        ///
        /// - Throws: ``SkyrosError/Code/syncConfiguration`` naming the file and the line: a
        ///   line without `=`, an unknown key (a value is never echoed, in case it is a
        ///   secret), a key given twice, an empty value, a bad schema or retention.
        package init(parsing text: String, path: String) throws {
            self.path = path
            var seen: Set<String> = []
            for (index, rawLine) in text.split(omittingEmptySubsequences: false, whereSeparator: \.isNewline)
                .enumerated()
            {
                let line = rawLine.trimmingCharacters(in: .whitespaces.union(CharacterSet(charactersIn: "\r")))
                if line.isEmpty || line.hasPrefix("#") { continue }
                let place = "\(path) line \(index + 1)"
                guard let equals = line.firstIndex(of: "=") else {
                    throw invalid(
                        "\(place): expected key = value (keys: \(Self.keys.joined(separator: ", ")); # starts a comment)"
                    )
                }
                let key = line[..<equals].trimmingCharacters(in: .whitespaces)
                var value = line[line.index(after: equals)...].trimmingCharacters(in: .whitespaces)
                // A value in quotes, as a shell or systemd environment file writes it, is the
                // text inside them (a quote is never part of a URL, a schema or a path here).
                if value.count >= 2, let quote = value.first, quote == "\"" || quote == "'", value.last == quote {
                    value = String(value.dropFirst().dropLast()).trimmingCharacters(in: .whitespaces)
                }
                guard Self.keys.contains(key) else {
                    if key == "password" {
                        throw invalid(
                            "\(place): sync.conf holds no password itself: \(passwordAdvice); remove this line")
                    }
                    if ["host", "port"].contains(key) {
                        throw invalid(
                            "\(place): hosts and ports go in the url "
                                + "(url = postgresql://user@host1:port1,host2:port2/db)")
                    }
                    if ["sslmode", "sslrootcert", "target_session_attrs"].contains(key) {
                        throw invalid(
                            "\(place): \(key) goes in the url's query (url = postgresql://user@host/db?\(key)=…)")
                    }
                    let shown =
                        key.count <= 40
                        && key.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber || $0 == "_" || $0 == "-") }
                    throw invalid(
                        "\(place): unknown key\(shown ? " '\(key)'" : ""); the keys are \(Self.keys.joined(separator: ", "))"
                    )
                }
                guard seen.insert(key).inserted else { throw invalid("\(place): \(key) is given a second time") }
                guard !value.isEmpty else { throw invalid("\(place): \(key) has no value") }
                switch key {
                case "url": url = value
                case "schema": schema = try checkedSchema(value, from: place)
                case "password-file": passwordFile = value
                case "token-file": tokenFile = value
                default: retention = try checkedRetention(value, from: place)
                }
            }
        }

        /// The `sync.conf` of a container, or nil when it has none.
        ///
        /// - Throws: ``SkyrosError/Code/syncConfiguration`` when it exists but cannot be read
        ///   or is invalid.
        package static func read(in container: URL) throws -> File? {
            let path = container.appendingPathComponent(SyncConfiguration.fileName).path
            guard FileManager.default.fileExists(atPath: path) else { return nil }
            let text = try readText(path, what: "the sync configuration")
            return try File(parsing: text, path: path)
        }
    }

    /// The text of a file, or an error naming it and the reason (as `strerror` says it).
    static func readText(_ path: String, what: String) throws -> String {
        let descriptor = open(path, O_RDONLY | O_CLOEXEC)
        guard descriptor >= 0 else {
            let reason = String(cString: strerror(errno))
            throw invalid("cannot read \(path) (\(what)): \(reason)")
        }
        defer { close(descriptor) }
        var data = Data()
        var buffer = [UInt8](repeating: 0, count: 4096)
        while true {
            let count = read(descriptor, &buffer, buffer.count)
            if count < 0 {
                if errno == EINTR { continue }
                throw invalid("cannot read \(path) (\(what)): \(String(cString: strerror(errno)))")
            }
            if count == 0 { break }
            data.append(contentsOf: buffer[0..<count])
            if data.count > 1 << 20 { throw invalid("\(path) (\(what)) is larger than 1 MiB: is it the right file?") }
        }
        guard let text = String(data: data, encoding: .utf8) else {
            throw invalid("\(path) (\(what)) is not UTF-8 text")
        }
        return text
    }
}
