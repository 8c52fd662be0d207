/// The shape of org.tessera.Broker1 as the daemon serves it. dbus/org.tessera.Broker1.xml is the
/// contract; a test compares the running daemon's introspection with that file.
public enum BrokerInterface {
  public static let busName = "org.tessera.Broker1"
  public static let objectPath = "/org/tessera/Broker1"
  public static let interfaceName = "org.tessera.Broker1"
  public static let version = "0.1.0"

  public struct Argument: Sendable {
    public let name: String
    public let signature: String
  }

  public struct Method: Sendable {
    public let name: String
    public let inputs: [Argument]
    public let outputs: [Argument]
    public var inputSignature: String { inputs.map(\.signature).joined() }
    public var outputSignature: String { outputs.map(\.signature).joined() }
  }

  public struct Signal: Sendable {
    public let name: String
    public let arguments: [Argument]
    public var signature: String { arguments.map(\.signature).joined() }
  }

  public struct Property: Sendable {
    public let name: String
    public let signature: String
  }

  private static func arg(_ name: String, _ signature: String) -> Argument {
    Argument(name: name, signature: signature)
  }

  public static let methods: [Method] = [
    Method(
      name: "AcquireToken",
      inputs: [arg("client_id", "s"), arg("scopes", "as"), arg("options", "a{sv}")],
      outputs: [arg("result", "a{sv}")]),
    Method(
      name: "AcquireTokenSilent",
      inputs: [arg("client_id", "s"), arg("scopes", "as"), arg("account_id", "s"), arg("options", "a{sv}")],
      outputs: [arg("result", "a{sv}")]),
    Method(name: "GetAccounts", inputs: [arg("filter", "a{sv}")], outputs: [arg("accounts", "aa{sv}")]),
    Method(name: "SignOut", inputs: [arg("account_id", "s"), arg("options", "a{sv}")], outputs: []),
    Method(name: "Cancel", inputs: [arg("correlation_id", "s")], outputs: []),
  ]

  public static let signals: [Signal] = [
    Signal(name: "InteractionPending", arguments: [arg("correlation_id", "s"), arg("info", "a{sv}")]),
    Signal(name: "AccountsChanged", arguments: []),
  ]

  public static let properties: [Property] = [Property(name: "Version", signature: "s")]

  public static func method(named name: String) -> Method? { methods.first { $0.name == name } }
}
