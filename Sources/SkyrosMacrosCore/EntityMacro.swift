import SwiftDiagnostics
import SwiftSyntax
import SwiftSyntaxBuilder
import SwiftSyntaxMacros

/// `@Entity`: makes a final class a managed object.
///
/// Generates the entity description, the storage and its initializer, the `ManagedObject`
/// conformance, and marks each persistent property with `@_Persisted(index)`, which turns
/// it into accessors of the storage. Nothing it writes uses non-public API.
public struct EntityMacro: MemberMacro, MemberAttributeMacro, ExtensionMacro {
    /// The members: the storage, the initialiser from storage and the entity description.
    public static func expansion(
        of node: AttributeSyntax, providingMembersOf declaration: some DeclGroupSyntax,
        conformingTo protocols: [TypeSyntax], in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] {
        guard let classDecl = declaration.as(ClassDeclSyntax.self) else {
            context.diagnose(Diagnostic(node: Syntax(node), message: SkyrosDiagnostic.notAClass))
            return []
        }
        if !classDecl.modifiers.contains(where: { $0.name.text == "final" }) {
            context.diagnose(Diagnostic(node: Syntax(classDecl.classKeyword), message: SkyrosDiagnostic.notFinal))
            return []
        }
        let (properties, diagnostics) = PersistentProperty.collect(in: classDecl.memberBlock)
        for diagnostic in diagnostics { context.diagnose(diagnostic) }
        let typeName = classDecl.name.trimmedDescription
        let access = accessLevel(of: classDecl)
        let descriptions = properties.map { description(of: $0, in: typeName) }
        // `name:` and `originalName:` come first; `indexes:` labels the first index, and the
        // unlabelled arguments after it are the other indexes.
        var indexes = ""
        var names = ""
        var entityName: String?
        if let arguments = node.arguments?.as(LabeledExprListSyntax.self), !arguments.isEmpty {
            let indexList = arguments.filter { $0.label == nil || $0.label?.text == "indexes" }
            if !indexList.isEmpty {
                indexes = ", indexes: [" + indexList.map { $0.expression.trimmedDescription }.joined(separator: ", ") + "]"
            }
            for label in ["name", "originalName"] {
                if let argument = arguments.first(where: { $0.label?.text == label }) {
                    names += ", \(label): \(argument.expression.trimmedDescription)"
                    if label == "name" { entityName = argument.expression.trimmedDescription }
                }
            }
        }
        let list = descriptions.isEmpty ? "[]" : "[\n" + descriptions.map { "        \($0)," }.joined(separator: "\n") + "\n    ]"
        var members: [DeclSyntax] = [
            "\(raw: access)static let entityDescription = EntityDescription(\(raw: typeName).self\(raw: names), properties: \(raw: list)\(raw: indexes))",
            "\(raw: access)let skyrosStorage: ObjectStorage",
            "\(raw: access)init(skyrosStorage: ObjectStorage) {\n    self.skyrosStorage = skyrosStorage\n}",
        ]
        if let entityName { members.insert("\(raw: access)static let entityName: String = \(raw: entityName)", at: 1) }
        return members
    }

    /// Each persistent property's attribute: `@_Persisted(index)`, its position in the entity.
    public static func expansion(
        of node: AttributeSyntax, attachedTo declaration: some DeclGroupSyntax,
        providingAttributesFor member: some DeclSyntaxProtocol, in context: some MacroExpansionContext
    ) throws -> [AttributeSyntax] {
        guard let classDecl = declaration.as(ClassDeclSyntax.self),
            classDecl.modifiers.contains(where: { $0.name.text == "final" }),
            let variable = member.as(VariableDeclSyntax.self)
        else { return [] }
        let (properties, _) = PersistentProperty.collect(in: classDecl.memberBlock)
        guard let name = variable.bindings.first?.pattern.as(IdentifierPatternSyntax.self)?.identifier.text,
            let index = properties.firstIndex(where: { $0.name == name })
        else { return [] }
        return ["@_Persisted(\(raw: index))"]
    }

    /// The `ManagedObject` conformance.
    public static func expansion(
        of node: AttributeSyntax, attachedTo declaration: some DeclGroupSyntax,
        providingExtensionsOf type: some TypeSyntaxProtocol, conformingTo protocols: [TypeSyntax],
        in context: some MacroExpansionContext
    ) throws -> [ExtensionDeclSyntax] {
        guard let classDecl = declaration.as(ClassDeclSyntax.self),
            classDecl.modifiers.contains(where: { $0.name.text == "final" })
        else { return [] }
        return [try ExtensionDeclSyntax("extension \(type.trimmed): ManagedObject {}")]
    }

    static func accessLevel(of decl: ClassDeclSyntax) -> String {
        for modifier in decl.modifiers {
            switch modifier.name.text {
            case "public", "open": return "public "
            case "package": return "package "
            case "fileprivate", "private": return "fileprivate "
            default: continue
            }
        }
        return ""
    }

    /// `.persistent("name", \Type.name, default: { … }, …)`.
    static func description(of property: PersistentProperty, in typeName: String) -> String {
        var text = ".persistent(\"\(property.name)\", \\\(typeName).\(property.name), default: { \(property.defaultValue) }"
        if let attribute = property.attribute, let arguments = attribute.arguments?.as(LabeledExprListSyntax.self) {
            let options = arguments.filter { $0.label == nil }.map { $0.expression.trimmedDescription }
            if !options.isEmpty { text += ", attributeOptions: [\(options.joined(separator: ", "))]" }
            if let original = arguments.first(where: { $0.label?.text == "originalName" }) {
                text += ", originalName: \(original.expression.trimmedDescription)"
            }
        }
        if let relationship = property.relationship, let arguments = relationship.arguments?.as(LabeledExprListSyntax.self) {
            let options = arguments.filter { $0.label == nil }.map { $0.expression.trimmedDescription }
            if !options.isEmpty { text += ", relationshipOptions: [\(options.joined(separator: ", "))]" }
            for label in ["deleteRule", "inverse", "originalName"] {
                if let argument = arguments.first(where: { $0.label?.text == label }) {
                    text += ", \(label): \(argument.expression.trimmedDescription)"
                }
            }
        }
        return text + ")"
    }
}

/// `@_Persisted(index)`: turns a stored property into accessors of the object's storage.
/// The `init` accessor accepts (and ignores) the declared initial value: defaults live in
/// the entity description and are applied when an object is created.
public struct PersistedPropertyMacro: AccessorMacro {
    /// The getter and setter of a persistent property, through the object's storage.
    public static func expansion(
        of node: AttributeSyntax, providingAccessorsOf declaration: some DeclSyntaxProtocol,
        in context: some MacroExpansionContext
    ) throws -> [AccessorDeclSyntax] {
        guard let arguments = node.arguments?.as(LabeledExprListSyntax.self),
            let index = arguments.first?.expression.trimmedDescription
        else { return [] }
        return [
            "init(initialValue) {}",
            "get { skyrosStorage.persistentValue(at: \(raw: index)) }",
            "set { skyrosStorage.setPersistentValue(newValue, at: \(raw: index)) }",
        ]
    }
}

/// `@Attribute`, `@Relationship`, `@Transient`: markers read by `@Entity`; they expand to nothing.
public struct MarkerMacro: PeerMacro {
    /// Nothing: the markers are read by `@Entity`.
    public static func expansion(
        of node: AttributeSyntax, providingPeersOf declaration: some DeclSyntaxProtocol,
        in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] { [] }
}
