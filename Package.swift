// swift-tools-version:6.2
import PackageDescription

let package = Package(
  name: "Tessera",
  products: [
    .executable(name: "tesserad", targets: ["tesserad"]),
    .executable(name: "tessera", targets: ["tessera"]),
    .library(name: "TesseraClient", targets: ["TesseraClient"]),
  ],
  dependencies: [
    .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
    .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
    .package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"),
    .package(url: "https://github.com/vapor/jwt-kit.git", from: "5.8.0"),
    .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
  ],
  targets: [
    // System libraries, reached only through TesseraPlatform.
    .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
    .systemLibrary(name: "CSecret", pkgConfig: "libsecret-1", providers: [.apt(["libsecret-1-dev"])]),
    // Headers only: libcurl itself is loaded on the first HTTP request (CurlLibrary.swift).
    .systemLibrary(name: "CCurl", providers: [.apt(["libcurl4-openssl-dev"])]),
    // What Swift cannot call: sd-bus vtable macros and libcurl's variadic setopt/getinfo.
    .target(name: "CTesseraShim", dependencies: ["CSystemd", "CCurl"]),

    // Pure Swift: accounts, token cache, OAuth/OIDC protocol, request handling, configuration.
    .target(
      name: "TesseraCore",
      dependencies: [
        .product(name: "Logging", package: "swift-log"),
        .product(name: "Crypto", package: "swift-crypto"),
        .product(name: "JWTKit", package: "jwt-kit"),
      ]
    ),
    // The only importer of the C modules: sd-bus, libsecret, libcurl, journal, sockets, processes.
    .target(
      name: "TesseraPlatform",
      dependencies: [
        "TesseraCore", "CSystemd", "CSecret", "CCurl", "CTesseraShim",
        .product(name: "Logging", package: "swift-log"),
      ]
    ),
    // Typed client for org.tessera.Broker1, used by the CLI and by Swift apps.
    .target(name: "TesseraClient", dependencies: ["TesseraCore", "TesseraPlatform"]),
    .executableTarget(
      name: "tesserad",
      dependencies: [
        "TesseraCore", "TesseraPlatform",
        .product(name: "Logging", package: "swift-log"),
        .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
        .product(name: "ArgumentParser", package: "swift-argument-parser"),
      ]
    ),
    .executableTarget(
      name: "tessera",
      dependencies: [
        "TesseraClient",
        .product(name: "ArgumentParser", package: "swift-argument-parser"),
      ]
    ),
    // The benchmark (scripts/bench): measures a tesserad binary against the D-Bus floor.
    .executableTarget(
      name: "tessera-bench",
      dependencies: [
        "TesseraCore", "TesseraPlatform",
        .product(name: "ArgumentParser", package: "swift-argument-parser"),
      ]
    ),
    .testTarget(name: "TesseraCoreTests", dependencies: ["TesseraCore"]),
    .testTarget(
      name: "TesseraPlatformTests", dependencies: ["TesseraPlatform", "TesseraCore"],
      resources: []
    ),
  ],
  swiftLanguageModes: [.v6]
)
