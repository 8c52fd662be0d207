import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// A fake store that says which kind it is; optionally loads as the Secret Service does (only
/// `tessera_schema` and `kind` as attributes), and fails every save after a number of them.
final class KindStore: SecretStore, Sendable {
  let base: FakeStore
  let kind: StoreKind
  let stripsAttributes: Bool
  /// Saves left before every save fails as a locked keyring does; nil: never.
  let savesLeft = Locked<Int?>(nil)
  /// Deletes left before every delete fails so; nil: never.
  let deletesLeft = Locked<Int?>(nil)
  /// Saves wait here while it is shut (a slow keyring): the move is under way meanwhile.
  let saveGate = Gate()

  init(_ base: FakeStore = FakeStore(), kind: StoreKind, stripsAttributes: Bool = false) {
    self.base = base
    self.kind = kind
    self.stripsAttributes = stripsAttributes
  }

  func loadAll() async throws -> [StoredItem] {
    let items = try await base.loadAll()
    guard stripsAttributes else { return items }
    return items.map {
      StoredItem(
        attributes: ["tessera_schema": "1", "kind": $0.attributes["kind"] ?? ""], secret: $0.secret, label: "")
    }
  }
  func save(_ item: StoredItem) async throws {
    let refused = savesLeft.withLock { left -> Bool in
      guard let count = left else { return false }
      if count == 0 { return true }
      left = count - 1
      return false
    }
    if refused { throw TesseraError.storeUnavailable("the fake \(kind) store is locked") }
    await saveGate.pass()
    try await base.save(item)
  }
  func delete(matching attributes: [String: String]) async throws {
    let refused = deletesLeft.withLock { left -> Bool in
      guard let count = left else { return false }
      if count == 0 { return true }
      left = count - 1
      return false
    }
    if refused { throw TesseraError.storeUnavailable("the fake \(kind) store is locked") }
    try await base.delete(matching: attributes)
  }
  func probe(withinSeconds seconds: Double) async throws { try await base.probe(withinSeconds: seconds) }
  var storeDescription: StoreDescription { StoreDescription(kind: kind) }

  /// Each item as attributes and secret (what a move must keep, byte for byte).
  var contents: Set<[String: String]> {
    Set(base.items.withLock { $0 }.map { $0.attributes.merging(["(secret)": $0.secret]) { $1 } })
  }
}

final class MemoryMoveJournal: StoreMoveJournal, Sendable {
  let note = Locked<StoreMoveNote?>(nil)
  /// Every note written, in order.
  let written = Locked<[StoreMoveNote]>([])
  func write(_ note: StoreMoveNote) throws {
    self.note.withLock { $0 = note }
    written.withLock { $0.append(note) }
  }
  func pending() -> StoreMoveNote? { note.withLock { $0 } }
  func end() throws { note.withLock { $0 = nil } }
}

struct FakeOpener: StoreOpener {
  let stores: [StoreKind: any SecretStore]
  func open(_ kind: StoreKind) throws -> any SecretStore {
    guard let store = stores[kind] else { throw TesseraError.invalidArgument("no \(kind) store") }
    return store
  }
}

final class StoreMoveTests: XCTestCase {
  struct Setup {
    let h: Harness
    let keyring: KindStore
    let file: KindStore
    let journal: MemoryMoveJournal
    let broker: Broker
    /// What the keyring held before the move.
    let before: Set<[String: String]>
  }

  /// Two accounts signed in, with a grant and a current account, in a fake keyring that loads as
  /// the Secret Service does; a broker over it that can move to a fake file store.
  func prepare(config: ((inout BrokerConfig) -> Void)? = nil) async throws -> Setup {
    let h = await Harness()
    try await h.signIn()
    h.idp.subject.withLock { $0 = "bob-sub" }
    try await h.signIn()
    try await h.signIn(clientID: "app2")
    try await h.broker.grant(
      AccessGrant(app: "exe:/usr/bin/git", clientID: "app1", accountID: "*", grantedAt: 1, via: "command"),
      caller: nil)
    await h.broker.finishStoreWrites()
    let keyring = KindStore(h.store, kind: .secretService, stripsAttributes: true)
    let file = KindStore(kind: .file)
    let journal = MemoryMoveJournal()
    var cfg = await h.broker.config
    config?(&cfg)
    let broker = Broker(
      config: cfg,
      dependencies: BrokerDependencies(
        http: h.idp, store: keyring, browser: NoBrowser(), listeners: h.listeners, events: h.events, clock: h.clock,
        storeOpener: FakeOpener(stores: [.secretService: keyring, .file: file]), moveJournal: journal),
      logger: .init(label: "t"))
    return Setup(h: h, keyring: keyring, file: file, journal: journal, broker: broker, before: keyring.contents)
  }

