/// The stores tesserad can keep accounts and tokens in: one type for every place that names one
/// (config.toml's `store` and `allowed_stores`, GetStatus's `store`, MoveStore, the move journal).
/// On the wire and in files a store is its raw value.
public enum StoreKind: String, CaseIterable, Sendable, Equatable, CustomStringConvertible {
  /// The desktop keyring, over the session bus.
  case secretService = "secret-service"
  /// Sealed files under $XDG_STATE_HOME/tessera/store (FileStore).
  case file
  /// Nothing written: a restart needs a new sign-in.
  case memory

  /// The stores a move (`tessera store migrate`, MoveStore) goes between: the memory store
  /// keeps nothing to move.
  public static let movable: [StoreKind] = [.file, .secretService]

  /// The raw value, so that a message that interpolates a store reads as config.toml writes it.
  public var description: String { rawValue }

  /// The store as a sentence names it, for every message a user reads: "the Secret Service",
  /// "the file store /path" (or "the file store" without a path), "the memory store".
  public func name(path: String? = nil) -> String {
    switch self {
    case .secretService: "the Secret Service"
    case .file: path.map { "the file store \($0)" } ?? "the file store"
    case .memory: "the memory store"
    }
  }

  /// A store named on the wire (GetStatus's `store`): absent means a broker older than the key,
  /// which used the Secret Service; an unknown one (a newer broker's) is named as it is.
  public static func name(_ raw: String?, path: String? = nil) -> String {
    guard let raw else { return StoreKind.secretService.name(path: path) }
    return StoreKind(rawValue: raw)?.name(path: path) ?? "the store \(raw)"
  }

  /// The store a move names (MoveStore's `to`), or InvalidArgument naming the ones there are.
  public static func movable(named name: String) throws(TesseraError) -> StoreKind {
    guard let kind = StoreKind(rawValue: name), movable.contains(kind) else { throw notMovable(name) }
    return kind
  }

  /// A move to a store that is not among `movable`: InvalidArgument naming the ones there are.
  public static func notMovable(_ name: String) -> TesseraError {
    TesseraError.invalidArgument(
      "There is no store '\(RequestOptions.clip(name))' to move to; use one of: \(movable.map(\.rawValue).joined(separator: ", "))."
    )
  }
}
