import ArgumentParser
import Foundation
import Skyros
import SkyrosGateway
import Synchronization

/// `skyros token`: prints an HS256 sync token for a machine, signed with the gateway's secret
/// (for tests and small deployments; a fleet's tokens come from the operator's own issuer).
struct Token: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print an HS256 sync token for a machine, signed with the gateway's secret file.",
        discussion: """
            The token names the machine (--sub), expires (--expires, 1h by default: a number and s, m, h or d), \
            may name the gateway's audience (--audience) and carries any other claims (--claim name=value, \
            repeated; a whole number or true/false as such, anything else as text) for the sync rules' \
            bucket parameters. Exit status: 0 printed; 64 a usage error (a bad duration or claim, a secret \
            shorter than 32 bytes, a file that cannot be read).
            """)

    @Option(
        name: .customLong("secret-file"), help: ArgumentHelp("The file holding the HS256 secret.", valueName: "path"))
    var secretFile: String

    @Option(
        name: .customLong("sub"), help: ArgumentHelp("The machine's identity (the token's subject).", valueName: "id"))
    var subject: String

    @Option(name: .customLong("claim"), help: ArgumentHelp("Another claim, name=value (repeatable).", valueName: "k=v"))
    var claims: [String] = []

    @Option(help: ArgumentHelp("How long the token is valid: 90s, 15m, 1h, 30d.", valueName: "duration"))
    var expires: String = "1h"

    @Option(help: ArgumentHelp("The gateway's audience (`aud`).", valueName: "name"))
    var audience: String?

    func run() throws {
        try reportingFailures {
            guard !subject.isEmpty else { throw ToolFailure(ToolExit.usage, "--sub must name the machine") }
            guard let lifetime = SyncToken.duration(expires) else {
                throw ToolFailure(ToolExit.usage, "--expires \(expires): write a number and s, m, h or d (1h, 30d)")
            }
            var extra: [String: SyncTokenClaims.ClaimValue] = [:]
            for claim in claims {
                let parts = claim.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
                guard parts.count == 2, !parts[0].isEmpty else {
                    throw ToolFailure(ToolExit.usage, "--claim \(claim): write name=value")
                }
                let name = String(parts[0])
                guard !["sub", "exp", "nbf", "aud"].contains(name) else {
                    throw ToolFailure(ToolExit.usage, "--claim \(name): set it with its own option, not --claim")
                }
                extra[name] = SyncToken.claimValue(String(parts[1]))
            }
            let secret: Data
            do {
                secret = try SyncToken.readSecret(secretFile)
            } catch let error as SkyrosError {
                throw ToolFailure(ToolExit.usage, error.message)
            }
            let payload = SyncTokenClaims(
                subject: subject, expiration: Date().addingTimeInterval(lifetime),
                audience: audience.map { [$0] } ?? [], claims: extra)
            let minted = Mutex<Result<String, any Error>?>(nil)
            let done = DispatchSemaphore(value: 0)
            Task {
                let result: Result<String, any Error>
                do {
                    result = .success(try await SyncToken.mint(payload, secret: secret))
                } catch {
                    result = .failure(error)
                }
                minted.withLock { $0 = result }
                done.signal()
            }
            done.wait()
            switch minted.withLock({ $0 }) {
            case .success(let token): print(token)
            case .failure(let error as SkyrosError): throw ToolFailure(ToolExit.usage, error.message)
            case .failure(let error): throw ToolFailure(ToolExit.failure, "cannot sign the token: \(error)")
            case nil: throw ToolFailure(ToolExit.failure, "cannot sign the token")
            }
        }
    }
}
