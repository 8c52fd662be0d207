import Glibc
import TesseraInterface
import Testing

@testable import TesseraSystem

/// CheckedFile reads a file only after checking the descriptor actually opened, and the directory
/// of the file it leads to (issue 37 §1).
@Suite struct CheckedFileTests {
  /// A private directory of its own, removed at the end.
  final class Scratch {
    let path: String
    init() throws {
      var template = Array("/tmp/tessera-checked-XXXXXX".utf8CString)
      guard let made = mkdtemp(&template) else { throw SystemCallError("mkdtemp", .init(rawValue: errno)) }
      path = String(cString: made)
      chmod(path, 0o700)
    }
    func write(_ name: String, _ text: String, mode: mode_t = 0o600) -> String {
      let file = path + "/" + name
      let fd = open(file, O_WRONLY | O_CREAT | O_TRUNC, mode)
      _ = text.withCString { Glibc.write(fd, $0, strlen($0)) }
      close(fd)
      chmod(file, mode)
      return file
    }
    func directory(_ name: String, mode: mode_t) -> String {
      let dir = path + "/" + name
      mkdir(dir, 0o700)
      chmod(dir, mode)
      return dir
    }
    deinit { _ = system("rm -rf '\(path)'") }
  }

  @Test func aPrivateFileIsRead() throws {
    let scratch = try Scratch()
    let file = scratch.write("config.toml", "log_level = \"debug\"\n")
    #expect(try CheckedFile.read(file, limit: 1024, rules: .configuration) == Array("log_level = \"debug\"\n".utf8))
  }

  @Test func aLinkFromAPrivateDirectoryToASafeFileIsRead() throws {
    // A dotfiles manager's link: the link and its target both in directories only the user writes.
    let scratch = try Scratch()
    let dotfiles = scratch.directory("dotfiles", mode: 0o755)
    let target = dotfiles + "/config.toml"
    let fd = open(target, O_WRONLY | O_CREAT, 0o644)
    close(fd)
    let config = scratch.directory("config", mode: 0o700)
    #expect(symlink(target, config + "/config.toml") == 0)
    #expect(try CheckedFile.read(config + "/config.toml", limit: 1024, rules: .configuration) == [])
  }

