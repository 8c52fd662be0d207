import Crypto
import Glibc
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
/// - 3: the store move journal's note;
/// - 4: a whole file-store directory, loaded as tesserad loads it at start (the listing, the key
///   check, records that open, and damaged ones set aside): the sections are its files, the first
///   the `key-check` file, each other a record (under the name on its first line, else one of
///   its place). The key is the fixed one,
///   read from its key file through the checked descriptor. Returns what the load said.
enum FuzzStore {
  static let keys = FileStore.derive(SymmetricKey(data: Array(repeating: UInt8(7), count: 32)))
  static let name = String(repeating: "0", count: 64) + FileStore.recordSuffix

  static func run(_ input: [UInt8]) {
    guard let (selector, bytes) = input.selector else { return }
    switch selector % 5 {
    case 4: _ = load(bytes.sections())
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

  /// A directory of the process's own for case 4, and its key file (the fixed key, 0600).
  static let scratch: String = {
    var template = Array("/tmp/tessera-fuzzstore-XXXXXX".utf8CString)
    let root = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    let key = root + "/store.key"
    let fd = open(key, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
    _ = [UInt8](repeating: 7, count: 32).withUnsafeBytes { write(fd, $0.baseAddress, 32) }
    close(fd)
    return root
  }()

  /// What loading a store directory of these files gives: the items' count, or the error's code.
  static func load(_ files: [[UInt8]]) -> String {
    let directory = scratch + "/store"
    _ = system("rm -rf '\(directory)'")
    mkdir(directory, 0o700)
    for (index, file) in files.enumerated() {
      // A record may say its own name on a first line ("NAME.item\n"); else it is named by its place.
      var content = file
      let hex = String(index, radix: 16)
      var name =
        index == 0
        ? FileStore.keyCheckName : String(repeating: "0", count: 64 - hex.count) + hex + FileStore.recordSuffix
      let nameLength = 64 + FileStore.recordSuffix.utf8.count
      if index > 0, content.count > nameLength, content[nameLength] == UInt8(ascii: "\n"),
        FileStore.isRecordName(String(decoding: content[..<nameLength], as: UTF8.self))
      {
        name = String(decoding: content[..<nameLength], as: UTF8.self)
        content = Array(content[(nameLength + 1)...])
      }
      let fd = open(directory + "/" + name, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0o600)
      guard fd >= 0 else { continue }
      _ = content.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
      close(fd)
    }
    let store = FileStore(directory: directory, key: .file(scratch + "/store.key"), logger: quiet)
    let said = LockedResult()
    blocking {
      do { said.set("\(try await store.loadAll().count) items") } catch {
        said.set(TesseraError.wrap(error).code.rawValue)
      }
    }
    return said.value
  }

  final class LockedResult: @unchecked Sendable {
    private let lock = Locked("")
    func set(_ text: String) { lock.withLock { $0 = text } }
    var value: String { lock.withLock { $0 } }
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
