/// `tessera token` as scripts, prompts and `$(tessera token)` write it, read without
/// swift-argument-parser. Its parse reflects over the command's options at every start (Mirror,
/// generic metadata, protocol conformance scans): about a third of a cached `tessera token`
/// (issue 41). Only exact, common forms are taken here; anything else (help, --reject, an unknown
/// option, a missing or odd value, an option given twice, `--`) goes to the full parser, which
/// reads it as before and says what is wrong. TokenLineTests check that both read every command
/// line this takes alike.
struct TokenLine: Equatable {
  var clientID = ""
  var authority: String?
  var provider: String?
  var scopes: [String] = []
  var account: String?
  var minValidity: UInt32?
  var forceRefresh = false
  var json = false

  /// The words after `token`; nil for the full parser.
  static func parse(_ words: ArraySlice<String>) -> TokenLine? {
    var line = TokenLine()
    var seen: [String] = []  // a few names: no hashing (a Set seeds its hash from getrandom)
    var index = words.startIndex
    while index < words.endIndex {
      var name = words[index]
      index += 1
      guard name.hasPrefix("--") else { return nil }
      var value: String?
      if let equals = name.firstIndex(of: "=") {
        value = String(name[name.index(after: equals)...])
        name = String(name[..<equals])
      }
      // Each option once (--scope: as often as wanted).
      guard name == "--scope" || !seen.contains(name) else { return nil }
      seen.append(name)
      switch name {
      case "--json", "--force-refresh":
        guard value == nil else { return nil }
        if name == "--json" { line.json = true } else { line.forceRefresh = true }
        continue
      case "--client-id", "--authority", "--provider", "--scope", "--account", "--min-validity":
        if value == nil {
          guard index < words.endIndex, !words[index].hasPrefix("-") else { return nil }
          value = words[index]
          index += 1
        }
      default:
        return nil
      }
      // `--client-id=`: the full parser reads a bare option and takes the next word as its value.
      guard let value, !value.isEmpty else { return nil }
      switch name {
      case "--client-id": line.clientID = value
      case "--authority": line.authority = value
      case "--provider": line.provider = value
      case "--account": line.account = value
      case "--scope":
        guard !value.contains(" ") else { return nil }  // the full parser says how to write it
        line.scopes.append(value)
      default:
        guard let seconds = UInt32(value) else { return nil }
        line.minValidity = seconds
      }
    }
    return line
  }
}

extension Tessera.Token {
  /// What the full parser read, as the hot path reads it.
  var line: TokenLine {
    TokenLine(
      clientID: request.target.clientId, authority: request.target.authority, provider: request.target.provider,
      scopes: request.target.scopes, account: request.account, minValidity: request.minValidity,
      forceRefresh: forceRefresh, json: output.json)
  }
}
