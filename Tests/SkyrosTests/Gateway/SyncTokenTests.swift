import Crypto
import CryptoExtras
import Foundation
import JWTKit
import Skyros
import SkyrosGateway
import SkyrosTestSupport
import Testing

/// Machines' sync tokens (DESIGN §10): real signatures with keys made here (HS256 secrets;
/// RS256, ES256 and EdDSA key pairs whose public halves go into a JWKS file), each refusal
/// with its reason, and `skyros token`'s tokens verified by the gateway's verifier.
@Suite("Sync tokens", .timeLimit(.minutes(2)))
struct SyncTokenTests {
    static let secret = Data((0..<48).map { UInt8($0 * 7 % 251) })
    static let now = Date()

    static func claims(
        subject: String = "kiosk-7", expiresIn: TimeInterval = 3_600, notBefore: Date? = nil,
        audience: [String] = ["skyros"], extra: [String: SyncTokenClaims.ClaimValue] = [:]
    ) -> SyncTokenClaims {
        SyncTokenClaims(
            subject: subject, expiration: now.addingTimeInterval(expiresIn), notBefore: notBefore, audience: audience,
            claims: extra)
    }

    /// The reason `verify` refused `token` with, or nil when it accepted it.
    static func refusal(_ verifier: SyncTokenVerifier, _ token: String) async -> SyncTokenRefusal.Reason? {
        do {
            _ = try await verifier.verify(token, now: now)
            return nil
        } catch let refusal as SyncTokenRefusal {
            return refusal.reason
        } catch {
            Issue.record("not a SyncTokenRefusal: \(error)")
            return nil
        }
    }

    static func base64URL(_ data: Data) -> String {
        data.base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_")
            .replacingOccurrences(of: "=", with: "")
    }

    /// A token whose header and payload are the JSON texts given, and whose signature is `signature`.
    static func handMade(header: String, payload: String, signature: String = "") -> String {
        base64URL(Data(header.utf8)) + "." + base64URL(Data(payload.utf8)) + "." + signature
    }

    @Test("an HS256 token round-trips: subject, expiration, audience and every other claim, typed")
    func roundTrip() async throws {
        let extra: [String: SyncTokenClaims.ClaimValue] = [
            "store": .string("berlin"), "level": .integer(3), "admin": .bool(false), "lists": .list([.string("a")]),
        ]
        let token = try await SyncToken.mint(Self.claims(extra: extra), secret: Self.secret)
        let verifier = try await SyncTokenVerifier(secret: Self.secret, audience: "skyros")
        let claims = try await verifier.verify(token, now: Self.now)
        #expect(claims.subject == "kiosk-7")
        #expect(claims.audience == ["skyros"])
        #expect(claims.claims == extra)
        #expect(abs(claims.expiration.timeIntervalSince(Self.now.addingTimeInterval(3_600))) < 1)
        #expect(claims.claims["level"]?.description == "3")
    }

