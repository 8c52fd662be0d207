// swift-tools-version:6.2
// Tessera's coverage-guided fuzz targets (issue 25), one executable per parser group, each calling
// the project's own code (`@testable import`: debug builds of the package are compiled with
// -enable-testing). A package of its own, so that the main package never builds these: libFuzzer
// provides their `main`. Built and run by scripts/fuzz, which passes the sanitizer flags.
import PackageDescription

// libFuzzer has the `main`; each target only defines LLVMFuzzerTestOneInput.
let asLibrary: [SwiftSetting] = [.unsafeFlags(["-parse-as-library"])]
let tessera = Target.Dependency.product(name: "TesseraFuzzable", package: "Tessera")

let package = Package(
  name: "TesseraFuzz",
  dependencies: [.package(name: "Tessera", path: "..")],
  targets: [
    // config.toml: the reader, the broker's keys and the [[git]] tables.
    .executableTarget(name: "FuzzConfig", dependencies: [tessera], swiftSettings: asLibrary),
    // The identity provider's answers: token and error responses, client_info, Retry-After,
    // base64url, form encoding.
    .executableTarget(name: "FuzzOAuth", dependencies: [tessera], swiftSettings: asLibrary),
    // git's credential protocol and kubectl's KUBERNETES_EXEC_INFO.
    .executableTarget(name: "FuzzGitCredential", dependencies: [tessera], swiftSettings: asLibrary),
    // The loopback listener: the browser's request head and redirect query, and /proc/net/tcp.
    .executableTarget(name: "FuzzLoopback", dependencies: [tessera], swiftSettings: asLibrary),
    // The Microsoft broker front's request JSON.
    .executableTarget(name: "FuzzMicrosoft", dependencies: [tessera], swiftSettings: asLibrary),
  ]
)
