import ArgumentParser
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

extension Tessera {
  struct Provider: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "provider",
      abstract: "Add, list, show and remove identity providers (the [[provider]] tables of config.toml).",
      discussion: """
        A provider is an identity provider with a name of your own: GitHub, GitLab, Google, \
        Bitbucket, Gitea, Forgejo, Codeberg or Microsoft from a built-in profile, which knows \
        its endpoints and quirks, or any OpenID Connect or OAuth 2.0 provider written out in \
        config.toml. You supply what only you have: your app's client id, and its secret where \
        the provider demands one.

          $ tessera provider add work-github --profile github --client-id Iv1.0123456789abcdef
          $ tessera provider add gmail --profile google --client-id 1234.apps.googleusercontent.com \\
                --client-secret-file ~/Downloads/secret.txt
          $ tessera provider list

        The secret is read from a file or from standard input, never from the command line \
        (which every user of the machine can read in /proc). It is kept in a file only you can \
        read, beside config.toml, which only tesserad reads: `tessera config` and `tessera \
        provider show` say "set" or "not set", never the secret.

        Profiles: \(ProviderProfile.names.joined(separator: ", ")). `tessera provider profiles` \
        lists what each one knows.
        """,
      subcommands: [Add.self, List.self, Show.self, Remove.self, Profiles.self])

    /// One provider as `--json` and `tessera config show --json` give it: never the secret.
    struct Entry: Encodable {
      var name: String
      var profile: String?
      var issuer: String
      var discovery: String
      var endpoints: [String: String]
      var clientID: String
      var clientSecret: String
      var clientAuthentication: String
      var scopes: [String]
      var authorizationParameters: [String]
      var gitHost: String?
      var gitUsername: String?
      var source: String

      init(_ p: ProviderConfig) {
        name = p.name
        profile = p.profile
        issuer = p.issuer
        discovery = p.discovery.rawValue
        endpoints = Dictionary(uniqueKeysWithValues: p.endpoints.all.compactMap { e in e.url.map { (e.key, $0) } })
        clientID = p.clientID
        clientSecret = p.clientSecretFile == nil ? "not set" : "set"
        clientAuthentication = p.clientAuthentication.rawValue
        scopes = p.scopes
        authorizationParameters = p.authorizationParameters.map { "\($0.name)=\($0.value)" }
        gitHost = p.gitHost
        gitUsername = p.gitUsername
        source = "\(p.file):\(p.line)"
      }

      enum CodingKeys: String, CodingKey {
        case name, profile, issuer, discovery, endpoints, scopes, source
        case clientID = "client_id"
        case clientSecret = "client_secret"
        case clientAuthentication = "client_authentication"
        case authorizationParameters = "authorization_parameters"
        case gitHost = "git_host"
        case gitUsername = "git_username"
      }
    }

    /// A provider as its table (for `tessera config`): the secret only as set or not set.
    static func tableLines(_ p: ProviderConfig) -> [String] {
      func value(_ s: String) -> String { ConfigFile.Value.string(s).toml }
      var lines = ["[[provider]]  # \(SafeText.clip(p.file, limit: 500)):\(p.line)", "name = \(value(p.name))"]
      if let profile = p.profile { lines.append("profile = \(value(profile))") }
      if let host = p.host { lines.append("host = \(value(host))") }
      lines.append("discovery = \(value(p.discovery.rawValue))")
      lines.append("issuer = \(value(p.issuer))")
      for (key, url) in p.endpoints.all { if let url { lines.append("\(key) = \(value(url))") } }
      lines.append("client_id = \(value(p.clientID))")
      lines.append("# client secret: \(p.clientSecretFile == nil ? "not set (a public client)" : "set")")
      lines.append("client_authentication = \(value(p.clientAuthentication.rawValue))")
      lines.append("scopes = \(ConfigFile.Value.array(p.scopes.map { .string($0) }).toml)")
      if !p.authorizationParameters.isEmpty {
        let list = p.authorizationParameters.map { ConfigFile.Value.string("\($0.name)=\($0.value)") }
        lines.append("authorization_parameters = \(ConfigFile.Value.array(list).toml)")
      }
      return lines
    }

    /// The configuration as tesserad would read it, or exit 15 with its problems.
    static func load(_ option: String?) throws -> EffectiveConfig {
      switch checkConfig(option: option, environment: ProcessInfo.processInfo.environment) {
      case .checked(let effective):
        for warning in effective.warnings { printError("tessera: warning: \(warning)") }
        return effective
      case .problems(let problems):
        for problem in problems { printError(problem.description) }
        throw ExitCode(TesseraError.Code.configuration.exitCode)
      }
    }
  }
}

