import Foundation
import Glibc
import TesseraCore
import TesseraInterface
import XCTest

@testable import TesseraPlatform

/// The file store (store = "file") against a temporary directory: sealed, private, atomic, and
/// each kind of damage named without losing anything else.
final class FileStoreTests: XCTestCase {
  var root = ""
  var directory: String { root + "/state/tessera/store" }
  var keyPath: String { root + "/config/tessera/store.key" }

  override func setUpWithError() throws {
    var template = Array("/tmp/tessera-filestore-XXXXXX".utf8CString)
    let made = template.withUnsafeMutableBufferPointer { mkdtemp($0.baseAddress!) }
    root = String(cString: try XCTUnwrap(made))
  }

  override func tearDownWithError() throws {
    _ = chmod(directory, 0o700)
    try? FileManager.default.removeItem(atPath: root)
  }

  func store(key: FileStore.KeySource? = nil) -> FileStore {
    FileStore(directory: directory, key: key ?? .file(keyPath))
  }

  static func item(_ account: String, kind: String = "refresh_token", secret: String) -> StoredItem {
    StoredItem(
      attributes: [
        "tessera_schema": "1", "kind": kind, "account_id": account, "environment": "idp.example.com",
        "client_id": "app",
      ],
      secret: "{\"secret\":\"\(secret)\"}", label: "Tessera refresh token for app (idp.example.com)")
  }

