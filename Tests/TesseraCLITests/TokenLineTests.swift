import ArgumentParser
import TesseraTestSupport
import Testing

@testable import TesseraCLI

/// `tessera token`'s hot path (TokenLine) against the full parser: every command line the hot
/// path takes, swift-argument-parser takes too and reads the same way; what the hot path leaves
/// to it includes every form it could get wrong. Command lines are generated from words that
/// make valid and invalid forms, with a fixed seed so that a failure replays.
@Suite struct TokenLineTests {
  static let words: [[String]] = [
    ["--client-id", "tessera-test"], ["--client-id=app"], ["--client-id="], ["--client-id"],
    ["--client-id", "--json"], ["--scope", "read"], ["--scope=write"], ["--scope", "a b"], ["--scope", "-x"],
    ["--authority", "https://login.example/tenant"], ["--authority=https://idp.test/x?y=1"], ["--provider", "github"],
    ["--provider=work"], ["--account", "alice"], ["--account=bob@example.test"], ["--account", ""],
    ["--min-validity", "60"], ["--min-validity=0"], ["--min-validity", "+5"], ["--min-validity", "-1"],
    ["--min-validity", "4294967296"], ["--min-validity", "ten"], ["--json"], ["--json=yes"], ["--force-refresh"],
    ["--reject"], ["-h"], ["--help"], ["--"], ["--unknown"], ["stray"], ["--scope", "read", "--scope", "write"],
  ]

  func generated(count: Int) -> [[String]] {
    var rng = SeededGenerator(state: 41)
    return (0..<count).map { _ in
      (0..<Int.random(in: 0...5, using: &rng)).flatMap { _ in Self.words.randomElement(using: &rng)! }
    }
  }

  @Test func everyLineTheHotPathTakesTheFullParserReadsTheSame() throws {
    var taken = 0
    for argv in generated(count: 600) {
      guard let hot = TokenLine.parse(argv[...]) else { continue }
      taken += 1
      let full = try #require(try? Tessera.Token.parse(argv), "the full parser refuses \(argv)")
      #expect(full.line == hot, "\(argv)")
      #expect(!full.reject)
    }
    #expect(taken > 60, "the hot path takes the common forms (\(taken) of 600)")
  }

  @Test func theCommonFormsTakeTheHotPath() {
    for argv in [
      [], ["--client-id", "tessera-test"], ["--json"], ["--scope", "a", "--scope", "b", "--provider", "github"],
      ["--account", "alice", "--min-validity", "600", "--force-refresh"],
    ] {
      #expect(TokenLine.parse(argv[...]) != nil, "\(argv)")
    }
    #expect(TokenLine.parse(["--client-id", "a"][...])?.clientID == "a")
    #expect(TokenLine.parse(["--scope", "a", "--scope=b"][...])?.scopes == ["a", "b"])
  }

  @Test func whatItCannotReadExactlyGoesToTheFullParser() {
    for argv in [
      ["--help"], ["--reject"], ["--client-id", "a", "--client-id", "b"], ["--scope", "a b"], ["--json", "--json"],
      ["--min-validity", "soon"], ["--client-id"], ["--", "x"], ["x"], ["--json=1"],
    ] {
      #expect(TokenLine.parse(argv[...]) == nil, "\(argv)")
    }
  }
}
