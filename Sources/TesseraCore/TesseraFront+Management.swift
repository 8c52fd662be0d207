import Logging
import TesseraInterface

/// org.tessera.Broker1's calls that manage rather than get tokens: the account list, the current
/// account, a store move, and forwards. Each its own function, so `dispatch` stays a table.
extension TesseraFront {
  /// A call's arguments, read by position (their types were checked against the method's).
  struct Arguments {
    let values: [BusValue]
    func string(_ i: Int) -> String { values[i].stringValue ?? "" }
    func strings(_ i: Int) -> [String] { if case .strings(let v) = values[i] { v } else { [] } }
    func dict(_ i: Int) -> [String: BusValue] { values[i].dictValue ?? [:] }
  }

  func accounts(_ a: Arguments, _ caller: CallerInfo, _ metadata: inout Logger.Metadata) async throws -> [BusValue] {
    var parsed = try RequestParser.accountFilter(a.dict(0))
    parsed.caller = caller
    if let clientID = parsed.clientID { metadata["client_id"] = "\(clientID)" }
    let accounts = try await broker.knownAccounts(matching: parsed)
    metadata["accounts"] = "\(accounts.count)"
    let current = await broker.currentAccountIDs()
    let bound = await broker.boundAccountIDs()
    return [
      .dicts(
        accounts.map { account in
          var info = account.info
          info.current = current.contains(account.id)
          info.tokenBinding = bound.contains(account.id) ? "dpop" : "bearer"
          return info.busValue
        })
    ]
  }

  func setCurrentAccount(_ a: Arguments, _ caller: CallerInfo, _ metadata: inout Logger.Metadata) async throws
    -> [BusValue]
  {
    try RequestOptions.checkText(a.string(0), name: "account", max: ArgumentLimits.accountIDBytes)
    try RequestOptions.checkText(a.string(1), name: "authority", max: 2048, allowSpaces: false)
    guard !a.string(0).isEmpty else {
      throw TesseraError.invalidArgument(
        "SetCurrentAccount needs an account id or username. Call GetAccounts to list them.")
    }
    let account = try await broker.makeCurrent(a.string(0), authority: a.string(1), caller: caller)
    metadata["account_id"] = "\(account.id)"
    var info = account.info
    info.current = true
    return [.dict(info.busValue)]
  }

  func moveStore(_ a: Arguments, _ caller: CallerInfo, _ metadata: inout Logger.Metadata) async throws -> [BusValue] {
    try RequestOptions.checkText(a.string(0), name: "to", max: 64, allowSpaces: false)
    if let key = a.dict(1).keys.sorted().first {
      throw TesseraError.invalidArgument(
        "MoveStore takes no option '\(RequestOptions.clip(key))': its options must be empty.")
    }
    metadata["to"] = "\(a.string(0))"
    let result = try await broker.moveStore(to: StoreKind.movable(named: a.string(0)), caller: caller)
    metadata["from"] = "\(result.from)"
    metadata["items"] = "\(result.items)"
    return [.dict(result.busValue)]
  }

  func addForward(_ a: Arguments, _ caller: CallerInfo, _ metadata: inout Logger.Metadata) async throws -> [BusValue] {
    try await broker.checkMayManage(caller)
    try await broker.checkForwardingAllowed()
    let (name, host, path) = (a.string(0), a.string(1), a.string(2))
    guard AppIdentity.isForwardName(name) else {
      throw TesseraError.invalidArgument(
        "'\(RequestOptions.clip(name))' cannot name a forward: use 1 to 64 of the letters A-Z a-z, digits, '.', '_' and '-', not starting with '.'."
      )
    }
    try RequestOptions.checkText(host, name: "host", max: 255)
    guard host.isEmpty || AppIdentity.isForwardHost(host) else {
      throw TesseraError.invalidArgument(
        "'\(RequestOptions.clip(host))' cannot be a forward's host: give the ssh destination as `host` or `user@host` (letters, digits and . _ - @ : [ ] %)."
      )
    }
    try RequestOptions.checkText(path, name: "path", max: 107)
    guard path.isEmpty || path.hasPrefix("/") else {
      throw TesseraError.invalidArgument(
        "The forward's path '\(RequestOptions.clip(path))' must be absolute (or empty for the default place).")
    }
    try RequestOptions.validate(a.dict(3), for: .addForward)
    var lasting = false
    if case .bool(let value)? = a.dict(3)[RequestOptions.lasting.key] { lasting = value }
    guard let forwards = broker.deps.forwards else {
      throw TesseraError.invalidArgument("This tesserad cannot make forwards (it serves no socket of its own).")
    }
    metadata["forward"] = "\(name)"
    metadata["host"] = "\(host)"
    let made = try await forwards.open(name: name, host: host, path: path, lasting: lasting, owner: caller)
    // A reload that forbade forwards while this one was being opened: it goes too.
    do { try await broker.checkForwardingAllowed() } catch {
      _ = await forwards.close(name: name, reason: Broker.forwardsForbidden)
      throw error
    }
    metadata["path"] = "\(made)"
    return [.string(made)]
  }

  func removeForward(_ a: Arguments, _ caller: CallerInfo, _ metadata: inout Logger.Metadata) async throws
    -> [BusValue]
  {
    try await broker.checkMayManage(caller)
    try RequestOptions.checkText(a.string(0), name: "name", max: 64)
    metadata["forward"] = "\(a.string(0))"
    guard let forwards = broker.deps.forwards,
      await forwards.close(name: a.string(0), reason: "ended by RemoveForward (`tessera forward --stop`)")
    else {
      throw TesseraError.invalidArgument(
        "There is no forward named '\(RequestOptions.clip(a.string(0)))'. `tessera forward --list` shows the live ones."
      )
    }
    return []
  }
}
