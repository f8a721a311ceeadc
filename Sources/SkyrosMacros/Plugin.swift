import SkyrosMacrosCore
import SwiftCompilerPlugin
import SwiftSyntax
import SwiftSyntaxMacros

// The compiler asks this plugin for `SkyrosMacros.EntityMacro` (the module `#externalMacro`
// names): the types it finds here forward to SkyrosMacrosCore, where the macros are written
// and tested (Package.swift says why the tests depend on that library, not on this target).

@main
struct SkyrosMacrosPlugin: CompilerPlugin {
    let providingMacros: [any Macro.Type] = [
        EntityMacro.self,
        PersistedPropertyMacro.self,
        MarkerMacro.self,
    ]
}

/// `@Entity`: SkyrosMacrosCore's ``SkyrosMacrosCore/EntityMacro``.
public struct EntityMacro: MemberMacro, MemberAttributeMacro, ExtensionMacro {
    public static func expansion(
        of node: AttributeSyntax, providingMembersOf declaration: some DeclGroupSyntax,
        conformingTo protocols: [TypeSyntax], in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] {
        try SkyrosMacrosCore.EntityMacro.expansion(
            of: node, providingMembersOf: declaration, conformingTo: protocols, in: context)
    }

    public static func expansion(
        of node: AttributeSyntax, attachedTo declaration: some DeclGroupSyntax,
        providingAttributesFor member: some DeclSyntaxProtocol, in context: some MacroExpansionContext
    ) throws -> [AttributeSyntax] {
        try SkyrosMacrosCore.EntityMacro.expansion(
            of: node, attachedTo: declaration, providingAttributesFor: member, in: context)
    }

    public static func expansion(
        of node: AttributeSyntax, attachedTo declaration: some DeclGroupSyntax,
        providingExtensionsOf type: some TypeSyntaxProtocol, conformingTo protocols: [TypeSyntax],
        in context: some MacroExpansionContext
    ) throws -> [ExtensionDeclSyntax] {
        try SkyrosMacrosCore.EntityMacro.expansion(
            of: node, attachedTo: declaration, providingExtensionsOf: type, conformingTo: protocols, in: context)
    }
}

/// `@_Persisted`: SkyrosMacrosCore's ``SkyrosMacrosCore/PersistedPropertyMacro``.
public struct PersistedPropertyMacro: AccessorMacro {
    public static func expansion(
        of node: AttributeSyntax, providingAccessorsOf declaration: some DeclSyntaxProtocol,
        in context: some MacroExpansionContext
    ) throws -> [AccessorDeclSyntax] {
        try SkyrosMacrosCore.PersistedPropertyMacro.expansion(of: node, providingAccessorsOf: declaration, in: context)
    }
}

/// `@Attribute`, `@Relationship`, `@Transient`: SkyrosMacrosCore's ``SkyrosMacrosCore/MarkerMacro``.
public struct MarkerMacro: PeerMacro {
    public static func expansion(
        of node: AttributeSyntax, providingPeersOf declaration: some DeclSyntaxProtocol,
        in context: some MacroExpansionContext
    ) throws -> [DeclSyntax] {
        try SkyrosMacrosCore.MarkerMacro.expansion(of: node, providingPeersOf: declaration, in: context)
    }
}