  func silent(_ broker: Broker) async throws -> [String: BusValue] {
    try await broker.acquireTokenSilent(
      try RequestParser.tokenRequest(clientID: "", scopes: [], accountID: "", options: [:]))
  }

  func testAMoveTakesEveryItemAcrossAndTheBrokerUsesTheNewStore() async throws {
    let s = try await prepare()
    XCTAssertGreaterThanOrEqual(s.before.count, 8)
    _ = try await silent(s.broker)
    let requests = s.h.idp.tokenRequests.count
    let result = try await s.broker.moveStore(to: .file, caller: nil)
    XCTAssertEqual(result, StoreMoveResult(from: .secretService, to: .file, items: s.before.count))
    // Every item, with every attribute and its secret byte for byte, in the target alone.
    XCTAssertEqual(s.file.contents, s.before)
    XCTAssertTrue(s.keyring.contents.isEmpty)
    XCTAssertNil(s.journal.pending())
    let status = try await s.broker.status()
    XCTAssertEqual(status.storeKind, "file")
    // Tokens keep coming, with no sign-in and no request to the IdP.
    _ = try await silent(s.broker)
    XCTAssertEqual(s.h.idp.tokenRequests.count, requests)
    // New writes go to the new store (alice is current: the first account).
    s.h.idp.subject.withLock { $0 = "alice-sub" }
    _ = try await s.broker.acquireTokenSilent(
      try RequestParser.tokenRequest(
        clientID: "", scopes: [], accountID: "", options: ["force_refresh": .bool(true)]))
    await s.broker.finishStoreWrites()
    XCTAssertTrue(s.keyring.contents.isEmpty)
    XCTAssertNotEqual(s.file.contents, s.before)
    // And back.
    let back = try await s.broker.moveStore(to: .secretService, caller: nil)
    XCTAssertEqual(back.from, .file)
    XCTAssertTrue(s.file.contents.isEmpty)
    XCTAssertEqual(s.keyring.contents.count, back.items)
  }

