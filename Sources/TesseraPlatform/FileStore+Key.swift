import CTesseraSystemShim
import Crypto
import Glibc
import Logging
import SystemPackage
import TesseraCore
import TesseraInterface
import TesseraSystem

/// The file store's key: read through its checked descriptor, made once (never replacing one),
/// and the two subkeys derived from it.
extension FileStore {
  // MARK: - The key

  var keyFix: String {
    switch keySource {
    case .file(let path): "Make it yours and private (`chmod 600 \(path)`), then retry"
    case .credential: "Check the unit's LoadCredential= or LoadCredentialEncrypted= setting, then restart tesserad"
    }
  }

  func keyProblem(_ what: String, fix: String) -> TesseraError {
    .storeUnavailable("The file store's key (\(keySource)) \(what). \(fix); nothing was deleted or overwritten.")
  }

  /// The rules the key's file is read under: the user's own key file is theirs alone, in a
  /// directory no one else can write; a systemd credential is the service manager's (root's or
  /// the user's), writable by no one else.
  var keyRules: CheckedFile.Rules {
    switch keySource {
    case .file: .secret
    case .credential: .configuration
    }
  }

  /// The key's 32 bytes, created first when it is a key file that is not there. Read through the
  /// descriptor that was checked (a FIFO put in its place is refused, never waited on).
  func readKey() throws -> Keys {
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

  func keyProblem(_ problem: CheckedFile.Problem) -> TesseraError {
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
  func existingKey(_ path: String) throws -> [UInt8] {
    do { return try CheckedFile.read(path, limit: 4096, rules: keyRules) } catch { throw keyProblem(error) }
  }

  /// A new key file: its directory made 0700; 32 random bytes written 0600 (O_EXCL) to a
  /// temporary file and fsynced, then put in place in a way that never replaces a key: a hard
  /// link, or where the file system has none, renameat2's RENAME_NOREPLACE. The key file is whole
  /// or absent, even if tesserad is killed meanwhile, and a key made meanwhile by another process
  /// wins (it is read instead), so two tesserads starting at once use one key. Then the
  /// directories are fsynced.
  func createKey(_ path: String) throws -> [UInt8] {
    let parent = Files.directory(of: path)
    let made: [String]
    do { made = try Files.makeDirectories(parent) } catch {
      throw keyProblem("could not be created (\(error.errno))", fix: "Make \(parent) yours and writable")
    }
    var key = SymmetricKey(size: .bits256).withUnsafeBytes { Array($0) }
    let temporary = path + ".\(UInt64.random(in: 0...UInt64.max))" + Self.temporarySuffix
    do { try Files.writeNew(temporary, key) } catch {
      for i in key.indices { key[i] = 0 }
      throw error.step == .create
        ? keyProblem("could not be created (\(error.errno))", fix: "Make \(parent) yours and writable")
        : keyProblem("could not be written (\(error.errno))", fix: "Free some space, or make \(parent) writable")
    }
    // Made here: gone once the key is in place (linked or renamed), or given up.
    defer { _ = unlink(temporary) }
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
}
