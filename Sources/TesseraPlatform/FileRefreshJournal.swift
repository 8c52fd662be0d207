import Glibc
import SystemPackage
import TesseraCore
import TesseraSystem

/// The refresh journal as files: `DIR/<key>.json`, one per refresh in flight, holding the account,
/// client, authority and scopes (never a token). Written without fsync: a killed process loses
/// nothing the kernel has; a power cut may lose the note, which costs what it cost before.
public final class FileRefreshJournal: RefreshJournal {
  let directory: String

  /// `directory` is made (0700, with its parents) if it is not there.
  public init(directory: String) {
    self.directory = directory
    _ = try? Files.makeDirectories(directory)
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
    // A note that cannot be written (a full disk, say) only loses what it is for: the check of an
    // interrupted refresh after a kill. A half-written one is removed: it would not decode.
    let file = path(entry)
    guard
      let fd = try? FileDescriptor.open(
        FilePath(file), .writeOnly, options: [.create, .truncate, .closeOnExec, .noFollow],
        permissions: [.ownerReadWrite])
    else { return }
    defer { try? fd.close() }
    do { try Syscall.writeAll(fd, entry.encoded) } catch { _ = unlink(file) }
  }

  public func end(_ entry: RefreshJournalEntry) {
    _ = unlink(path(entry))
  }

  public func pending() -> [RefreshJournalEntry] {
    var entries: [RefreshJournalEntry] = []
    for name in (try? Files.names(in: directory)) ?? [] where entries.count < 1024 {
      guard name.hasSuffix(".json") else { continue }
      guard let bytes = try? Syscall.readFile(directory + "/" + name, limit: 64 * 1024, followLinks: false) else {
        continue
      }
      if let entry = RefreshJournalEntry(decoding: bytes) {
        entries.append(entry)
      } else {
        _ = unlink(directory + "/" + name)  // unreadable: of no use to anyone
      }
    }
    return entries
  }
}