  func records() -> [String] {
    ((try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []).filter { $0.hasSuffix(".item") }.sorted()
  }

  func mode(_ path: String) -> mode_t {
    var info = stat()
    XCTAssertEqual(stat(path, &info), 0, path)
    return info.st_mode & 0o7777
  }

  func bytes(_ path: String) throws -> [UInt8] { Array(try Data(contentsOf: URL(fileURLWithPath: path))) }

  func write(_ path: String, _ bytes: [UInt8]) throws { try Data(bytes).write(to: URL(fileURLWithPath: path)) }

  func snapshot() throws -> [String: [UInt8]] {
    var all: [String: [UInt8]] = [:]
    for name in try FileManager.default.contentsOfDirectory(atPath: directory) {
      all[name] = try bytes(directory + "/" + name)
    }
    return all
  }

  func expectStoreError(
    _ body: () async throws -> Void, contains: [String], file: StaticString = #filePath, line: UInt = #line
  ) async {
    do {
      try await body()
      XCTFail("expected StoreUnavailable", file: file, line: line)
    } catch {
      let error = TesseraError.wrap(error)
      XCTAssertEqual(error.code, .storeUnavailable, "\(error)", file: file, line: line)
      for text in contains { XCTAssertTrue(error.message.contains(text), "\(error.message)", file: file, line: line) }
    }
  }

  func testItemsRoundTripAcrossInstancesAndDeleteMatchesOnAttributes() async throws {
    let first = store()
    let alice = Self.item("alice", secret: "rt-alice")
    let bob = Self.item("bob", secret: "rt-bob")
    let aliceAccount = Self.item("alice", kind: "account", secret: "acct-alice")
    let got1 = try await first.loadAll()
    XCTAssertEqual(got1, [])
    try await first.save(alice)
    try await first.apply([.save(bob), .save(aliceAccount)])
    XCTAssertEqual(records().count, 3)

    let second = store()
    let loaded = try await second.loadAll()
    XCTAssertEqual(Set(loaded.map(\.secret)), [alice.secret, bob.secret, aliceAccount.secret])
    XCTAssertEqual(loaded.first { $0.secret == alice.secret }, alice, "attributes, secret and label come back")

    try await second.delete(matching: ["tessera_schema": "1", "account_id": "alice"])
    let got2 = try await store().loadAll()
    XCTAssertEqual(got2, [bob])
    XCTAssertEqual(records().count, 1)
    XCTAssertEqual(second.storeDescription.kind, .file)
    XCTAssertEqual(second.storeDescription.path, directory)
  }

  func testTheDirectoryIs0700TheFilesAndTheKey0600() async throws {
    try await store().save(Self.item("alice", secret: "rt"))
    XCTAssertEqual(mode(directory), 0o700)
    XCTAssertEqual(mode(root + "/config/tessera"), 0o700)
    XCTAssertEqual(mode(keyPath), 0o600)
    for name in try FileManager.default.contentsOfDirectory(atPath: directory) {
      XCTAssertEqual(mode(directory + "/" + name), 0o600, name)
    }
  }

  func testNoSecretAttributeOrLabelIsReadableInTheFiles() async throws {
    let secret = "refresh-token-0123456789-abcdefghij"
    try await store().save(Self.item("alice@example.test", secret: secret))
    for (name, content) in try snapshot() {
      let text = String(decoding: content, as: UTF8.self)
      for plain in [secret, "alice@example.test", "idp.example.com", "refresh_token", "Tessera refresh token"] {
        XCTAssertFalse(text.contains(plain), "\(name) holds \(plain)")
        XCTAssertFalse(name.contains(plain), "the name \(name) tells \(plain)")
      }
    }
  }

  func testRecordsSwappedIntoEachOthersPlaceDoNotOpen() async throws {
    let first = store()
    try await first.save(Self.item("alice", secret: "rt-alice"))
    try await first.save(Self.item("bob", secret: "rt-bob"))
    let carol = Self.item("carol", secret: "rt-carol")
    try await first.save(carol)
    let names = records()
    XCTAssertEqual(names.count, 3)
    // Carol's record: the one her delete removes.
    let reopened = store()
    _ = try await reopened.loadAll()
    try await reopened.delete(matching: ["account_id": "carol"])
    let carolName = Set(names).subtracting(records()).first!
    try await reopened.save(carol)
    let swap = names.filter { $0 != carolName }
    let a = try bytes(directory + "/" + swap[0])
    let b = try bytes(directory + "/" + swap[1])
    try write(directory + "/" + swap[0], b)
    try write(directory + "/" + swap[1], a)

    let after = store()
    let got3 = try await after.loadAll()
    XCTAssertEqual(got3, [carol], "a record in another's place opens as neither")
    XCTAssertEqual(records(), [carolName])
    for name in swap {
      XCTAssertTrue(FileManager.default.fileExists(atPath: directory + "/" + name + ".corrupt"), "\(name) set aside")
    }
    XCTAssertEqual(after.storeDescription.notes.count, 2)
  }

  func testATruncatedRecordIsSetAsideAndTheOthersLoad() async throws {
    let first = store()
    for name in ["alice", "bob", "carol"] { try await first.save(Self.item(name, secret: "rt-\(name)")) }
    let victim = records()[1]
    let whole = try bytes(directory + "/" + victim)
    try write(directory + "/" + victim, Array(whole.prefix(whole.count / 2)))

    let after = store()
    let loaded = try await after.loadAll()
    XCTAssertEqual(loaded.count, 2)
    XCTAssertFalse(records().contains(victim))
    XCTAssertEqual(try bytes(directory + "/" + victim + ".corrupt"), Array(whole.prefix(whole.count / 2)))
    XCTAssertEqual(after.storeDescription.notes.count, 1)
    XCTAssertTrue(after.storeDescription.notes[0].contains(victim + ".corrupt"), after.storeDescription.notes[0])
    // The store goes on: writes work and the next start loads the two without a note.
    try await after.save(Self.item("dave", secret: "rt-dave"))
    let again = store()
    let got4 = try await again.loadAll().count
    XCTAssertEqual(got4, 3)
    XCTAssertEqual(again.storeDescription.notes, [])
  }

  /// Every byte of a sealed record, flipped in turn (its lowest bit, then its highest): the
  /// record never opens, as itself or as anything else; it is set aside and named, and the others
  /// load. Nothing in a record (header, nonce, ciphertext, tag) is outside the seal.
  func testAFlippedBitAnywhereInARecordIsSetAsideAndTheOthersLoad() async throws {
    let first = store()
    for name in ["alice", "bob", "carol"] { try await first.save(Self.item(name, secret: "rt-\(name)")) }
    let victim = records()[1]
    let path = directory + "/" + victim
    let whole = try bytes(path)
    XCTAssertGreaterThan(whole.count, 64)
    let expected = Set(try await store().loadAll().map(\.attributes))
    for index in whole.indices {
      for bit: UInt8 in [0x01, 0x80] {
        var flipped = whole
        flipped[index] ^= bit
        try write(path, flipped)
        let after = store()
        let loaded = try await after.loadAll()
        XCTAssertEqual(loaded.count, 2, "byte \(index) ^ \(bit): the record opened")
        XCTAssertTrue(Set(loaded.map(\.attributes)).isSubset(of: expected), "byte \(index): opened as another item")
        XCTAssertEqual(try bytes(path + ".corrupt"), flipped, "byte \(index): set aside as it was")
        XCTAssertEqual(after.storeDescription.notes.count, 1, "byte \(index): named")
        try FileManager.default.removeItem(atPath: path + ".corrupt")
      }
    }
    try write(path, whole)
    let restored = try await store().loadAll().count
    XCTAssertEqual(restored, 3, "the record as it was opens again")
  }

  func testAWrongKeyIsNamedAndNothingIsDeletedOrOverwritten() async throws {
    let first = store()
    for name in ["alice", "bob"] { try await first.save(Self.item(name, secret: "rt-\(name)")) }
    let before = try snapshot()
    try write(keyPath, [UInt8](repeating: 7, count: 32))

    let wrong = store()
    await expectStoreError(
      { _ = try await wrong.loadAll() }, contains: [keyPath, "not the key", "nothing was deleted"])
    await expectStoreError({ try await wrong.save(Self.item("carol", secret: "x")) }, contains: [keyPath])
    await expectStoreError({ try await wrong.delete(matching: ["account_id": "alice"]) }, contains: [keyPath])
    await expectStoreError({ try await wrong.probe(withinSeconds: 1) }, contains: [keyPath])
    XCTAssertEqual(try snapshot(), before, "every file as it was, none set aside")

    // Also when the key check is gone: records that do not open with a key that opens nothing.
    try FileManager.default.removeItem(atPath: directory + "/key-check")
    await expectStoreError({ _ = try await self.store().loadAll() }, contains: [keyPath])
    XCTAssertEqual(records(), before.keys.filter { $0.hasSuffix(".item") }.sorted())
  }

  func testAReplaceIsAtomicAndALeftoverTemporaryFileIsIgnored() async throws {
    let first = store()
    try await first.save(Self.item("alice", secret: "old"))
    let name = records()[0]
    // A write killed before its rename leaves NAME.N.tmp: never read, never renamed into place by
    // a later write (each has a name of its own), removed at the next load.
    let leftover = directory + "/" + name + ".12345.tmp"
    try write(leftover, [1, 2, 3])
    try await first.save(Self.item("alice", secret: "new"))
    XCTAssertEqual(records(), [name], "the same attributes replace the same file")
    let got5 = try await store().loadAll().map(\.secret)
    XCTAssertEqual(got5, ["{\"secret\":\"new\"}"])
    XCTAssertFalse(FileManager.default.fileExists(atPath: leftover))
    XCTAssertEqual(
      try FileManager.default.contentsOfDirectory(atPath: directory).filter { $0.hasSuffix(".tmp") }, [],
      "no write leaves a temporary file")
  }

  func testTheKeyFileIsCreatedOnceAndNeverReplaced() async throws {
    XCTAssertFalse(FileManager.default.fileExists(atPath: keyPath))
    try await store().save(Self.item("alice", secret: "rt"))
    let key = try bytes(keyPath)
    XCTAssertEqual(key.count, 32)
    XCTAssertEqual(mode(keyPath), 0o600)
    let keyDirectory = (keyPath as NSString).deletingLastPathComponent
    XCTAssertEqual(
      try FileManager.default.contentsOfDirectory(atPath: keyDirectory), ["store.key"],
      "written aside and linked into place: nothing else is left")
    _ = try await store().loadAll()
    XCTAssertEqual(try bytes(keyPath), key, "read, not made again")

    // Eight stores making the key at once (two tesserads, say): one key, the same for all.
    try FileManager.default.moveItem(atPath: keyPath, toPath: root + "/first.key")
    let root = self.root
    let keyPath = self.keyPath
    let made = try await withThrowingTaskGroup(of: [UInt8].self) { group in
      for index in 0..<8 {
        group.addTask {
          let store = FileStore(directory: root + "/state-\(index)", key: .file(keyPath))
          _ = try await store.loadAll()
          return try Array(Data(contentsOf: URL(fileURLWithPath: keyPath)))
        }
      }
      return try await group.reduce(into: Set<[UInt8]>()) { $0.insert($1) }
    }
    XCTAssertEqual(made.count, 1, "one key")
    XCTAssertEqual(made.first?.count, 32)
    XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: keyDirectory), ["store.key"])
    try FileManager.default.removeItem(atPath: keyPath)
    try FileManager.default.moveItem(atPath: root + "/first.key", toPath: keyPath)

