import Glibc
import TesseraCore

/// The refresh journal as files: `DIR/<key>.json`, one per refresh in flight, holding the account,
/// client, authority and scopes (never a token). Written without fsync: a killed process loses
/// nothing the kernel has; a power cut may lose the note, which costs what it cost before.
public final class FileRefreshJournal: RefreshJournal {
  let directory: String

  /// `directory` is made (0700, with its parents) if it is not there.
  public init(directory: String) {
    self.directory = directory
    var path = ""
    for part in directory.split(separator: "/") {
      path += "/" + part
      _ = mkdir(path, 0o700)
    }
  }

  /// `$XDG_STATE_HOME/tessera/refreshing`, else `~/.local/state/tessera/refreshing`.
  public static func defaultDirectory() -> String? {
    if let state = getenv("XDG_STATE_HOME").map({ String(cString: $0) }), state.hasPrefix("/") {
      return state + "/tessera/refreshing"
    }
    guard let home = getenv("HOME").map({ String(cString: $0) }), home.hasPrefix("/") else { return nil }
    return home + "/.local/state/tessera/refreshing"
  }

  func path(_ entry: RefreshJournalEntry) -> String { directory + "/" + entry.key + ".json" }

  public func begin(_ entry: RefreshJournalEntry) {
    let fd = open(path(entry), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC | O_NOFOLLOW, 0o600)
    guard fd >= 0 else { return }
    let bytes = entry.encoded
    _ = bytes.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
    close(fd)
  }

  public func end(_ entry: RefreshJournalEntry) {
    _ = unlink(path(entry))
  }

  public func pending() -> [RefreshJournalEntry] {
    guard let dir = opendir(directory) else { return [] }
    defer { closedir(dir) }
    var entries: [RefreshJournalEntry] = []
    while let item = readdir(dir), entries.count < 1024 {
      let name = withUnsafeBytes(of: item.pointee.d_name) { String(decoding: $0.prefix { $0 != 0 }, as: UTF8.self) }
      guard name.hasSuffix(".json") else { continue }
      let fd = open(directory + "/" + name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)
      guard fd >= 0 else { continue }
      let text = CallerIdentity.readAll(fd, limit: 64 * 1024)
      close(fd)
      if let text, let entry = RefreshJournalEntry(decoding: Array(text.utf8)) {
        entries.append(entry)
      } else {
        _ = unlink(directory + "/" + name)  // unreadable: of no use to anyone
      }
    }
    return entries
  }
}
