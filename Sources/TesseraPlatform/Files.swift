import Glibc
import SystemPackage
import TesseraBus

/// Reads a whole file (at most `limit` bytes); nil when it cannot be opened or read.
public func readFile(_ path: String, limit: Int = 16 << 20) -> [UInt8]? {
  guard let fd = try? FileDescriptor.open(FilePath(path), .readOnly, options: [.closeOnExec]) else { return nil }
  defer { try? fd.close() }
  var bytes: [UInt8] = []
  var chunk = [UInt8](repeating: 0, count: 65536)
  while bytes.count < limit {
    // swift-system retries EINTR.
    guard let n = try? chunk.withUnsafeMutableBytes({ try fd.read(into: $0) }) else { return nil }
    if n == 0 { break }
    bytes += chunk[0..<min(n, limit - bytes.count)]
  }
  return bytes
}

/// Reads a UTF-8 text file; nil when it cannot be opened.
public func readTextFile(_ path: String) -> String? {
  readFile(path).map { String(decoding: $0, as: UTF8.self) }
}