  func testRefusalsSayWhatToDoAndMoveNothing() async throws {
    let s = try await prepare()
    await XCTAssertThrowsTessera(.invalidArgument) {
      _ = try await s.broker.moveStore(to: .secretService, caller: nil)
    }
    await XCTAssertThrowsTessera(.invalidArgument) { _ = try await s.broker.moveStore(to: .memory, caller: nil) }
    s.file.base.locked.withLock { $0 = true }
    await XCTAssertThrowsTessera(.storeUnavailable) { _ = try await s.broker.moveStore(to: .file, caller: nil) }
    s.file.base.locked.withLock { $0 = false }
    // A target that holds items of its own is not mixed with these.
    try await s.file.save(
      StoredItem(
        attributes: ["tessera_schema": "1", "kind": "app_use", "app": "x", "account_id": "y"],
        secret: #"{"accountID":"y","app":"x","firstUsedAt":1}"#, label: ""))
    do {
      _ = try await s.broker.moveStore(to: .file, caller: nil)
      XCTFail("moved into a store holding items")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .invalidArgument)
      XCTAssertTrue(error.message.contains("already holds 1"), error.message)
    }
    XCTAssertEqual(s.keyring.contents, s.before)
    XCTAssertNil(s.journal.pending())

    let pinned = try await prepare { $0.store = .only(.secretService) }
    do {
      _ = try await pinned.broker.moveStore(to: .file, caller: nil)
      XCTFail("moved against config.toml")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .configuration)
      XCTAssertTrue(
        error.message.contains(#"config.toml says store = "secret-service": set it to "file" or "auto" first"#),
        error.message)
    }
    XCTAssertEqual(pinned.keyring.contents, pinned.before)
  }

  /// `tessera store migrate` interrupted (Ctrl-C) goes on in tesserad; run again meanwhile, the
  /// second move is refused. (It used to pass its checks, wait behind the first, and then take
  /// every item the first had moved into the target for a stale copy: both stores ended empty.)
  func testASecondMoveWhileOneRunsIsRefusedAndLosesNothing() async throws {
    let s = try await prepare()
    // The first move is held at its first save into the target until the second has been tried:
    // no window of time for the second to land in.
    s.file.saveGate.shut()
    let broker = s.broker
    let first = Task { try await broker.moveStore(to: .file, caller: nil) }
    let held = await s.file.saveGate.held()
    XCTAssertTrue(held, "the first move never saved into the target")
    do {
      _ = try await broker.moveStore(to: .file, caller: nil)
      XCTFail("a second move was started while one ran")
    } catch {
      let error = TesseraError.wrap(error)
      XCTAssertEqual(error.code, .busy, error.message)
      XCTAssertTrue(error.message.contains("under way already"), error.message)
    }
    s.file.saveGate.open()
    let result = try await first.value
    XCTAssertEqual(result.items, s.before.count)
    XCTAssertEqual(s.file.contents, s.before, "every item is in the target")
    XCTAssertTrue(s.keyring.contents.isEmpty)
    XCTAssertNil(s.journal.pending())
    // Once it has ended, the store in use is the target: there is nothing more to move.
    await XCTAssertThrowsTessera(.invalidArgument) { _ = try await broker.moveStore(to: .file, caller: nil) }
    XCTAssertEqual(s.file.contents, s.before)
  }

  /// Only a move taken up again (its journal there) deletes from its target; a new move never
  /// deletes what its target holds, even items its source does not have.
  func testANewMoveNeverDeletesFromItsTargetAndATakenUpOneDeletesItsStaleCopies() async throws {
    let s = try await prepare()
    let all = s.h.store.items.withLock { $0 }
    let extra = try XCTUnwrap(all.first { $0.attributes["kind"] == "refresh_token" })
    try await s.file.base.save(extra)
    try await s.keyring.base.delete(matching: extra.attributes)
    let source = s.keyring.contents
    let targetsOwn = s.file.contents
    XCTAssertEqual(targetsOwn.count, 1)
    try await StoreMove.run(s.journal, from: s.keyring, to: s.file, fromKind: .secretService, toKind: .file)
    XCTAssertEqual(s.file.contents, source.union(targetsOwn), "the source's items, and the target's own item kept")
    XCTAssertTrue(s.file.contents.contains { $0["(secret)"] == extra.secret }, "the target's own item is kept")

    // Taken up again after a kill while copying: what the target holds that the source does not is
    // this move's own stale copy, and goes.
    for item in all { try await s.keyring.base.save(item) }
    try await s.keyring.base.delete(matching: extra.attributes)
    try await s.file.base.save(extra)
    s.journal.note.withLock { $0 = StoreMoveNote(from: .secretService, to: .file) }
    try await StoreMove.run(s.journal, from: s.keyring, to: s.file, fromKind: .secretService, toKind: .file)
    XCTAssertFalse(s.file.contents.contains { $0["(secret)"] == extra.secret }, "the stale copy is deleted")
  }

  func testATargetFailingMidWayLosesNothingKeepsTheJournalAndARetryFinishes() async throws {
    let s = try await prepare()
    s.file.savesLeft.withLock { $0 = 3 }
    await XCTAssertThrowsTessera(.storeUnavailable) { _ = try await s.broker.moveStore(to: .file, caller: nil) }
    // Nothing lost: the source holds everything and is still in use; the journal says what to finish.
    XCTAssertEqual(s.keyring.contents, s.before)
    XCTAssertEqual(s.file.contents.count, 3)
    XCTAssertEqual(s.journal.pending(), StoreMoveNote(from: .secretService, to: .file, deleting: false))
    let status = try await s.broker.status()
    XCTAssertEqual(status.storeKind, "secret-service")
    _ = try await silent(s.broker)

    // A retry finishes it (the target's partial copies are replaced, not doubled).
    s.file.savesLeft.withLock { $0 = nil }
    let result = try await s.broker.moveStore(to: .file, caller: nil)
    XCTAssertEqual(result.items, s.before.count)
    XCTAssertEqual(s.file.contents, s.before)
    XCTAssertTrue(s.keyring.contents.isEmpty)
    XCTAssertNil(s.journal.pending())
  }

  func testASourceFailingWhileDeletingSwitchesToTheTargetAndARetryFinishes() async throws {
    let s = try await prepare()
    s.keyring.deletesLeft.withLock { $0 = 2 }
    await XCTAssertThrowsTessera(.storeUnavailable) { _ = try await s.broker.moveStore(to: .file, caller: nil) }
    // Every item is in the target, which is used now; the source's leftovers wait for the retry.
    XCTAssertEqual(s.file.contents, s.before)
    XCTAssertEqual(s.journal.pending(), StoreMoveNote(from: .secretService, to: .file, deleting: true))
    let status = try await s.broker.status()
    XCTAssertEqual(status.storeKind, "file")
    _ = try await silent(s.broker)
    XCTAssertFalse(s.keyring.contents.isEmpty)
    s.keyring.deletesLeft.withLock { $0 = nil }
    let result = try await s.broker.moveStore(to: .file, caller: nil)
    XCTAssertEqual(result.from, .secretService)
    XCTAssertTrue(s.keyring.contents.isEmpty)
    XCTAssertEqual(s.file.contents, s.before)
    XCTAssertNil(s.journal.pending())
  }

  func testTheStartFinishesAMoveKilledAtAnyPoint() async throws {
    let s = try await prepare()
    let all = s.h.store.items.withLock { $0 }
    let items = s.before.count
    func stores() -> (KindStore, KindStore) {
      let keyring = KindStore(kind: .secretService, stripsAttributes: true)
      keyring.base.items.withLock { $0 = all }
      return (keyring, KindStore(kind: .file))
    }
    // Killed while copying, after k copies: the copy is done again, nothing doubled.
    for copied in [0, 1, items / 2, items] {
      let (keyring, file) = stores()
      let journal = MemoryMoveJournal()
      try journal.write(StoreMoveNote(from: .secretService, to: .file))
      let movable = TokenCache.movable(try await keyring.loadAll())
      for item in movable.prefix(copied) { try await file.save(item) }
      let moved = try await StoreMove.run(
        journal, from: keyring, to: file, fromKind: .secretService, toKind: .file)
      XCTAssertEqual(file.contents, s.before, "killed after \(copied) copies")
      XCTAssertTrue(keyring.contents.isEmpty)
      XCTAssertNil(journal.pending())
      XCTAssertEqual(moved, items)
      XCTAssertEqual(journal.written.withLock { $0.map(\.deleting) }, [false, false, true])
    }
    // Killed while copying, then the source was used and dropped an item (a sign-out): the
    // target's copy of it goes too.
    do {
      let (keyring, file) = stores()
      let journal = MemoryMoveJournal()
      try journal.write(StoreMoveNote(from: .secretService, to: .file))
      for item in TokenCache.movable(try await keyring.loadAll()) { try await file.save(item) }
      let dropped = try XCTUnwrap(all.first { $0.attributes["kind"] == "access_token" })
      try await keyring.delete(matching: dropped.attributes)
      try await StoreMove.run(journal, from: keyring, to: file, fromKind: .secretService, toKind: .file)
      XCTAssertEqual(file.contents, s.before.filter { $0["(secret)"] != dropped.secret })
      XCTAssertEqual(file.contents.count, items - 1)
      XCTAssertTrue(keyring.contents.isEmpty)
    }
    // Killed while deleting: the target holds every item (one newer since): nothing is copied
    // again, the source's leftovers go.
    do {
      let (keyring, file) = stores()
      let journal = MemoryMoveJournal()
      let movable = TokenCache.movable(try await keyring.loadAll())
      for item in movable { try await file.save(item) }
      try journal.write(StoreMoveNote(from: .secretService, to: .file, deleting: true))
      for item in movable.prefix(items / 2) { try await keyring.delete(matching: item.attributes) }
      var newer = movable[movable.count - 1]
      newer.secret = newer.secret.replacingOccurrences(of: "}", with: #","note":"newer"}"#)
      try await file.save(newer)
      let after = file.contents
      try await StoreMove.run(journal, from: keyring, to: file, fromKind: .secretService, toKind: .file)
      XCTAssertEqual(file.contents, after)
      XCTAssertTrue(keyring.contents.isEmpty)
      XCTAssertNil(journal.pending())
      // Finishing again does nothing.
      let again = try await StoreMove.moveItems(from: keyring, to: file)
      XCTAssertEqual(again, 0)
    }
  }

  /// A move interrupted before the administrator's allowed_stores forbade its target is taken
  /// back: every item in the source again, none left in the target, at either point of the move.
  func testAMoveToAStoreThePolicyNoLongerAllowsIsTakenBack() async throws {
    let s = try await prepare()
    let all = s.h.store.items.withLock { $0 }
    func stores() -> (KindStore, KindStore) {
      let keyring = KindStore(kind: .secretService, stripsAttributes: true)
      keyring.base.items.withLock { $0 = all }
      return (keyring, KindStore(kind: .file))
    }
    // Killed while copying: the copies go, the source is as it was.
    do {
      let (keyring, file) = stores()
      let journal = MemoryMoveJournal()
      let note = StoreMoveNote(from: .secretService, to: .file)
      try journal.write(note)
      for item in TokenCache.movable(try await keyring.loadAll()).prefix(3) { try await file.save(item) }
      let undone = try await StoreMove.undo(journal, note, source: keyring, target: file)
      XCTAssertEqual(undone, 3)
      XCTAssertEqual(keyring.contents, s.before)
      XCTAssertTrue(file.contents.isEmpty)
      XCTAssertNil(journal.pending())
    }
    // Killed while deleting from the source: every item moves back, as a move of its own.
    do {
      let (keyring, file) = stores()
      let journal = MemoryMoveJournal()
      let movable = TokenCache.movable(try await keyring.loadAll())
      for item in movable { try await file.save(item) }
      let note = StoreMoveNote(from: .secretService, to: .file, deleting: true)
      try journal.write(note)
      for item in movable.prefix(movable.count / 2) { try await keyring.delete(matching: item.attributes) }
      try await StoreMove.undo(journal, note, source: keyring, target: file)
      XCTAssertEqual(keyring.contents, s.before)
      XCTAssertTrue(file.contents.isEmpty)
      XCTAssertNil(journal.pending())
      // The reverse note replaced the old one in one write (kill-safe), then ran to its end.
      XCTAssertEqual(
        journal.written.withLock { $0 }.suffix(3).map { "\($0.from)>\($0.to):\($0.deleting)" },
        ["file>secret-service:false", "file>secret-service:false", "file>secret-service:true"])
    }
  }

  func testAtStartAMoveIsFinishedOrTakenBackAsThePolicySays() async throws {
    let s = try await prepare()
    let all = s.h.store.items.withLock { $0 }
    func interrupted() async throws -> (KindStore, KindStore, MemoryMoveJournal) {
      let keyring = KindStore(kind: .secretService, stripsAttributes: true)
      keyring.base.items.withLock { $0 = all }
      let file = KindStore(kind: .file)
      let journal = MemoryMoveJournal()
      try journal.write(StoreMoveNote(from: .secretService, to: .file))
      for item in TokenCache.movable(try await keyring.loadAll()).prefix(2) { try await file.save(item) }
      return (keyring, file, journal)
    }
    // No policy: finished into the target.
    var (keyring, file, journal) = try await interrupted()
    var used = await StoreMove.finishInterrupted(
      journal, opener: FakeOpener(stores: [.secretService: keyring, .file: file]), configured: .auto,
      probeSeconds: 0.5, logger: .init(label: "t"))
    XCTAssertEqual(used?.storeDescription.kind, .file)
    XCTAssertEqual(file.contents, s.before)
    // The policy allows only the Secret Service now: taken back, the source used.
    (keyring, file, journal) = try await interrupted()
    var policy = ConfigPolicy()
    policy.allowedStores = [.secretService]
    used = await StoreMove.finishInterrupted(
      journal, opener: FakeOpener(stores: [.secretService: keyring, .file: file]), configured: .auto,
      policy: policy, probeSeconds: 0.5, logger: .init(label: "t"))
    XCTAssertEqual(used?.storeDescription.kind, .secretService)
    XCTAssertEqual(keyring.contents, s.before)
    XCTAssertTrue(file.contents.isEmpty)
    XCTAssertNil(journal.pending())
    // Neither store allowed: nothing is opened or changed, and the caller chooses an allowed one.
    (keyring, file, journal) = try await interrupted()
    policy.allowedStores = [.memory]
    used = await StoreMove.finishInterrupted(
      journal, opener: FakeOpener(stores: [.secretService: keyring, .file: file]), configured: .auto,
      policy: policy, probeSeconds: 0.5, logger: .init(label: "t"))
    XCTAssertNil(used)
    XCTAssertEqual(keyring.contents, s.before)
    XCTAssertNotNil(journal.pending())
  }
}
