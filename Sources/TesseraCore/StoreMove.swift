import Logging
import TesseraInterface

/// Opens the store of a kind (file or Secret Service) other than the one in use, for a move
/// (`tessera store migrate`). The daemon provides it, so the engine imports no C library.
public protocol StoreOpener: Sendable {
  func open(_ kind: StoreKind) throws -> any SecretStore
}

/// What the move journal says: which move is under way, and whether it got to deleting the items
/// from the source (every item is in the target by then).
public struct StoreMoveNote: Sendable, Equatable {
  public var from: StoreKind
  public var to: StoreKind
  /// False while items are copied (the source still holds every item); true once every item is
  /// in the target and the source's copies are being deleted.
  public var deleting: Bool

  public init(from: StoreKind, to: StoreKind, deleting: Bool = false) {
    self.from = from
    self.to = to
    self.deleting = deleting
  }
}

/// The note of a store move under way (`$XDG_STATE_HOME/tessera/moving`): written before the
/// first item is copied, rewritten before the first is deleted from the source, removed once the
/// source holds none. A note found at start means a move was interrupted: the daemon finishes it
/// before it chooses a store.
public protocol StoreMoveJournal: Sendable {
  /// Writes the note durably (atomic: a note is either whole or absent).
  func write(_ note: StoreMoveNote) throws
  /// The move the note names, if there is one.
  func pending() -> StoreMoveNote?
  /// Removes the note.
  func end() throws
}

/// What a move did: the store kinds and how many items went across.
public struct StoreMoveResult: Sendable, Equatable {
  public var from: StoreKind
  public var to: StoreKind
  public var items: Int

  public init(from: StoreKind, to: StoreKind, items: Int) {
    self.from = from
    self.to = to
    self.items = items
  }

  /// MoveStore's reply.
  public var busValue: [String: BusValue] {
    ["from": .string(from.rawValue), "to": .string(to.rawValue), "items": .uint32(UInt32(clamping: items))]
  }
}

/// The store the engine writes to, which a move switches: every reader and writer (the loader,
/// StoreWriter, status) goes through it, so after the switch all of them use the new store.
final class StoreSlot: SecretStore, Sendable {
  private let inner: Locked<any SecretStore>

  init(_ store: any SecretStore) { inner = Locked(store) }

  var current: any SecretStore {
    get { inner.withLock { $0 } }
    set { inner.withLock { $0 = newValue } }
  }

  func loadAll() async throws -> [StoredItem] { try await current.loadAll() }
  func save(_ item: StoredItem) async throws { try await current.save(item) }
  func delete(matching attributes: [String: String]) async throws { try await current.delete(matching: attributes) }
  func apply(_ operations: [TokenCache.StoreOperation]) async throws { try await current.apply(operations) }
  func probe(withinSeconds seconds: Double) async throws { try await current.probe(withinSeconds: seconds) }
  var storeDescription: StoreDescription { current.storeDescription }
}

/// Moving every item from one store to another, in the order that makes a kill harmless at any
/// point: the journal first; each item copied into the target (create-or-replace by its
/// attributes, so a repeat never doubles one); the journal marked "deleting"; each item deleted
/// from the source; the journal removed. Run again after an interruption, it finishes:
/// - interrupted while copying, the source still holds every item: the copy is done again, and
///   what the target holds that the source does not (copies of items the source has dropped
///   since: the target held none of Tessera's items when the move began) is deleted;
/// - interrupted while deleting, the target holds every item (and may have newer ones since):
///   nothing is copied again, only what the source still holds is deleted.
public enum StoreMove {
  /// Runs (or finishes) the move of every item from `source` to `target` the journal names, or
  /// starts one (no journal). Returns how many items were copied (when copying), else deleted.
  @discardableResult
  public static func run(
    _ journal: any StoreMoveJournal, from source: any SecretStore, to target: any SecretStore, fromKind: StoreKind,
    toKind: StoreKind
  ) async throws -> Int {
    let resumed = journal.pending()
    var note = resumed ?? StoreMoveNote(from: fromKind, to: toKind)
    var moved = 0
    if !note.deleting {
      try journal.write(note)
      let items = TokenCache.movable(try await source.loadAll())
      // Only a move taken up again deletes from its target: what the target holds then that the
      // source does not are this move's own copies of items dropped since. A new move's target
      // held none of Tessera's items (the caller checked), and what it holds is never deleted.
      if resumed != nil {
        let wanted = Set(items.map(\.attributes))
        let stale = TokenCache.movable(try await target.loadAll()).filter { !wanted.contains($0.attributes) }
        // Deleted first: deleting matches on a subset of attributes, so it may take a wanted item
        // with it, which the copy then puts back.
        try await target.apply(stale.map { .delete($0.attributes) })
      }
      try await target.apply(items.map { .save($0) })
      moved = items.count
      note.deleting = true
      try journal.write(note)
    }
    let left = TokenCache.movable(try await source.loadAll())
    try await source.apply(left.map { .delete($0.attributes) })
    try journal.end()
    return note.deleting && moved == 0 ? left.count : moved
  }

