import Glibc

/// Reads a whole file; nil when it cannot be opened.
public func readFile(_ path: String, limit: Int = 16 << 20) -> [UInt8]? {
  let fd = open(path, O_RDONLY | O_CLOEXEC)
  guard fd >= 0 else { return nil }
  defer { close(fd) }
  var bytes: [UInt8] = []
  var chunk = [UInt8](repeating: 0, count: 65536)
  while bytes.count < limit {
    let n = chunk.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
    if n < 0 && errno == EINTR { continue }
    if n <= 0 { break }
    bytes += chunk[0..<n]
  }
  return bytes
}

/// Reads a UTF-8 text file; nil when it cannot be opened.
public func readTextFile(_ path: String) -> String? {
  readFile(path).map { String(decoding: $0, as: UTF8.self) }
}
