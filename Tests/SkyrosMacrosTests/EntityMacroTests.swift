import SkyrosMacrosCore
import SwiftSyntaxMacroExpansion
import SwiftSyntaxMacros
import SwiftSyntaxMacrosGenericTestSupport
import Testing

private let macroSpecs: [String: MacroSpec] = [
    "Entity": MacroSpec(type: EntityMacro.self, conformances: ["ManagedObject"]),
    "_Persisted": MacroSpec(type: PersistedPropertyMacro.self),
    "Attribute": MacroSpec(type: MarkerMacro.self),
    "Relationship": MacroSpec(type: MarkerMacro.self),
    "Transient": MacroSpec(type: MarkerMacro.self),
]

private func expect(
    _ source: String, expands expanded: String, diagnostics: [DiagnosticSpec] = [],
    sourceLocation: SourceLocation = #_sourceLocation
) {
    assertMacroExpansion(
        source, expandedSource: expanded, diagnostics: diagnostics, macroSpecs: macroSpecs,
        failureHandler: { failure in
            Issue.record(Comment(rawValue: failure.message), sourceLocation: sourceLocation)
        })
}

@Suite("@Entity macro expansion")
struct EntityMacroTests {
    @Test("attributes, options, relationships, transient and computed properties")
    func expansion() {
        expect(
            """
            @Entity public final class User {
                public var name: String = ""
                var age = 0
                var email: String?
                @Attribute(.unique, originalName: "login") var handle: String = ""
                @Relationship(deleteRule: .cascade, inverse: \\Post.author) var posts: [Post] = []
                @Transient var cache: Int = 0
                var display: String { name }
                static var shared = 1
            }
            """,
            expands: """
                public final class User {
                    public var name: String {
                        init(initialValue) {
                        }
                        get {
                            skyrosStorage.persistentValue(at: 0)
                        }
                        set {
                            skyrosStorage.setPersistentValue(newValue, at: 0)
                        }
                    }
                    var age {
                        init(initialValue) {
                        }
                        get {
                            skyrosStorage.persistentValue(at: 1)
                        }
                        set {
                            skyrosStorage.setPersistentValue(newValue, at: 1)
                        }
                    }
                    var email: String? {
                        init(initialValue) {
                        }
                        get {
                            skyrosStorage.persistentValue(at: 2)
                        }
                        set {
                            skyrosStorage.setPersistentValue(newValue, at: 2)
                        }
                    }
                    var handle: String {
                        init(initialValue) {
                        }
                        get {
                            skyrosStorage.persistentValue(at: 3)
                        }
                        set {
                            skyrosStorage.setPersistentValue(newValue, at: 3)
                        }
                    }
                    var posts: [Post] {
                        init(initialValue) {
                        }
                        get {
                            skyrosStorage.persistentValue(at: 4)
                        }
                        set {
                            skyrosStorage.setPersistentValue(newValue, at: 4)
                        }
                    }
                    var cache: Int = 0
                    var display: String { name }
                    static var shared = 1

                    public static let entityDescription = EntityDescription(User.self, properties: [
                            .persistent("name", \\User.name, default: {
                                        ""
                                    }),
                            .persistent("age", \\User.age, default: {
                                        0
                                    }),
                            .persistent("email", \\User.email, default: {
                                        nil
                                    }),
                            .persistent("handle", \\User.handle, default: {
                                        ""
                                    }, attributeOptions: [.unique], originalName: "login"),
                            .persistent("posts", \\User.posts, default: {
                                        []
                                    }, deleteRule: .cascade, inverse: \\Post.author),
                        ])

                    public let skyrosStorage: ObjectStorage

                    public init(skyrosStorage: ObjectStorage) {
                        self.skyrosStorage = skyrosStorage
                    }
                }

                extension User: ManagedObject {
                }
                """)
    }

    @Test("entity-level indexes are passed through")
    func indexes() {
        expect(
            """
            @Entity(indexes: ["a", "b"], ["b"]) final class Pair {
                var a: Int = 0
                var b: Int = 0
            }
            """,
            expands: """
                final class Pair {
                    var a: Int {
                        init(initialValue) {
                        }
                        get {
                            skyrosStorage.persistentValue(at: 0)
                        }
                        set {
                            skyrosStorage.setPersistentValue(newValue, at: 0)
                        }
                    }
                    var b: Int {
                        init(initialValue) {
                        }
                        get {
                            skyrosStorage.persistentValue(at: 1)
                        }
                        set {
                            skyrosStorage.setPersistentValue(newValue, at: 1)
                        }
                    }

                    static let entityDescription = EntityDescription(Pair.self, properties: [
                            .persistent("a", \\Pair.a, default: {
                                        0
                                    }),
                            .persistent("b", \\Pair.b, default: {
                                        0
                                    }),
                        ], indexes: [["a", "b"], ["b"]])

                    let skyrosStorage: ObjectStorage

                    init(skyrosStorage: ObjectStorage) {
                        self.skyrosStorage = skyrosStorage
                    }
                }

                extension Pair: ManagedObject {
                }
                """)
    }

