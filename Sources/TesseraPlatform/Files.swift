import Glibc
import SystemPackage
import TesseraBus

/// Reads a whole file (at most `limit` bytes); nil when it cannot be opened or read, or is larger.
public func readFile(_ path: String, limit: Int = 16 << 20) -> [UInt8]? {
  try? Syscall.readFile(path, limit: limit)
}

/// Reads a UTF-8 text file; nil when it cannot be opened.
public func readTextFile(_ path: String) -> String? {
  readFile(path).map { String(decoding: $0, as: UTF8.self) }
}

/// Why another user could change the file at `path`, or nil when only its owner (this user, or
/// root) can: the file, and the directory holding it, must belong to this user or root and be
/// writable by no one else (a directory's sticky bit keeps others from replacing the file).
public func othersCanWrite(_ path: String) -> String? {
  let me = geteuid()
  func check(_ target: String, isDirectory: Bool) -> String? {
    var info = stat()
    guard stat(target, &info) == 0 else { return nil }  // unreadable: reading it fails elsewhere
    let what = isDirectory ? "the directory \(target)" : target
    if info.st_uid != me && info.st_uid != 0 { return "\(what) belongs to another user (uid \(info.st_uid))" }
    let sticky = isDirectory && info.st_mode & S_ISVTX != 0
    if info.st_mode & (S_IWGRP | S_IWOTH) != 0 && !sticky {
      return "\(what) is writable by other users (mode \(String(info.st_mode & 0o7777, radix: 8)))"
    }
    return nil
  }
  let directory = path.contains("/") ? String(path[..<path.lastIndex(of: "/")!]) : "."
  return check(path, isDirectory: false) ?? check(directory.isEmpty ? "/" : directory, isDirectory: true)
}
