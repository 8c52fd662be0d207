// swift-tools-version:6.2
// Tessera Accounts (issue 39): the desktop app, a GTK 4 + libadwaita client of tesserad through
// TesseraClient's async API. A package of its own, so that the main package (tesserad, tessera)
// never builds or links GTK: servers need none of it, and the app ships apart (tessera-gtk).
import PackageDescription

let package = Package(
  name: "TesseraDesktop",
  products: [.executable(name: "tessera-accounts", targets: ["tessera-accounts"])],
  dependencies: [.package(name: "Tessera", path: "..")],
  targets: [
    .systemLibrary(name: "CAdwaita", pkgConfig: "libadwaita-1", providers: [.apt(["libadwaita-1-dev"])]),
    .target(name: "CTesseraGtkShim", dependencies: ["CAdwaita"]),
    .target(
      name: "TesseraAccountsUI",
      dependencies: [
        "CAdwaita", "CTesseraGtkShim", .product(name: "TesseraClient", package: "Tessera"),
        .product(name: "TesseraInterface", package: "Tessera"),
      ]),
    .executableTarget(name: "tessera-accounts", dependencies: ["TesseraAccountsUI"]),
    .testTarget(name: "TesseraAccountsUITests", dependencies: ["TesseraAccountsUI"]),
  ]
)
