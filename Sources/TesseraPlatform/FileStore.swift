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
  private let logger: Logger
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
      kind: StatusReport.StoreKind.file, path: directory, key: keySource.description,
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

  /// A temporary file beside the target: written, fsynced, renamed over it, and the directory
  /// fsynced, so the record is either the old one or the new one, and stays after a power cut.
  private func writeAtomically(_ name: String, _ bytes: [UInt8]) throws {
    let target = directory + "/" + name
    // A name of its own: a write never opens, or renames into place, another's temporary file.
    // (One killed before its rename is removed at the next load.)
    let temporary = target + ".\(UInt64.random(in: 0...UInt64.max))" + Self.temporarySuffix
    do {
      try Files.writeDurably(target, bytes, temporary: temporary)
    } catch {
      if error.step == .syncDirectory { throw notDurable(error.errno) }
      if error.errno == .noSuchFileOrDirectory, access(directory, F_OK) != 0 {
        // Removed while tesserad ran: what it held is in memory only. Not made again here (a
        // store holding only the changes from now on would lose the rest at the next start).
        throw Self.directoryGone(directory)
      }
      let what =
        switch error.step {
        case .create: "create"
        case .write: "write"
        case .replace, .syncDirectory: "replace"
        }
      let advice =
        error.errno == .noSpace || error.errno == .diskQuotaExceeded
        ? "Free some space on its file system, then retry."
        : "Check that \(directory) is yours and writable (`chmod 700`), then retry."
      throw TesseraError.storeUnavailable("Cannot \(what) the store record \(target) (\(error.errno)). \(advice)")
    }
  }

  private func notDurable(_ code: Errno) -> TesseraError {
    .storeUnavailable(
      "Cannot make the file store's changes durable (fsync of \(directory): \(code)). Check the file system, then retry."
    )
  }

  private func syncDirectory() throws {
    do { try Files.syncDirectory(directory) } catch {
      if error.call.hasPrefix("open") { throw unreadableDirectory(error.errno) }
      throw notDurable(error.errno)
    }
  }

  // MARK: - The directory

  /// The error for a store directory removed while tesserad runs (never made again then).
  static func directoryGone(_ directory: String) -> TesseraError {
    .storeUnavailable(
      "The file store's directory \(directory) is gone (removed while tesserad ran); changes are kept in memory and retried. "
        + "Put the directory back, or restart tesserad to start with a new, empty store (every account then signs in again)."
    )
  }

  /// Makes the directory and its missing parents, 0700.
  private func makeDirectory() throws {
    do { try Files.makeDirectories(directory) } catch {
      throw TesseraError.storeUnavailable(
        "Cannot create the file store's directory \(directory) (\(error.errno)). Create it yourself (`mkdir -p -m 700 \(directory)`), then retry."
      )
    }
  }

  /// The directory must be a directory of this user's that no one else can write, and readable.
  private func checkDirectory() throws {
    var info = stat()
    guard stat(directory, &info) == 0 else {
      let code = Errno(rawValue: Glibc.errno)
      if code == .noSuchFileOrDirectory { return }  // made at the next load
      throw unreadableDirectory(code)
    }
    guard info.st_mode & S_IFMT == S_IFDIR else {
      throw TesseraError.storeUnavailable(
        "The file store's directory \(directory) is not a directory. Move it aside, then retry.")
    }
    if info.st_uid != geteuid() {
      throw TesseraError.storeUnavailable(
        "The file store's directory \(directory) belongs to another user (uid \(info.st_uid)), who could read or replace its records. "
          + "Make it yours (`chown -R` it to yourself) or move it aside, then retry.")
    }
    if info.st_mode & (S_IWGRP | S_IWOTH) != 0 {
      throw TesseraError.storeUnavailable(
        "The file store's directory \(directory) is writable by other users (mode \(String(info.st_mode & 0o7777, radix: 8))), "
          + "who could replace or remove its records. Run `chmod 700 \(directory)`, then retry.")
    }
    if access(directory, R_OK | W_OK | X_OK) != 0 {
      throw unreadableDirectory(Errno(rawValue: Glibc.errno))
    }
  }

  private func unreadableDirectory(_ code: Errno) -> TesseraError {
    .storeUnavailable(
      "Cannot read the file store's directory \(directory) (\(code)). Make it yours and usable (`chmod 700 \(directory)`), then retry; "
        + "nothing was changed.")
  }

  // MARK: - The key

  private var keyFix: String {
    switch keySource {
    case .file(let path): "Make it yours and private (`chmod 600 \(path)`), then retry"
    case .credential: "Check the unit's LoadCredential= or LoadCredentialEncrypted= setting, then restart tesserad"
    }
  }

  private func keyProblem(_ what: String, fix: String) -> TesseraError {
    .storeUnavailable("The file store's key (\(keySource)) \(what). \(fix); nothing was deleted or overwritten.")
  }

  /// The rules the key's file is read under: the user's own key file is theirs alone, in a
  /// directory no one else can write; a systemd credential is the service manager's (root's or
  /// the user's), writable by no one else.
  private var keyRules: CheckedFile.Rules {
    switch keySource {
    case .file: .secret
    case .credential: .configuration
    }
  }

  /// The key's 32 bytes, created first when it is a key file that is not there. Read through the
  /// descriptor that was checked (a FIFO put in its place is refused, never waited on).
  private func readKey() throws -> Keys {
    let path = keySource.path
    var bytes: [UInt8]
    do {
      bytes = try CheckedFile.read(path, limit: 4096, rules: keyRules)
    } catch {
      guard error.errno == .noSuchFileOrDirectory, case .file = keySource else { throw keyProblem(error) }
      bytes = try createKey(path)
    }
    defer { for i in bytes.indices { bytes[i] = 0 } }
    guard bytes.count == Self.keyBytes else {
      throw keyProblem(
        "holds \(bytes.count) bytes, not \(Self.keyBytes)",
        fix: "Put the store's own key back (32 random bytes)")
    }
    return Self.derive(SymmetricKey(data: bytes))
  }

  private func keyProblem(_ problem: CheckedFile.Problem) -> TesseraError {
    switch problem {
    case .system(let code): keyProblem("cannot be read (\(code))", fix: keyFix)
    case .mode(let mode) where mode & 0o077 != 0 && keyRules.forbiddenModeBits == 0o077:
      keyProblem(
        "can be read or changed by other users (mode \(String(mode & 0o7777, radix: 8)))", fix: keyFix)
    case .directoryOwner(let directory, _), .directoryMode(let directory, _):
      keyProblem("\(problem)", fix: "Keep it in a directory only you can write (`chmod 700 \(directory)`)")
    default: keyProblem("\(problem)", fix: keyFix)
    }
  }

  /// The key another process made first, read as any key is.
  private func existingKey(_ path: String) throws -> [UInt8] {
    do { return try CheckedFile.read(path, limit: 4096, rules: keyRules) } catch { throw keyProblem(error) }
  }

  /// A new key file: its directory made 0700; 32 random bytes written 0600 (O_EXCL) to a
  /// temporary file and fsynced, then put in place in a way that never replaces a key: a hard
  /// link, or where the file system has none, renameat2's RENAME_NOREPLACE. The key file is whole
  /// or absent, even if tesserad is killed meanwhile, and a key made meanwhile by another process
  /// wins (it is read instead), so two tesserads starting at once use one key. Then the
  /// directories are fsynced.
  private func createKey(_ path: String) throws -> [UInt8] {
    let parent = Files.directory(of: path)
    let made: [String]
    do { made = try Files.makeDirectories(parent) } catch {
      throw keyProblem("could not be created (\(error.errno))", fix: "Make \(parent) yours and writable")
    }
    var key = SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) }
    let temporary = path + ".\(UInt64.random(in: 0...UInt64.max))" + Self.temporarySuffix
    let fd: FileDescriptor
    do {
      fd = try FileDescriptor.open(
        FilePath(temporary), .writeOnly, options: [.create, .exclusiveCreate, .closeOnExec, .noFollow],
        permissions: [.ownerReadWrite])
    } catch {
      throw keyProblem("could not be created (\(error))", fix: "Make \(parent) yours and writable")
    }
    defer { _ = unlink(temporary) }
    do {
      try fd.closeAfter {
        try Syscall.writeAll(fd, key)
        try Syscall.check("fsync") { fsync(fd.rawValue) }
      }
    } catch {
      throw keyProblem("could not be written (\(error))", fix: "Free some space, or make \(parent) writable")
    }
    var code: Errno?
    if !linksKey {
      code = .notPermitted
    } else if link(temporary, path) != 0 {
      code = Errno(rawValue: Glibc.errno)
    }
    // A file system with no hard links (a CIFS home): renamed into place, but only where no key
    // is (RENAME_NOREPLACE is atomic: of two tesserads, one puts its key there, the other finds it).
    if let linkError = code, Self.lacksHardLinks(linkError) {
      code = tessera_rename_noreplace(temporary, path) == 0 ? nil : Errno(rawValue: Glibc.errno)
      if code == .invalidArgument || code == .notSupported {
        for i in key.indices { key[i] = 0 }
        throw keyProblem(
          "could not be created: the file system of \(parent) has neither hard links nor a rename that keeps an existing file",
          fix:
            "Point XDG_CONFIG_HOME at a local file system, or give the key as a systemd credential (tessera-store-key)")
      }
    }
    if let code {
      for i in key.indices { key[i] = 0 }
      if code == .fileExists { return try existingKey(path) }
      throw keyProblem("could not be created (\(code))", fix: "Make \(parent) yours and writable")
    }
    // The new key's directory, and each directory made for it (in the one above it).
    for directory in [parent] + made.reversed().map(Files.directory(of:)) {
      try? Files.syncDirectory(directory)
    }
    logger.notice("Created the file store's key", metadata: ["path": "\(path)"])
    return key
  }

  static func lacksHardLinks(_ code: Errno) -> Bool {
    code == .notPermitted || code == .notSupported || code == .notSupportedOnSocket || code == .noFunction
  }

  package static func derive(_ key: SymmetricKey) -> Keys {
    let salt = Array("tessera file store".utf8)
    return Keys(
      seal: HKDF<SHA256>.deriveKey(
        inputKeyMaterial: key, salt: salt, info: Array("seal records, version 1".utf8), outputByteCount: 32),
      name: HKDF<SHA256>.deriveKey(
        inputKeyMaterial: key, salt: salt, info: Array("name records, version 1".utf8), outputByteCount: 32))
  }

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