  /// Takes back an interrupted move whose target the administrator's policy no longer allows:
  /// every item ends in the move's source again and none stays in its target. While items were
  /// being copied (the source holds them all) the copies are deleted; once they were being
  /// deleted from the source (the target holds them all) they move back, kill-safe, as a move of
  /// their own (the journal's note is replaced by the reverse one in one atomic write). Returns
  /// how many items were deleted or moved back.
  public static func undo(
    _ journal: any StoreMoveJournal, _ note: StoreMoveNote, source: any SecretStore, target: any SecretStore
  ) async throws -> Int {
    if note.deleting {
      try journal.write(StoreMoveNote(from: note.to, to: note.from))
      return try await run(journal, from: target, to: source, fromKind: note.to, toKind: note.from)
    }
    let copied = TokenCache.movable(try await target.loadAll())
    try await target.apply(copied.map { .delete($0.attributes) })
    try journal.end()
    return copied.count
  }

  /// A move journal left at start means `tessera store migrate` was interrupted (killed, or a
  /// store failed part-way): the move is finished now, before the store is chosen, and the target
  /// is used. Returns nil when there was no journal. When the move cannot be finished yet (the
  /// target is locked, say), the journal stays for the next start, and the store that holds every
  /// item is used: the source while items were being copied, the target once they were being
  /// deleted. When the administrator's `allowed_stores` no longer allow the target, the move is
  /// taken back (`undo`) and the source is used: nothing is finished into a forbidden store.
  public static func finishInterrupted(
    _ journal: (any StoreMoveJournal)?, opener: any StoreOpener, configured: BrokerConfig.StoreChoice,
    policy: ConfigPolicy = ConfigPolicy(), probeSeconds: Double, logger: Logger
  ) async -> (any SecretStore)? {
    guard let journal, let move = journal.pending() else { return nil }
    let metadata: Logger.Metadata = [
      "from": "\(move.from)", "to": "\(move.to)", "config": "\(configured.rawValue)",
      "phase": "\(move.deleting ? "deleting" : "copying")",
    ]
    let takeBack = !policy.allows(move.to)
    if takeBack && !policy.allows(move.from) {
      logger.error(
        "A store move (tessera store migrate) was interrupted, and the administrator's allowed_stores allow neither of its stores; Tessera's items stay where they are, unused",
        metadata: metadata)
      return nil
    }
    do {
      let source = try opener.open(move.from)
      let target = try opener.open(move.to)
      try await source.probe(withinSeconds: probeSeconds)
      try await target.probe(withinSeconds: probeSeconds)
      if takeBack {
        let items = try await undo(journal, move, source: source, target: target)
        logger.notice(
          "Using the \(move.from) store: a store move to the \(move.to) store was interrupted, and the administrator's allowed_stores no longer allow that store; took the move back (\(items) items)",
          metadata: metadata.merging(["items": "\(items)"]) { $1 })
        return source
      }
      let moved = try await run(journal, from: source, to: target, fromKind: move.from, toKind: move.to)
      logger.notice(
        "Using the \(move.to) store: a store move (tessera store migrate) was interrupted; finished it now (\(moved) items)",
        metadata: metadata.merging(["items": "\(moved)"]) { $1 })
      return target
    } catch {
      // The store that holds every item serves until a later start can finish (or take back) the move.
      let using = move.deleting ? move.to : move.from
      logger.error(
        takeBack
          ? "A store move was interrupted and its target is no longer allowed, but it cannot be taken back now; using the \(using) store, which holds every item, until a later start can"
          : "A store move (tessera store migrate) was interrupted and cannot be finished now; using the \(using) store, which holds every item, and finishing the move at a later start",
        metadata: metadata.merging(["error": "\(TesseraError.wrap(error).message)"]) { $1 })
      return try? opener.open(using)
    }
  }

