import CTesseraSystemShim
import Crypto
import Dispatch
import Glibc
import Logging
import Synchronization
import SystemPackage
import TesseraCore
import TesseraInterface
import TesseraSystem

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// The store without a desktop keyring (config.toml `store = "file"`, or `auto` with no Secret
/// Service): every item the keyring would hold (the same attributes and secret JSON,
/// docs/storage.md) is a file `DIR/<name>.item`, sealed with AES-256-GCM.
///
/// - The key: 32 random bytes in `$XDG_CONFIG_HOME/tessera/store.key` (made 0600 on first use, with
///   O_EXCL), or a systemd credential `$CREDENTIALS_DIRECTORY/tessera-store-key` (read only).
///   HKDF-SHA256 derives two subkeys from it: one seals, one names.
/// - A record's name is HMAC-SHA256 (naming subkey) of its identity: its attributes, canonically
///   encoded. Names leak nothing; the same attributes always give the same file, so a save
///   replaces, as in the keyring.
/// - A record is `TSTORE1\n` and AES.GCM's combined box (nonce, ciphertext, tag) of the JSON
///   {attributes, label, secret}, with the record's name as associated data: it opens only under
///   its own name, so no record can be moved into another's place. The attributes inside must
///   hash to that name too.
/// - `key-check` holds a sealed constant: it tells a wrong key (nothing opens) from damaged records.
/// - Writes: a temporary file in the directory, write, fsync, rename, fsync of the directory.
///
/// Every file operation runs on one serial dispatch queue of its own, never on Swift's cooperative
/// pool; `probe` runs on another, never behind a call that may hang.
public final class FileStore: SecretStore, @unchecked Sendable {
  // Invariant for @unchecked Sendable: `keys` and `index` are touched only on `queue`; `shared` is
  // a Locked value; everything else is immutable after init.

  /// Where the key comes from.
  public enum KeySource: Sendable, Equatable, CustomStringConvertible {
    /// A key file of the user's: created (32 random bytes, 0600, O_EXCL) when it is not there.
    case file(String)
    /// A systemd credential (`LoadCredential=`/`LoadCredentialEncrypted=`): read, never created.
    case credential(String)

    public var path: String {
      switch self {
      case .file(let path), .credential(let path): path
      }
    }

    public var description: String {
      switch self {
      case .file(let path): path
      case .credential(let path): "systemd credential \(path)"
      }
    }
  }

  public let directory: String
  public let keySource: KeySource
  let logger: Logger
  private let queue = DispatchQueue(label: "tessera.file-store")
  private let probeQueue = DispatchQueue(label: "tessera.file-store-probe", attributes: .concurrent)

  package struct Keys {
    package var seal: SymmetricKey
    var name: SymmetricKey
  }

  /// On `queue`: the keys once they opened the store, and the records by file name.
  private var keys: Keys?
  private var index: [String: StoredItem] = [:]
  /// A load succeeded in this process: the directory is not made again if it goes.
  private var loadedOnce = false

  private struct Shared {
    var notes: [String] = []
    /// Why the last load failed (a wrong key, say): probe says it too.
    var failure: TesseraError?
  }
  private let shared = Locked(Shared())

  static let magic = Array("TSTORE1\n".utf8)
  package static let keyCheckName = "key-check"
  package static let keyCheckText = Array("tessera file store key check, version 1".utf8)
  package static let recordSuffix = ".item"
  static let corruptSuffix = ".corrupt"
  static let temporarySuffix = ".tmp"
  /// A record larger than this is not one of ours (a secret JSON is a few KB at most).
  static let recordLimit = 1 << 20
  public static let keyBytes = 32
  /// The credential's name under $CREDENTIALS_DIRECTORY.
  public static let credentialName = "tessera-store-key"

  /// Whether a new key is put in place with a hard link (false: as on a file system without
  /// them, for the tests of the other way).
  package let linksKey: Bool

  public convenience init(directory: String, key: KeySource, logger: Logger = Logger(label: "tesserad")) {
    self.init(directory: directory, key: key, logger: logger, linksKey: true)
  }

  package init(directory: String, key: KeySource, logger: Logger = Logger(label: "tesserad"), linksKey: Bool) {
    self.directory = directory
    self.keySource = key
    self.logger = logger
    self.linksKey = linksKey
  }

