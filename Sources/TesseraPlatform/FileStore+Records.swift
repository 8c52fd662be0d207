import Crypto
import FoundationEssentials
import TesseraCore
import TesseraInterface

/// The sealed-record format, pure: a record's name (a keyed hash of its attributes), its
/// associated data, sealing and opening (AES-256-GCM). No file is touched here (FuzzStore reads it).
extension FileStore {
  // MARK: - Records

  struct Record: Codable {
    var attributes: [String: String]
    var label: String
    var secret: String
  }

  static let encoder: JSONEncoder = {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys]
    return encoder
  }()

  /// The identity: the attributes sorted by name (bytewise), each name and value with its length.
  static func canonical(_ attributes: [String: String]) -> [UInt8] {
    var out = Array("tessera record identity, version 1\u{0}".utf8)
    func put(_ text: String) {
      let bytes = Array(text.utf8)
      withUnsafeBytes(of: UInt32(bytes.count).bigEndian) { out += $0 }
      out += bytes
    }
    for (key, value) in attributes.sorted(by: { $0.key.utf8.lexicographicallyPrecedes($1.key.utf8) }) {
      put(key)
      put(value)
    }
    return out
  }

  /// The file name of the record with these attributes: 64 hex digits of a keyed hash.
  package static func name(_ attributes: [String: String], _ keys: Keys) -> String {
    let mac = HMAC<SHA256>.authenticationCode(for: canonical(attributes), using: keys.name)
    return mac.map { String($0, radix: 16).leftPadded(to: 2) }.joined() + recordSuffix
  }

  /// Associated data: a record is bound to its name, so it opens in its own place only.
  package static func aad(_ name: String) -> [UInt8] {
    Array("tessera file store, version 1\u{0}".utf8) + Array(name.utf8)
  }

  package static func seal(_ plain: [UInt8], aad: [UInt8], _ key: SymmetricKey) throws -> [UInt8] {
    do {
      let box = try AES.GCM.seal(plain, using: key, authenticating: aad)
      guard let combined = box.combined else { throw TesseraError.storeUnavailable("AES-GCM gave no sealed box") }
      return magic + Array(combined)
    } catch let error as TesseraError {
      throw error
    } catch {
      throw TesseraError.storeUnavailable("Cannot seal a store record: \(error)")
    }
  }

  static func open(_ bytes: [UInt8], aad: [UInt8], _ key: SymmetricKey) throws -> [UInt8] {
    guard bytes.count > magic.count, Array(bytes.prefix(magic.count)) == magic else {
      throw TesseraError.storeUnavailable("not a store record")
    }
    let box = try AES.GCM.SealedBox(combined: bytes.dropFirst(magic.count))
    return Array(try AES.GCM.open(box, using: key, authenticating: aad))
  }

  package static func openRecord(_ bytes: [UInt8], name: String, _ keys: Keys) -> StoredItem? {
    guard let plain = try? open(bytes, aad: aad(name), keys.seal),
      let record = try? JSONDecoder().decode(Record.self, from: Data(plain)),
      Self.name(record.attributes, keys) == name
    else { return nil }
    return StoredItem(attributes: record.attributes, secret: record.secret, label: record.label)
  }
}

extension String {
  fileprivate func leftPadded(to width: Int) -> String {
    count >= width ? self : String(repeating: "0", count: width - count) + self
  }
}
