import Foundation
import TesseraInterface
import Testing

/// `tessera provider` as a user runs it (issue 38): a provider added from a profile with its
/// secret from standard input, listed, shown and removed; a mistake writes nothing; the secret is
/// never on the command line nor in any output.
extension BinaryTests {
  var secretPath: String { home + "/.config/tessera/secrets/work.secret" }

  func contents(_ path: String) -> String? {
    FileManager.default.contents(atPath: path).map { String(decoding: $0, as: UTF8.self) }
  }

  @Test func aProviderIsAddedListedShownAndRemovedAndItsSecretNeverShows() throws {
    try "log_level = \"info\"\n".write(toFile: configPath, atomically: true, encoding: .utf8)
    let secret = "gho-secret-0123456789"
    let added = try run(
      ["provider", "add", "work", "--profile", "bitbucket", "--client-id", "consumer-key", "--client-secret-stdin"],
      stdin: secret + "\n")
    #expect(added.status == 0, "\(added.stderr)")
    #expect(added.stdout.contains("Added provider work (bitbucket)"))
    #expect(contents(secretPath) == secret, "the secret, without its newline")
    var info = stat()
    #expect(stat(secretPath, &info) == 0 && info.st_mode & 0o777 == 0o600)
    #expect(
      contents(configPath)
        == "log_level = \"info\"\n\n[[provider]]\nname = \"work\"\nprofile = \"bitbucket\"\nclient_id = \"consumer-key\"\nclient_secret_file = \"\(secretPath)\"\n"
    )

    let list = try run(["provider", "list"])
    #expect(list.status == 0, "\(list.stderr)")
    #expect(list.stdout == "work\tbitbucket\thttps://bitbucket.org\tconsumer-key\tset\n")
    let show = try run(["provider", "show", "work", "--json"])
    #expect(show.status == 0, "\(show.stderr)")
    let json = try #require(try JSONSerialization.jsonObject(with: Data(show.stdout.utf8)) as? [String: Any])
    #expect(json["client_secret"] as? String == "set")
    #expect(json["client_authentication"] as? String == "client_secret_basic")
    #expect(json["git_username"] as? String == "x-token-auth")
    #expect(json["git_host"] as? String == "bitbucket.org")
    #expect(
      (json["endpoints"] as? [String: String])?["token_endpoint"] == "https://bitbucket.org/site/oauth2/access_token")
    let config = try run(["config", "show"])
    #expect(config.stdout.contains("[[provider]]  # \(configPath):3\nname = \"work\""))
    #expect(config.stdout.contains("# client secret: set"))
    for output in [added, list, show, config] {
      #expect(!output.stdout.contains(secret) && !output.stderr.contains(secret), "the secret showed")
    }
    #expect(try run(["config", "check"]).status == 0)

    let removed = try run(["provider", "remove", "work"])
    #expect(removed.status == 0, "\(removed.stderr)")
    #expect(contents(configPath) == "log_level = \"info\"\n")
    #expect(!FileManager.default.fileExists(atPath: secretPath))
    let gone = try run(["provider", "show", "work"])
    #expect(gone.status == TesseraError.Code.invalidArgument.exitCode)
  }

  /// `remove` takes its table and nothing else: the comments that head the next table stay; a
  /// config.toml that is a symbolic link (dotfiles in a repository) stays a link.
  @Test func removingAProviderKeepsTheNextTablesCommentsAndASymlinkedConfig() throws {
    let real = home + "/dotfiles-tessera.toml"
    try """
    log_level = "info"

    [[provider]]
    name = "work"
    profile = "github"
    client_id = "Ov23li"

    # The team's GitLab: ask Dana for the app.
    [[provider]]
    name = "team"
    profile = "gitlab"
    client_id = "gl-app"

    """.write(toFile: real, atomically: true, encoding: .utf8)
    try? FileManager.default.removeItem(atPath: configPath)
    try FileManager.default.createSymbolicLink(atPath: configPath, withDestinationPath: real)
    defer {
      try? FileManager.default.removeItem(atPath: configPath)
      try? FileManager.default.removeItem(atPath: real)
    }
    let removed = try run(["provider", "remove", "work"])
    #expect(removed.status == 0, "\(removed.stderr)")
    #expect(
      contents(real)
        == "log_level = \"info\"\n\n# The team's GitLab: ask Dana for the app.\n[[provider]]\nname = \"team\"\nprofile = \"gitlab\"\nclient_id = \"gl-app\"\n",
      "\(contents(real) ?? "")")
    #expect(
      (try? FileManager.default.destinationOfSymbolicLink(atPath: configPath)) == real, "still a link to the dotfile")
  }

  @Test func aProviderWithAMistakeWritesNothingAndSaysWhatToDo() throws {
    let before = "default_client_id = \"app\"\n"
    try before.write(toFile: configPath, atomically: true, encoding: .utf8)
    let wrong = try run(
      ["provider", "add", "work", "--profile", "google", "--client-id", "x"], stdin: "")
    #expect(wrong.status == TesseraError.Code.configuration.exitCode)
    #expect(wrong.stderr.contains("google signs in only with the app's client secret"), "\(wrong.stderr)")
    #expect(wrong.stderr.contains("nothing was written"))
    let http = try run(
      [
        "provider", "add", "work", "--client-id", "x", "--authorization-endpoint", "https://idp.example/a",
        "--token-endpoint", "http://idp.example/t", "--client-secret-stdin",
      ], stdin: "s3cret\n")
    #expect(http.status == TesseraError.Code.configuration.exitCode)
    #expect(http.stderr.contains("key 'token_endpoint': 'http://idp.example/t' uses http:"), "\(http.stderr)")
    #expect(contents(configPath) == before)
    #expect(!FileManager.default.fileExists(atPath: secretPath), "no secret written for a provider not added")
    // A secret cannot be given on the command line at all (other users read argv in /proc).
    let argv = try run(["provider", "add", "work", "--profile", "github", "--client-id", "x", "--client-secret", "s"])
    #expect(argv.status == ClientExitStatus.usage.rawValue)
    #expect(contents(configPath) == before)
  }
}
