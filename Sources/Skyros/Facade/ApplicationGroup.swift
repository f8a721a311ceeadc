import Foundation

extension SkyrosError.Code {
    /// An application group identifier breaks the rule of ``Skyros/validateApplicationGroup(_:)``.
    public static let invalidApplicationGroup = SkyrosError.Code(rawValue: "invalidApplicationGroup")
}

extension Skyros {
    /// The longest application group identifier accepted.
    public static let maximumApplicationGroupLength = 128

    /// The container directory of an application group: the directory whose `store.sqlite`
    /// the group's daemon owns and whose socket files its clients connect to.
    ///
    /// Resolution order: `$SKYROS_GROUPS_DIR/<id>`; else `/var/lib/skyros/<id>` when that
    /// directory exists (the systemd service's `StateDirectory`); else
    /// `$XDG_DATA_HOME/skyros/<id>`, `~/.local/share/skyros/<id>` by default.
    ///
    /// This only computes the URL: no file or directory is read, created or changed, except
    /// for the existence check of `/var/lib/skyros/<id>`.
    ///
    /// - Throws: ``SkyrosError/Code/invalidApplicationGroup`` when `identifier` breaks the rule
    ///   of ``validateApplicationGroup(_:)``.
    public static func containerURL(forApplicationGroup identifier: String) throws -> URL {
        try containerURL(forApplicationGroup: identifier, environment: ProcessInfo.processInfo.environment)
    }

    /// ``containerURL(forApplicationGroup:)`` with an explicit environment (for tests and tools).
    public static func containerURL(
        forApplicationGroup identifier: String, environment: [String: String],
        systemStateDirectory: URL = URL(fileURLWithPath: "/var/lib/skyros")
    ) throws -> URL {
        try validateApplicationGroup(identifier)
        if let groups = environment["SKYROS_GROUPS_DIR"], !groups.isEmpty {
            return URL(fileURLWithPath: groups, isDirectory: true).appendingPathComponent(identifier, isDirectory: true)
        }
        let system = systemStateDirectory.appendingPathComponent(identifier, isDirectory: true)
        var isDirectory: ObjCBool = false
        if FileManager.default.fileExists(atPath: system.path, isDirectory: &isDirectory), isDirectory.boolValue {
            return system
        }
        let data: URL
        if let xdg = environment["XDG_DATA_HOME"], xdg.hasPrefix("/") {
            data = URL(fileURLWithPath: xdg, isDirectory: true)
        } else {
            let home = environment["HOME"].flatMap { $0.isEmpty ? nil : $0 } ?? NSHomeDirectory()
            data = URL(fileURLWithPath: home, isDirectory: true).appendingPathComponent(
                ".local/share", isDirectory: true)
        }
        return data.appendingPathComponent("skyros", isDirectory: true).appendingPathComponent(
            identifier, isDirectory: true)
    }

    /// Checks an application group identifier against the one rule (the README and
    /// docs/PROTOCOL.md state it in the same words): 1 to 128 characters of letters, digits,
    /// `.`, `_` and `-`, the first a letter or a digit, and no `..` — reverse-DNS names such as
    /// `com.example.todo`. So `.`, `..`, `.hidden` and `-g` (which would read as an option) are
    /// refused: the group's container is a directory named after it, never the groups
    /// directory itself, its parent, or a hidden file.
    ///
    /// - Throws: ``SkyrosError/Code/invalidApplicationGroup``, its message naming the rule broken.
    public static func validateApplicationGroup(_ identifier: String) throws {
        func refuse(_ reason: String) -> SkyrosError {
            SkyrosError(.invalidApplicationGroup, "invalid application group \"\(identifier)\": \(reason)")
        }
        guard !identifier.isEmpty else { throw refuse("it is empty") }
        guard identifier.utf8.count <= maximumApplicationGroupLength else {
            throw refuse("it is longer than \(maximumApplicationGroupLength) characters")
        }
        guard !identifier.contains("/") else { throw refuse("it contains '/'") }
        guard !identifier.contains("..") else { throw refuse("it contains '..'") }
        func isLetterOrDigit(_ byte: UInt8) -> Bool {
            (byte >= 0x30 && byte <= 0x39) || (byte >= 0x41 && byte <= 0x5A) || (byte >= 0x61 && byte <= 0x7A)
        }
        let allowed = identifier.utf8.allSatisfy { byte in
            isLetterOrDigit(byte) || byte == 0x2E || byte == 0x5F || byte == 0x2D
        }
        guard allowed else { throw refuse("only letters, digits, '.', '_' and '-' are allowed") }
        guard let first = identifier.utf8.first, isLetterOrDigit(first) else {
            throw refuse("it must begin with a letter or a digit")
        }
    }
}
