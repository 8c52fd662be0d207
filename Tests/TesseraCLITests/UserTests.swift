import Foundation
import TesseraInterface
import TesseraTestSupport
import Testing

@testable import TesseraCLI

/// Issue 22 as a new user meets the CLI: a current account, status that always answers, the
/// CLI's own words in messages, output for people and for scripts. Through the built binary.
extension BinaryTests {
  static let bob = AccountInfo(
    id: "bob-sub.0a1b2c", username: "bob@idp.test", name: "Bob", authority: "https://idp.test/tenant",
    environment: "idp.test", realm: "tenant", localAccountID: "bob-sub")

  static func listed(_ accounts: [AccountInfo], current: String?) -> [BusValue] {
    [
      .dicts(
        accounts.map { a in
          var a = a
          a.current = a.id == current
          return a.busValue
        })
    ]
  }

  // MARK: The current account

  @Test func accountUseMakesAnAccountCurrentAndAccountsMarkIt() async throws {
    try await ScriptedBroker.with({ call in
      switch call.member {
      case "SetCurrentAccount":
        var bob = Self.bob
        bob.current = true
        return .success([.dict(bob.busValue)])
      case "GetAccounts": return .success(Self.listed([Self.alice, Self.bob], current: Self.bob.id))
      case "CountHiddenAccounts": return .success([.uint32(0)])
      default: return .failure(.internal("unexpected \(call.member)"))
      }
    }) { broker in
      let use = try run(["account", "use", "bob@idp.test"])
      #expect(use.status == 0, "\(use.stderr)")
      #expect(use.stdout == "bob@idp.test is now the current account at idp.test.\n")
      let call = try #require(broker.calls.last)
      #expect(call.member == "SetCurrentAccount")
      #expect(call.arguments == [.string("bob@idp.test"), .string("")])
      // Piped: the tab form, with "current" or "-" at the end of each line.
      let accounts = try run(["accounts"])
      #expect(
        accounts.stdout
          == "alice@idp.test\tAlice Liddell\tidp.test\t\(Self.alice.id)\t-\nbob@idp.test\tBob\tidp.test\t\(Self.bob.id)\tcurrent\n"
      )
      let json = try run(["accounts", "--json"])
      let list = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [[String: Any]])
      #expect(list.map { $0["current"] as? Bool } == [false, true])
    }
  }

  @Test func anEmptyFilteredListSaysTheOthersExist() async throws {
    try await ScriptedBroker.with({ call in
      switch call.member {
      case "GetAccounts":
        // Filtered by client: none; unfiltered: alice.
        guard case .dict(let filter)? = call.arguments.first, !filter.isEmpty else {
          return .success(Self.listed([Self.alice], current: nil))
        }
        return .success([.dicts([])])
      case "CountHiddenAccounts": return .success([.uint32(0)])
      default: return .failure(.internal("unexpected \(call.member)"))
      }
    }) { _ in
      let outcome = try run(["accounts", "--client-id", "nope"])
      #expect(outcome.status == 0)
      #expect(outcome.stdout.isEmpty)
      #expect(outcome.stderr.contains("No account is signed in to client nope; 1 account is signed in elsewhere"))
      #expect(!outcome.stderr.contains("No accounts."))
    }
  }

  @Test func logoutOfAClientThatHeldNothingSaysSo() async throws {
    let health = StatusReport.AccountStatus(
      id: Self.alice.id, username: Self.alice.username, authority: Self.alice.authority, state: "ok", lastError: nil,
      nextRefresh: nil, tokens: [], refreshTokenClients: ["app-1"])
    try await ScriptedBroker.with({ call in
      switch call.member {
      case "GetAccounts": return .success(Self.listed([Self.alice], current: nil))
      case "GetStatus":
        return .success([
          .dict(StatusReport.Report(storeProblem: nil, accounts: [health], attentionNeeded: []).busValue)
        ])
      case "SignOut": return .success([])
      default: return .failure(.internal("unexpected \(call.member)"))
      }
    }) { _ in
      let wrong = try run(["logout", "--client-id", "wrong-client"])
      #expect(wrong.status == 0)
      #expect(wrong.stdout.contains("alice@idp.test held no tokens of wrong-client: nothing to remove"))
      let right = try run(["logout", "--client-id", "app-1"])
      #expect(right.stdout.contains("Removed the tokens of app-1 for alice@idp.test"))
    }
  }

  // MARK: Status always answers

  @Test func statusWithoutABrokerPrintsWhyAndItsStatus() throws {
    let bus = try PrivateBus.another()
    let text = try run(["status"], environment: ["DBUS_SESSION_BUS_ADDRESS": bus])
    #expect(text.status == ClientExitStatus.brokerNotRunning.rawValue)
    #expect(text.stdout.hasPrefix("tesserad is not running: "), "the report is on stdout: \(text.stdout)")
    let json = try run(["status", "--json"], environment: ["DBUS_SESSION_BUS_ADDRESS": bus])
    #expect(json.status == ClientExitStatus.brokerNotRunning.rawValue)
    let report = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
    #expect(report["running"] as? Bool == false)
    #expect((report["reason"] as? String)?.contains("not running") == true)
    #expect(report["needs_attention"] as? Bool == true)
  }

  @Test func statusShowsTheCurrentAccountExpiryNextRefreshAndExitsFourWhenASignInIsNeeded() async throws {
    let now = Int64(Date().timeIntervalSince1970)
    let alice = StatusReport.AccountStatus(
      id: Self.alice.id, username: Self.alice.username, authority: Self.alice.authority, state: "ok", lastError: nil,
      nextRefresh: now + 1800,
      tokens: [.init(clientID: "app-1", scopes: ["read"], expiresOn: now + 3300, refreshOn: nil)],
      refreshTokenClients: ["app-1"])
    let bob = StatusReport.AccountStatus(
      id: Self.bob.id, username: Self.bob.username, authority: Self.bob.authority, state: "needs_sign_in",
      lastError: nil, nextRefresh: nil, tokens: [], refreshTokenClients: [])
    try await ScriptedBroker.with({ call in
      switch call.member {
      case "GetAccounts": return .success(Self.listed([Self.alice, Self.bob], current: Self.alice.id))
      case "GetStatus":
        return .success([
          .dict(
            StatusReport.Report(storeProblem: nil, accounts: [alice, bob], attentionNeeded: [Self.bob.id]).busValue)
        ])
      default: return .failure(.internal("unexpected \(call.member)"))
      }
    }) { _ in
      let status = try run(["status"])
      #expect(status.status == TesseraError.Code.interactionRequired.exitCode, "\(status.stderr)")
      #expect(status.stdout.contains("* alice@idp.test (idp.test): ok"))
      #expect(status.stdout.contains("token for app-1 (read): expires at "))
      #expect(status.stdout.contains("(in 55 min)"))
      #expect(status.stdout.contains("next refresh at "))
      #expect(
        status.stdout.contains(
          "  bob@idp.test (idp.test): needs a sign-in: run `tessera login --login-hint bob@idp.test`"))
      let json = try run(["status", "--json"])
      let report = try #require(try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as? [String: Any])
      #expect(report["needs_attention"] as? Bool == true)
      #expect((report["accounts"] as? [[String: Any]])?.first?["current"] as? Bool == true)
    }
  }

  // MARK: The CLI's words

  @Test func brokerMessagesNameTheFlagsTheUserTyped() async throws {
    try await ScriptedBroker.with({ _ in
      .failure(.invalidArgument("The option 'min_validity' is 999999; it must be between 0 and 86400."))
    }) { _ in
      let outcome = try run(["token", "--min-validity", "999999"])
      #expect(outcome.status == TesseraError.Code.invalidArgument.exitCode)
      #expect(outcome.stderr == "tessera: InvalidArgument: --min-validity is 999999; it must be between 0 and 86400.\n")
    }
    try await ScriptedBroker.with({ _ in
      .failure(
        .interactionRequired(
          "The identity provider needs you to sign in interactively (x). Run AcquireToken without prompt=none, or `tessera login`."
        ))
    }) { _ in
      let outcome = try run(["token"])
      #expect(outcome.stderr.contains("Run `tessera login` (without --prompt none)."))
      #expect(!outcome.stderr.contains("AcquireToken"))
    }
    #expect(
      CLIWords.rewrite("The browser sign-in did not finish within 300 s. Start it again, or pass a larger 'timeout'.")
        == "The browser sign-in did not finish within 300 s. Start it again, or pass a larger --timeout.")
  }

  @Test func aScopeWithASpaceSaysToRepeatTheFlag() throws {
    let outcome = try run(["token", "--scope", "openid read"])
    #expect(outcome.status == ClientExitStatus.usage.rawValue)
    #expect(outcome.stderr.contains("--scope takes one scope; repeat it for each: --scope openid --scope read"))
  }

  @Test func tokenHelpGivesTheStatusesItReallyExitsWith() throws {
    let help = try run(["token", "--help"])
    #expect(help.stdout.contains("status \(TesseraError.Code.interactionRequired.exitCode)"))
    #expect(help.stdout.contains("\(TesseraError.Code.noSuchAccount.exitCode)"))
  }

  @Test func execRunsACommandGivenWithoutTheDashes() async throws {
    try await ScriptedBroker.with({ _ in .success(Self.token("at-exec")) }) { _ in
      let outcome = try run(["exec", "/bin/sh", "-c", #"printf '%s' "$ACCESS_TOKEN""#])
      #expect(outcome.status == 0, "\(outcome.stderr)")
      #expect(outcome.stdout == "at-exec")
      let help = try run(["exec", "--help"])
      #expect(help.status == 0)
      #expect(help.stdout.contains("USAGE: tessera exec"))
      let typo = try run(["exec", "--evn", "X", "/bin/true"])
      #expect(typo.status == ClientExitStatus.usage.rawValue)
      #expect(typo.stderr.contains("Unknown option '--evn'"))
    }
  }

  // MARK: Output for people and for scripts

  @Test func anEmptyAccessLogSaysSo() async throws {
    try await ScriptedBroker.with({ _ in .success([.dicts([])]) }) { _ in
      let outcome = try run(["access", "log"])
      #expect(outcome.status == 0)
      #expect(outcome.stdout.isEmpty)
      #expect(outcome.stderr.contains("No access decisions since tesserad started"))
    }
  }

  @Test func tablesAreAlignedUnderAHeaderOnATerminalAndTabsWhenPiped() {
    var table = Table("USERNAME", "ID")
    table.add("alice@idp.test", "1")
    table.add("bo", "22")
    #expect(table.lines(aligned: true) == ["USERNAME        ID", "alice@idp.test  1", "bo              22"])
    #expect(table.lines(aligned: false) == ["alice@idp.test\t1", "bo\t22"])
  }

  @Test func valuesCompleteInTheShells() throws {
    let bash = try run(["--generate-completion-script", "bash"])
    #expect(bash.stdout.contains("select_account"), "--prompt's values")
    #expect(bash.stdout.contains("oauthbearer"), "--mech's values")
    // --account asks the binary itself, which asks the broker for the usernames.
    #expect(bash.stdout.contains("---completion"))
  }
}
