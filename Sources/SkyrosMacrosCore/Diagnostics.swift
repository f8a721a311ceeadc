import SwiftDiagnostics
import SwiftSyntax

/// The errors the Skyros macros report at compile time.
enum SkyrosDiagnostic: String, DiagnosticMessage {
    case notAClass
    case openClass
    case letProperty
    case missingType
    case missingDefault
    case unsupportedType
    case observers

    var message: String {
        switch self {
        case .notAClass: "@Entity can only be applied to a class"
        case .openClass: "an @Entity class cannot be 'open': its subclasses must be @Entity classes of the same module"
        case .letProperty: "a persistent property must be a 'var'; use @Transient for a constant that is not stored"
        case .missingType: "a persistent property needs a type annotation (for example ': String')"
        case .missingDefault: "a persistent property needs a default value (optionals default to nil)"
        case .unsupportedType:
            "this type cannot be stored: use a supported attribute type, an enum with String or Int raw values, a Codable struct, or an @Entity class; mark the property @Transient to keep it out of the store"
        case .observers: "persistent properties cannot have willSet/didSet observers or custom accessors"
        }
    }

    var diagnosticID: MessageID { MessageID(domain: "Skyros", id: rawValue) }
    var severity: DiagnosticSeverity { .error }
}
