import TesseraAccountsUI
import TesseraInterface
import Testing

/// What the Accounts page shows for each account, from GetAccounts and GetStatus.
struct AccountRowTests {
  static func account(_ id: String, _ username: String, current: Bool = false) -> AccountInfo {
    var info = AccountInfo(
      id: id, username: username, name: username.prefix(1).uppercased() + username.dropFirst(),
      authority: "https://idp.test/t",
      environment: "idp.test", realm: "t", localAccountID: id)
    info.current = current
    return info
  }

  @Test func accountsThatNeedTheUserComeFirstAndEveryStateIsWords() {
    let status = StatusReport.Report(
      storeProblem: nil,
      accounts: [
        .init(id: "a", username: "alice", authority: "https://idp.test/t", state: "ok"),
        .init(id: "b", username: "bob", authority: "https://idp.test/t", state: "needs_sign_in"),
        .init(id: "c", username: "carol", authority: "https://idp.test/t", state: "idp_unreachable"),
      ], attentionNeeded: ["b"])
    let rows = AccountRow.rows(
      accounts: [Self.account("a", "alice", current: true), Self.account("c", "carol"), Self.account("b", "bob")],
      status: status)
    #expect(rows.map(\.username) == ["bob", "carol", "alice"])
    #expect(rows.map(\.state) == ["Needs sign-in", "Offline, retrying", "Signed in"])
    #expect(rows[2].accessibleLabel == "alice at idp.test, signed in, current account")
    #expect(rows[0].accessibleLabel == "bob at idp.test, needs sign-in")
    #expect(rows[2].subtitle == "Alice · idp.test · Current account")
  }

  @Test func aStateTheAppDoesNotKnowIsNamedNotHidden() {
    #expect(StatusReport.label(forState: "quarantined") == "Unknown state (quarantined)")
    #expect(
      StatusReport.states.map(StatusReport.label(forState:)) == [
        "Signed in", "Needs sign-in", "Keyring locked", "Offline, retrying", "Blocked by policy",
      ])
  }

  @Test func everyAccountIsShownEvenWhenTheAppHoldsNoGrantForIt() {
    // access_mode = "strict": GetAccounts shows the app none, GetStatus shows the manager all.
    let status = StatusReport.Report(
      storeProblem: nil,
      accounts: [
        .init(
          id: "b", username: "bob", authority: "https://login.example.com:8443/tenant", state: "ok", name: "Bob B",
          current: true)
      ], attentionNeeded: [])
    let rows = AccountRow.rows(accounts: [], status: status)
    #expect(rows.count == 1)
    #expect(rows[0].environment == "login.example.com" && rows[0].name == "Bob B" && rows[0].current)
    #expect(rows[0].accessibleLabel == "bob at login.example.com, signed in, current account")
  }
}
