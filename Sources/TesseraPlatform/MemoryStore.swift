import TesseraCore
import TesseraInterface

/// config.toml `store = "memory"`: items live in this process only. Nothing is written anywhere,
/// so a restart of tesserad needs a new sign-in (`tessera status` says so).
public final class MemoryStore: SecretStore {
  private let items = Locked<[[String: String]: StoredItem]>([:])

  public init() {}

  public var storeDescription: StoreDescription { StoreDescription(kind: .memory) }

  public func loadAll() async throws -> [StoredItem] { items.withLock { Array($0.values) } }

  public func save(_ item: StoredItem) async throws { items.withLock { $0[item.attributes] = item } }

  public func delete(matching attributes: [String: String]) async throws {
    items.withLock { stored in
      stored = stored.filter { _, item in !attributes.allSatisfy { item.attributes[$0.key] == $0.value } }
    }
  }

  public func probe(withinSeconds seconds: Double) async throws {}
}
