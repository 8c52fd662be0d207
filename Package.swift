// swift-tools-version:6.2
import PackageDescription

// The libFuzzer executables (scripts/fuzz, issue 25): one per target of Tests/TesseraFuzzTargets,
// each a few lines in Fuzz/Sources that hand its arguments to libFuzzer's driver and libFuzzer's
// inputs to the target. They exist only in the build scripts/lib/sanitize.sh describes, which names
// libFuzzer's archive (the one without a `main`) in TESSERA_LIBFUZZER: the unit tests under
// AddressSanitizer and the fuzzers come from that one build, with libFuzzer's coverage compiled into
// every Swift module (elsewhere its calls land in AddressSanitizer's empty defaults).
let fuzzers: [Target] =
  Context.environment["TESSERA_LIBFUZZER"].map { libFuzzer in
    // libFuzzer's driver, declared (it ships no header).
    [.systemLibrary(name: "CLibFuzzer", path: "Fuzz/Driver")]
      + [
        "FuzzConfig", "FuzzOAuth", "FuzzGitCredential", "FuzzLoopback", "FuzzMicrosoft", "FuzzProvider", "FuzzBus",
        "FuzzStore",
      ].map {
        .executableTarget(
          name: $0, dependencies: ["TesseraFuzzTargets", "CLibFuzzer"], path: "Fuzz/Sources/\($0)",
          linkerSettings: [.unsafeFlags(["-Xlinker", libFuzzer, "-Xlinker", "-lstdc++"])])
      }
  } ?? []

