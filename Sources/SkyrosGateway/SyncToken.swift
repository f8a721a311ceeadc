import Foundation
import JWTKit
import Skyros

/// The claims of a machine's sync token: a JWT the operator signs, which a machine presents to
/// the sync gateway at every connection.
///
/// `sub` is the machine's identity (its uploads are bound to it), `exp` is required, `nbf` and
/// `aud` are checked when present (and `aud` required when the gateway names its audience).
/// Every other claim is kept, for the sync rules' bucket parameters (`token.<claim>`).
public struct SyncTokenClaims: JWTPayload, Equatable {
    /// The machine's identity (`sub`).
    public var subject: String
    /// When the token stops being valid (`exp`).
    public var expiration: Date
    /// When it starts being valid (`nbf`), if it says.
    public var notBefore: Date?
    /// Whom it is for (`aud`): one or more names.
    public var audience: [String]
    /// Every other claim, as JSON values (strings, numbers, booleans, lists, objects).
    public var claims: [String: ClaimValue]
    /// Whether the token had an `exp` (one read without it has ``expiration`` `distantPast`).
    var hasExpiration = true

    /// A claim's value.
    public indirect enum ClaimValue: Codable, Sendable, Equatable, CustomStringConvertible {
        /// A JSON string.
        case string(String)
        /// A whole JSON number that an `Int64` holds exactly.
        case integer(Int64)
        /// Any other JSON number.
        case number(Double)
        /// `true` or `false`.
        case bool(Bool)
        /// A JSON array.
        case list([ClaimValue])
        /// A JSON object.
        case object([String: ClaimValue])
        /// `null`.
        case null

        public init(from decoder: any Decoder) throws {
            let container = try decoder.singleValueContainer()
            if container.decodeNil() {
                self = .null
            } else if let value = try? container.decode(Bool.self) {
                self = .bool(value)
            } else if let value = try? container.decode(Int64.self) {
                self = .integer(value)
            } else if let value = try? container.decode(Double.self) {
                self = .number(value)
            } else if let value = try? container.decode(String.self) {
                self = .string(value)
            } else if let value = try? container.decode([ClaimValue].self) {
                self = .list(value)
            } else {
                self = .object(try container.decode([String: ClaimValue].self))
            }
        }

        public func encode(to encoder: any Encoder) throws {
            var container = encoder.singleValueContainer()
            switch self {
            case .string(let value): try container.encode(value)
            case .integer(let value): try container.encode(value)
            case .number(let value): try container.encode(value)
            case .bool(let value): try container.encode(value)
            case .list(let value): try container.encode(value)
            case .object(let value): try container.encode(value)
            case .null: try container.encodeNil()
            }
        }

        /// The value as `skyros token --claim` and the sync rules write it: text as is, a
        /// whole number without a fraction.
        public var description: String {
            switch self {
            case .string(let value): value
            case .integer(let value): String(value)
            case .number(let value): String(value)
            case .bool(let value): String(value)
            case .list(let values): "[" + values.map(\.description).joined(separator: ", ") + "]"
            case .object(let values):
                "{" + values.keys.sorted().map { "\($0): \(values[$0]!)" }.joined(separator: ", ") + "}"
            case .null: "null"
            }
        }
    }

    /// Claims for a token of `subject` valid until `expiration`.
    public init(
        subject: String, expiration: Date, notBefore: Date? = nil, audience: [String] = [],
        claims: [String: ClaimValue] = [:]
    ) {
        self.subject = subject
        self.expiration = expiration
        self.notBefore = notBefore
        self.audience = audience
        self.claims = claims
    }

    private struct Key: CodingKey {
        var stringValue: String
        var intValue: Int? { nil }
        init(_ string: String) { stringValue = string }
        init?(stringValue: String) { self.stringValue = stringValue }
        init?(intValue: Int) { nil }
    }

    /// The registered claims this type reads itself; the rest go to ``claims``.
    private static let registered: Set<String> = ["sub", "exp", "nbf", "aud"]

