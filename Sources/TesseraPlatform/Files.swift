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