  /// `$XDG_STATE_HOME/tessera/store` (else `~/.local/state/tessera/store`), and the key: the
  /// systemd credential when `$CREDENTIALS_DIRECTORY/tessera-store-key` exists, else
  /// `$XDG_CONFIG_HOME/tessera/store.key` (else `~/.config/tessera/store.key`). Nil without HOME.
  public static func defaultLocation(environment: [String: String]) -> (directory: String, key: KeySource)? {
    func absolute(_ name: String) -> String? { environment[name].flatMap { $0.hasPrefix("/") ? $0 : nil } }
    let home = absolute("HOME")
    guard let state = absolute("XDG_STATE_HOME") ?? home.map({ $0 + "/.local/state" }) else { return nil }
    if let credentials = absolute("CREDENTIALS_DIRECTORY") {
      let path = credentials + "/" + credentialName
      if access(path, F_OK) == 0 { return (state + "/tessera/store", .credential(path)) }
    }
    guard let config = absolute("XDG_CONFIG_HOME") ?? home.map({ $0 + "/.config" }) else { return nil }
    return (state + "/tessera/store", .file(config + "/tessera/store.key"))
  }

  public var storeDescription: StoreDescription {
    StoreDescription(
      kind: .file, path: directory, key: keySource.description,
      notes: shared.withLock { $0.notes })
  }

