import Foundation
import TesseraInterface
import TesseraTestSupport
import Testing

@testable import TesseraCLI

/// Issue 38 points 4 and 5 as the CLI shows them, through the built binary and a scripted broker:
/// `tessera token --reject`, "does not expire", a refresh token's own lifetime, and where to
/// revoke a grant at a provider with no revocation endpoint.
extension BinaryTests {
  static let octocat = AccountInfo(
    id: "583231.a1b2c3", username: "octocat", name: "The Octocat", authority: "https://github.com",
    environment: "github.com",
    realm: "", localAccountID: "583231")

  @Test func tokenRejectSendsTheTokenFromStandardInputAndSaysWhenNothingWasDropped() async throws {
    try await ScriptedBroker.with({ call in
      switch call.member {
      case "RejectToken":
        guard case .string(let token)? = call.arguments.dropFirst(2).first else { return .failure(.internal("args")) }
        return .success([.bool(token == "gho_cached")])
      default: return .failure(.internal("unexpected \(call.member)"))
      }
    }) { broker in
      let dropped = try run(["token", "--reject", "--provider", "gh", "--json"], stdin: "gho_cached\n")
      #expect(dropped.status == 0, "\(dropped.stderr)")
      #expect(dropped.stdout.contains("\"dropped\" : true"), "\(dropped.stdout)")
      let call = try #require(broker.calls.last)
      #expect(call.arguments.prefix(3) == [.string(""), .string(""), .string("gho_cached")])
      #expect(call.arguments.last == .dict(["provider": .string("gh")]))

      let stale = try run(["token", "--reject"], stdin: "gho_old")
      #expect(stale.status == 0)
      #expect(stale.stdout.isEmpty)
      #expect(stale.stderr.contains("nothing was dropped"), "\(stale.stderr)")

      let huge = try run(["token", "--reject"], stdin: String(repeating: "a", count: 20_000))
      #expect(huge.status == ClientExitStatus.usage.rawValue)
      #expect(huge.stderr.contains("longer than 16384 bytes"), "\(huge.stderr)")
      let both = try run(["token", "--reject", "--force-refresh"], stdin: "x")
      #expect(both.status == ClientExitStatus.usage.rawValue)
      #expect(both.stderr.contains("--reject takes no --force-refresh"), "\(both.stderr)")
    }
  }

  @Test func statusSaysATokenDoesNotExpireAndWhenASignInLapses() async throws {
    let now = Int64(Date().timeIntervalSince1970)
    let octocat = StatusReport.AccountStatus(
      id: Self.octocat.id, username: "octocat", authority: "https://github.com", state: "ok",
      tokens: [.init(clientID: "Ov23.app", scopes: ["repo"], expiresOn: TokenExpiry.never, refreshOn: nil)],
      refreshTokenClients: ["Iv1.app"], refreshTokenExpiresOn: now + 15_811_200)
    try await ScriptedBroker.with({ call in
      switch call.member {
      case "GetAccounts": return .success(Self.listed([Self.octocat], current: nil))
      case "GetStatus":
        return .success([
          .dict(StatusReport.Report(storeProblem: nil, accounts: [octocat], attentionNeeded: []).busValue)
        ])
      default: return .failure(.internal("unexpected \(call.member)"))
      }
    }) { _ in
      let status = try run(["status"])
      #expect(status.stdout.contains("token for Ov23.app (repo): does not expire"), "\(status.stdout)")
      #expect(status.stdout.contains("the sign-in lapses when its refresh token expires, at "), "\(status.stdout)")
      let json = try run(["status", "--json"])
      #expect(json.stdout.contains("\"refresh_token_expires_on\" : \(now + 15_811_200)"), "\(json.stdout)")
    }
  }

  @Test func logoutOfAnAccountAtGitHubSaysWhereToRevokeTheGrant() async throws {
    let config = home + "/.config/tessera/config.toml"
    try """
    [[provider]]
    name = "gh"
    profile = "github"
    client_id = "Ov23.app"
    """.write(toFile: config, atomically: true, encoding: .utf8)
    defer { try? FileManager.default.removeItem(atPath: config) }
    try await ScriptedBroker.with({ call in
      switch call.member {
      case "GetAccounts": return .success(Self.listed([Self.octocat], current: nil))
      case "SignOut": return .success([])
      default: return .failure(.internal("unexpected \(call.member)"))
      }
    }) { _ in
      let out = try run(["logout"])
      #expect(out.status == 0, "\(out.stderr)")
      #expect(out.stdout.contains("Signed out octocat."))
      #expect(
        out.stdout.contains(
          "github.com keeps the grant to Ov23.app (provider 'gh', which has no revocation endpoint) until you revoke it: https://github.com/settings/connections/applications/Ov23.app"
        ), "\(out.stdout)")
    }
    // An account of an authority with no such provider gets no hint.
    try await ScriptedBroker.with({ call in
      switch call.member {
      case "GetAccounts": return .success(Self.listed([Self.alice], current: nil))
      case "SignOut": return .success([])
      default: return .failure(.internal("unexpected \(call.member)"))
      }
    }) { _ in
      let out = try run(["logout"])
      #expect(out.stdout == "Signed out alice@idp.test.\n", "\(out.stdout)")
    }
  }

  /// `tessera login --username NAME` (issue 38 §3) is --login-hint by the name a user of a plain
  /// OAuth 2.0 provider looks for: the account is named by it when the provider cannot say.
  @Test func loginUsernameIsSentAsTheLoginHint() async throws {
    try await ScriptedBroker.with({ call in
      switch call.member {
      case "AcquireToken":
        return .success([
          .dict(
            TokenInfo(
              accessToken: "t", tokenType: "Bearer", expiresOn: TokenExpiry.never, scopes: ["read"],
              account: Self.octocat, idToken: nil, correlationID: "c"
            ).busValue)
        ])
      default: return .failure(.internal("unexpected \(call.member)"))
      }
    }) { broker in
      let login = try run(["login", "--provider", "plain", "--username", "ann"])
      #expect(login.status == 0, "\(login.stderr)")
      let options = try #require(broker.calls.last?.arguments.last?.dictValue)
      #expect(options["login_hint"] == .string("ann"))
      #expect(options["provider"] == .string("plain"))
    }
  }
}
