// swift-tools-version:6.2
// Tessera's coverage-guided fuzz targets (issue 25): one libFuzzer executable per target of
// Tests/TesseraFuzzTargets (the main package's TesseraFuzzTargets, which the unit tests replay),
// each a few lines that hand libFuzzer's input to it. A package of its own, so that the main
// package never builds these: libFuzzer provides their `main`. Built and run by scripts/fuzz, which
// passes the sanitizer flags.
import PackageDescription

// libFuzzer has the `main`; each target only defines LLVMFuzzerTestOneInput.
let asLibrary: [SwiftSetting] = [.unsafeFlags(["-parse-as-library"])]
let tessera = Target.Dependency.product(name: "TesseraFuzzable", package: "Tessera")
let names = [
  "FuzzConfig", "FuzzOAuth", "FuzzGitCredential", "FuzzLoopback", "FuzzMicrosoft", "FuzzProvider", "FuzzBus",
  "FuzzStore",
]

let package = Package(
  name: "TesseraFuzz",
  dependencies: [.package(name: "Tessera", path: "..")],
  targets: names.map { .executableTarget(name: $0, dependencies: [tessera], swiftSettings: asLibrary) }
)
