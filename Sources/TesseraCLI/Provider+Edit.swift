import ArgumentParser
import SystemPackage
import TesseraInterface
import TesseraSystem

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

#if canImport(Glibc)
  import Glibc
#endif

extension Tessera.Provider {
  struct Add: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "add",
      abstract: "Add a provider: a [[provider]] table in your config.toml, its secret in a file only you can read.",
      discussion: """
        With --profile, the profile knows the endpoints; give your app's client id (and the \
        secret where the provider demands one: google, bitbucket). Without a profile, give \
        --issuer (OpenID Connect or RFC 8414 discovery), or --authorization-endpoint and \
        --token-endpoint.

        The secret comes from --client-secret-file FILE or, with --client-secret-stdin, from \
        standard input (`pass show github-app | tessera provider add …`); never from an \
        argument. It is copied to $XDG_CONFIG_HOME/tessera/secrets/NAME.secret (0600).

        The table is checked exactly as tesserad checks it before anything is written: a \
        mistake is printed with what to do, and the files are left as they were (exit 15).
        """)

    @Argument(help: "A name of your own for the provider (letters, digits, '.', '_', '-').")
    var name: String

    @Option(
      name: .long,
      help: ArgumentHelp("A built-in profile: \(ProviderProfile.names.joined(separator: ", ")).", valueName: "profile"))
    var profile: String?

    @Option(name: .long, help: ArgumentHelp("Your app's client id at the provider.", valueName: "id"))
    var clientId: String

    @Option(
      name: .long,
      help: ArgumentHelp(
        "A self-managed server's host (GitHub Enterprise Server, GitLab, Gitea, Forgejo).", valueName: "host"))
    var host: String?

    @Option(name: .long, help: ArgumentHelp("The issuer URL, for discovery (without a profile).", valueName: "url"))
    var issuer: String?

    @Option(
      name: .long, help: ArgumentHelp("openid, oauth (RFC 8414) or none (endpoints written out).", valueName: "kind"))
    var discovery: String?

    @Option(name: .long, help: ArgumentHelp("The authorization endpoint (discovery none).", valueName: "url"))
    var authorizationEndpoint: String?

    @Option(name: .long, help: ArgumentHelp("The token endpoint (discovery none).", valueName: "url"))
    var tokenEndpoint: String?

    @Option(name: .long, help: ArgumentHelp("The device authorization endpoint, where there is one.", valueName: "url"))
    var deviceAuthorizationEndpoint: String?

    @Option(
      name: .long, help: ArgumentHelp("The revocation endpoint (RFC 7009), where there is one.", valueName: "url"))
    var revocationEndpoint: String?

    @Option(name: .long, help: ArgumentHelp("The OpenID userinfo endpoint, where there is one.", valueName: "url"))
    var userinfoEndpoint: String?

    @Option(
      name: .customLong("scope"),
      help: ArgumentHelp("A scope to ask for; repeat for several (default: the profile's).", valueName: "scope"))
    var scopes: [String] = []

    @Option(name: .long, help: ArgumentHelp("Read the client secret from this file.", valueName: "path"))
    var clientSecretFile: String?

    @Flag(name: .long, help: "Read the client secret from standard input (one line).")
    var clientSecretStdin = false

    @Option(
      name: .long,
      help: ArgumentHelp(
        "client_secret_basic, client_secret_post or none (default: the profile's).", valueName: "method"))
    var clientAuthentication: String?

    @Option(name: .long, help: ArgumentHelp("Write to this file instead of your config.toml.", valueName: "path"))
    var config: String?

    func validate() throws {
      guard ProviderConfig.isName(name) else {
        throw ValidationError(
          "'\(SafeText.clip(name, limit: 64))' cannot name a provider: use 1 to 64 of A-Z a-z 0-9 '.' '_' '-', not starting with '.' or '-'."
        )
      }
      if clientSecretFile != nil && clientSecretStdin {
        throw ValidationError("Give the secret one way: --client-secret-file or --client-secret-stdin.")
      }
    }

    func run() throws {
      let environment = ProcessInfo.processInfo.environment
      let path = ConfigLocation.path(option: config, environment: environment)
      let secret = try readSecret()
      let secretPath = secret.map { _ in Tessera.Provider.secretPath(name, configPath: path) }
      let before = try Tessera.Provider.readUserFile(path)
      let table = tableText(secretPath: secretPath)
      let after =
        before + (before.isEmpty || before.last == UInt8(ascii: "\n") ? [] : [UInt8(ascii: "\n")])
        + Array(((before.isEmpty ? "" : "\n") + table).utf8)
      // Checked as tesserad checks the whole file, before anything is written.
      do {
        _ = try ConfigLayer.parse(bytes: after, path: path, isSystem: false)
      } catch {
        for problem in error.problems where problem.line.map({ $0 > Tessera.Provider.lineCount(before) }) ?? true {
          printError(problem.description)
        }
        if error.problems.contains(where: { ($0.line ?? 0) <= Tessera.Provider.lineCount(before) }) {
          printError("tessera: \(path) has mistakes of its own; fix them first (`tessera config check`).")
        }
        printError("tessera: nothing was written.")
        throw ExitCode(TesseraError.Code.configuration.exitCode)
      }
      if let secret, let secretPath {
        try Tessera.Provider.writeSecret(secret, to: secretPath)
      }
      try Tessera.Provider.writeUserFile(path, after)
      print("Added provider \(name)\(profile.map { " (\($0))" } ?? "") to \(path).")
      if let secretPath { print("Its client secret is in \(secretPath) (0600); only tesserad reads it.") }
      print("Check it with `tessera provider show \(name)`.")
    }

    /// The secret, from the file or standard input: one line, printable, at most 4 KiB.
    func readSecret() throws -> [UInt8]? {
      guard let source = clientSecretFile ?? (clientSecretStdin ? "standard input" : nil) else { return nil }
      var bytes: [UInt8]
      do {
        bytes =
          try clientSecretFile.map { try Syscall.readFile($0, limit: 4096) }
          ?? Syscall.readAll(FileDescriptor.standardInput, limit: 4096)
      } catch {
        printError("tessera: cannot read the client secret from \(source): \(error)")
        throw ExitCode(TesseraError.Code.invalidArgument.exitCode)
      }
      while let last = bytes.last, last == UInt8(ascii: "\n") || last == UInt8(ascii: "\r") { bytes.removeLast() }
      guard !bytes.isEmpty, bytes.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
        printError("tessera: the client secret must be one line of printable characters without spaces.")
        throw ExitCode(TesseraError.Code.invalidArgument.exitCode)
      }
      return bytes
    }

    /// The table, as TOML.
    func tableText(secretPath: String?) -> String {
      func value(_ s: String) -> String { ConfigFile.Value.string(s).toml }
      var lines = ["[[provider]]", "name = \(value(name))"]
      if let profile { lines.append("profile = \(value(profile))") }
      if let host { lines.append("host = \(value(host))") }
      if let discovery { lines.append("discovery = \(value(discovery))") }
      if let issuer { lines.append("issuer = \(value(issuer))") }
      let endpoints = [
        ("authorization_endpoint", authorizationEndpoint), ("token_endpoint", tokenEndpoint),
        ("device_authorization_endpoint", deviceAuthorizationEndpoint), ("revocation_endpoint", revocationEndpoint),
        ("userinfo_endpoint", userinfoEndpoint),
      ]
      for (key, url) in endpoints { if let url { lines.append("\(key) = \(value(url))") } }
      lines.append("client_id = \(value(clientId))")
      if let secretPath { lines.append("client_secret_file = \(value(secretPath))") }
      if let clientAuthentication { lines.append("client_authentication = \(value(clientAuthentication))") }
      if !scopes.isEmpty { lines.append("scopes = \(ConfigFile.Value.array(scopes.map { .string($0) }).toml)") }
      return lines.joined(separator: "\n") + "\n"
    }
  }

  struct Remove: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "remove",
      abstract: "Remove a provider from your config.toml, and its secret file when Tessera made it.",
      discussion: """
        Accounts signed in through it stay until you sign them out (`tessera logout`). An \
        administrator's provider (in /etc/tessera) is theirs to remove.
        """)

    @Argument(help: "The provider's name.")
    var name: String

    @Option(name: .long, help: ArgumentHelp("Edit this file instead of your config.toml.", valueName: "path"))
    var config: String?

    func run() throws {
      let environment = ProcessInfo.processInfo.environment
      let path = ConfigLocation.path(option: config, environment: environment)
      let bytes = try Tessera.Provider.readUserFile(path)
      let file: ConfigFile
      do { file = try ConfigFile(parsing: bytes) } catch {
        printError("tessera: \(path):\(error.line): \(error.reason); fix it first (`tessera config check`).")
        throw ExitCode(TesseraError.Code.configuration.exitCode)
      }
      let tables = file.tables
      guard
        let index = tables.firstIndex(where: { t in
          t.name == "provider" && t.isArray && t.entries.contains { $0.key == "name" && $0.value.string == name }
        })
      else {
        printError(
          "tessera: \(path) has no provider '\(SafeText.clip(name, limit: 64))' (`tessera provider list` shows where each one is written)."
        )
        throw ExitCode(TesseraError.Code.invalidArgument.exitCode)
      }
      let table = tables[index]
      let end = index + 1 < tables.count ? tables[index + 1].line : Int.max
      var lines = bytes.split(separator: UInt8(ascii: "\n"), omittingEmptySubsequences: false)
      if lines.last?.isEmpty == true { lines.removeLast() }  // the file's last newline, put back below
      let first = table.line - 1
      var last = min(end - 1, lines.count) - 1
      // Comments and blank lines just before the next table are that table's: they stay.
      if end != Int.max {
        while last > first, Self.isCommentOrBlank(lines[last]) { last -= 1 }
      }
      lines.removeSubrange(first...max(first, last))
      // The blank line `add` put before the table.
      if first > 0, first <= lines.count, lines[first - 1].isEmpty { lines.remove(at: first - 1) }
      var after = Array(lines.joined(separator: [UInt8(ascii: "\n")]))
      if after.allSatisfy({ $0 == UInt8(ascii: "\n") }) { after = [] } else { after.append(UInt8(ascii: "\n")) }
      try Tessera.Provider.writeUserFile(path, after)
      print("Removed provider \(name) from \(path).")
      removeSecret(table)
    }

    static func isCommentOrBlank(_ line: ArraySlice<UInt8>) -> Bool {
      let text = line.drop { $0 == 0x20 || $0 == 0x09 }
      return text.isEmpty || text.first == UInt8(ascii: "#")
    }

    /// The table's secret file, when `add` made it (beside config.toml); another is left alone.
    func removeSecret(_ table: ConfigFile.Table) {
      let environment = ProcessInfo.processInfo.environment
      let path = ConfigLocation.path(option: config, environment: environment)
      let secret = table.entries.first { $0.key == "client_secret_file" }?.value.string
      if let secret, secret == Tessera.Provider.secretPath(name, configPath: path) {
        if unlink(secret) == 0 { print("Removed its client secret \(secret).") }
      } else if let secret {
        print("Its client secret file \(secret) was not made by Tessera and is left as it is.")
      }
    }
  }
}