  /// Copies every Tessera item of `source` (of the schema version this daemon knows) into `target`,
  /// then deletes them from `source`; returns how many. Items of other versions stay where they
  /// are. (Without a journal: `run` is the kill-safe move.)
  @discardableResult
  public static func moveItems(from source: any SecretStore, to target: any SecretStore) async throws -> Int {
    let items = TokenCache.movable(try await source.loadAll())
    guard !items.isEmpty else { return 0 }
    try await target.apply(items.map { .save($0) })
    try await source.apply(items.map { .delete($0.attributes) })
    return items.count
  }

  /// How many of Tessera's items `store` holds (of the schema version this daemon knows).
  public static func count(in store: any SecretStore) async throws -> Int {
    TokenCache.movable(try await store.loadAll()).count
  }
}

extension TokenCache {
  /// Items as they are stored, with every attribute and label rebuilt from their secret (a store
  /// may return only their `tessera_schema` and `kind`, as the Secret Service's load does). The
  /// secrets are kept byte for byte. Items of another schema version, or that do not decode, are
  /// left out.
  static func movable(_ items: [StoredItem]) -> [StoredItem] {
    let records = items.map { (item: $0, record: record($0)) }
    var hosts: [String: String] = [:]
    for case .account(let a)? in records.map(\.record) { hosts[a.id] = a.environment }
    var seen = Set<[String: String]>()
    var result: [StoredItem] = []
    for (item, record) in records {
      guard var record else { continue }
      if case .current(let c, _) = record { record = .current(c, environment: hosts[c.accountID]) }
      var rebuilt = Self.item(record)
      rebuilt.secret = item.secret
      // A store with two items of one identity (it should not have) moves one: the target keeps one.
      guard seen.insert(rebuilt.attributes).inserted else { continue }
      result.append(rebuilt)
    }
    return result
  }
}

extension Broker {
  /// Moves every item to the store of `kind` (StoreKind.movable) and uses it from now on
  /// (`tessera store migrate`, MoveStore). Serialized with the store writes; kill-safe through the
  /// move journal (see StoreMove).
  public func moveStore(to kind: StoreKind, caller: CallerInfo?) async throws -> StoreMoveResult {
    try checkMayManage(caller)
    // One move at a time. This actor takes other calls at each `await`: a second move started
    // while the first runs (its client gone after Ctrl-C, say) would still see the first's source
    // in use and its journal, and once the first had emptied the source it would take every item
    // now in the target for a stale copy and delete it.
    guard !storeMoveUnderWay else {
      throw TesseraError.busy(
        "A store move (tessera store migrate) is under way already; it goes on even when the command that started it was interrupted. Wait for it to end (`tessera status` shows the store in use), then run this again if you still need to."
      )
    }
    storeMoveUnderWay = true
    defer { storeMoveUnderWay = false }
    guard StoreKind.movable.contains(kind) else { throw StoreKind.notMovable(kind.rawValue) }
    let from = storeSlot.current.storeDescription.kind
    if let journal = deps.moveJournal, let note = journal.pending(), note.deleting, note.to == from, note.to == kind,
      let opener = deps.storeOpener
    {
      // A move that stopped while deleting from the source (this store holds every item): finish it.
      let source = try opener.open(note.from)
      let target = storeSlot.current
      let deleted = try await storeWriter.exclusive {
        try await StoreMove.run(journal, from: source, to: target, fromKind: note.from, toKind: note.to)
      }
      logger.notice("Finished an earlier store move", metadata: ["from": "\(note.from)", "to": "\(kind)"])
      return StoreMoveResult(from: note.from, to: kind, items: deleted)
    }
    guard from != kind else {
      throw TesseraError.invalidArgument(
        "Tessera keeps its items in the \(kind) store already: there is nothing to move. (`tessera status` shows the store in use.)"
      )
    }
    try checkMoveAllowed(to: kind, from: from)
    guard let opener = deps.storeOpener, let journal = deps.moveJournal else {
      throw TesseraError(
        .environment, "This tesserad cannot move its store: it has no place for the move journal (set HOME).")
    }
    let target = try await openTarget(kind, opener)
    try await ensureLoaded()
    let source = storeSlot.current
    let slot = storeSlot
    try await checkTargetTakesTheMove(target, kind, from: from, journal: journal)
    let logger = self.logger
    let moved = try await storeWriter.exclusive { () async throws -> Int in
      // Checked again where the writes are serialized: the store in use is still this move's source.
      guard slot.current.storeDescription.kind == from else {
        throw TesseraError.invalidArgument(
          "The store in use changed while this move waited (it is the \(slot.current.storeDescription.kind) store now): nothing was moved. `tessera status` shows the store in use."
        )
      }
      let moved: Int
      do {
        moved = try await StoreMove.run(journal, from: source, to: target, fromKind: from, toKind: kind)
      } catch {
        let cause = TesseraError.wrap((error as? StoreBatchError)?.error ?? error)
        let deleting = journal.pending()?.deleting == true
        logger.error(
          "Moving the store stopped part-way; the move journal stays, and running it again (or the next start) finishes it",
          metadata: ["from": "\(from)", "to": "\(kind)", "error": "\(cause.message)", "deleting": "\(deleting)"])
        if deleting {
          // Every item is in the target: use it; what the source still holds goes at the retry.
          slot.current = target
        }
        throw TesseraError(
          .storeUnavailable,
          "Moving the items to the \(kind) store stopped part-way (\(cause.message)). Nothing is lost: tesserad uses the \(deleting ? kind : from) store, which holds every item. Run `tessera store migrate --to \(kind)` again once both stores work (or restart tesserad: it finishes the move at start)."
        )
      }
      slot.current = target
      return moved
    }
    fastPath.clear()
    logger.notice(
      "Moved the store", metadata: ["from": "\(from)", "to": "\(kind)", "items": "\(moved)"])
    return StoreMoveResult(from: from, to: kind, items: moved)
  }

