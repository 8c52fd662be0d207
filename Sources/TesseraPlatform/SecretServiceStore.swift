import CSecret
import CTesseraSystemShim
import Dispatch
import Glibc
import TesseraCore
import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// The Secret Service through libsecret. libsecret's `*_sync` calls block, so they run on one
/// serial dispatch queue of their own, never on Swift's cooperative pool.
public final class SecretServiceStore: SecretStore, @unchecked Sendable {
  // Invariant for @unchecked Sendable: `schema` is immutable after init; libsecret calls run on `queue`.
  private let queue = DispatchQueue(label: "tessera.secret-service")
  /// `probe` runs here: never behind a call of `queue` that may be the one that hangs.
  private let probeQueue = DispatchQueue(label: "tessera.secret-service-probe", attributes: .concurrent)
  private let schema: UnsafeMutablePointer<SecretSchema>

  /// libsecret schema name; stored as `xdg:schema` on every item. Documented in docs/storage.md.
  public static let schemaName = "org.tessera.Broker1"
  /// Every attribute an item of TokenCache's schema carries (StoreSchemaTests checks each kind's):
  /// libsecret refuses to store an item with an attribute its schema does not name.
  static let attributeNames = [
    "tessera_schema", "kind", "account_id", "environment", "client_id", "realm", "scopes", "app", "authority", "jkt",
  ]

  /// The collection new items go to: nil for the default (the user's login keyring). Loading
  /// always searches every collection.
  private let collection: String?

