import Foundation
import NIOSSL
import PostgresNIO

/// What PostgreSQL's errors mean for a machine: offline (the network, the server down) or an
/// error an operator must fix, in words the operator can act on.
package enum ServerErrors {
    /// The schema exists, and this daemon's role may not use it.
    struct NoSchemaUsage: Error, CustomStringConvertible {
        var role: String
        var schema: String
        var description: String {
            """
            the role \(role) may not use the schema \(schema) (no USAGE privilege) [SQLSTATE 42501]: check the sync \
            schema (--sync-schema, schema=), or grant the role the group's privileges (docs/SYNC.md, Security)
            """
        }
    }

    /// The server schema was claimed by another group (two group ids that map to one schema
    /// name, such as `com-example-todo` and `com.example.todo`).
    struct OtherGroup: Error, CustomStringConvertible {
        var schema: String
        var owner: String
        var group: String
        var description: String {
            """
            the server schema \(schema) holds the group \(owner), not this daemon's group \(group): nothing is \
            uploaded or applied; give this group a schema of its own (--sync-schema NAME, or schema = NAME in sync.conf)
            """
        }
    }

    /// The server lacks tables or columns this daemon's role may not create.
    struct SetupNeeded: Error, CustomStringConvertible {
        var missing: [String]
        var schema: String
        var description: String {
            """
            the server lacks \(missing.prefix(5).joined(separator: ", "))\(missing.count > 5 ? " and \(missing.count - 5) more" : ""), \
            and this role may not create them: run skyrosd --group … --sync URL --sync-setup once with a role that owns \
            the schema \(schema)
            """
        }
    }

    /// Why the TLS handshake refused the server's certificate (not trusted, expired, not
    /// naming the host), in a few words, or nil for any other error.
    static func certificateRefusal(_ error: any Error) -> String? {
        var candidate: (any Error)? = error
        while let current = candidate {
            if let extra = current as? NIOSSLExtraError, extra == .failedToValidateHostname {
                return "it does not name the host"
            }
            if let ssl = current as? NIOSSLError {
                if case .noCertificateToValidate = ssl { return "the server sent no certificate" }
                // BoringSSL's reason, without the source file it names.
                guard "\(ssl)".contains("CERTIFICATE_VERIFY_FAILED") else { return nil }
                return "CERTIFICATE_VERIFY_FAILED: not signed by a CA the daemon trusts, expired, or not yet valid"
            }
            candidate = (current as? PSQLError)?.underlying
        }
        return nil
    }

    /// Whether an error means offline (the network, the server down) or an error an operator
    /// must fix (authentication, permissions, tables), with its message.
    package static func classify(_ error: any Error, configuration: SyncConfiguration) -> (
        SyncEngine.Status.State, String
    ) {
        if let setup = error as? SetupNeeded { return (.error, setup.description) }
        if let failure = error as? SyncConfiguration.NoServerAvailable {
            // Each server's reason in the engine's words; an error only when every server
            // refused for something an operator must fix (a wrong password everywhere).
            let verdicts = failure.attempts.map {
                $0.error.map { classify($0, configuration: configuration) } ?? (.offline, $0.refusal ?? "not used")
            }
            let message = failure.description(reasons: verdicts.map(\.1))
            return (verdicts.allSatisfy { $0.0 == .error } ? .error : .offline, message)
        }
        if let usage = error as? NoSchemaUsage { return (.error, usage.description) }
        if let other = error as? OtherGroup { return (.error, other.description) }
        if let certificate = Self.certificateRefusal(error) {
            let roots =
                configuration.rootCertificate.map { "the CA certificate \($0) (sslrootcert)" }
                ?? "the system's CA certificates"
            return (
                .error,
                """
                the server's TLS certificate was not accepted (sslmode=\(configuration.tls.rawValue)): \(certificate); \
                it must be signed by \(roots)\(configuration.tls == .verifyFull ? " and name the host \(configuration.host)" : "")
                """
            )
        }
        if let timeout = error as? Watchdog.TimedOut { return (.offline, timeout.description) }
        if let report = ServerSession.serverReport(error) {
            // 28: authentication; 42: privileges, missing objects; 3D: no such database; 3F: no
            // such schema; 23: a migration of the server's tables that its rows refuse (a
            // change set's own refusals never get here: they are recorded as rejected).
            let text = ServerSession.describe(error)
            if report.state == "28000", report.message?.contains("no encryption") == true {
                // pg_hba.conf has only hostssl lines for us.
                return (
                    .error,
                    """
                    \(text): the server accepts this connection only over TLS; set sslmode=verify-full (with sslrootcert) \
                    or sslmode=require in the sync URL
                    """
                )
            }
            if ["28", "42", "3D", "3F", "23"].contains(where: { report.state.hasPrefix($0) }) {
                return (.error, text)
            }
            return (.offline, text)
        }
        if let error = error as? PSQLError {
            switch error.code {
            case .server:
                return (.offline, ServerSession.describe(error))
            case .sslUnsupported:
                return (.error, "the server does not offer TLS, which the sync URL requires (sslmode)")
            case .authMechanismRequiresPassword, .unsupportedAuthMechanism, .saslError:
                return (
                    .error,
                    "the server asks for a password: give it with --sync-password-file, SKYROS_SYNC_PASSWORD or the credential skyros-sync-password"
                )
            default:
                let cause = error.underlying.map { "\($0)" } ?? "\(error.code)"
                return (.offline, "cannot reach the server (\(cause))")
            }
        }
        return (.offline, "\(error)")
    }
}
