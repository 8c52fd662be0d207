/// A D-Bus interface as a server exports it and a client calls it: its well-known name, object
/// path, methods, signals and constant properties. The bus layer builds its vtable from this, and a
/// test compares the running daemon's introspection with the contract XML under dbus/.
public struct InterfaceDescription: Sendable {
  public struct Argument: Sendable {
    public let name: String
    public let signature: String
    public init(_ name: String, _ signature: String) {
      self.name = name
      self.signature = signature
    }
  }

  public struct Method: Sendable {
    public let name: String
    public let inputs: [Argument]
    public let outputs: [Argument]
    public let inputSignature: String
    public let outputSignature: String
    public init(_ name: String, inputs: [Argument], outputs: [Argument]) {
      self.name = name
      self.inputs = inputs
      self.outputs = outputs
      inputSignature = inputs.map(\.signature).joined()
      outputSignature = outputs.map(\.signature).joined()
    }
  }

  public struct Signal: Sendable {
    public let name: String
    public let arguments: [Argument]
    public var signature: String { arguments.map(\.signature).joined() }
    public init(_ name: String, _ arguments: [Argument]) {
      self.name = name
      self.arguments = arguments
    }
  }

  /// A read-only property: constant while the daemon runs, or, with `emitsChange`, a value the
  /// daemon updates (with PropertiesChanged); `value` is then its initial value.
  public struct Property: Sendable {
    public let name: String
    public let value: BusValue
    public let emitsChange: Bool
    public var signature: String { value.signature }
    public init(_ name: String, _ value: BusValue, emitsChange: Bool = false) {
      self.name = name
      self.value = value
      self.emitsChange = emitsChange
    }
  }

  public let busName: String
  public let objectPath: String
  public let name: String
  public let methods: [Method]
  public let signals: [Signal]
  public let properties: [Property]
  /// Limits applied while a call's values are decoded (see WireLimits).
  public let callLimits: WireLimits
  /// How a call the bus layer refuses before the handler sees it (wrong argument types, over the
  /// limits) is answered: nil for a D-Bus error of the table's name; else the method's reply
  /// values (a protocol whose errors travel inside its replies).
  public let refusal: (@Sendable (_ method: String, _ error: TesseraError) -> [BusValue])?
  /// Whether the server may run without this interface's well-known name (another program owns
  /// it): it then serves its other names and reports the missing one.
  public let nameIsOptional: Bool

  public init(
    busName: String, objectPath: String, name: String, methods: [Method], signals: [Signal] = [],
    properties: [Property] = [], callLimits: WireLimits = .calls,
    refusal: (@Sendable (_ method: String, _ error: TesseraError) -> [BusValue])? = nil,
    nameIsOptional: Bool = false
  ) {
    self.busName = busName
    self.objectPath = objectPath
    self.name = name
    self.methods = methods
    self.signals = signals
    self.properties = properties
    self.callLimits = callLimits
    self.refusal = refusal
    self.nameIsOptional = nameIsOptional
  }

  public func method(named name: String) -> Method? { methods.first { $0.name == name } }
}

/// The shape of org.tessera.Broker1 as the daemon serves it. dbus/org.tessera.Broker1.xml is the
/// contract; a test compares the running daemon's introspection with that file.
public enum BrokerInterface {
  public static let busName = "org.tessera.Broker1"
  public static let objectPath = "/org/tessera/Broker1"
  public static let interfaceName = "org.tessera.Broker1"
  public static let version = "0.1.0"

  public typealias Method = InterfaceDescription.Method
  private typealias Arg = InterfaceDescription.Argument

  /// The methods, once: the interface description, the daemon's dispatch and the client's calls
  /// all use these names, with exhaustive switches.
  public enum MethodName: String, CaseIterable, Sendable {
    case acquireToken = "AcquireToken"
    case acquireTokenSilent = "AcquireTokenSilent"
    case getAccounts = "GetAccounts"
    case countHiddenAccounts = "CountHiddenAccounts"
    case signOut = "SignOut"
    case cancel = "Cancel"
    case getStatus = "GetStatus"
    case listGrants = "ListGrants"
    case grant = "Grant"
    case revoke = "Revoke"
    case getAccessLog = "GetAccessLog"
    case setCurrentAccount = "SetCurrentAccount"
    case moveStore = "MoveStore"
    case addForward = "AddForward"
    case removeForward = "RemoveForward"
    case listForwards = "ListForwards"
    // Last: the fuzz seeds name methods by their place in this list (new methods go after).
    case rejectToken = "RejectToken"
    case revokeGrant = "RevokeGrant"
    case registerPrompter = "RegisterPrompter"
    case answerQuestion = "AnswerQuestion"
    case getProof = "GetProof"