    // A key file already there (made by someone else first: O_EXCL loses to it) is used as it is.
    try FileManager.default.removeItem(atPath: root + "/state")
    let given = [UInt8](repeating: 42, count: 32)
    try write(keyPath, given)
    _ = chmod(keyPath, 0o600)
    try await store().save(Self.item("bob", secret: "rt"))
    XCTAssertEqual(try bytes(keyPath), given)

    // A key others can read is refused, naming it.
    _ = chmod(keyPath, 0o644)
    await expectStoreError({ _ = try await self.store().loadAll() }, contains: [keyPath, "chmod 600"])
  }

  /// Issue 37 §5: where the file system has no hard links, the key is renamed into place with
  /// RENAME_NOREPLACE. A plain rename after a look let two starting tesserads each install a key,
  /// and one of them then sealed records the other's key could not open.
  func testWithoutHardLinksEightStoresMakingTheKeyAtOnceGetOneKey() async throws {
    let root = self.root
    let keyPath = self.keyPath
    for round in 0..<20 {
      let made = try await withThrowingTaskGroup(of: [UInt8].self) { group in
        for index in 0..<8 {
          group.addTask {
            let store = FileStore(
              directory: root + "/state-\(round)-\(index)", key: .file(keyPath), linksKey: false)
            try await store.save(Self.item("alice", secret: "rt-\(index)"))
            return try Array(Data(contentsOf: URL(fileURLWithPath: keyPath)))
          }
        }
        return try await group.reduce(into: Set<[UInt8]>()) { $0.insert($1) }
      }
      XCTAssertEqual(made.count, 1, "round \(round): one key for every store")
      // Every store's records open with the one key there is.
      for index in 0..<8 {
        let reread = FileStore(directory: root + "/state-\(round)-\(index)", key: .file(keyPath))
        let items = try await reread.loadAll()
        XCTAssertEqual(
          items.map(\.secret), [Self.item("alice", secret: "rt-\(index)").secret], "round \(round), store \(index)")
      }
      let keyDirectory = (keyPath as NSString).deletingLastPathComponent
      XCTAssertEqual(try FileManager.default.contentsOfDirectory(atPath: keyDirectory), ["store.key"])
      try FileManager.default.removeItem(atPath: keyPath)
    }
  }

  /// Issue 37 §5: the key is checked on the descriptor read, so a FIFO in its place is refused at
  /// once (it hung the store's queue), and a key linked into a directory others can write is
  /// refused though the link itself is private.
  func testAKeyThatIsAFIFOOrLinkedIntoASharedDirectoryIsRefused() async throws {
    try FileManager.default.createDirectory(
      atPath: (keyPath as NSString).deletingLastPathComponent, withIntermediateDirectories: true)
    XCTAssertEqual(mkfifo(keyPath, 0o600), 0)
    await expectStoreError(
      { _ = try await self.store().loadAll() }, contains: [keyPath, "is a FIFO, not a regular file"])
    try FileManager.default.removeItem(atPath: keyPath)

    let shared = root + "/shared"
    try FileManager.default.createDirectory(atPath: shared, withIntermediateDirectories: true)
    _ = chmod(shared, 0o777)
    try write(shared + "/store.key", [UInt8](repeating: 7, count: 32))
    _ = chmod(shared + "/store.key", 0o600)
    try FileManager.default.createSymbolicLink(atPath: keyPath, withDestinationPath: shared + "/store.key")
    await expectStoreError(
      { _ = try await self.store().loadAll() }, contains: [keyPath, "writable by other users", "chmod 700 \(shared)"])
    _ = chmod(shared, 0o700)
    _ = try await store().loadAll()
  }

  func testASystemdCredentialIsUsedWhenThereAndNeverCreated() async throws {
    let credentials = root + "/credentials"
    try FileManager.default.createDirectory(atPath: credentials, withIntermediateDirectories: true)
    let environment = [
      "HOME": root + "/home", "XDG_STATE_HOME": root + "/state", "XDG_CONFIG_HOME": root + "/config",
      "CREDENTIALS_DIRECTORY": credentials,
    ]
    // No credential file: the user's key file.
    XCTAssertEqual(FileStore.defaultLocation(environment: environment)?.key, .file(keyPath))
    XCTAssertEqual(FileStore.defaultLocation(environment: environment)?.directory, directory)
    let credential = credentials + "/tessera-store-key"
    try write(credential, [UInt8](repeating: 9, count: 32))
    let location = try XCTUnwrap(FileStore.defaultLocation(environment: environment))
    XCTAssertEqual(location.key, .credential(credential))
    let viaCredential = FileStore(directory: location.directory, key: location.key)
    try await viaCredential.save(Self.item("alice", secret: "rt"))
    XCTAssertFalse(FileManager.default.fileExists(atPath: keyPath), "no key file made beside the credential")
    let got6 = try await FileStore(directory: directory, key: .credential(credential)).loadAll().count
    XCTAssertEqual(got6, 1)
    XCTAssertTrue(viaCredential.storeDescription.key?.contains("credential") == true)

    // A missing credential is never created: a named error.
    let missing = credentials + "/other"
    await expectStoreError(
      { _ = try await FileStore(directory: self.directory, key: .credential(missing)).loadAll() }, contains: [missing])
    XCTAssertFalse(FileManager.default.fileExists(atPath: missing))
    // Defaults without XDG variables.
    XCTAssertEqual(
      FileStore.defaultLocation(environment: ["HOME": "/home/u"])?.directory, "/home/u/.local/state/tessera/store")
    XCTAssertEqual(
      FileStore.defaultLocation(environment: ["HOME": "/home/u"])?.key, .file("/home/u/.config/tessera/store.key"))
  }

  func testADirectoryOthersCanWriteOrNobodyCanReadIsRefusedByName() async throws {
    let first = store()
    try await first.save(Self.item("alice", secret: "rt"))
    _ = chmod(directory, 0o770)
    await expectStoreError({ _ = try await self.store().loadAll() }, contains: [directory, "writable by other users"])
    await expectStoreError({ try await first.save(Self.item("bob", secret: "rt")) }, contains: ["chmod 700"])
    await expectStoreError({ try await first.probe(withinSeconds: 1) }, contains: [directory])
    _ = chmod(directory, 0o700)
    try await first.probe(withinSeconds: 1)
    if geteuid() != 0 {  // root reads any directory
      _ = chmod(directory, 0o000)
      await expectStoreError({ _ = try await self.store().loadAll() }, contains: ["Cannot read", directory])
      await expectStoreError({ try await first.probe(withinSeconds: 1) }, contains: ["Cannot read", directory])
      _ = chmod(directory, 0o700)
    }
    let got7 = try await store().loadAll().count
    XCTAssertEqual(got7, 1, "nothing lost")
  }

  /// The directory removed while tesserad runs: a write says so and what to do (the change stays
  /// in memory, retried); put back, writes go on, with no restart.
  func testADirectoryRemovedWhileRunningIsNamedAndPutBackWorksAgain() async throws {
    let running = store()
    try await running.save(Self.item("alice", secret: "rt-alice"))
    try FileManager.default.moveItem(atPath: directory, toPath: root + "/aside")
    await expectStoreError(
      { try await running.save(Self.item("bob", secret: "rt-bob")) },
      contains: [directory, "is gone", "Put the directory back", "restart tesserad"])
    XCTAssertFalse(FileManager.default.fileExists(atPath: directory), "not made again behind the user's back")
    // Nor by a load (a store move reads its source whole first): it would find an empty store.
    await expectStoreError({ _ = try await running.loadAll() }, contains: [directory, "is gone"])
    XCTAssertFalse(FileManager.default.fileExists(atPath: directory))
    try FileManager.default.moveItem(atPath: root + "/aside", toPath: directory)
    try await running.save(Self.item("bob", secret: "rt-bob"))
    let all = try await store().loadAll().count
    XCTAssertEqual(all, 2)
  }

  func testTheMemoryStoreKeepsItemsInThisProcessOnly() async throws {
    let memory = MemoryStore()
    try await memory.save(Self.item("alice", secret: "a"))
    try await memory.save(Self.item("alice", secret: "b"))
    try await memory.save(Self.item("bob", secret: "c"))
    let got8 = try await memory.loadAll().count
    XCTAssertEqual(got8, 2)
    try await memory.delete(matching: ["account_id": "alice"])
    let got9 = try await memory.loadAll().map(\.secret)
    XCTAssertEqual(got9, ["{\"secret\":\"c\"}"])
    XCTAssertEqual(memory.storeDescription.kind, .memory)
    let got10 = try await MemoryStore().loadAll()
    XCTAssertEqual(got10, [])
  }
}