    public init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: Key.self)
        // Missing ones are refused by ``SyncTokenVerifier`` once the signature holds (an
        // error thrown here would reach it as jwt-kit's "malformed token").
        subject = (try? container.decode(String.self, forKey: Key("sub"))) ?? ""
        expiration =
            (try? container.decode(Double.self, forKey: Key("exp"))).map(Date.init(timeIntervalSince1970:))
            ?? .distantPast
        hasExpiration =
            container.contains(Key("exp")) && (try? container.decode(Double.self, forKey: Key("exp"))) != nil
        notBefore = (try? container.decode(Double.self, forKey: Key("nbf"))).map(Date.init(timeIntervalSince1970:))
        // An `nbf` that is not a number is not ignored: the token is refused as not yet valid.
        if container.contains(Key("nbf")), notBefore == nil { notBefore = .distantFuture }
        if let one = try? container.decode(String.self, forKey: Key("aud")) {
            audience = [one]
        } else {
            audience = (try? container.decode([String].self, forKey: Key("aud"))) ?? []
        }
        var claims: [String: ClaimValue] = [:]
        for key in container.allKeys where !Self.registered.contains(key.stringValue) {
            claims[key.stringValue] = try container.decode(ClaimValue.self, forKey: key)
        }
        self.claims = claims
    }

    public func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: Key.self)
        for (name, value) in claims where !Self.registered.contains(name) {
            try container.encode(value, forKey: Key(name))
        }
        try container.encode(subject, forKey: Key("sub"))
        try container.encode(Int64(expiration.timeIntervalSince1970.rounded(.down)), forKey: Key("exp"))
        if let notBefore {
            try container.encode(Int64(notBefore.timeIntervalSince1970.rounded(.down)), forKey: Key("nbf"))
        }
        switch audience.count {
        case 0: break
        case 1: try container.encode(audience[0], forKey: Key("aud"))
        default: try container.encode(audience, forKey: Key("aud"))
        }
    }

    /// Checked by ``SyncTokenVerifier`` with its clock and audience, not here (jwt-kit calls
    /// this after the signature holds).
    public func verify(using algorithm: some JWTAlgorithm) async throws {}
}

/// Why the gateway refuses a token: the reason a machine's connection is closed with.
public struct SyncTokenRefusal: Error, Sendable, Equatable, CustomStringConvertible {
    /// The kinds of refusal, for a caller (and a close reason) to match.
    public enum Reason: String, Sendable, Equatable, CaseIterable {
        /// Not three base64url parts of JSON.
        case malformed
        /// `alg: none`: a token nobody signed.
        case unsigned
        /// Signed with an algorithm the gateway's keys do not have (or a key id it does not know).
        case unknownKey
        /// The signature does not hold: another key signed it, or it was changed since.
        case forged
        /// Past its `exp`.
        case expired
        /// Before its `nbf`.
        case notYetValid
        /// No `exp`.
        case missingExpiration
        /// No `sub`.
        case missingSubject
        /// Its `aud` does not name the gateway's audience.
        case wrongAudience
    }

    /// The kind.
    public var reason: Reason
    /// What happened, in words an operator can act on.
    public var message: String

    public init(_ reason: Reason, _ message: String) {
        self.reason = reason
        self.message = message
    }

    public var description: String { "token refused (\(reason.rawValue)): \(message)" }

    /// The refusal as a ``SkyrosError`` (code ``SkyrosError/Code/permissionDenied``).
    public var skyrosError: SkyrosError { SkyrosError(.permissionDenied, description) }
}

/// Verifies machines' sync tokens: the signature with the operator's keys (HS256 with a shared
/// secret, or RS256, ES256 and EdDSA public keys from a JWKS document), then `exp`, `nbf` and
/// the audience, each refusal with its reason (``SyncTokenRefusal``).
///
/// ```swift
/// let verifier = try await SyncTokenVerifier(secretFile: "/etc/skyros/gateway.secret", audience: "skyros")
/// let claims = try await verifier.verify(token)   // throws SyncTokenRefusal
/// ```
public struct SyncTokenVerifier: Sendable {
    private let keys: JWTKeyCollection
    /// The algorithms the keys sign with, and their key ids (nil: a key without one).
    private let known: [(algorithm: String, kid: String?)]
    /// The audience a token must name (nil: any, or none).
    public let audience: String?
    /// Tolerated clock difference for `exp` and `nbf`.
    public let leeway: TimeInterval