  private func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
      queue.async { continuation.resume(with: Result { try body() }) }
    }
  }

  // MARK: - SecretStore

  public func loadAll() async throws -> [StoredItem] {
    try await run { try self.loadNow() }
  }

  public func save(_ item: StoredItem) async throws {
    try await run {
      let keys = try self.ready()
      try self.saveNow(item, keys)
    }
  }

  public func delete(matching attributes: [String: String]) async throws {
    try await run {
      _ = try self.ready()
      try self.deleteNow(attributes)
    }
  }

  /// In order, in one hop to the queue.
  public func apply(_ operations: [TokenCache.StoreOperation]) async throws {
    try await run {
      let keys: Keys
      do { keys = try self.ready() } catch { throw StoreBatchError(completed: 0, error: error) }
      for (index, operation) in operations.enumerated() {
        do {
          switch operation {
          case .save(let item): try self.saveNow(item, keys)
          case .delete(let attributes): try self.deleteNow(attributes)
          }
        } catch {
          throw StoreBatchError(completed: index, error: error)
        }
      }
    }
  }

  /// Whether the directory and the key are usable now: the directory is there, the user's and
  /// writable by no one else, and readable; the key is there (or can be made); and the last load
  /// did not fail (a wrong key).
  public func probe(withinSeconds seconds: Double) async throws {
    try await withCheckedThrowingContinuation { (done: CheckedContinuation<Void, any Error>) in
      probeQueue.async {
        done.resume(
          with: Result {
            if let failure = self.shared.withLock({ $0.failure }) { throw failure }
            if access(self.directory, F_OK) == 0 { try self.checkDirectory() }
            if access(self.keySource.path, F_OK) == 0, access(self.keySource.path, R_OK) != 0 {
              throw self.keyProblem("cannot be read (\(Errno(rawValue: Glibc.errno)))", fix: self.keyFix)
            }
            if case .credential(let path) = self.keySource, access(path, F_OK) != 0 {
              throw self.keyProblem("is not there any more", fix: self.keyFix)
            }
          })
      }
    }
  }

  /// Whether the directory holds records (auto keeps using a file store that does). On the queue.
  public func holdsRecords() async -> Bool {
    // Leftovers stay: another tesserad may be writing (this one may yet find the name taken).
    (try? await run { (try? self.listDirectory(removingLeftovers: false))?.records.isEmpty == false }) ?? false
  }

  // MARK: - Loading

  /// The keys, after loading the store once (which checks them against it).
  private func ready() throws -> Keys {
    try checkDirectory()
    if let keys { return keys }
    _ = try loadNow()
    guard let keys else { throw TesseraError.storeUnavailable("The file store \(directory) could not be loaded.") }
    return keys
  }

  private func loadNow() throws -> [StoredItem] {
    do {
      let items = try loadOrThrow()
      shared.withLock { $0.failure = nil }
      return items
    } catch {
      keys = nil
      let failure = TesseraError.wrap(error)
      shared.withLock { $0.failure = failure }
      throw failure
    }
  }

  private struct Listing {
    var records: [String] = []
    var hasKeyCheck = false
  }

  /// The directory's records and whether it has a key check; leftover temporary files go.
  private func listDirectory(removingLeftovers: Bool = true) throws -> Listing {
    let names: [String]
    do { names = try Files.names(in: directory) } catch {
      if error.errno == .noSuchFileOrDirectory { return Listing() }
      throw unreadableDirectory(error.errno)
    }
    var listing = Listing()
    for name in names {
      if name == Self.keyCheckName {
        listing.hasKeyCheck = true
      } else if Self.isRecordName(name) {
        listing.records.append(name)
      } else if removingLeftovers && name.hasSuffix(Self.temporarySuffix) {
        _ = unlink(directory + "/" + name)  // a write killed before its rename: never a record
      }
    }
    listing.records.sort()
    return listing
  }

  package static func isRecordName(_ name: String) -> Bool {
    guard name.hasSuffix(recordSuffix) else { return false }
    let stem = name.utf8.dropLast(recordSuffix.utf8.count)
    return stem.count == 64 && stem.allSatisfy { (48...57).contains($0) || (97...102).contains($0) }
  }

  private func loadOrThrow() throws -> [StoredItem] {
    // Gone after this process loaded it: removed while tesserad ran. What it held is in memory
    // only; an empty store made here would have a move or a write take it for all there is.
    if loadedOnce, access(directory, F_OK) != 0 { throw Self.directoryGone(directory) }
    try makeDirectory()
    try checkDirectory()
    let keys = try readKey()
    let listing = try listDirectory()
    var keyCheckOpens: Bool?
    if listing.hasKeyCheck {
      let bytes = try readInStore(Self.keyCheckName)
      keyCheckOpens = (try? Self.open(bytes, aad: Self.aad(Self.keyCheckName), keys.seal)) == Self.keyCheckText
    }
    var opened: [String: StoredItem] = [:]
    var damaged: [String] = []
    for name in listing.records {
      let bytes = try readInStore(name)
      if let item = Self.openRecord(bytes, name: name, keys) {
        opened[name] = item
      } else {
        damaged.append(name)
      }
    }
    // Nothing opens, while something is there to open: the key is not this store's. Nothing is
    // set aside, deleted or overwritten: the right key opens everything again.
    if keyCheckOpens != true && opened.isEmpty && (keyCheckOpens == false || !damaged.isEmpty) {
      throw TesseraError.storeUnavailable(
        "The file store's key (\(keySource)) does not open the store \(directory): it is not the key its records were sealed with "
          + "(the key was replaced, or another credential given). Put the right key back, then retry; nothing was deleted or overwritten. "
          + "To start afresh instead (every account then signs in again), move \(directory) aside.")
    }
    if keyCheckOpens != true {
      try writeAtomically(Self.keyCheckName, Self.seal(Self.keyCheckText, aad: Self.aad(Self.keyCheckName), keys.seal))
    }
    for name in damaged {
      let aside = name + Self.corruptSuffix
      let moved = rename(directory + "/" + name, directory + "/" + aside) == 0
      let note =
        moved
        ? "The store record \(directory)/\(name) could not be opened (damaged, truncated, or moved from another record's place): set aside as \(aside). "
          + "The item it held is lost; if an account needs it, `tessera status` says so: sign in again."
        : "The store record \(directory)/\(name) could not be opened (damaged or truncated) and could not be set aside "
          + "(\(Errno(rawValue: Glibc.errno))); it is skipped."
      logger.error("\(note)")
      shared.withLock { $0.notes.append(note) }
    }
    if !damaged.isEmpty { try syncDirectory() }
    self.keys = keys
    index = opened
    loadedOnce = true
    logger.info(
      "Opened the file store",
      metadata: ["directory": "\(directory)", "records": "\(opened.count)", "key": "\(keySource)"])
    return listing.records.compactMap { opened[$0] }
  }

  private func readInStore(_ name: String) throws -> [UInt8] {
    do {
      return try Syscall.readFile(directory + "/" + name, limit: Self.recordLimit, followLinks: false)
    } catch {
      if error.errno == .fileTooLarge { return [] }  // not a record of ours: set aside as damaged
      throw TesseraError.storeUnavailable(
        "Cannot read the store record \(directory)/\(name) (\(error.errno)). Make it yours and readable (`chmod 600`), then retry; nothing was changed."
      )
    }
  }

  // MARK: - Writing

  private func saveNow(_ item: StoredItem, _ keys: Keys) throws {
    let name = Self.name(item.attributes, keys)
    let record = Record(attributes: item.attributes, label: item.label, secret: item.secret)
    let plain: [UInt8]
    do { plain = Array(try Self.encoder.encode(record)) } catch {
      throw TesseraError.storeUnavailable("Cannot encode a store record: \(error)")
    }
    try writeAtomically(name, Self.seal(plain, aad: Self.aad(name), keys.seal))
    index[name] = item
  }

  private func deleteNow(_ attributes: [String: String]) throws {
    let doomed = index.filter { _, item in attributes.allSatisfy { item.attributes[$0.key] == $0.value } }.map(\.key)
    guard !doomed.isEmpty else { return }
    for name in doomed.sorted() {
      if unlink(directory + "/" + name) != 0 {
        let code = Errno(rawValue: Glibc.errno)
        if code != .noSuchFileOrDirectory {
          throw TesseraError.storeUnavailable(
            "Cannot delete the store record \(directory)/\(name) (\(code)). Check that \(directory) is yours and writable, then retry."
          )
        }
      }
      index[name] = nil
    }
    try syncDirectory()
  }

}
