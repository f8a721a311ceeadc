import SwiftDiagnostics
import SwiftSyntax

/// A stored property of an @Entity class, as the macros see it.
struct PersistentProperty {
    let name: String
    let type: TypeSyntax
    let defaultValue: ExprSyntax
    let attribute: AttributeSyntax?
    let relationship: AttributeSyntax?
    let decl: VariableDeclSyntax

    /// Finds the persistent properties of a class, in declaration order, and the
    /// diagnostics of the ones that cannot be persisted.
    static func collect(in members: MemberBlockSyntax) -> ([PersistentProperty], [Diagnostic]) {
        var properties: [PersistentProperty] = []
        var diagnostics: [Diagnostic] = []
        for member in members.members {
            guard let decl = member.decl.as(VariableDeclSyntax.self) else { continue }
            if decl.modifiers.contains(where: { ["static", "class", "lazy"].contains($0.name.text) }) { continue }
            if hasAttribute(decl, "Transient") { continue }
            for binding in decl.bindings {
                guard let pattern = binding.pattern.as(IdentifierPatternSyntax.self) else { continue }
                if let accessors = binding.accessorBlock {
                    if case .getter = accessors.accessors { continue }  // computed
                    if case .accessors(let list) = accessors.accessors {
                        let kinds = list.map { $0.accessorSpecifier.text }
                        if kinds.contains("get") { continue }  // computed
                        diagnostics.append(Diagnostic(node: Syntax(binding), message: SkyrosDiagnostic.observers))
                        continue
                    }
                }
                if decl.bindingSpecifier.text == "let" {
                    diagnostics.append(
                        Diagnostic(node: Syntax(decl.bindingSpecifier), message: SkyrosDiagnostic.letProperty))
                    continue
                }
                let initializer = binding.initializer?.value
                var type = binding.typeAnnotation?.type
                if type == nil, let initializer { type = inferType(initializer) }
                guard let type else {
                    diagnostics.append(Diagnostic(node: Syntax(binding), message: SkyrosDiagnostic.missingType))
                    continue
                }
                if let problem = unsupported(type) {
                    diagnostics.append(Diagnostic(node: Syntax(problem), message: SkyrosDiagnostic.unsupportedType))
                    continue
                }
                var value = initializer
                if value == nil, isOptional(type) { value = "nil" }
                guard let value else {
                    diagnostics.append(Diagnostic(node: Syntax(binding), message: SkyrosDiagnostic.missingDefault))
                    continue
                }
                properties.append(
                    PersistentProperty(
                        name: pattern.identifier.text, type: type.trimmed, defaultValue: value.trimmed,
                        attribute: attribute(decl, "Attribute"), relationship: attribute(decl, "Relationship"),
                        decl: decl))
            }
        }
        return (properties, diagnostics)
    }

    static func attribute(_ decl: VariableDeclSyntax, _ name: String) -> AttributeSyntax? {
        for element in decl.attributes {
            guard let attribute = element.as(AttributeSyntax.self) else { continue }
            let text = attribute.attributeName.trimmedDescription
            if text == name || text == "Skyros.\(name)" { return attribute }
        }
        return nil
    }

    static func hasAttribute(_ decl: VariableDeclSyntax, _ name: String) -> Bool {
        attribute(decl, name) != nil
    }

    static func isOptional(_ type: TypeSyntax) -> Bool {
        if type.is(OptionalTypeSyntax.self) || type.is(ImplicitlyUnwrappedOptionalTypeSyntax.self) { return true }
        if let identifier = type.as(IdentifierTypeSyntax.self), identifier.name.text == "Optional" { return true }
        return false
    }

    /// Literal initializers whose type is obvious.
    static func inferType(_ expression: ExprSyntax) -> TypeSyntax? {
        if expression.is(StringLiteralExprSyntax.self) { return "String" }
        if expression.is(IntegerLiteralExprSyntax.self) { return "Int" }
        if expression.is(FloatLiteralExprSyntax.self) { return "Double" }
        if expression.is(BooleanLiteralExprSyntax.self) { return "Bool" }
        if let prefix = expression.as(PrefixOperatorExprSyntax.self), prefix.operator.text == "-" {
            return inferType(prefix.expression)
        }
        return nil
    }

    /// The part of a type that can never be stored: functions, tuples, existentials, metatypes.
    static func unsupported(_ type: TypeSyntax) -> TypeSyntax? {
        if type.is(FunctionTypeSyntax.self) || type.is(MetatypeTypeSyntax.self) { return type }
        if let tuple = type.as(TupleTypeSyntax.self) {
            if tuple.elements.count == 1, let only = tuple.elements.first { return unsupported(only.type) }
            return type
        }
        if let attributed = type.as(AttributedTypeSyntax.self) { return unsupported(attributed.baseType) }
        if type.is(SomeOrAnyTypeSyntax.self) { return type }
        if let identifier = type.as(IdentifierTypeSyntax.self), ["Any", "AnyObject"].contains(identifier.name.text) {
            return type
        }
        if let optional = type.as(OptionalTypeSyntax.self) { return unsupported(optional.wrappedType) }
        if let optional = type.as(ImplicitlyUnwrappedOptionalTypeSyntax.self) {
            return unsupported(optional.wrappedType)
        }
        if let array = type.as(ArrayTypeSyntax.self) { return unsupported(array.element) }
        return nil
    }
}