    /// A verifier of HS256 tokens signed with `secret` (at least 32 bytes).
    public init(secret: Data, audience: String? = nil, leeway: TimeInterval = 30) async throws {
        keys = try await SyncToken.hmacKeys(secret)
        known = [("HS256", nil)]
        self.audience = audience
        self.leeway = leeway
    }

    /// A verifier of HS256 tokens signed with the secret in the file at `path` (its bytes; a
    /// final newline is not part of the secret).
    public init(secretFile path: String, audience: String? = nil, leeway: TimeInterval = 30) async throws {
        try await self.init(secret: try SyncToken.readSecret(path), audience: audience, leeway: leeway)
    }

    /// A verifier of tokens signed by the private keys whose public halves the JWKS document
    /// at `path` holds (RS256, ES256, EdDSA; each key's `kid` is matched to the token's).
    public init(jwksFile path: String, audience: String? = nil, leeway: TimeInterval = 30) async throws {
        let json: String
        do {
            json = try String(contentsOfFile: path, encoding: .utf8)
        } catch {
            throw SkyrosError(.syncConfiguration, "cannot read the JWKS file \(path): \(error.localizedDescription)")
        }
        keys = JWTKeyCollection()
        do {
            try await keys.add(jwksJSON: json)
        } catch {
            throw SkyrosError(.syncConfiguration, "the JWKS file \(path) holds no usable key: \(error)")
        }
        known = Self.algorithms(ofJWKS: json)
        guard !known.isEmpty else {
            throw SkyrosError(.syncConfiguration, "the JWKS file \(path) holds no RS256, ES256 or EdDSA key")
        }
        self.audience = audience
        self.leeway = leeway
    }

    /// The algorithm and key id of each key of a JWKS document (the key's `alg`, or the one
    /// its type implies: RS256 for RSA, ES256 for P-256, EdDSA for Ed25519).
    static func algorithms(ofJWKS json: String) -> [(algorithm: String, kid: String?)] {
        guard let document = try? JSONSerialization.jsonObject(with: Data(json.utf8)) as? [String: Any],
            let keys = document["keys"] as? [[String: Any]]
        else { return [] }
        return keys.compactMap { key in
            let implied: String? =
                switch (key["kty"] as? String, key["crv"] as? String) {
                case ("RSA", _): "RS256"
                case ("EC", "P-256"): "ES256"
                case ("EC", "P-384"): "ES384"
                case ("EC", "P-521"): "ES512"
                case ("OKP", "Ed25519"): "EdDSA"
                default: nil
                }
            guard let algorithm = (key["alg"] as? String) ?? implied else { return nil }
            return (algorithm, key["kid"] as? String)
        }
    }

    /// The claims of `token` once its signature, time and audience hold.
    ///
    /// - Throws: ``SyncTokenRefusal`` with the reason.
    public func verify(_ token: String, now: Date = Date()) async throws -> SyncTokenClaims {
        let header = try SyncToken.header(of: token)
        let algorithm = (header["alg"] as? String) ?? ""
        if algorithm.lowercased() == "none" || algorithm.isEmpty {
            throw SyncTokenRefusal(
                .unsigned, "the token is not signed (`alg: \(algorithm.isEmpty ? "(none given)" : algorithm)`)")
        }
        // A key the gateway does not have is named as such (jwt-kit tries its default key and
        // reports a signature that does not hold).
        let kid = header["kid"] as? String
        guard known.contains(where: { $0.algorithm == algorithm && (kid == nil || $0.kid == kid) }) else {
            throw SyncTokenRefusal(
                .unknownKey, "no key of the gateway signs `\(algorithm)`\(kid.map { " with key id \($0)" } ?? "")")
        }
        let claims: SyncTokenClaims
        do {
            claims = try await keys.verify(token, as: SyncTokenClaims.self)
        } catch let refusal as SyncTokenRefusal {
            throw refusal
        } catch let error as JWTError {
            switch error.errorType {
            case .signatureVerificationFailed:
                throw SyncTokenRefusal(
                    .forged, "its signature does not hold (another key signed it, or it was changed)")
            case .unknownKID, .noKeyProvided, .missingKIDHeader, .unsupportedAlgorithm, .unsupportedCurve:
                throw SyncTokenRefusal(
                    .unknownKey,
                    "no key of the gateway signs `\(algorithm)`\((header["kid"] as? String).map { " with key id \($0)" } ?? "")"
                )
            default:
                throw SyncTokenRefusal(
                    .malformed, "it cannot be read as a JWT: \(error.reason ?? "\(error.errorType)")")
            }
        } catch {
            throw SyncTokenRefusal(.malformed, "it cannot be read as a JWT: \(error)")
        }
        guard !claims.subject.isEmpty else {
            throw SyncTokenRefusal(.missingSubject, "the token has no subject (`sub`): it names no machine")
        }
        guard claims.hasExpiration else {
            throw SyncTokenRefusal(
                .missingExpiration, "the token has no expiration (`exp`), which the gateway requires")
        }
        if now.timeIntervalSince(claims.expiration) > leeway {
            throw SyncTokenRefusal(.expired, "it expired at \(SyncToken.format(claims.expiration))")
        }
        if let notBefore = claims.notBefore, notBefore.timeIntervalSince(now) > leeway {
            throw SyncTokenRefusal(.notYetValid, "it is not valid before \(SyncToken.format(notBefore))")
        }
        if let audience, !claims.audience.contains(audience) {
            throw SyncTokenRefusal(
                .wrongAudience,
                claims.audience.isEmpty
                    ? "it names no audience; the gateway's is \(audience)"
                    : "it is for \(claims.audience.joined(separator: ", ")), not \(audience)")
        }
        return claims
    }
}