  /// `collection` "session" keeps items in memory only (the benchmark uses it for bulk data).
  public init(collection: String? = nil) {
    self.collection = collection
    let types = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, nil)
    for name in Self.attributeNames {
      // SECRET_SCHEMA_ATTRIBUTE_STRING is 0, stored as a NULL pointer value.
      g_hash_table_insert(types, g_strdup(name), nil)
    }
    schema = secret_schema_newv(Self.schemaName, SECRET_SCHEMA_NONE, types)
    g_hash_table_unref(types)
  }

  private func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
      queue.async { continuation.resume(with: Result { try body() }) }
    }
  }

  private static func attributesTable(_ attributes: [String: String]) -> OpaquePointer {
    let table = g_hash_table_new_full(g_str_hash, g_str_equal, g_free, g_free)!
    for (key, value) in attributes { g_hash_table_insert(table, g_strdup(key), g_strdup(value)) }
    return table
  }

  private static func take(_ error: UnsafeMutablePointer<GError>?) -> String {
    guard let error else { return "unknown error" }
    defer { g_error_free(error) }
    return error.pointee.message.map { String(cString: $0) } ?? "unknown error"
  }

  static func unavailable(_ detail: String) -> TesseraError {
    .storeUnavailable(
      "The Secret Service is not available (\(detail)). Start your desktop keyring (gnome-keyring-daemon or KeePassXC's Secret Service) "
        + "and make sure it is unlocked; Tessera keeps running and will use it as soon as it is there.")
  }

  /// Fails unless the default collection exists and is unlocked. A locked keyring answers searches
  /// with "nothing found", which must never be read as "signed out".
  ///
  /// One property read on the default alias's path, on the session bus libsecret also uses: the
  /// same answer libsecret's alias lookup gives (ReadAlias, then a collection proxy that loads every
  /// property), at a third of the cost. It runs before every write, the refresh token's included.
  private func checkUnlocked(timeoutMilliseconds: Int32 = 25_000) throws {
    var error: UnsafeMutablePointer<GError>?
    guard let bus = g_bus_get_sync(G_BUS_TYPE_SESSION, nil, &error) else {
      throw Self.unavailable(Self.take(error))
    }
    defer { g_object_unref(UnsafeMutableRawPointer(bus)) }
    var names = [g_variant_new_string("org.freedesktop.Secret.Collection"), g_variant_new_string("Locked")]
    let arguments = names.withUnsafeMutableBufferPointer { g_variant_new_tuple($0.baseAddress, 2) }
    guard
      let reply = g_dbus_connection_call_sync(
        bus, "org.freedesktop.secrets", "/org/freedesktop/secrets/aliases/default", "org.freedesktop.DBus.Properties",
        "Get", arguments, nil, G_DBUS_CALL_FLAGS_NONE, timeoutMilliseconds, nil, &error)
    else {
      if let e = error, g_error_matches(e, g_io_error_quark(), Int32(G_IO_ERROR_TIMED_OUT.rawValue)) != 0 {
        g_clear_error(&error)
        throw Self.notAnswering(bus: bus, waitedMilliseconds: timeoutMilliseconds)
      }
      let remote = error.flatMap { g_dbus_error_get_remote_error($0) }
      defer { g_free(remote) }
      let name = remote.map { String(cString: $0) } ?? ""
      // UnknownObject (no such alias) and its kin; ServiceUnknown (no keyring running) falls through.
      if name.hasPrefix("org.freedesktop.DBus.Error.Unknown") {
        g_clear_error(&error)
        throw Self.unavailable("there is no default keyring collection")
      }
      throw Self.unavailable(Self.take(error))
    }
    defer { g_variant_unref(reply) }
    // A reply of any other shape counts as locked: never guess "unlocked".
    var locked = true
    if String(cString: g_variant_get_type_string(reply)) == "(v)" {
      let boxed = g_variant_get_child_value(reply, 0)
      defer { g_variant_unref(boxed) }
      let value = g_variant_get_variant(boxed)
      defer { g_variant_unref(value) }
      if g_variant_classify(value) == G_VARIANT_CLASS_BOOLEAN { locked = g_variant_get_boolean(value) != 0 }
    }
    if locked {
      throw TesseraError.storeUnavailable(
        "The keyring is locked. Unlock it (log in to the desktop session, or unlock the 'login' keyring in Passwords and Keys / seahorse), "
          + "then retry; Tessera keeps its accounts and will use them again once it is unlocked.")
    }
  }

  /// See SecretStore.probe: the default collection's Locked property, with a short timeout.
  public func probe(withinSeconds seconds: Double) async throws {
    let milliseconds = Int32(max(100, min(25_000, seconds * 1000)))
    try await withCheckedThrowingContinuation { (done: CheckedContinuation<Void, any Error>) in
      probeQueue.async { done.resume(with: Result { try self.checkUnlocked(timeoutMilliseconds: milliseconds) }) }
    }
  }

  /// Whether a Secret Service is on the session bus, asked of the bus daemon alone (never of the
  /// keyring, which may be locked, slow, or starting).
  public enum Presence: Sendable, Equatable {
    /// A process owns org.freedesktop.secrets.
    case owned
    /// Nothing owns it yet, and the bus daemon can start one (D-Bus activation).
    case activatable
    /// Neither, or there is no session bus: why, for the log.
    case absent(String)
  }

  /// See `Presence`; on the probe queue, never the cooperative pool.
  public func presence() async -> Presence {
    await withCheckedContinuation { (done: CheckedContinuation<Presence, Never>) in
      probeQueue.async { done.resume(returning: Self.presenceNow()) }
    }
  }

  private static func presenceNow() -> Presence {
    var error: UnsafeMutablePointer<GError>?
    guard let bus = g_bus_get_sync(G_BUS_TYPE_SESSION, nil, &error) else {
      return .absent("there is no session bus: \(take(error))")
    }
    defer { g_object_unref(UnsafeMutableRawPointer(bus)) }
    if busCall(bus, "NameHasOwner", "org.freedesktop.secrets") == "true" { return .owned }
    guard
      let reply = g_dbus_connection_call_sync(
        bus, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", "ListActivatableNames", nil, nil,
        G_DBUS_CALL_FLAGS_NONE, 5000, nil, &error)
    else {
      return .absent("the session bus did not list what it can start: \(take(error))")
    }
    defer { g_variant_unref(reply) }
    let names = g_variant_get_child_value(reply, 0)
    defer { g_variant_unref(names) }
    for index in 0..<g_variant_n_children(names) {
      let name = g_variant_get_child_value(names, index)
      defer { g_variant_unref(name) }
      if let text = g_variant_get_string(name, nil), String(cString: text) == "org.freedesktop.secrets" {
        return .activatable
      }
    }
    return .absent("nothing on the session bus owns org.freedesktop.secrets or can start it")
  }

  /// Why the Secret Service has not answered in time: nobody owns its name yet (D-Bus is still
  /// starting it), or its owner does not reply. Each with what to do.
  static func notAnswering(bus: OpaquePointer, waitedMilliseconds: Int32) -> TesseraError {
    let waited = waitedMilliseconds % 1000 == 0 ? "\(waitedMilliseconds / 1000) s" : "\(waitedMilliseconds) ms"
    guard let owner = busCall(bus, "GetNameOwner", "org.freedesktop.secrets") else {
      var message =
        "The Secret Service (org.freedesktop.secrets) has not answered in \(waited): nothing owns it on this session bus, and D-Bus is still trying to start it."
      if let control = getenv("GNOME_KEYRING_CONTROL").map({ String(cString: $0) }), !control.isEmpty {
        message +=
          " GNOME_KEYRING_CONTROL is set (\(SafeText.clip(control, limit: 300))): a keyring started with it joins the keyring of the session that set it, which is on another bus; this happens in a dbus-run-session started inside a desktop session. Start that session with `env -u GNOME_KEYRING_CONTROL dbus-run-session …` (and unlock a keyring in it: `gnome-keyring-daemon --unlock`), or use the desktop's own session bus."
      } else {
        message +=
          " Start a keyring on this bus (`gnome-keyring-daemon --start --components=secrets`, then unlock it, or KeePassXC with its Secret Service integration), then retry."
      }
      return .storeUnavailable(message)
    }
    var who = owner
    if let pid = busCall(bus, "GetConnectionUnixProcessID", owner).flatMap(UInt32.init) {
      var exe = [CChar](repeating: 0, count: 4096)
      let n = readlink("/proc/\(pid)/exe", &exe, exe.count - 1)
      who =
        "pid \(pid)" + (n > 0 ? ", \(String(decoding: exe[0..<n].map { UInt8(bitPattern: $0) }, as: UTF8.self))" : "")
    }
    return .storeUnavailable(
      "The keyring (org.freedesktop.secrets, \(SafeText.clip(who, limit: 500))) has not answered in \(waited): it may be waiting for an unlock prompt to be answered, or be stuck. Answer or close its prompt, or restart it (e.g. `gnome-keyring-daemon --replace --unlock`), then retry; Tessera keeps its accounts."
    )
  }

  /// One call to the bus daemon itself (a second at most), its string or number answer as text;
  /// nil when it failed (no owner, no such process).
  private static func busCall(_ bus: OpaquePointer, _ method: String, _ text: String) -> String? {
    var error: UnsafeMutablePointer<GError>?
    var values = [g_variant_new_string(text)]
    let arguments = values.withUnsafeMutableBufferPointer { g_variant_new_tuple($0.baseAddress, 1) }
    guard
      let reply = g_dbus_connection_call_sync(
        bus, "org.freedesktop.DBus", "/org/freedesktop/DBus", "org.freedesktop.DBus", method, arguments, nil,
        G_DBUS_CALL_FLAGS_NONE, 1000, nil, &error)
    else {
      g_clear_error(&error)
      return nil
    }
    defer { g_variant_unref(reply) }
    let value = g_variant_get_child_value(reply, 0)
    defer { g_variant_unref(value) }
    switch g_variant_classify(value) {
    case G_VARIANT_CLASS_STRING: return g_variant_get_string(value, nil).map { String(cString: $0) }
    case G_VARIANT_CLASS_UINT32: return String(g_variant_get_uint32(value))
    case G_VARIANT_CLASS_BOOLEAN: return g_variant_get_boolean(value) != 0 ? "true" : "false"
    default: return nil
    }
  }

  /// libsecret keeps one service proxy, with its session, for the whole process; once the keyring
  /// has restarted, both are stale. Forgotten, the next call opens new ones. On the store queue.
  private static func forgetService() { secret_service_disconnect() }

  /// Loads every Tessera item in a few D-Bus calls: one search per kind (item paths only), then one
  /// GetSecrets per `secretsPerBatch` items. (libsecret's item search would make a proxy, and a D-Bus
  /// round trip, per item: seconds for a few thousand.) Our own writes run on the same serial queue,
  /// so none lands between the search and the reads; an item another program deletes meanwhile fails
  /// the load, which is retried on the next request (with a fresh libsecret service and session).
  public func loadAll() async throws -> [StoredItem] {
    do {
      return try await loadAllNow()
    } catch {
      // The next load (the next request's) starts from a fresh service and session.
      try? await run { Self.forgetService() }
      throw error
    }
  }

  private func loadAllNow() async throws -> [StoredItem] {
    try await run {
      try self.checkUnlocked()
      var error: UnsafeMutablePointer<GError>?
      guard let service = secret_service_get_sync(SECRET_SERVICE_OPEN_SESSION, nil, &error) else {
        throw Self.unavailable(Self.take(error))
      }
      defer { g_object_unref(UnsafeMutableRawPointer(service)) }
      var found: [(path: String, kind: String)] = []
      for kind in TokenCache.itemKinds {
        let match = Self.attributesTable(TokenCache.allItemsAttributes.merging(["kind": kind]) { $1 })
        defer { g_hash_table_unref(match) }
        var unlocked: UnsafeMutablePointer<UnsafeMutablePointer<gchar>?>?
        var locked: UnsafeMutablePointer<UnsafeMutablePointer<gchar>?>?
        guard
          secret_service_search_for_dbus_paths_sync(service, self.schema, match, nil, &unlocked, &locked, &error) != 0
        else { throw Self.unavailable(Self.take(error)) }
        defer {
          g_strfreev(unlocked)
          g_strfreev(locked)
        }
        if let locked, locked.pointee != nil {
          // Some of Tessera's items sit in a locked collection: not "signed out", just unreadable.
          throw TesseraError.storeUnavailable(
            "Some of Tessera's keyring items are in a locked keyring collection. Unlock it (Passwords and Keys / seahorse), then retry."
          )
        }
        var cursor = unlocked
        while let path = cursor?.pointee {
          found.append((String(cString: path), kind))
          cursor = cursor! + 1
        }
      }
      guard !found.isEmpty else { return [] }
      // GetSecrets is called here, in libsecret's own (encrypted) session, and each answer is
      // decoded with libsecret's secret_service_decode_dbus_secret. libsecret's
      // secret_service_get_secrets_for_dbus_paths would do the same, but (0.20.5) never frees its
      // reply: measured, every load kept a copy of all the secrets it read. In batches: GDBus
      // keeps its read buffer at the size of the largest message the connection ever received.
      guard secret_service_ensure_session_sync(service, nil, &error) != 0,
        let session = secret_service_get_session_dbus_path(service).map({ String(cString: $0) })
      else { throw Self.unavailable(Self.take(error)) }
      guard let bus = g_bus_get_sync(G_BUS_TYPE_SESSION, nil, &error) else { throw Self.unavailable(Self.take(error)) }
      defer { g_object_unref(UnsafeMutableRawPointer(bus)) }
      let kinds = Dictionary(found.map { ($0.path, $0.kind) }, uniquingKeysWith: { first, _ in first })
      var items: [StoredItem] = []
      items.reserveCapacity(found.count)
      var start = 0
      while start < found.count {
        let batch = found[start..<min(start + Self.secretsPerBatch, found.count)]
        start = batch.endIndex
        let paths: [UnsafePointer<gchar>?] = batch.map { UnsafePointer(strdup($0.path)) } + [nil]
        defer { paths.forEach { free(UnsafeMutableRawPointer(mutating: $0)) } }
        var arguments = [
          paths.withUnsafeBufferPointer { g_variant_new_objv($0.baseAddress, gssize(batch.count)) },
          g_variant_new_object_path(session),
        ]
        guard
          let reply = g_dbus_connection_call_sync(
            bus, "org.freedesktop.secrets", "/org/freedesktop/secrets", "org.freedesktop.Secret.Service", "GetSecrets",
            arguments.withUnsafeMutableBufferPointer { g_variant_new_tuple($0.baseAddress, 2) }, nil,
            G_DBUS_CALL_FLAGS_NO_AUTO_START, 25_000, nil, &error)
        else { throw Self.unavailable(Self.take(error)) }
        defer { g_variant_unref(reply) }
        guard String(cString: g_variant_get_type_string(reply)) == "(a{o(oayays)})" else {
          throw Self.unavailable(
            "the Secret Service answered GetSecrets with \(String(cString: g_variant_get_type_string(reply)))")
        }
        let secrets = g_variant_get_child_value(reply, 0)
        defer { g_variant_unref(secrets) }
        for index in 0..<g_variant_n_children(secrets) {
          let entry = g_variant_get_child_value(secrets, index)
          defer { g_variant_unref(entry) }
          let pathValue = g_variant_get_child_value(entry, 0)
          let path = String(cString: g_variant_get_string(pathValue, nil))
          g_variant_unref(pathValue)
          let encoded = g_variant_get_child_value(entry, 1)
          defer { g_variant_unref(encoded) }
          guard let kind = kinds[path], let value = secret_service_decode_dbus_secret(service, encoded) else {
            continue
          }
          defer { secret_value_unref(UnsafeMutableRawPointer(value)) }
          guard let text = secret_value_get_text(value) else { continue }
          items.append(
            StoredItem(
              attributes: TokenCache.allItemsAttributes.merging(["kind": kind]) { $1 },
              secret: String(cString: text),
              label: ""))
        }
      }
      return items
    }
  }

  /// Secrets asked for in one GetSecrets call (about 2.5 KB each at most).
  static let secretsPerBatch = 128

  public func save(_ item: StoredItem) async throws {
    try await run {
      // Checked first: storing into a locked collection would ask the keyring to prompt for the
      // password, which could hold the store queue until someone answers.
      try self.checkUnlocked()
      do { try self.saveNow(item) } catch let away as KeyringAway { throw away.error }
    }
  }

  /// On the store queue, after checkUnlocked().
  private func saveNow(_ item: StoredItem) throws {
    let attributes = Self.attributesTable(item.attributes)
    defer { g_hash_table_unref(attributes) }
    var error: UnsafeMutablePointer<GError>?
    if secret_password_storev_sync(schema, attributes, collection, item.label, item.secret, nil, &error) == 0 {
      throw Self.failure(error)
    }
  }

  /// On the store queue, after checkUnlocked().
  private func deleteNow(_ attributes: [String: String]) throws {
    let table = Self.attributesTable(attributes)
    defer { g_hash_table_unref(table) }
    var error: UnsafeMutablePointer<GError>?
    _ = secret_password_clearv_sync(schema, table, nil, &error)
    if let error { throw Self.failure(error) }
  }

  /// A write that failed because the keyring did not answer (a timeout, no reply, gone from the
  /// bus): the keyring is away, however unlocked it says it is; never a refusal of the item.
  struct KeyringAway: Error {
    var error: TesseraError
  }

  /// The error of a failed write: KeyringAway for a keyring that did not answer, else unavailable.
  private static func failure(_ error: UnsafeMutablePointer<GError>?) -> any Error {
    var away = false
    if let error {
      if g_error_matches(error, g_io_error_quark(), Int32(G_IO_ERROR_TIMED_OUT.rawValue)) != 0 { away = true }
      if let remote = g_dbus_error_get_remote_error(error) {
        let name = String(cString: remote)
        g_free(remote)
        away =
          away
          || ["NoReply", "Timeout", "TimedOut", "ServiceUnknown", "NameHasNoOwner", "Disconnected"].contains {
            name == "org.freedesktop.DBus.Error.\($0)"
          }
      }
    }
    let unavailable = Self.unavailable(Self.take(error))
    return away ? KeyringAway(error: unavailable) : unavailable
  }

  /// One hop to the store queue and one lock check for the whole batch.
  public func apply(_ operations: [TokenCache.StoreOperation]) async throws {
    try await run {
      do {
        try self.checkUnlocked()
      } catch {
        throw StoreBatchError(completed: 0, error: error)
      }
      for (index, operation) in operations.enumerated() {
        do {
          switch operation {
          case .save(let item): try self.saveNow(item)
          case .delete(let attributes): try self.deleteNow(attributes)
          }
        } catch {
          // A keyring that restarted since libsecret opened its session fails every write ("The
          // session wrapping the secret does not exist"): start afresh and try once more.
          Self.forgetService()
          do {
            try self.checkUnlocked()
            switch operation {
            case .save(let item): try self.saveNow(item)
            case .delete(let attributes): try self.deleteNow(attributes)
            }
            continue
          } catch let away as KeyringAway {
            throw StoreBatchError(completed: index, error: away.error)
          } catch {
            // Still there and unlocked: the keyring refused this operation, not the store gone.
            let stillThere = (try? self.checkUnlocked()) != nil
            throw StoreBatchError(completed: index, error: error, rejected: stillThere)
          }
        }
      }
    }
  }

  public func delete(matching attributes: [String: String]) async throws {
    try await run {
      try self.checkUnlocked()
      do { try self.deleteNow(attributes) } catch let away as KeyringAway { throw away.error }
    }
  }

}