extension Tessera.Provider {
  /// Where `add` keeps a provider's secret: `secrets/NAME.secret` beside config.toml.
  static func secretPath(_ name: String, configPath: String) -> String {
    Files.directory(of: configPath) + "/secrets/\(name).secret"
  }

  static func lineCount(_ bytes: [UInt8]) -> Int {
    bytes.reduce(0) { $0 + ($1 == UInt8(ascii: "\n") ? 1 : 0) }
      + (bytes.last == UInt8(ascii: "\n") || bytes.isEmpty ? 0 : 1)
  }

  /// The user's config.toml as it is (empty when there is none yet), read as tesserad reads it.
  static func readUserFile(_ path: String) throws -> [UInt8] {
    do {
      return try CheckedFile.read(path, limit: BrokerConfig.maxFileBytes, rules: .configuration)
    } catch {
      if case .system(.noSuchFileOrDirectory) = error { return [] }
      printError("tessera: \(path) \(error); fix that first (`tessera config check` says how).")
      throw ExitCode(TesseraError.Code.configuration.exitCode)
    }
  }

  /// Replaces config.toml whole (a kill leaves the old file or the new one), 0600. A config.toml
  /// that is a symbolic link (dotfiles kept in a repository) stays one: the file it points to is
  /// replaced.
  static func writeUserFile(_ link: String, _ bytes: [UInt8]) throws {
    let path = URL(fileURLWithPath: link).resolvingSymlinksInPath().path
    do {
      _ = try Files.makeDirectories(Files.directory(of: path))
      let temporary = path + ".tessera-\(getpid()).tmp"
      try Files.writeDurably(path, bytes, temporary: temporary)
    } catch {
      printError("tessera: cannot write \(path): \(error)")
      throw ExitCode(TesseraError.Code.environment.exitCode)
    }
  }

  /// The secret in a new 0600 file (one left from an earlier provider of the name is replaced).
  static func writeSecret(_ secret: [UInt8], to path: String) throws {
    var copy = secret
    defer { for i in copy.indices { copy[i] = 0 } }
    do {
      _ = try Files.makeDirectories(Files.directory(of: path))
      _ = unlink(path)
      try Files.writeNew(path, copy)
    } catch {
      printError("tessera: cannot write the client secret to \(path): \(error)")
      throw ExitCode(TesseraError.Code.environment.exitCode)
    }
  }
}