    /// The method's arguments and results, as the contract XML declares them.
    public var spec: Method {
      switch self {
      case .acquireToken:
        Method(
          rawValue, inputs: [Arg("client_id", "s"), Arg("scopes", "as"), Arg("options", "a{sv}")],
          outputs: [Arg("result", "a{sv}")])
      case .acquireTokenSilent:
        Method(
          rawValue,
          inputs: [Arg("client_id", "s"), Arg("scopes", "as"), Arg("account_id", "s"), Arg("options", "a{sv}")],
          outputs: [Arg("result", "a{sv}")])
      case .getAccounts: Method(rawValue, inputs: [Arg("filter", "a{sv}")], outputs: [Arg("accounts", "aa{sv}")])
      case .countHiddenAccounts: Method(rawValue, inputs: [], outputs: [Arg("hidden", "u")])
      case .signOut: Method(rawValue, inputs: [Arg("account_id", "s"), Arg("options", "a{sv}")], outputs: [])
      case .rejectToken:
        Method(
          rawValue,
          inputs: [Arg("client_id", "s"), Arg("account_id", "s"), Arg("token", "s"), Arg("options", "a{sv}")],
          outputs: [Arg("dropped", "b")])
      case .cancel: Method(rawValue, inputs: [Arg("correlation_id", "s")], outputs: [])
      case .getStatus: Method(rawValue, inputs: [], outputs: [Arg("status", "a{sv}")])
      case .listGrants: Method(rawValue, inputs: [], outputs: [Arg("grants", "aa{sv}")])
      case .grant:
        Method(
          rawValue,
          inputs: [
            Arg("app", "s"), Arg("client_id", "s"), Arg("account_id", "s"), Arg("authority", "s"),
            Arg("scopes", "as"), Arg("operations", "as"),
          ], outputs: [])
      case .revoke: Method(rawValue, inputs: [Arg("app", "s"), Arg("client_id", "s")], outputs: [Arg("removed", "u")])
      case .registerPrompter: Method(rawValue, inputs: [], outputs: [])
      case .getProof:
        Method(
          rawValue, inputs: [Arg("method", "s"), Arg("url", "s"), Arg("token", "s"), Arg("options", "a{sv}")],
          outputs: [Arg("proof", "s")])
      case .answerQuestion:
        Method(rawValue, inputs: [Arg("id", "s"), Arg("answer", "s"), Arg("options", "a{sv}")], outputs: [])
      case .revokeGrant:
        Method(
          rawValue, inputs: [Arg("app", "s"), Arg("client_id", "s"), Arg("account_id", "s")],
          outputs: [Arg("removed", "u")])
      case .getAccessLog: Method(rawValue, inputs: [], outputs: [Arg("records", "aa{sv}")])
      case .setCurrentAccount:
        Method(rawValue, inputs: [Arg("account", "s"), Arg("authority", "s")], outputs: [Arg("result", "a{sv}")])
      case .moveStore:
        Method(rawValue, inputs: [Arg("to", "s"), Arg("options", "a{sv}")], outputs: [Arg("result", "a{sv}")])
      case .addForward:
        Method(
          rawValue, inputs: [Arg("name", "s"), Arg("host", "s"), Arg("path", "s"), Arg("options", "a{sv}")],
          outputs: [Arg("path", "s")])
      case .removeForward: Method(rawValue, inputs: [Arg("name", "s")], outputs: [])
      case .listForwards: Method(rawValue, inputs: [], outputs: [Arg("forwards", "aa{sv}")])
      }
    }
  }

  public static let description = InterfaceDescription(
    busName: busName, objectPath: objectPath, name: interfaceName,
    methods: MethodName.allCases.map(\.spec),
    signals: [
      .init("InteractionPending", [Arg("correlation_id", "s"), Arg("info", "a{sv}")]),
      .init(accountsChanged, []),
      .init(forwardEnded, [Arg("name", "s"), Arg("reason", "s")]),
      .init(managementChanged, [Arg("part", "s")]),
      .init(question, [Arg("id", "s"), Arg("info", "a{sv}")]),
    ],
    properties: [.init("Version", .string(version)), .init(attentionNeeded, .strings([]), emitsChange: true)])

  /// Sent to the connection that made a forward when it ends by RemoveForward or tesserad
  /// stopping: `tessera forward` then ends its ssh.
  public static let forwardEnded = "ForwardEnded"
  public static let accountsChanged = "AccountsChanged"
  /// Broadcast when what `tessera access`, `tessera forward` or a reload changes did change: the
  /// argument is a ManagementPart. It carries no detail: who may read the detail calls for it.
  public static let managementChanged = "ManagementChanged"

  /// Sent only to the connection that called RegisterPrompter (the desktop app): a question for
  /// the user, answered with AnswerQuestion. See Question's keys.
  public static let question = "Question"

  /// What a ManagementChanged signal says changed, and what to read again.
  public enum ManagementPart: String, Sendable, CaseIterable {
    /// ListGrants: a grant made (by a command, "Always allow", a sign-in) or revoked.
    case grants
    /// ListForwards: a forward opened or ended.
    case forwards
    /// GetStatus's config: a reload put in force, or refused.
    case config
  }

  /// What a caller that came through a forward may call (issue 24): tokens (and dropping one a
  /// resource refused, and the DPoP proofs of one it holds), the accounts it holds a grant for, and
  /// cancelling its own call. Everything else is refused on the bus
  /// thread, before the engine sees it, and again by the engine.
  public static let forwardedMethods: Set<String> = [
    MethodName.acquireTokenSilent.rawValue, MethodName.getAccounts.rawValue, MethodName.countHiddenAccounts.rawValue,
    MethodName.rejectToken.rawValue, MethodName.cancel.rawValue, MethodName.getProof.rawValue,
  ]
  /// The one property a forwarded caller may read.
  public static let forwardedProperties: Set<String> = ["Version"]

  /// The accounts (ids) that need the user to sign in again; PropertiesChanged tells when it changes.
  public static let attentionNeeded = "AttentionNeeded"

  public static var methods: [Method] { description.methods }
  public static func method(named name: String) -> Method? { description.method(named: name) }
}