/// Minting tokens (`skyros token`), and what verifying and minting share.
public enum SyncToken {
    /// An HS256 token of `claims`, signed with `secret`.
    public static func mint(_ claims: SyncTokenClaims, secret: Data) async throws -> String {
        let keys = try await hmacKeys(secret)
        return try await keys.sign(claims)
    }

    /// The keys of HS256 tokens signed with `secret`, which must have at least 32 bytes.
    static func hmacKeys(_ secret: Data) async throws -> JWTKeyCollection {
        guard secret.count >= 32 else {
            throw SkyrosError(
                .syncConfiguration,
                "the token secret has \(secret.count) bytes (a final newline is not part of it); HS256 needs at least 32: make one with openssl rand -hex 32"
            )
        }
        let keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256)
        return keys
    }

    /// The secret in the file at `path`: its bytes, without one final newline (an editor's).
    public static func readSecret(_ path: String) throws -> Data {
        guard var data = FileManager.default.contents(atPath: path) else {
            throw SkyrosError(.syncConfiguration, "cannot read the token secret file \(path)")
        }
        if data.last == UInt8(ascii: "\n") { data.removeLast() }
        if data.last == UInt8(ascii: "\r") { data.removeLast() }
        return data
    }

    /// A duration as `--expires` writes it: a number and a unit, `s`, `m`, `h` or `d`
    /// (`90s`, `15m`, `1h`, `30d`); nil for anything else.
    public static func duration(_ text: String) -> TimeInterval? {
        guard let unit = text.last, let number = Double(text.dropLast()), number > 0, number.isFinite else {
            return nil
        }
        switch unit {
        case "s": return number
        case "m": return number * 60
        case "h": return number * 3_600
        case "d": return number * 86_400
        default: return nil
        }
    }

    /// A `--claim k=v` value: a whole number written as such (no leading zero or `+`) or
    /// `true`/`false` as such, anything else as text (`007` stays text).
    public static func claimValue(_ text: String) -> SyncTokenClaims.ClaimValue {
        if let number = Int64(text), String(number) == text { return .integer(number) }
        if text == "true" { return .bool(true) }
        if text == "false" { return .bool(false) }
        return .string(text)
    }

    /// The decoded header of a token (its first part).
    static func header(of token: String) throws -> [String: Any] {
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, let data = base64URL(parts[0]),
            let header = try? JSONSerialization.jsonObject(with: data) as? [String: Any]
        else {
            throw SyncTokenRefusal(.malformed, "it is not three base64url parts, the first a JSON header")
        }
        return header
    }

    private static func base64URL(_ text: Substring) -> Data? {
        var base64 = text.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while base64.count % 4 != 0 { base64 += "=" }
        return Data(base64Encoded: base64)
    }

    static func format(_ date: Date) -> String {
        date.formatted(.iso8601)
    }
}
