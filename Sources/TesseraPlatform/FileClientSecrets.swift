import TesseraCore
import TesseraInterface
import TesseraSystem

/// Providers' client secrets, read from their `client_secret_file` through the descriptor that
/// was checked: a regular file of this user's that no one else can read, in a directory no one
/// else can write (an administrator's: root's or this user's, that no one else can write). One line; what follows its first line break is not part of it.
public struct FileClientSecrets: ClientSecretSource {
  public init() {}

  public func secret(at path: String, shared: Bool) throws -> String {
    var bytes: [UInt8]
    do {
      bytes = try CheckedFile.read(path, limit: 4096, rules: shared ? .sharedSecret : .secret)
    } catch {
      throw TesseraError(.configuration, "\(path) \(error)")
    }
    defer { for i in bytes.indices { bytes[i] = 0 } }
    let line = bytes.prefix { $0 != UInt8(ascii: "\n") && $0 != UInt8(ascii: "\r") }
    guard !line.isEmpty else { throw TesseraError(.configuration, "\(path) is empty; write the client secret in it") }
    return String(decoding: line, as: UTF8.self)
  }
}