extension Tessera.Provider {
  struct List: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "list",
      abstract: "List the providers config.toml names (the administrator's first).")

    @Option(name: .long, help: ArgumentHelp("Read this file as yours instead of the default.", valueName: "path"))
    var config: String?

    @Flag(name: .long, help: "Print JSON: [{\"name\", \"profile\", \"issuer\", \"client_id\", \"client_secret\", …}].")
    var json = false

    func run() throws {
      let providers = try Tessera.Provider.load(config).config.providers
      if json {
        printJSON(providers.map(Entry.init))
        return
      }
      if providers.isEmpty {
        printError(
          "No providers yet. Add one: tessera provider add NAME --profile PROFILE --client-id ID (profiles: \(ProviderProfile.names.joined(separator: ", ")))."
        )
        return
      }
      var table = Table("NAME", "PROFILE", "ISSUER", "CLIENT ID", "SECRET")
      for p in providers {
        table.add(
          p.name, p.profile ?? "-", SafeText.clip(p.issuer, limit: 200), SafeText.clip(p.clientID, limit: 200),
          p.clientSecretFile == nil ? "not set" : "set")
      }
      table.print()
    }
  }

  struct Show: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "show",
      abstract: "Show one provider: its endpoints, scopes and where it is written; the secret only as set.")

    @Argument(help: "The provider's name.")
    var name: String

    @Option(name: .long, help: ArgumentHelp("Read this file as yours instead of the default.", valueName: "path"))
    var config: String?

    @Flag(name: .long, help: "Print JSON, as one entry of `tessera provider list --json`.")
    var json = false

    func run() throws {
      let providers = try Tessera.Provider.load(config).config.providers
      guard let provider = providers.first(where: { $0.name == name }) else {
        printError(
          "tessera: there is no provider '\(SafeText.clip(name, limit: 64))'; "
            + NearestName.suggestion(for: name, among: providers.map(\.name), known: "the providers are"))
        throw ExitCode(TesseraError.Code.invalidArgument.exitCode)
      }
      if json {
        printJSON(Entry(provider))
      } else {
        for line in Tessera.Provider.tableLines(provider) { print(line) }
        if let host = provider.gitHost {
          print("# git: https://\(host)/ gets its tokens, as user \(provider.gitUsername ?? "(the account's)")")
        }
      }
    }
  }

  struct Profiles: ParsableCommand {
    static let configuration = CommandConfiguration(
      commandName: "profiles",
      abstract: "List the built-in profiles: their hosts, whether they need a secret, and their default scopes.")

    @Flag(name: .long, help: "Print JSON: [{\"name\", \"host\", \"secret_required\", \"scopes\", \"git_username\"}].")
    var json = false

    struct Row: Encodable {
      var name: String
      var host: String?
      var secretRequired: Bool
      var scopes: [String]
      var gitUsername: String?
      enum CodingKeys: String, CodingKey {
        case name, host, scopes
        case secretRequired = "secret_required"
        case gitUsername = "git_username"
      }
    }

    func run() {
      let rows = ProviderProfile.all.map {
        Row(
          name: $0.name, host: $0.defaultHost, secretRequired: $0.secretRequired, scopes: $0.defaultScopes,
          gitUsername: $0.gitUsername)
      }
      if json {
        printJSON(rows)
        return
      }
      var table = Table("PROFILE", "HOST", "SECRET", "DEFAULT SCOPES")
      for r in rows {
        table.add(
          r.name, r.host ?? "(host = yours)", r.secretRequired ? "required" : "optional",
          r.scopes.joined(separator: " "))
      }
      table.print()
    }
  }
}
