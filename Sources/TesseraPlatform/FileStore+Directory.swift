import CTesseraSystemShim
import Crypto
import Glibc
import Logging
import SystemPackage
import TesseraCore
import TesseraInterface
import TesseraSystem

/// The file store's directory: made and checked (the user's, writable by no one else), and every
/// write to it whole and durable (Files.writeDurably), with what to do when one fails.
extension FileStore {
  /// A temporary file beside the target: written, fsynced, renamed over it, and the directory
  /// fsynced, so the record is either the old one or the new one, and stays after a power cut.
  func writeAtomically(_ name: String, _ bytes: [UInt8]) throws {
    let target = directory + "/" + name
    // A name of its own: a write never opens, or renames into place, another's temporary file.
    // (One killed before its rename is removed at the next load.)
    let temporary = target + ".\(UInt64.random(in: 0...UInt64.max))" + Self.temporarySuffix
    do {
      try Files.writeDurably(target, bytes, temporary: temporary)
    } catch {
      if error.step == .syncDirectory { throw notDurable(error.errno) }
      if error.errno == .noSuchFileOrDirectory, access(directory, F_OK) != 0 {
        // Removed while tesserad ran: what it held is in memory only. Not made again here (a
        // store holding only the changes from now on would lose the rest at the next start).
        throw Self.directoryGone(directory)
      }
      let what =
        switch error.step {
        case .create: "create"
        case .write: "write"
        case .replace, .syncDirectory: "replace"
        }
      let advice =
        error.errno == .noSpace || error.errno == .diskQuotaExceeded
        ? "Free some space on its file system, then retry."
        : "Check that \(directory) is yours and writable (`chmod 700`), then retry."
      throw TesseraError.storeUnavailable("Cannot \(what) the store record \(target) (\(error.errno)). \(advice)")
    }
  }

  func notDurable(_ code: Errno) -> TesseraError {
    .storeUnavailable(
      "Cannot make the file store's changes durable (fsync of \(directory): \(code)). Check the file system, then retry."
    )
  }

  func syncDirectory() throws {
    do { try Files.syncDirectory(directory) } catch {
      if error.call.hasPrefix("open") { throw unreadableDirectory(error.errno) }
      throw notDurable(error.errno)
    }
  }

  // MARK: - The directory

  /// The error for a store directory removed while tesserad runs (never made again then).
  static func directoryGone(_ directory: String) -> TesseraError {
    .storeUnavailable(
      "The file store's directory \(directory) is gone (removed while tesserad ran); changes are kept in memory and retried. "
        + "Put the directory back, or restart tesserad to start with a new, empty store (every account then signs in again)."
    )
  }

  /// Makes the directory and its missing parents, 0700.
  func makeDirectory() throws {
    do { try Files.makeDirectories(directory) } catch {
      throw TesseraError.storeUnavailable(
        "Cannot create the file store's directory \(directory) (\(error.errno)). Create it yourself (`mkdir -p -m 700 \(directory)`), then retry."
      )
    }
  }

  /// The directory must be a directory of this user's that no one else can write, and readable.
  func checkDirectory() throws {
    var info = stat()
    guard stat(directory, &info) == 0 else {
      let code = Errno(rawValue: Glibc.errno)
      if code == .noSuchFileOrDirectory { return }  // made at the next load
      throw unreadableDirectory(code)
    }
    guard info.st_mode & S_IFMT == S_IFDIR else {
      throw TesseraError.storeUnavailable(
        "The file store's directory \(directory) is not a directory. Move it aside, then retry.")
    }
    if info.st_uid != geteuid() {
      throw TesseraError.storeUnavailable(
        "The file store's directory \(directory) belongs to another user (uid \(info.st_uid)), who could read or replace its records. "
          + "Make it yours (`chown -R` it to yourself) or move it aside, then retry.")
    }
    if info.st_mode & (S_IWGRP | S_IWOTH) != 0 {
      throw TesseraError.storeUnavailable(
        "The file store's directory \(directory) is writable by other users (mode \(String(info.st_mode & 0o7777, radix: 8))), "
          + "who could replace or remove its records. Run `chmod 700 \(directory)`, then retry.")
    }
    if access(directory, R_OK | W_OK | X_OK) != 0 {
      throw unreadableDirectory(Errno(rawValue: Glibc.errno))
    }
  }

  func unreadableDirectory(_ code: Errno) -> TesseraError {
    .storeUnavailable(
      "Cannot read the file store's directory \(directory) (\(code)). Make it yours and usable (`chmod 700 \(directory)`), then retry; "
        + "nothing was changed.")
  }
}
