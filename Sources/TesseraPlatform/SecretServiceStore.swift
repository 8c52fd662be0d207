import CSecret
import CTesseraShim
import Dispatch
import Glibc
import TesseraCore

/// The Secret Service through libsecret. libsecret's `*_sync` calls block, so they run on one
/// serial dispatch queue of their own, never on Swift's cooperative pool.
public final class SecretServiceStore: SecretStore, @unchecked Sendable {
  // Invariant for @unchecked Sendable: `schema` is immutable after init; libsecret calls run on `queue`.
  private let queue = DispatchQueue(label: "tessera.secret-service")
  private let schema: UnsafeMutablePointer<SecretSchema>

  /// libsecret schema name; stored as `xdg:schema` on every item. Documented in docs/storage.md.
  public static let schemaName = "org.tessera.Broker1"
  static let attributeNames = ["tessera_schema", "kind", "account_id", "environment", "client_id", "realm", "scopes"]

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
  private func checkUnlocked() throws {
    var error: UnsafeMutablePointer<GError>?
    guard let service = secret_service_get_sync(SECRET_SERVICE_NONE, nil, &error) else {
      throw Self.unavailable(Self.take(error))
    }
    defer { g_object_unref(UnsafeMutableRawPointer(service)) }
    guard let collection = secret_collection_for_alias_sync(service, "default", SECRET_COLLECTION_NONE, nil, &error)
    else {
      let detail = error == nil ? "there is no default keyring collection" : Self.take(error)
      throw Self.unavailable(detail)
    }
    defer { g_object_unref(UnsafeMutableRawPointer(collection)) }
    if secret_collection_get_locked(collection) != 0 {
      throw TesseraError.storeUnavailable(
        "The keyring is locked. Unlock it (log in to the desktop session, or unlock the 'login' keyring in Passwords and Keys / seahorse), "
          + "then retry; Tessera keeps its accounts and will use them again once it is unlocked.")
    }
  }

  public func loadAll() async throws -> [StoredItem] {
    try await run {
      let schema = self.schema
      try self.checkUnlocked()
      let match = Self.attributesTable(TokenCache.allItemsAttributes)
      defer { g_hash_table_unref(match) }
      var error: UnsafeMutablePointer<GError>?
      let flags = SecretSearchFlags(rawValue: SECRET_SEARCH_ALL.rawValue | SECRET_SEARCH_LOAD_SECRETS.rawValue)
      let list = secret_password_searchv_sync(schema, match, flags, nil, &error)
      if let error { throw Self.unavailable(Self.take(error)) }
      defer { g_list_free_full(list, g_object_unref) }
      var items: [StoredItem] = []
      var node = list
      while let current = node {
        node = current.pointee.next
        guard let raw = current.pointee.data else { continue }
        let retrievable = OpaquePointer(raw)
        var attributes: [String: String] = [:]
        if let table = secret_retrievable_get_attributes(retrievable) {
          var iterator = GHashTableIter()
          g_hash_table_iter_init(&iterator, table)
          var key: gpointer?
          var value: gpointer?
          while g_hash_table_iter_next(&iterator, &key, &value) != 0 {
            if let key, let value {
              attributes[String(cString: key.assumingMemoryBound(to: CChar.self))] = String(
                cString: value.assumingMemoryBound(to: CChar.self))
            }
          }
          g_hash_table_unref(table)
        }
        var itemError: UnsafeMutablePointer<GError>?
        guard let secret = secret_retrievable_retrieve_secret_sync(retrievable, nil, &itemError) else {
          throw Self.unavailable("an item could not be read: \(Self.take(itemError))")
        }
        let text = secret_value_get_text(secret).map { String(cString: $0) }
        secret_value_unref(UnsafeMutableRawPointer(secret))
        guard let text else { continue }
        let label =
          secret_retrievable_get_label(retrievable).map { pointer in
            defer { g_free(pointer) }
            return String(cString: pointer)
          } ?? ""
        items.append(StoredItem(attributes: attributes, secret: text, label: label))
      }
      return items
    }
  }

  /// Hands memory freed after a big load back to the system (glibc keeps it otherwise).
  public static func releaseFreedMemory() {
    _ = malloc_trim(0)
  }

  public func save(_ item: StoredItem) async throws {
    try await run {
      // Checked first: storing into a locked collection would ask the keyring to prompt for the
      // password, which could hold the store queue until someone answers.
      try self.checkUnlocked()
      try self.saveNow(item)
    }
  }

  /// On the store queue, after checkUnlocked().
  private func saveNow(_ item: StoredItem) throws {
    let attributes = Self.attributesTable(item.attributes)
    defer { g_hash_table_unref(attributes) }
    var error: UnsafeMutablePointer<GError>?
    if secret_password_storev_sync(schema, attributes, collection, item.label, item.secret, nil, &error) == 0 {
      throw Self.unavailable(Self.take(error))
    }
  }

  /// On the store queue, after checkUnlocked().
  private func deleteNow(_ attributes: [String: String]) throws {
    let table = Self.attributesTable(attributes)
    defer { g_hash_table_unref(table) }
    var error: UnsafeMutablePointer<GError>?
    _ = secret_password_clearv_sync(schema, table, nil, &error)
    if let error { throw Self.unavailable(Self.take(error)) }
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
          throw StoreBatchError(completed: index, error: error)
        }
      }
    }
  }

  public func delete(matching attributes: [String: String]) async throws {
    try await run {
      try self.checkUnlocked()
      try self.deleteNow(attributes)
    }
  }

}
