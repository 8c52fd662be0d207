import Glibc
import SystemPackage
import TesseraCore
import TesseraInterface
import TesseraSystem

/// The note of a store move under way, as a file: `$XDG_STATE_HOME/tessera/moving` (0600 in a
/// 0700 directory), holding `from=KIND`, `to=KIND` and `phase=copying|deleting` lines. Written atomically and durably
/// (`moving.tmp`, fsync, rename, fsync of the directory), so a note is whole or absent.
public final class FileStoreMoveJournal: StoreMoveJournal {
  public let path: String
  let directory: String

  public init(path: String) {
    self.path = path
    directory = Files.directory(of: path)
  }

  /// `$XDG_STATE_HOME/tessera/moving`, else `~/.local/state/tessera/moving`.
  public static func defaultPath(environment: [String: String]) -> String? {
    if let state = environment["XDG_STATE_HOME"], state.hasPrefix("/") { return state + "/tessera/moving" }
    guard let home = environment["HOME"], home.hasPrefix("/") else { return nil }
    return home + "/.local/state/tessera/moving"
  }

  public func write(_ note: StoreMoveNote) throws {
    let text = "from=\(note.from)\nto=\(note.to)\nphase=\(note.deleting ? "deleting" : "copying")\n"
    do {
      try Files.makeDirectories(directory)
      _ = unlink(path + ".tmp")  // a write killed before its rename
      try Files.writeDurably(path, Array(text.utf8), temporary: path + ".tmp")
    } catch {
      throw TesseraError(
        .environment,
        "Cannot write the store move journal \(path) (\(error)), so nothing was moved. Check the disk and the directory's permissions."
      )
    }
  }

  public func pending() -> StoreMoveNote? {
    guard let bytes = try? Syscall.readFile(path, limit: 4096, followLinks: false) else { return nil }
    return Self.note(from: bytes)
  }

  /// A note's text as `write` leaves it; nil for anything else (no move is then resumed).
  package static func note(from bytes: [UInt8]) -> StoreMoveNote? {
    var fields: [String: String] = [:]
    for line in String(decoding: bytes, as: UTF8.self).split(separator: "\n") {
      guard let equals = line.firstIndex(of: "=") else { continue }
      fields[String(line[..<equals])] = String(line[line.index(after: equals)...])
    }
    guard let from = fields["from"].flatMap(StoreKind.init), let to = fields["to"].flatMap(StoreKind.init), from != to,
      StoreKind.movable.contains(from), StoreKind.movable.contains(to)
    else { return nil }
    return StoreMoveNote(from: from, to: to, deleting: fields["phase"] == "deleting")
  }

  /// Removed durably: a note that came back after a power cut would have the next start finish a
  /// move that had ended, deleting from its source whatever that holds by then.
  public func end() throws {
    guard unlink(path) == 0 || Glibc.errno == ENOENT else {
      throw TesseraError(.environment, "Cannot remove the store move journal \(path): \(Errno(rawValue: Glibc.errno)).")
    }
    try? Files.syncDirectory(directory)
  }
}
