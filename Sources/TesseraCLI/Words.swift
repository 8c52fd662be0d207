import TesseraClient

/// The broker speaks to every caller in D-Bus terms (methods, option keys); a person at the
/// terminal typed `tessera` commands and flags. `cliWords` rewrites a broker message into them:
/// one table of the D-Bus words and the CLI's, used for every message the CLI prints.
enum CLIWords {
  /// The request options (RequestOptions keys) and the flags that set them.
  static let flags: [(key: String, flag: String)] = [
    ("min_validity", "--min-validity"), ("timeout", "--timeout"), ("prompt", "--prompt"),
    ("login_hint", "--login-hint"), ("authority", "--authority"), ("client_id", "--client-id"),
    ("force_refresh", "--force-refresh"), ("account_id", "--account"), ("flow", "--device-code"),
  ]

  /// Whole phrases first (they carry a method name), then method and option names.
  static let phrases: [(String, String)] = [
    ("Run AcquireToken without prompt=none, or `tessera login`.", "Run `tessera login` (without --prompt none)."),
    ("Sign in first with AcquireToken (or `tessera login`).", "Sign in first with `tessera login`."),
    (
      "Call GetAccounts for the list, or sign in with AcquireToken.",
      "`tessera accounts` lists them; `tessera login` signs one in."
    ),
    ("Call GetAccounts for the list.", "`tessera accounts` lists them."),
    ("Sign in again with AcquireToken.", "Sign in again with `tessera login`."),
    ("AcquireToken with this account, or `tessera login", "`tessera login"),
    ("Retry AcquireToken with the option claims set to:", "Sign in again with `tessera login`; the claims asked for:"),
    ("call AcquireToken", "run `tessera login`"),
    ("with AcquireToken", "with `tessera login`"),
  ]

  static func rewrite(_ message: String) -> String {
    var text = message
    for (from, to) in phrases { text = text.replacingAll(from, with: to) }
    for (key, flag) in flags {
      text = text.replacingAll("The option '\(key)'", with: flag)
      text = text.replacingAll("the option '\(key)'", with: flag)
      text = text.replacingAll("'\(key)'", with: flag)
    }
    return text
  }
}

extension String {
  /// Every occurrence of `target` replaced (without Foundation's ranges).
  func replacingAll(_ target: String, with replacement: String) -> String {
    guard !target.isEmpty, contains(target) else { return self }
    var result = ""
    var rest = Substring(self)
    while let range = rest.firstRange(of: target) {
      result += rest[..<range.lowerBound] + replacement
      rest = rest[range.upperBound...]
    }
    return result + rest
  }
}