let package = Package(
  name: "Tessera",
  products: [
    .executable(name: "tesserad", targets: ["tesserad"]),
    .executable(name: "tessera", targets: ["tessera"]),
    .library(name: "TesseraClient", targets: ["TesseraClient"]),
    // The values both sides of the bus share (accounts, tokens, status, errors): for TesseraClient's
    // users, Desktop/ (tessera-accounts) among them.
    .library(name: "TesseraInterface", targets: ["TesseraInterface"]),
  ],
  dependencies: [
    .package(url: "https://github.com/apple/swift-argument-parser.git", from: "1.8.2"),
    .package(url: "https://github.com/apple/swift-log.git", from: "1.16.2"),
    .package(url: "https://github.com/apple/swift-crypto.git", from: "4.5.2"),
    .package(url: "https://github.com/vapor/jwt-kit.git", from: "5.8.0"),
    .package(url: "https://github.com/swift-server/swift-service-lifecycle.git", from: "2.13.0"),
    .package(url: "https://github.com/apple/swift-system.git", from: "1.8.1"),
    // Tests only: generated values with shrinking and replayable seeds (TesseraBusTests).
    .package(url: "https://github.com/x-sheep/swift-property-based.git", from: "2.0.1"),
  ],
  targets: [
    // What both sides of the bus share: values, the interface, the error table, the option table,
    // the wire mapping of accounts and results, correlation ids. No dependencies at all.
    .target(name: "TesseraInterface"),

    // System libraries. libsystemd is reached only through TesseraBus (sd-bus) and TesseraPlatform
    // (journal); libsecret, libcurl and tpm2-tss only through TesseraPlatform.
    .systemLibrary(name: "CSystemd", pkgConfig: "libsystemd", providers: [.apt(["libsystemd-dev"])]),
    .systemLibrary(name: "CSecret", pkgConfig: "libsecret-1", providers: [.apt(["libsecret-1-dev"])]),
    // Headers only: libcurl itself is loaded on the first HTTP request (CurlLibrary.swift).
    .systemLibrary(name: "CCurl", providers: [.apt(["libcurl4-openssl-dev"])]),
    // Headers only: tpm2-tss (ESAPI, marshalling, the TCTI loader) is loaded on the first use of a
    // TPM (Tss2Library.swift); a machine without one never maps it.
    .systemLibrary(name: "CTss2", providers: [.apt(["libtss2-dev"])]),
    // What Swift cannot call of sd-bus: the vtable macros.
    .target(name: "CTesseraBusShim", dependencies: ["CSystemd"]),
    // What Swift cannot call of libcurl, with its reason in tessera_shim.h: the variadic
    // setopt/getinfo.
    .target(name: "CTesseraShim", dependencies: ["CCurl"]),
    // What Swift cannot call of glibc, each with its reason in tessera_system_shim.h: the GNU-only
    // pipe2, accept4, posix_spawn_file_actions_addclosefrom_np, memfd_create with its seals,
    // renameat2, pthread_setname_np and pidfd_open; and malloc_trim's header, <malloc.h>.
    .target(name: "CTesseraSystemShim"),

    // The system layer, below everything that touches the operating system: system calls with
    // their errno, files (made, listed, written durably, read through a checked descriptor),
    // threads, and reading the configuration's files. No libsystemd, no bus, no engine.
    .target(
      name: "TesseraSystem",
      dependencies: [
        "TesseraInterface", "CTesseraSystemShim", .product(name: "SystemPackage", package: "swift-system"),
      ]
    ),

    // The bus layer, for both sides: sd-bus client and server, the value codec, tesserad's own
    // socket. Depends on libsystemd and the system layer only: no engine, no libsecret, no libcurl.
    .target(
      name: "TesseraBus",
      dependencies: [
        "TesseraInterface", "TesseraSystem", "CSystemd", "CTesseraBusShim", "CTesseraSystemShim",
        .product(name: "SystemPackage", package: "swift-system"),
      ]
    ),

    // The engine, pure Swift: accounts, token cache, OAuth/OIDC protocol, request handling, policy.
    .target(
      name: "TesseraCore",
      dependencies: [
        "TesseraInterface",
        .product(name: "Logging", package: "swift-log"),
        .product(name: "Crypto", package: "swift-crypto"),
        .product(name: "JWTKit", package: "jwt-kit"),
      ]
    ),
    // The engine's adapters: libsecret, libcurl, the loopback listener, the browser, the journal, and
    // the engine's events on the bus. The only importer of libsecret, libcurl and tpm2-tss.
    .target(
      name: "TesseraPlatform",
      dependencies: [
        "TesseraInterface", "TesseraCore", "TesseraBus", "TesseraSystem", "CSystemd", "CSecret", "CCurl", "CTss2",
        "CTesseraShim",
        "CTesseraSystemShim", .product(name: "Logging", package: "swift-log"),
        .product(name: "SystemPackage", package: "swift-system"),
        .product(name: "Crypto", package: "swift-crypto"),
      ]
    ),
    // Typed client for org.tessera.Broker1, used by the CLI and by Swift apps: no engine.
    .target(name: "TesseraClient", dependencies: ["TesseraInterface", "TesseraSystem", "TesseraBus"]),
    .executableTarget(
      name: "tesserad",
      dependencies: [
        "TesseraInterface", "TesseraCore", "TesseraPlatform", "TesseraBus", "TesseraSystem",
        .product(name: "Logging", package: "swift-log"),
        .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
        .product(name: "UnixSignals", package: "swift-service-lifecycle"),
        .product(name: "ArgumentParser", package: "swift-argument-parser"),
      ]
    ),
    // The CLI's logic: subcommands, output, and the helpers for git, kubectl, SASL and exec. Only
    // what both sides share and the bus layer: no engine.
    .target(
      name: "TesseraCLI",
      dependencies: [
        "TesseraInterface", "TesseraClient", "TesseraBus", "TesseraSystem",
        .product(name: "ArgumentParser", package: "swift-argument-parser"),
        .product(name: "SystemPackage", package: "swift-system"),
      ]),
    .executableTarget(
      name: "tessera",
      dependencies: ["TesseraCLI"],
      // Runs inside `$(tessera token)` in scripts and prompts: the Swift runtime linked in statically
      // saves loading and relocating ten shared libraries at every start (BENCHMARKS.md, "CLI
      // start-up"). The daemon starts once and keeps the shared runtime. The sanitizer runs of the
      // test command set TESSERA_SHARED_STDLIB: ThreadSanitizer's runtime cannot start a binary
      // with the Swift runtime linked in statically (its allocator aborts at the first call).
      linkerSettings: Context.environment["TESSERA_SHARED_STDLIB"] == nil
        ? [.unsafeFlags(["-static-stdlib", "-Xlinker", "-l_FoundationCShims", "-Xlinker", "-l_FoundationCollections"])]
        : []
    ),
    // The benchmark (scripts/bench): measures a tesserad binary against the D-Bus floor.
    .executableTarget(
      name: "tessera-bench",
      dependencies: [
        "TesseraInterface", "TesseraCore", "TesseraPlatform", "TesseraBus", "TesseraSystem", "TesseraClient",
        "CSystemd", "TesseraTestSupport", .product(name: "ArgumentParser", package: "swift-argument-parser"),
      ]
    ),
    .testTarget(name: "TesseraInterfaceTests", dependencies: ["TesseraInterface"]),
    .testTarget(
      name: "TesseraSystemTests",
      dependencies: ["TesseraSystem", "TesseraInterface", .product(name: "SystemPackage", package: "swift-system")]),
    // The CLI: its pure parts, and the built `tessera` binary run as a user runs it (stdout,
    // stderr, exit status), against a scripted broker on a private dbus-daemon.
    .testTarget(name: "TesseraClientTests", dependencies: ["TesseraClient", "TesseraInterface", "TesseraTestSupport"]),
    .testTarget(
      name: "TesseraCLITests",
      dependencies: [
        "TesseraCLI", "TesseraInterface", "TesseraTestSupport",
        .product(name: "ArgumentParser", package: "swift-argument-parser"),
      ]),
    // The engine's fakes (a clock, a keyring, a scripted identity provider, a broker wired to them),
    // for the engine's unit tests and the fuzz targets: pure logic only.
    .target(
      name: "TesseraEngineFakes",
      dependencies: [
        "TesseraInterface", "TesseraCore", .product(name: "Logging", package: "swift-log"),
        .product(name: "JWTKit", package: "jwt-kit"),
      ],
      path: "Tests/TesseraEngineFakes"),
    .testTarget(
      name: "TesseraCoreTests",
      dependencies: ["TesseraInterface", "TesseraCore", "TesseraEngineFakes", "TesseraTestSupport"]),
    // One function per fuzz target (issue 25), each reading one kind of untrusted input with the
    // project's code: Fuzz/ wraps them for libFuzzer, and the replay tests run their seeds and every
    // input that once failed.
    .target(
      name: "TesseraFuzzTargets",
      dependencies: [
        "TesseraInterface", "TesseraCore", "TesseraCLI", "TesseraPlatform", "TesseraBus", "TesseraSystem",
        "TesseraEngineFakes",
        "CSystemd", .product(name: "Logging", package: "swift-log"), .product(name: "JWTKit", package: "jwt-kit"),
        .product(name: "Crypto", package: "swift-crypto"),
      ],
      path: "Tests/TesseraFuzzTargets"),
    .testTarget(
      name: "TesseraFuzzTargetsTests", dependencies: ["TesseraFuzzTargets", "TesseraInterface", "TesseraPlatform"]),
    // The bus layer on its own: the codec over generated values and the wire limits, and
    // BusServer with BusClient against a private dbus-daemon the tests start.
    // What the tests of the bus layer and of the CLI share: a private dbus-daemon, a scripted broker.
    .target(
      name: "TesseraTestSupport", dependencies: ["TesseraBus", "TesseraSystem", "TesseraInterface", "CSystemd"],
      path: "Tests/TesseraTestSupport"),
    .testTarget(
      name: "TesseraBusTests",
      dependencies: [
        "TesseraBus", "TesseraSystem", "TesseraInterface", "TesseraTestSupport", "CSystemd",
        .product(name: "PropertyBased", package: "swift-property-based"),
      ]),
    .testTarget(
      name: "TesseraPlatformTests",
      dependencies: [
        "TesseraInterface", "TesseraPlatform", "TesseraCore", "TesseraSystem", "TesseraEngineFakes",
        "TesseraTestSupport", .product(name: "Crypto", package: "swift-crypto"),
      ],
      resources: []
    ),
  ] + fuzzers,
  swiftLanguageModes: [.v6]
)
