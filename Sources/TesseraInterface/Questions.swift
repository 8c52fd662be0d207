/// The questions tesserad asks the user through the desktop app (issue 39): the Question signal's
/// info keys, the answers AnswerQuestion takes, and its options. One table for both sides.
public enum Question {
  /// What is asked: one of Kind.
  public static let kind = "kind"
  /// The app as the broker identified it ("org.example.App (Flatpak)", "/usr/bin/git
  /// (unverified)"): never a name the app gave itself.
  public static let app = "app"
  /// The app's key (flatpak:ID, exe:PATH...).
  public static let appKey = "app_key"
  /// How sure the broker is of who the app is, in a sentence.
  public static let assurance = "assurance"
  public static let clientID = "client_id"
  /// consent: the account the app asks for (its username).
  public static let account = "account"
  /// The identity provider's host.
  public static let provider = "provider"
  public static let scopes = "scopes"
  /// consent: token, sign-in, list-accounts or sign-out.
  public static let operation = "operation"
  /// choose_account: the accounts to choose from, aa{sv} of id, username, name.
  public static let accounts = "accounts"
  /// choose_account: the account the app used last (an id), preselected; absent when none.
  public static let preselected = "preselected"
  /// Seconds the broker waits for the answer.
  public static let expiresIn = "expires_in"

  public enum Kind: String, Sendable, CaseIterable {
    /// May the app use the account? Answers: allow_once, allow_always, deny.
    case consent
    /// Which account should the app use? Answers: an account id from `accounts`, or `another`.
    case chooseAccount = "choose_account"
  }

  /// consent's answers.
  public static let allowOnce = "allow_once"
  public static let allowAlways = "allow_always"
  public static let deny = "deny"
  /// choose_account: none of these, sign in to another account.
  public static let another = "another"
  /// AnswerQuestion's option (b): choose_account's answer holds for this app from now on.
  public static let remember = "remember"
  /// How long a question waits for its answer.
  public static let seconds: UInt32 = 120
}
