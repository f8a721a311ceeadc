import SwiftDiagnostics
import SwiftSyntax
import SwiftSyntaxBuilder
import SwiftSyntaxMacros

/// `@Entity`: makes a class a managed object: a final class, or a class of an entity
/// hierarchy (a class other `@Entity` classes inherit from, and those subclasses).
///
/// Generates the entity description, the storage and its initializer, the `ManagedObject`
/// conformance, and marks each persistent property with `@_Persisted(index)`, which turns
/// it into accessors of the storage. Nothing it writes uses non-public API.
public struct EntityMacro: MemberMacro, MemberAttributeMacro, ExtensionMacro {
    /// What the macros need to know of the class: its name, whether it is final, and its parent
    /// entity (the superclass, when the class inherits from another `@Entity` class).
    struct Shape {
        let typeName: String
        let isFinal: Bool
        /// The superclass named first in the inheritance clause: any type there but the
        /// protocols an entity commonly adopts is taken for the parent entity's class.
        let parent: String?

        /// The protocols an entity class may list first without being taken for a subentity.
        static let knownProtocols: Set<String> = [
            "ManagedObject", "ValidatingObject", "Sendable", "Identifiable", "Hashable", "Equatable", "Codable",
            "Encodable", "Decodable", "CustomStringConvertible", "CustomDebugStringConvertible", "Comparable",
            "AnyObject", "SendableMetatype", "Observable", "ObservableObject", "Error", "CaseIterable",
            "RawRepresentable", "LosslessStringConvertible", "TextOutputStreamable", "Copyable",
        ]

        init(_ decl: ClassDeclSyntax) {
            typeName = decl.name.trimmedDescription
            isFinal = decl.modifiers.contains(where: { $0.name.text == "final" })
            if var type = decl.inheritanceClause?.inheritedTypes.first?.type {
                // `@unchecked Sendable`, `~Copyable`: attributes and suppressions are never a class.
                if let attributed = type.as(AttributedTypeSyntax.self) { type = attributed.baseType }
                let first = type.trimmedDescription
                let last = first.split(separator: ".").last.map(String.init) ?? first
                parent = Self.knownProtocols.contains(last) || first.hasPrefix("~") || first.contains("&") ? nil : first
            } else {
                parent = nil
            }
        }

        /// Whether the class is part of a hierarchy: a parent (not final) or a subentity.
        var isInHierarchy: Bool { !isFinal || parent != nil }

        /// The name of the generated function giving a class's key paths re-rooted at a subclass.
        static func keyPathsFunction(of typeName: String) -> String {
            "_skyrosKeyPaths_" + (typeName.split(separator: ".").last.map(String.init) ?? typeName)
        }
    }