    @Test("an entity name, an original name, indexes and a renamed relationship")
    func names() {
        expect(
            """
            @Entity(name: "User", originalName: "Person", indexes: ["a"]) final class UserV2 {
                @Relationship(originalName: "boss") var manager: UserV2? = nil
                var a: Int = 0
            }
            """,
            expands: """
                final class UserV2 {
                    var manager: UserV2? {
                        init(initialValue) {
                        }
                        get {
                            skyrosStorage.persistentValue(at: 0)
                        }
                        set {
                            skyrosStorage.setPersistentValue(newValue, at: 0)
                        }
                    }
                    var a: Int {
                        init(initialValue) {
                        }
                        get {
                            skyrosStorage.persistentValue(at: 1)
                        }
                        set {
                            skyrosStorage.setPersistentValue(newValue, at: 1)
                        }
                    }

                    static let entityDescription = EntityDescription(UserV2.self, name: "User", originalName: "Person", properties: [
                            .persistent("manager", \\UserV2.manager, default: {
                                        nil
                                    }, originalName: "boss"),
                            .persistent("a", \\UserV2.a, default: {
                                        0
                                    }),
                        ], indexes: [["a"]])

                    static let entityName: String = "User"

                    let skyrosStorage: ObjectStorage

                    init(skyrosStorage: ObjectStorage) {
                        self.skyrosStorage = skyrosStorage
                    }
                }

                extension UserV2: ManagedObject {
                }
                """)
    }

    @Test("a struct is refused")
    func structRefused() {
        expect(
            "@Entity struct Point { var x: Int = 0 }",
            expands: "struct Point { var x: Int = 0 \n}",
            diagnostics: [DiagnosticSpec(message: "@Entity can only be applied to a class", line: 1, column: 1)])
    }

    @Test("a class that is not final is a hierarchy's root; a subclass of it a subentity")
    func hierarchy() {
        expect(
            """
            @Entity public class Vehicle { public var name: String = "" }
            """,
            expands: """
                public class Vehicle { 
                public var name: String { 
                    init(initialValue) {
                    }
                    get {
                        skyrosStorage.persistentValue(at: 0)
                    }
                    set {
                        skyrosStorage.setPersistentValue(newValue, at: 0)
                    }
                }

                    public static let _skyrosEntity_Vehicle = EntityDescription(Vehicle.self, properties: [
                            .persistent("name", \\Vehicle.name, default: {
                                        ""
                                    }),
                        ])

                    public class var entityDescription: EntityDescription {
                        _skyrosEntity_Vehicle
                    }

                    public class var entityName: String {
                        "Vehicle"
                    }

                    public let skyrosStorage: ObjectStorage

                    public required init(skyrosStorage: ObjectStorage) {
                        self.skyrosStorage = skyrosStorage
                    }

                    public static func _skyrosKeyPaths_Vehicle<Sub: Vehicle>(_: Sub.Type) -> [AnyKeyPath] {
                        [\\Sub.name]
                    }
                }

                extension Vehicle: ManagedObject {
                }
                """)
        expect(
            """
            @Entity(name: "Automobile") final class Car: Vehicle, Sendable { var doors = 4 }
            """,
            expands: """
                final class Car: Vehicle, Sendable { 
                var doors { 
                    init(initialValue) {
                    }
                    get {
                        skyrosStorage.persistentValue(at: skyrosStorage.entity.propertyBase(of: Car.self) &+ 0)
                    }
                    set {
                        skyrosStorage.setPersistentValue(newValue, at: skyrosStorage.entity.propertyBase(of: Car.self) &+ 0)
                    }
                }

                    static let _skyrosEntity_Car = EntityDescription(Car.self, name: "Automobile", parent: Vehicle.self, inheritedKeyPaths: Vehicle._skyrosKeyPaths_Vehicle(Car.self), properties: [
                            .persistent("doors", \\Car.doors, default: {
                                        4
                                    }),
                        ])

                    override class var entityDescription: EntityDescription {
                        _skyrosEntity_Car
                    }

                    override class var entityName: String {
                        "Automobile"
                    }

                    required init(skyrosStorage: ObjectStorage) {
                        super.init(skyrosStorage: skyrosStorage)
                    }
                }
                """)
    }

    @Test("an open class is refused: its subclasses could not be entities")
    func openRefused() {
        expect(
            "@Entity open class Point { var x: Int = 0 }",
            expands: "open class Point { var x: Int = 0 \n}",
            diagnostics: [
                DiagnosticSpec(
                    message:
                        "an @Entity class cannot be 'open': its subclasses must be @Entity classes of the same module",
                    line: 1, column: 14)
            ])
    }

    @Test("unsupported types, missing types and defaults, and constants are diagnosed")
    func propertyDiagnostics() {
        expect(
            """
            @Entity final class Bad {
                var callback: () -> Void = {}
                var pair: (Int, Int) = (0, 0)
                var anything: Any = 0
                var inferred = makeValue()
                var required: String
                let constant: Int = 0
            }
            """,
            expands: """
                final class Bad {
                    var callback: () -> Void = {}
                    var pair: (Int, Int) = (0, 0)
                    var anything: Any = 0
                    var inferred = makeValue()
                    var required: String
                    let constant: Int = 0

                    static let entityDescription = EntityDescription(Bad.self, properties: [])

                    let skyrosStorage: ObjectStorage

                    init(skyrosStorage: ObjectStorage) {
                        self.skyrosStorage = skyrosStorage
                    }
                }

                extension Bad: ManagedObject {
                }
                """,
            diagnostics: [
                DiagnosticSpec(message: unsupported, line: 2, column: 19),
                DiagnosticSpec(message: unsupported, line: 3, column: 15),
                DiagnosticSpec(message: unsupported, line: 4, column: 19),
                DiagnosticSpec(
                    message: "a persistent property needs a type annotation (for example ': String')", line: 5,
                    column: 9),
                DiagnosticSpec(
                    message: "a persistent property needs a default value (optionals default to nil)", line: 6,
                    column: 9),
                DiagnosticSpec(
                    message: "a persistent property must be a 'var'; use @Transient for a constant that is not stored",
                    line: 7, column: 5),
            ])
    }
}

private let unsupported =
    "this type cannot be stored: use a supported attribute type, an enum with String or Int raw values, a Codable struct, or an @Entity class; mark the property @Transient to keep it out of the store"