    @Test("refused, each with its reason: forged, changed, expired, not yet valid, unsigned, wrong audience")
    func refusals() async throws {
        let verifier = try await SyncTokenVerifier(secret: Self.secret, audience: "skyros", leeway: 30)
        let other = Data(repeating: 9, count: 48)
        #expect(await Self.refusal(verifier, try await SyncToken.mint(Self.claims(), secret: other)) == .forged)
        // Another machine's payload under this token's signature.
        let good = try await SyncToken.mint(Self.claims(), secret: Self.secret)
        let parts = good.split(separator: ".")
        let payload = Self.base64URL(
            Data(#"{"sub":"kiosk-8","exp":\#(Int(Self.now.timeIntervalSince1970) + 3600),"aud":"skyros"}"#.utf8))
        #expect(await Self.refusal(verifier, "\(parts[0]).\(payload).\(parts[2])") == .forged)
        #expect(
            await Self.refusal(verifier, try await SyncToken.mint(Self.claims(expiresIn: -120), secret: Self.secret))
                == .expired)
        // Within the leeway of clocks that differ a little.
        #expect(
            await Self.refusal(verifier, try await SyncToken.mint(Self.claims(expiresIn: -10), secret: Self.secret))
                == nil)
        let later = Self.now.addingTimeInterval(600)
        #expect(
            await Self.refusal(verifier, try await SyncToken.mint(Self.claims(notBefore: later), secret: Self.secret))
                == .notYetValid)
        let exp = Int(Self.now.timeIntervalSince1970) + 3_600
        for alg in ["none", "None", "NONE"] {
            let unsigned = Self.handMade(
                header: #"{"alg":"\#(alg)","typ":"JWT"}"#, payload: #"{"sub":"kiosk-7","exp":\#(exp),"aud":"skyros"}"#)
            #expect(await Self.refusal(verifier, unsigned) == .unsigned, "\(alg)")
        }
        #expect(
            await Self.refusal(
                verifier, try await SyncToken.mint(Self.claims(audience: ["other"]), secret: Self.secret))
                == .wrongAudience)
        #expect(
            await Self.refusal(verifier, try await SyncToken.mint(Self.claims(audience: []), secret: Self.secret))
                == .wrongAudience)
        // A gateway that names no audience takes any.
        let any = try await SyncTokenVerifier(secret: Self.secret)
        #expect(
            await Self.refusal(any, try await SyncToken.mint(Self.claims(audience: ["other"]), secret: Self.secret))
                == nil)
        for garbage in ["", "abc", "a.b", "a.b.c.d", "%%%.e30.x"] {
            #expect(await Self.refusal(verifier, garbage) == .malformed, "\(garbage)")
        }
    }

    /// A payload with neither `exp` nor `sub`, signed with the right secret.
    struct Bare: JWTPayload {
        var sub: String?
        var exp: Int?
        var nbf: String? = nil
        func verify(using algorithm: some JWTAlgorithm) async throws {}
    }

    @Test("whole-number claims keep every digit; text that looks like a number but is not written as one stays text")
    func claimValues() async throws {
        #expect(SyncToken.claimValue("9007199254740993") == .integer(9_007_199_254_740_993))
        #expect(SyncToken.claimValue("007") == .string("007"))
        #expect(SyncToken.claimValue("+5") == .string("+5"))
        #expect(SyncToken.claimValue("-12") == .integer(-12))
        #expect(SyncToken.claimValue("1.5") == .string("1.5"))
        let token = try await SyncToken.mint(
            Self.claims(extra: ["org": SyncToken.claimValue("9007199254740993"), "ratio": .number(0.5)]),
            secret: Self.secret)
        let claims = try await SyncTokenVerifier(secret: Self.secret).verify(token, now: Self.now)
        #expect(claims.claims["org"] == .integer(9_007_199_254_740_993))
        #expect(claims.claims["org"]?.description == "9007199254740993")
        #expect(claims.claims["ratio"] == .number(0.5))
    }

    @Test("a token without an expiration or a subject is refused, though its signature holds")
    func requiredClaims() async throws {
        let keys = JWTKeyCollection()
        await keys.add(hmac: HMACKey(from: Self.secret), digestAlgorithm: .sha256)
        let verifier = try await SyncTokenVerifier(secret: Self.secret)
        let exp = Int(Self.now.timeIntervalSince1970) + 3_600
        #expect(await Self.refusal(verifier, try await keys.sign(Bare(sub: "kiosk-7", exp: nil))) == .missingExpiration)
        #expect(await Self.refusal(verifier, try await keys.sign(Bare(sub: nil, exp: exp))) == .missingSubject)
        #expect(await Self.refusal(verifier, try await keys.sign(Bare(sub: "", exp: exp))) == .missingSubject)
        #expect(await Self.refusal(verifier, try await keys.sign(Bare(sub: "kiosk-7", exp: exp))) == nil)
        // An `nbf` that is not a number is not ignored.
        #expect(
            await Self.refusal(verifier, try await keys.sign(Bare(sub: "kiosk-7", exp: exp, nbf: "now")))
                == .notYetValid)
    }

    @Test("RS256, ES256 and EdDSA tokens verify against a JWKS file; another key, an unknown key id, HS256 are refused")
    func jwks() async throws {
        let directory = try TemporaryDirectory()
        let rsa = try Insecure.RSA.PrivateKey(backing: _RSA.Signing.PrivateKey(keySize: .bits2048))
        let ec = ES256PrivateKey()
        let ed = try EdDSA.PrivateKey(curve: .ed25519)
        let (modulus, exponent) = try rsa.publicKey.getKeyPrimitives()
        let ecParameters = try #require(ec.parameters)
        let edPublic = Self.base64URL(ed.publicKey.rawRepresentation)
        let jwks = """
            {"keys": [
              {"kty": "RSA", "kid": "r1", "alg": "RS256", "use": "sig", "n": "\(Self.base64URL(modulus))", "e": "\(Self.base64URL(exponent))"},
              {"kty": "EC", "kid": "e1", "alg": "ES256", "crv": "P-256", "x": "\(ecParameters.x)", "y": "\(ecParameters.y)"},
              {"kty": "OKP", "kid": "d1", "alg": "EdDSA", "crv": "Ed25519", "x": "\(edPublic)"}
            ]}
            """
        let path = directory.url.appendingPathComponent("jwks.json").path
        try Data(jwks.utf8).write(to: URL(fileURLWithPath: path))
        let verifier = try await SyncTokenVerifier(jwksFile: path, audience: "skyros")

        let signers = JWTKeyCollection()
        await signers.add(rsa: rsa, digestAlgorithm: .sha256, kid: "r1")
        await signers.add(ecdsa: ec, kid: "e1")
        await signers.add(eddsa: ed, kid: "d1")
        for kid in ["r1", "e1", "d1"] {
            let token = try await signers.sign(Self.claims(subject: "machine-\(kid)"), kid: JWKIdentifier(string: kid))
            let claims = try await verifier.verify(token, now: Self.now)
            #expect(claims.subject == "machine-\(kid)")
        }
        // Another key pair claiming a known key id: the signature does not hold.
        let impostor = JWTKeyCollection()
        await impostor.add(ecdsa: ES256PrivateKey(), kid: "e1")
        #expect(await Self.refusal(verifier, try await impostor.sign(Self.claims(), kid: "e1")) == .forged)
        let stranger = JWTKeyCollection()
        await stranger.add(ecdsa: ES256PrivateKey(), kid: "unknown")
        #expect(await Self.refusal(verifier, try await stranger.sign(Self.claims(), kid: "unknown")) == .unknownKey)
        #expect(
            await Self.refusal(verifier, try await SyncToken.mint(Self.claims(), secret: Self.secret)) == .unknownKey)
        // A JWKS file that cannot be read or holds nothing usable: a configuration error.
        await #expect(throws: SkyrosError.self) { try await SyncTokenVerifier(jwksFile: path + ".missing") }
        try Data(#"{"keys": [{"kty": "XX"}]}"#.utf8).write(to: URL(fileURLWithPath: path))
        await #expect(throws: SkyrosError.self) { try await SyncTokenVerifier(jwksFile: path) }
    }

    @Test("`skyros token` prints a token the gateway's verifier takes, claims typed; bad input exits 64")
    func tokenCommand() async throws {
        let directory = try TemporaryDirectory()
        let secretFile = directory.url.appendingPathComponent("secret").path
        // An editor's final newline is not part of the secret.
        try Data((Self.base64URL(Self.secret) + "\n").utf8).write(to: URL(fileURLWithPath: secretFile))
        let result = try OperatingToolTests.run(
            [
                "token", "--secret-file", secretFile, "--sub", "kiosk-7", "--claim", "store=berlin", "--claim",
                "level=3", "--claim", "admin=true", "--expires", "2h", "--audience", "skyros",
            ])
        #expect(result.status == 0, "\(result.stderr)")
        let token = result.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
        let verifier = try await SyncTokenVerifier(secretFile: secretFile, audience: "skyros")
        let claims = try await verifier.verify(token)
        #expect(claims.subject == "kiosk-7")
        #expect(claims.claims == ["store": .string("berlin"), "level": .integer(3), "admin": .bool(true)])
        #expect(abs(claims.expiration.timeIntervalSinceNow - 7_200) < 60)
        for arguments in [
            ["--expires", "2y"], ["--claim", "novalue"], ["--claim", "exp=5"], ["--sub", ""],
        ] {
            var all = ["token", "--secret-file", secretFile, "--sub", "kiosk-7"]
            all += arguments
            let refused = try OperatingToolTests.run(all)
            #expect(refused.status == 64, "\(arguments): \(refused.stderr)")
        }
        let short = directory.url.appendingPathComponent("short").path
        try Data("too short".utf8).write(to: URL(fileURLWithPath: short))
        let refused = try OperatingToolTests.run(["token", "--secret-file", short, "--sub", "x"])
        #expect(refused.status == 64)
        #expect(refused.stderr.contains("at least 32"))
    }
}
