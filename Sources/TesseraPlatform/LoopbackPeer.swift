import Glibc
import TesseraSystem

/// Which user holds the other end of a loopback TCP connection.
///
/// The kernel lists every TCP socket of the network namespace in /proc/net/tcp and tcp6 with its
/// owner's uid. The peer's socket is the one whose local address is our connection's remote
/// address and whose remote address is our local one. (SO_PEERCRED works only on Unix sockets,
/// and the unit's RestrictAddressFamilies leaves out netlink, so sock_diag is not an option.)
package enum LoopbackPeer {
  /// The peer's uid, or nil when it cannot be told (not loopback TCP, not found, or a socket in
  /// TIME_WAIT, which the kernel lists with uid 0): callers refuse such a peer.
  static func uid(of connection: Int32) -> uid_t? {
    guard let local = address(of: connection, peer: false), let remote = address(of: connection, peer: true),
      local.family == remote.family
    else { return nil }
    let table = local.family == AF_INET ? "/proc/net/tcp" : "/proc/net/tcp6"
    guard let bytes = readFile(table, limit: 64 << 20) else { return nil }
    let text = String(decoding: bytes, as: UTF8.self)
    return uid(in: text, peerAddress: remote.text, ourAddress: local.text)
  }

  /// Finds the socket `peerAddress` -> `ourAddress` in a /proc/net/tcp(6) table and returns its uid.
  package static func uid(in table: String, peerAddress: String, ourAddress: String) -> uid_t? {
    for line in table.split(separator: "\n").dropFirst() {
      // sl local_address rem_address st tx_queue:rx_queue tr:tm->when retrnsmt uid ...
      let fields = line.split(separator: " ", omittingEmptySubsequences: true)
      guard fields.count > 7, fields[1] == peerAddress, fields[2] == ourAddress else { continue }
      guard fields[3] != "06" else { return nil }  // TIME_WAIT: no owner recorded
      return uid_t(fields[7])
    }
    return nil
  }

  /// The address in the table's notation: the address's 32-bit words as the kernel prints them
  /// (`%08X` of each word in host byte order), a colon, and the port (`%04X`).
  private static func address(of fd: Int32, peer: Bool) -> (family: Int32, text: String)? {
    var storage = sockaddr_in6()
    var length = socklen_t(MemoryLayout<sockaddr_in6>.size)
    let result = withUnsafeMutablePointer(to: &storage) {
      $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
        peer ? getpeername(fd, $0, &length) : getsockname(fd, $0, &length)
      }
    }
    guard result == 0 else { return nil }
    switch Int32(storage.sin6_family) {
    case AF_INET:
      return withUnsafeBytes(of: &storage) { raw in
        let v4 = raw.load(as: sockaddr_in.self)
        return (AF_INET, hex(v4.sin_addr.s_addr) + ":" + hex16(UInt16(bigEndian: v4.sin_port)))
      }
    case AF_INET6:
      let words = withUnsafeBytes(of: storage.sin6_addr) { raw in
        (0..<4).map { raw.load(fromByteOffset: $0 * 4, as: UInt32.self) }
      }
      return (AF_INET6, words.map(hex).joined() + ":" + hex16(UInt16(bigEndian: storage.sin6_port)))
    default:
      return nil
    }
  }

  private static func hex(_ word: UInt32) -> String {
    let digits = String(word, radix: 16, uppercase: true)
    return String(repeating: "0", count: 8 - digits.count) + digits
  }

  private static func hex16(_ port: UInt16) -> String {
    let digits = String(port, radix: 16, uppercase: true)
    return String(repeating: "0", count: 4 - digits.count) + digits
  }
}
