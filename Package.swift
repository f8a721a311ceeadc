// swift-tools-version: 6.1
import CompilerPluginSupport
import PackageDescription

let package = Package(
    name: "Skyros",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Skyros", targets: ["Skyros"]),
        .library(name: "SkyrosShared", targets: ["SkyrosShared"]),
        // A separate product so that Skyros itself does not depend on swift-service-lifecycle.
        .library(name: "SkyrosServiceLifecycle", targets: ["SkyrosServiceLifecycle"]),
        .executable(name: "skyros-bench", targets: ["skyros-bench"]),
        .executable(name: "skyrosd", targets: ["skyrosd"]),
        .executable(name: "skyros", targets: ["skyros"]),
        .executable(name: "skyros-gateway", targets: ["skyros-gateway"]),
    ],
    dependencies: [
        .package(url: "https://github.com/groue/GRDB.swift", from: "7.10.0"),
        .package(url: "https://github.com/swiftlang/swift-syntax", "600.0.0"..<"700.0.0"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-log", from: "1.6.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.6.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.5.0"),
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.0.0"),
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.81.0"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.25.0"),
        .package(url: "https://github.com/vapor/jwt-kit", from: "5.7.1"),
        .package(url: "https://github.com/jpsim/Yams", from: "5.0.1"),
        // Keys made in tests (jwt-kit's own dependency, named for the RSA keys' CryptoExtras).
        .package(url: "https://github.com/apple/swift-crypto", "4.1.0"..<"6.0.0"),
        // `swift package generate-documentation --target Skyros`: the DocC catalog, in CI.
        .package(url: "https://github.com/swiftlang/swift-docc-plugin", from: "1.5.0"),
    ],
    targets: [
        // The macros' code is a library of its own that the macro target only serves, so the
        // macro tests depend on a library, not on a macro: a test target that depends on a macro
        // has SwiftPM build the whole test product, and everything under it (GRDB, swift-nio,
        // BoringSSL twice, every Skyros module), a second time for the host, which was half of
        // CI's build time.
        .target(
            name: "SkyrosMacrosCore",
            dependencies: [
                .product(name: "SwiftSyntax", package: "swift-syntax"),
                .product(name: "SwiftSyntaxMacros", package: "swift-syntax"),
                .product(name: "SwiftSyntaxBuilder", package: "swift-syntax"),
                .product(name: "SwiftDiagnostics", package: "swift-syntax"),
            ]
        ),
        .macro(
            name: "SkyrosMacros",
            dependencies: [
                "SkyrosMacrosCore",
                .product(name: "SwiftCompilerPlugin", package: "swift-syntax"),
                .product(name: "SwiftSyntax", package: "swift-syntax"),
                .product(name: "SwiftSyntaxMacros", package: "swift-syntax"),
            ]
        ),
        .target(
            name: "Skyros",
            dependencies: [
                "SkyrosMacros",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
            ]
        ),
        .target(
            name: "SkyrosServiceLifecycle",
            dependencies: [
                "Skyros",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // ZMTP 3.0 in Swift: no C dependency, so no shipped binary links libzmq.
        .target(name: "SkyrosZeroMQ"),
        .target(
            name: "SkyrosWire",
            dependencies: ["Skyros"]
        ),
        .target(
            name: "SkyrosShared",
            dependencies: ["Skyros", "SkyrosWire", "SkyrosZeroMQ"]
        ),
        // Sync with PostgreSQL (docs/SYNC.md): the daemon's upload queue and checkpoints, with
        // postgres-nio at the edge. Only the daemon links it.
        .target(
            name: "SkyrosSync",
            dependencies: [
                "Skyros", "SkyrosWire",
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
            ]
        ),
        // The sync gateway's parts (docs/SYNC.md): machines' tokens, verified and minted; the
        // sync rules, read and checked, and the SQL of a bucket's rows.
        .target(
            name: "SkyrosGateway",
            dependencies: [
                "Skyros", "SkyrosSync", "SkyrosWire", .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Yams", package: "Yams"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOWebSocket", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ]
        ),
        .target(
            name: "SkyrosDaemon",
            dependencies: [
                "Skyros", "SkyrosWire", "SkyrosZeroMQ", "SkyrosSync",
                // StoreCheck reads the store file through its own read-only SQLite connection.
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                // Admin sessions: backups (GRDB's online backup), metrics (Prometheus text).
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        .executableTarget(
            name: "skyros-gateway",
            dependencies: [
                "Skyros", "SkyrosGateway", "SkyrosSync",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ]
        ),
        .executableTarget(
            name: "skyrosd",
            dependencies: [
                "Skyros", "SkyrosDaemon", "SkyrosSync", "SkyrosWire",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
            ]
        ),
        .executableTarget(
            name: "skyros-bench",
            dependencies: [
                "Skyros", "SkyrosShared", "SkyrosDaemon", "SkyrosWire", "SkyrosZeroMQ", "CZeroMQ", "ZeroMQReference",
                "SkyrosTestSupport", "SkyrosSync", "SkyrosGateway",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "GRDBSQLite", package: "GRDB.swift"),
                // `skyros-bench sync`: the bare postgres-nio baselines.
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
            ],
            path: "Benchmarks/skyros-bench"
        ),
        .target(
            name: "TodoModel",
            dependencies: ["Skyros"],
            path: "examples/TodoModel"
        ),
        .executableTarget(
            name: "todo",
            dependencies: ["Skyros", "SkyrosShared", "TodoModel"],
            path: "examples/Todo"
        ),
        // The folder is SkyrosTool, not skyros: no two paths may differ only in case
        // (Sources/Skyros), or a checkout on a case-insensitive file system breaks.
        .executableTarget(
            name: "skyros",
            dependencies: [
                "Skyros", "SkyrosShared", "SkyrosDaemon", "SkyrosGateway", "SkyrosWire", "SkyrosZeroMQ", "TodoModel",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "GRDB", package: "GRDB.swift"),
            ],
            path: "Sources/SkyrosTool"
        ),
        .executableTarget(
            name: "skyros-quickstart",
            dependencies: ["Skyros"],
            path: "examples/QuickStart"
        ),
        // The async forms of `read` and `write` in top-level code: `swift run skyros-toplevel`.
        .executableTarget(
            name: "skyros-toplevel",
            dependencies: ["Skyros"],
            path: "examples/TopLevel"
        ),
        // Test support: libzmq from apt (libzmq3-dev), the reference peer the tests hold
        // SkyrosZeroMQ against. The header is in /usr/include, so no pkg-config (whose flags
        // for libzmq include -isystem paths SwiftPM refuses).
        .systemLibrary(
            name: "CZeroMQ",
            path: "Tests/CZeroMQ",
            providers: [.apt(["libzmq3-dev"])]
        ),
        .target(
            name: "ZeroMQReference",
            dependencies: ["CZeroMQ"],
            path: "Tests/ZeroMQReference"
        ),
        .target(
            name: "SkyrosTestSupport",
            dependencies: [
                "Skyros", "SkyrosDaemon", "SkyrosShared", "SkyrosSync", "SkyrosWire", "SkyrosZeroMQ", "ZeroMQReference",
                // The fault campaign reads each machine's store read-only (its checkpoint, queue, rejected log).
                .product(name: "GRDB", package: "GRDB.swift"),
            ],
            path: "Tests/SkyrosTestSupport"
        ),
        .executableTarget(
            name: "skyros-test-child",
            dependencies: [
                "Skyros", "SkyrosShared", "SkyrosTestSupport", "SkyrosWire", "SkyrosZeroMQ", "ZeroMQReference",
                "SkyrosServiceLifecycle",
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Tests/skyros-test-child"
        ),
        .testTarget(
            name: "SkyrosTests",
            dependencies: [
                "Skyros", "SkyrosShared", "SkyrosSync", "SkyrosGateway", "SkyrosTestSupport", "TodoModel", "ZeroMQReference",
                "skyros-test-child", "skyrosd",
                "skyros", "skyros-toplevel", "todo", "skyros-gateway",
                .product(name: "GRDB", package: "GRDB.swift"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "Crypto", package: "swift-crypto"),
                .product(name: "CryptoExtras", package: "swift-crypto"),
            ]
        ),
        // The sync engine's state machines and pure parts, as transcripts: no PostgreSQL.
        .testTarget(
            name: "SkyrosSyncTests",
            dependencies: ["SkyrosSync", "Skyros", "SkyrosWire", .product(name: "GRDB", package: "GRDB.swift")]
        ),
        .testTarget(
            name: "SkyrosWireTests",
            dependencies: ["SkyrosWire", "Skyros"]
        ),
        .testTarget(
            name: "SkyrosDaemonTests",
            dependencies: ["SkyrosDaemon", "SkyrosWire", "SkyrosZeroMQ", "Skyros", "SkyrosTestSupport", "ZeroMQReference", "CZeroMQ"]
        ),
        .testTarget(
            name: "SkyrosZeroMQTests",
            dependencies: ["SkyrosZeroMQ", "ZeroMQReference"]
        ),
        .testTarget(
            name: "SkyrosMacrosTests",
            dependencies: [
                "SkyrosMacrosCore",
                .product(name: "SwiftSyntaxMacrosGenericTestSupport", package: "swift-syntax"),
                .product(name: "SwiftSyntaxMacroExpansion", package: "swift-syntax"),
            ]
        ),
    ],
    swiftLanguageModes: [.v6]
)