    /// The members: the storage, the initialiser from storage and the entity description.
    public static func expansion(
        of node: AttributeSyntax, providingMembersOf declaration: some DeclGroupSyntax,
        conformingTo protocols: [TypeSyntax], in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] {
        guard let classDecl = declaration.as(ClassDeclSyntax.self) else {
            context.diagnose(Diagnostic(node: Syntax(node), message: SkyrosDiagnostic.notAClass))
            return []
        }
        let shape = Shape(classDecl)
        if classDecl.modifiers.contains(where: { $0.name.text == "open" }) {
            context.diagnose(Diagnostic(node: Syntax(classDecl.classKeyword), message: SkyrosDiagnostic.openClass))
            return []
        }
        let (properties, diagnostics) = PersistentProperty.collect(in: classDecl.memberBlock)
        for diagnostic in diagnostics { context.diagnose(diagnostic) }
        let typeName = shape.typeName
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
                indexes =
                    ", indexes: [" + indexList.map { $0.expression.trimmedDescription }.joined(separator: ", ") + "]"
            }
            for label in ["name", "originalName"] {
                if let argument = arguments.first(where: { $0.label?.text == label }) {
                    names += ", \(label): \(argument.expression.trimmedDescription)"
                    if label == "name" { entityName = argument.expression.trimmedDescription }
                }
            }
        }
        let list =
            descriptions.isEmpty
            ? "[]" : "[\n" + descriptions.map { "        \($0)," }.joined(separator: "\n") + "\n    ]"
        guard shape.isInHierarchy else {
            var members: [DeclSyntax] = [
                "\(raw: access)static let entityDescription = EntityDescription(\(raw: typeName).self\(raw: names), properties: \(raw: list)\(raw: indexes))",
                "\(raw: access)let skyrosStorage: ObjectStorage",
                "\(raw: access)init(skyrosStorage: ObjectStorage) {\n    self.skyrosStorage = skyrosStorage\n}",
            ]
            if let entityName {
                members.insert("\(raw: access)static let entityName: String = \(raw: entityName)", at: 1)
            }
            return members
        }
        // A class of a hierarchy: class-level members a subclass overrides, the description in a
        // static of a name of its own, and (for a class that may have subclasses) the key paths
        // of its properties re-rooted at a subclass, for predicates and sorts on inherited properties.
        let storageName = "_skyrosEntity_\(typeName)"
        let override = shape.parent != nil ? "override " : ""
        var parentArguments = ""
        if let parent = shape.parent {
            parentArguments =
                ", parent: \(parent).self, inheritedKeyPaths: \(parent).\(Shape.keyPathsFunction(of: parent))(\(typeName).self)"
        }
        var members: [DeclSyntax] = [
            "\(raw: access)static let \(raw: storageName) = EntityDescription(\(raw: typeName).self\(raw: names)\(raw: parentArguments), properties: \(raw: list)\(raw: indexes))",
            "\(raw: access)\(raw: override)class var entityDescription: EntityDescription { \(raw: storageName) }",
            "\(raw: access)\(raw: override)class var entityName: String { \(raw: entityName ?? "\"\(typeName)\"") }",
        ]
        if shape.parent == nil {
            members.append("\(raw: access)let skyrosStorage: ObjectStorage")
            members.append(
                "\(raw: access)required init(skyrosStorage: ObjectStorage) {\n    self.skyrosStorage = skyrosStorage\n}"
            )
        } else {
            members.append(
                "\(raw: access)required init(skyrosStorage: ObjectStorage) {\n    super.init(skyrosStorage: skyrosStorage)\n}"
            )
        }
        if !shape.isFinal {
            let own = properties.map { "\\Sub.\($0.name)" }.joined(separator: ", ")
            let inherited = shape.parent.map { "\($0).\(Shape.keyPathsFunction(of: $0))(Sub.self) + " } ?? ""
            members.append(
                "\(raw: access)static func \(raw: Shape.keyPathsFunction(of: typeName))<Sub: \(raw: typeName)>(_: Sub.Type) -> [AnyKeyPath] {\n    \(raw: inherited)[\(raw: own)]\n}"
            )
        }
        return members
    }

    /// Each persistent property's attribute: `@_Persisted(index)`, its position in the entity;
    /// in a subentity, `@_Persisted(index, Type.self)`, its position among the class's own
    /// properties (the store's entity of the hierarchy says where they begin).
    public static func expansion(
        of node: AttributeSyntax, attachedTo declaration: some DeclGroupSyntax,
        providingAttributesFor member: some DeclSyntaxProtocol, in context: some MacroExpansionContext
    ) throws -> [AttributeSyntax] {
        guard let classDecl = declaration.as(ClassDeclSyntax.self),
            !classDecl.modifiers.contains(where: { $0.name.text == "open" }),
            let variable = member.as(VariableDeclSyntax.self)
        else { return [] }
        let shape = Shape(classDecl)
        let (properties, _) = PersistentProperty.collect(in: classDecl.memberBlock)
        guard let name = variable.bindings.first?.pattern.as(IdentifierPatternSyntax.self)?.identifier.text,
            let index = properties.firstIndex(where: { $0.name == name })
        else { return [] }
        if shape.parent != nil { return ["@_Persisted(\(raw: index), \(raw: shape.typeName).self)"] }
        return ["@_Persisted(\(raw: index))"]
    }

    /// The `ManagedObject` conformance (a subentity inherits its parent's).
    public static func expansion(
        of node: AttributeSyntax, attachedTo declaration: some DeclGroupSyntax,
        providingExtensionsOf type: some TypeSyntaxProtocol, conformingTo protocols: [TypeSyntax],
        in context: some MacroExpansionContext
    ) throws -> [ExtensionDeclSyntax] {
        guard let classDecl = declaration.as(ClassDeclSyntax.self),
            !classDecl.modifiers.contains(where: { $0.name.text == "open" }), Shape(classDecl).parent == nil
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
        var text =
            ".persistent(\"\(property.name)\", \\\(typeName).\(property.name), default: { \(property.defaultValue) }"
        if let attribute = property.attribute, let arguments = attribute.arguments?.as(LabeledExprListSyntax.self) {
            let options = arguments.filter { $0.label == nil }.map { $0.expression.trimmedDescription }
            if !options.isEmpty { text += ", attributeOptions: [\(options.joined(separator: ", "))]" }
            if let original = arguments.first(where: { $0.label?.text == "originalName" }) {
                text += ", originalName: \(original.expression.trimmedDescription)"
            }
        }
        if let relationship = property.relationship,
            let arguments = relationship.arguments?.as(LabeledExprListSyntax.self)
        {
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
        if arguments.count > 1, let type = arguments.last?.expression.trimmedDescription {
            let position = "skyrosStorage.entity.propertyBase(of: \(type)) &+ \(index)"
            return [
                "init(initialValue) {}",
                "get { skyrosStorage.persistentValue(at: \(raw: position)) }",
                "set { skyrosStorage.setPersistentValue(newValue, at: \(raw: position)) }",
            ]
        }
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
