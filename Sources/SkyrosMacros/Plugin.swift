import SwiftCompilerPlugin
import SwiftSyntaxMacros

@main
struct SkyrosMacrosPlugin: CompilerPlugin {
    let providingMacros: [any Macro.Type] = [
        EntityMacro.self,
        PersistedPropertyMacro.self,
        MarkerMacro.self,
    ]
}
