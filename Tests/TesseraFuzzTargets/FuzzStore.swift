import Crypto
import TesseraCore
import TesseraInterface
import TesseraPlatform

/// What the stores give back, read as the engine reads it at start. The first byte chooses:
///
/// - 0: a file-store record file as found on disk (its magic, the sealed box), opened with a
///   fixed key; the rest of the input is the file;
/// - 1: a record's plaintext (the JSON inside the sealed box), sealed with the fixed key under the
///   name the input gives (before "\n--\n"), then opened as the store opens it; when the record
///   opens, its attributes must name it;
/// - 2: keyring items, as the token cache loads them: items cut at "\n--\n", each
///   `attr=value` lines, a blank line, then the secret (an item of any schema version and kind);
/// - 3: the store move journal's note.
enum FuzzStore {
  static let keys = FileStore.derive(SymmetricKey(data: Array(repeating: UInt8(7), count: 32)))
  static let name = String(repeating: "0", count: 64) + FileStore.recordSuffix

  static func run(_ input: [UInt8]) {
    guard let (selector, bytes) = input.selector else { return }
    switch selector % 4 {
    case 0: _ = FileStore.openRecord(bytes, name: name, keys)
    case 1:
      let parts = bytes.sections()
      let recordName = parts.count > 1 ? String(decoding: parts[0], as: UTF8.self) : name
      let plain = parts.last ?? []
      guard let sealed = try? FileStore.seal(plain, aad: FileStore.aad(recordName), keys.seal) else { return }
      if let item = FileStore.openRecord(sealed, name: recordName, keys) {
        precondition(FileStore.name(item.attributes, keys) == recordName, "a record opened under another's name")
      }
    case 2:
      let items = bytes.sections().map(item)
      let (cache, skipped) = TokenCache.load(items)
      precondition(skipped <= items.count, "more items skipped than read")
      // What a start does next with a loaded cache: list the accounts.
      _ = cache.accounts.values.map(\.id).sorted()
    default: _ = FileStoreMoveJournal.note(from: bytes)
    }
  }

  static func item(_ bytes: [UInt8]) -> StoredItem {
    let text = String(decoding: bytes, as: UTF8.self)
    let split = text.split(separator: "\n\n", maxSplits: 1, omittingEmptySubsequences: false)
    var attributes: [String: String] = [:]
    for line in split[0].split(separator: "\n") {
      let kv = line.split(separator: "=", maxSplits: 1, omittingEmptySubsequences: false)
      attributes[String(kv[0])] = kv.count > 1 ? String(kv[1]) : ""
    }
    return StoredItem(attributes: attributes, secret: split.count > 1 ? String(split[1]) : "", label: "fuzz")
  }
}