  /// What may refuse a move before any store is touched: the administrator's policy, config.toml
  /// naming another store, and the memory store (which has nothing to move).
  private func checkMoveAllowed(to kind: StoreKind, from: StoreKind) throws {
    if !adminPolicy.allows(kind) {
      throw TesseraError(
        .accessDenied,
        "The administrator's policy does not allow the \(kind) store (allowed_stores in [policy] of \(adminPolicy.files.joined(separator: ", "))): Tessera's items stay where they are."
      )
    }
    if config.store != .auto && config.store != .only(kind) {
      throw TesseraError(
        .configuration,
        "config.toml says store = \"\(config.store.rawValue)\": set it to \"\(kind)\" or \"auto\" first, then run this again (otherwise the next start would open the \(config.store.rawValue) store)."
      )
    }
    guard from != .memory else {
      throw TesseraError.invalidArgument(
        "The memory store keeps nothing to move. Set store = \"\(kind)\" in config.toml, restart tesserad and sign in again."
      )
    }
  }

  /// The target store, opened and asked whether it can be used now.
  private func openTarget(_ kind: StoreKind, _ opener: any StoreOpener) async throws -> any SecretStore {
    let target: any SecretStore
    do {
      target = try opener.open(kind)
      try await target.probe(withinSeconds: 1.5)
    } catch {
      let cause = TesseraError.wrap(error)
      throw TesseraError(
        .storeUnavailable, "The \(kind) store cannot be used now, so nothing was moved: \(cause.message)")
    }
    return target
  }

  /// A journal of this same move (one that failed part-way) is finished; another move's must be
  /// finished first (at start); otherwise a target that already holds items of its own would mix
  /// them with these, and is refused.
  private func checkTargetTakesTheMove(
    _ target: any SecretStore, _ kind: StoreKind, from: StoreKind, journal: any StoreMoveJournal
  ) async throws {
    if let note = journal.pending(), note.from != from || note.to != kind {
      throw TesseraError.invalidArgument(
        "An earlier move from the \(note.from) store to the \(note.to) store is not finished: restart tesserad (it finishes it at start), then run this again if you still need to."
      )
    }
    if journal.pending() == nil {
      let already: Int
      do { already = try await StoreMove.count(in: target) } catch {
        throw TesseraError(
          .storeUnavailable,
          "The \(kind) store cannot be read now, so nothing was moved: \(TesseraError.wrap(error).message)")
      }
      if already > 0 {
        let how =
          kind == .file
          ? "stop tesserad, remove \(target.storeDescription.path ?? "the file store's directory"), start it again"
          : "remove them (`secret-tool clear tessera_schema 1`: it removes only Tessera's items)"
        throw TesseraError.invalidArgument(
          "The \(kind) store already holds \(already) of Tessera's items (left from an earlier use): \(how), then run this again. Nothing was moved."
        )
      }
    }
  }
}
