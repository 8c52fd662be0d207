import TesseraEngineFakes
import XCTest

@testable import TesseraCore

/// Which account a request means, for every front: an id exactly, else the IdP's local id, else
/// the username (each case-insensitive, and only when exactly one account has it).
final class AccountReferenceTests: XCTestCase {
  func account(_ id: String, _ username: String, local: String) -> Account {
    Account(
      id: id, username: username, name: username, authority: "https://idp.test", environment: "idp.test",
      realm: "r", localAccountID: local)
  }

  func testAnIdNamesExactlyThatAccountAndNothingElse() {
    let accounts = [
      account("Sub1.abc", "alice@idp.test", local: "Sub1"), account("sub2.abc", "bob@idp.test", local: "sub2"),
    ]
    XCTAssertEqual(AccountReference(id: "Sub1.abc").match(in: accounts)?.username, "alice@idp.test")
    XCTAssertNil(AccountReference(id: "sub1.abc").match(in: accounts), "another IdP's sub is case-sensitive")
    XCTAssertNil(
      AccountReference(id: "gone.abc", username: "alice@idp.test").match(in: accounts),
      "an id no longer signed in names none, never another account of the same name")
  }

  func testTheLocalIdThenTheUsernameEachOnlyWhenUnique() {
    var accounts = [account("a.1", "alice@idp.test", local: "OID-A"), account("b.1", "bob@idp.test", local: "oid-b")]
    XCTAssertEqual(AccountReference(localID: "oid-a").match(in: accounts)?.id, "a.1")
    XCTAssertEqual(AccountReference(username: "BOB@idp.test").match(in: accounts)?.id, "b.1")
    XCTAssertEqual(
      AccountReference(id: "", localID: "nobody", username: "alice@idp.test").match(in: accounts)?.id, "a.1",
      "an empty id counts as not given; a local id that names none falls back to the username")
    accounts.append(account("a.2", "alice@idp.test", local: "oid-c"))
    XCTAssertNil(AccountReference(username: "alice@idp.test").match(in: accounts), "two accounts of that name")
    XCTAssertNil(AccountReference().match(in: accounts))
  }
}
