/// One forward of tesserad's socket (`tessera forward`, issue 24): a listener of its own whose
/// every caller is the app `forward:NAME`, as ListForwards returns it.
public struct ForwardInfo: Sendable, Equatable, Codable {
  public var name: String
  /// The host it is forwarded to ("" for a container socket).
  public var host: String
  /// The listener's socket on this machine.
  public var path: String
  /// Lives until RemoveForward or tesserad stops (a container socket); else it ends with the
  /// connection that made it (the `tessera forward` running ssh).
  public var lasting: Bool
  /// Unix seconds it was made.
  public var since: Int64
  /// Connections open on it now.
  public var connections: UInt32
  /// The process of the connection that made it (nil for a lasting forward).
  public var ownerPID: UInt32?

  public init(
    name: String, host: String, path: String, lasting: Bool, since: Int64, connections: UInt32, ownerPID: UInt32?
  ) {
    self.name = name
    self.host = host
    self.path = path
    self.lasting = lasting
    self.since = since
    self.connections = connections
    self.ownerPID = ownerPID
  }

  enum CodingKeys: String, CodingKey {
    case name, host, path, lasting, since, connections
    case ownerPID = "owner_pid"
  }

  /// The caller every connection on it is: its name and the host it leads to.
  public var identity: AppIdentity { .forward(name, host: host.isEmpty ? nil : host, path: path) }

  public init(busValue d: [String: BusValue]) {
    var lasting = false
    if case .bool(let b)? = d[CodingKeys.lasting.rawValue] { lasting = b }
    var since: Int64 = 0
    if case .int64(let s)? = d[CodingKeys.since.rawValue] { since = s }
    var connections: UInt32 = 0
    if case .uint32(let c)? = d[CodingKeys.connections.rawValue] { connections = c }
    var owner: UInt32?
    if case .uint32(let p)? = d[CodingKeys.ownerPID.rawValue] { owner = p }
    self.init(
      name: d[CodingKeys.name.rawValue]?.stringValue ?? "", host: d[CodingKeys.host.rawValue]?.stringValue ?? "",
      path: d[CodingKeys.path.rawValue]?.stringValue ?? "", lasting: lasting, since: since,
      connections: connections, ownerPID: owner)
  }

  public var busValue: [String: BusValue] {
    var d: [String: BusValue] = [
      CodingKeys.name.rawValue: .string(name), CodingKeys.host.rawValue: .string(host),
      CodingKeys.path.rawValue: .string(path), CodingKeys.lasting.rawValue: .bool(lasting),
      CodingKeys.since.rawValue: .int64(since), CodingKeys.connections.rawValue: .uint32(connections),
    ]
    if let ownerPID { d[CodingKeys.ownerPID.rawValue] = .uint32(ownerPID) }
    return d
  }

  /// The most forwards at once.
  public static let limit = 64
}