  @Test func aLinkIntoADirectoryOthersCanWriteIsRefused() throws {
    // The link sits in a private directory, so a check of the path's own directory passed; the
    // file it leads to can be replaced by anyone.
    let scratch = try Scratch()
    let shared = scratch.directory("shared", mode: 0o777)
    let target = shared + "/config.toml"
    close(open(target, O_WRONLY | O_CREAT, 0o600))
    chmod(target, 0o600)
    let config = scratch.directory("config", mode: 0o700)
    #expect(symlink(target, config + "/config.toml") == 0)
    #expect {
      try CheckedFile.read(config + "/config.toml", limit: 1024, rules: .configuration)
    } throws: { error in
      guard case .directoryMode(let path, _) = error as? CheckedFile.Problem else { return false }
      return path == shared
    }
  }

  @Test func aFIFOIsRefusedAtOnceWithoutWaitingForAWriter() throws {
    let scratch = try Scratch()
    let fifo = scratch.path + "/config.toml"
    #expect(mkfifo(fifo, 0o600) == 0)
    #expect {
      try CheckedFile.read(fifo, limit: 1024, rules: .configuration)
    } throws: { error in
      guard case .notRegular(let kind) = error as? CheckedFile.Problem else { return false }
      return kind == "a FIFO"
    }
  }

  @Test(arguments: [0o620, 0o602] as [mode_t])
  func aFileOthersCanWriteIsRefused(mode: mode_t) throws {
    let scratch = try Scratch()
    let file = scratch.write("config.toml", "", mode: mode)
    #expect {
      try CheckedFile.read(file, limit: 1024, rules: .configuration)
    } throws: { error in
      guard case .mode = error as? CheckedFile.Problem else { return false }
      return "\(error)".contains("writable by other users (mode \(String(mode, radix: 8)))")
    }
  }

  @Test func aSecretOthersCanReadIsRefusedAndAPrivateOneRead() throws {
    let scratch = try Scratch()
    let open = scratch.write("store.key", "k", mode: 0o640)
    #expect(throws: CheckedFile.Problem.self) { try CheckedFile.read(open, limit: 64, rules: .secret) }
    chmod(open, 0o600)
    #expect(try CheckedFile.read(open, limit: 64, rules: .secret) == Array("k".utf8))
  }

  @Test(.enabled(if: geteuid() == 0, "giving a file to another user needs root"))
  func aFileOfAnotherUserIsRefused() throws {
    let scratch = try Scratch()
    let file = scratch.write("config.toml", "")
    #expect(chown(file, 65534, UInt32.max) == 0)
    #expect {
      try CheckedFile.read(file, limit: 1024, rules: .configuration)
    } throws: { error in
      guard case .owner(let uid) = error as? CheckedFile.Problem else { return false }
      return uid == 65534
    }
  }

  @Test func overTheLimitIsAnErrorNotACut() throws {
    let scratch = try Scratch()
    let file = scratch.write("big", String(repeating: "x", count: 100))
    #expect(try CheckedFile.read(file, limit: 100, rules: .configuration).count == 100)
    #expect {
      try CheckedFile.read(file, limit: 99, rules: .configuration)
    } throws: { error in
      (error as? CheckedFile.Problem)?.errno == .fileTooLarge
    }
  }

  @Test func theConfigurationNamesALinkedFileInASharedDirectoryAndSaysWhatToDo() throws {
    let scratch = try Scratch()
    let shared = scratch.directory("shared", mode: 0o777)
    let target = shared + "/config.toml"
    close(open(target, O_WRONLY | O_CREAT, 0o600))
    chmod(target, 0o600)
    let config = scratch.directory("config", mode: 0o700)
    symlink(target, config + "/config.toml")
    let reading = ConfigFiles.load(
      option: config + "/config.toml", environment: ["TESSERA_SYSTEM_CONFIG_DIR": scratch.path + "/none"])
    guard case .problems(let problems) = reading else {
      Issue.record("a config linked into a shared directory was read: \(reading)")
      return
    }
    let text = problems.map(\.description).joined(separator: "\n")
    #expect(text.contains("which is writable by other users"))
    #expect(text.contains("chmod go-w \(shared)"))
  }

  /// A provider's client secret must be the user's alone (issue 38 §7): one others can read, one
  /// that is missing, or one in a directory others can write is a problem of the table's
  /// client_secret_file line, with what to do; the secret itself is never in the message.
  @Test func aClientSecretFileOthersCanReadIsAProblemOfItsLine() throws {
    let scratch = try Scratch()
    let secret = scratch.write("gh.secret", "s3cr3t-value", mode: 0o644)
    let shared = scratch.directory("shared", mode: 0o777)
    let inShared = shared + "/other.secret"
    close(open(inShared, O_WRONLY | O_CREAT, 0o600))
    chmod(inShared, 0o600)
    func load(_ secretPath: String) -> [String] {
      let config = scratch.write(
        "config.toml",
        "log_level = \"info\"\n\n[[provider]]\nname = \"gh\"\nprofile = \"github\"\nclient_id = \"x\"\nclient_secret_file = \"\(secretPath)\"\n"
      )
      let reading = ConfigFiles.load(option: config, environment: ["TESSERA_SYSTEM_CONFIG_DIR": scratch.path + "/none"])
      guard case .problems(let problems) = reading else { return [] }
      return problems.map(\.description)
    }
    let readable = load(secret)
    #expect(readable.count == 1)
    #expect(readable.first?.hasPrefix(scratch.path + "/config.toml:7: [[provider]] key 'client_secret_file': ") == true)
    #expect(readable.first?.contains("can be read by other users (mode 644)") == true)
    #expect(readable.first?.contains("chmod 600 \(secret)") == true)
    #expect(readable.allSatisfy { !$0.contains("s3cr3t") })
    #expect(load(scratch.path + "/missing.secret").first?.contains("does not exist") == true)
    #expect(load(inShared).first?.contains("chmod go-w \(shared)") == true)
    chmod(secret, 0o600)
    #expect(load(secret) == [], "a 0600 secret of the user's own")
  }

  /// The administrator's provider may share its secret with the users it serves (a desktop app's
  /// secret protects nothing, RFC 8252 §8.5): root's or the user's, readable by them, but no one
  /// else may change it. A user's own provider with the same file is still refused.
  @Test func anAdministratorsClientSecretMayBeReadByTheUsersButChangedByNoOne() throws {
    let scratch = try Scratch()
    let system = scratch.directory("etc-tessera", mode: 0o755)
    let secret = scratch.write("site.secret", "site-secret", mode: 0o644)
    let table =
      "[[provider]]\nname = \"site\"\nprofile = \"github\"\nclient_id = \"x\"\nclient_secret_file = \"\(secret)\"\n"
    _ = scratch.write("etc-tessera/config.toml", table, mode: 0o644)
    let user = scratch.write("config.toml", "log_level = \"info\"\n")
    func load() -> [String] {
      switch ConfigFiles.load(option: user, environment: ["TESSERA_SYSTEM_CONFIG_DIR": system]) {
      case .problems(let problems): return problems.map(\.description)
      case .loaded(let effective): return effective.config.providers.map { "loaded \($0.name)" }
      }
    }
    #expect(load() == ["loaded site"], "readable by the users it serves")
    chmod(secret, 0o666)
    let writable = load()
    #expect(writable.first?.contains("chmod go-w \(secret)") == true, "\(writable)")
    chmod(secret, 0o644)
    // The same file in the user's own table: theirs alone, or refused.
    _ = scratch.write(
      "config.toml", "log_level = \"info\"\n\n" + table.replacing("name = \"site\"", with: "name = \"mine\""))
    #expect(load().first?.contains("chmod 600 \(secret)") == true)
  }
}
