import CSystemd
import CTesseraBusShim
import Glibc
import SystemPackage
import TesseraInterface

/// Method calls in: the vtable of each exported interface, the signature filter that sees every
/// message, decoding a call within its interface's limits, refusing what the handler must not see
/// (another user's connection, wrong types, over the limits), the bus thread's own answers, and
/// handing the rest to the server's handler.
extension BusServer {
  func handleMethodCall(_ message: OpaquePointer, object: ExportedObject) -> Int32 {
    preconditionOnBusThread()
    let member = sd_bus_message_get_member(message).map { String(cString: $0) } ?? ""
    let arguments: [BusValue]
    do {
      arguments = try BusCodec.readAll(message, limits: object.description.callLimits)
    } catch let over as BusCodec.OverLimit {
      let inputs = object.description.methods.first { $0.name == member }?.inputs ?? []
      var place = over.argument.flatMap { $0 < inputs.count ? "argument \(inputs[$0].name)" : nil } ?? "a value"
      if let key = over.key { place += ", key '\(RequestOptions.clip(key))'" }
      return refuse(
        message, member,
        .invalidArgument(
          "The call to \(member) was refused before being read whole: \(place) holds \(over). Send fewer or shorter values (the limits are annotated in \(object.description.name).xml)."
        ))
    } catch {
      return refuse(
        message, member,
        .invalidArgument("The arguments of \(member) could not be read (\(error)). Check their types."))
    }
    let caller = callerInfo(message)
    // A session bus serves one user; a bus that lets another user connect (or a peer that passed
    // its connection on) must not reach anyone's tokens through it. Refused before anything else.
    if let refusal = refusalForAnotherUser(caller) { return refuse(message, member, .accessDenied(refusal)) }
    let call = Call(exported: object.box, member: member, arguments: arguments, caller: caller)
    switch answerAtOnce?(call) {
    case .reply(let result)?:
      send(reply: result, to: message)
      return 1
    case .template(let template, let key, let value)?:
      send(template, adding: key, value, to: message)
      return 1
    case nil: break
    }
    guard admitDirectCall(message, member: member) else { return 1 }
    nextID &+= 1
    pending[nextID] = sd_bus_message_ref(message)
    onCall(call, ReplyToken(id: nextID))
    return 1
  }

  /// Rejects calls whose argument types do not match the contract with our own error name
  /// (sd-bus would answer org.freedesktop.DBus.Error.InvalidArgs). It sees every message, so the
  /// common case (a call to one of our methods with the right types, or a message for someone else)
  /// is decided on C strings without building Swift ones.
  func filter(_ message: OpaquePointer) -> Int32 {
    preconditionOnBusThread()
    guard sd_bus_message_is_method_call(message, nil, nil) > 0, let path = sd_bus_message_get_path(message),
      let member = sd_bus_message_get_member(message)
    else { return 0 }
    // Calls may omit the interface field; sd-bus then dispatches them by member name.
    let interface = sd_bus_message_get_interface(message)
    for object in objects where strcmp(object.path, path) == 0 {
      guard interface.map({ strcmp($0, object.interfaceName) == 0 }) ?? true,
        let index = object.methodNames.firstIndex(where: { strcmp($0, member) == 0 })
      else { continue }
      let method = object.description.methods[index]
      guard sd_bus_message_has_signature(message, object.inputSignatures[index]) == 0 else { return 0 }
      let given = sd_bus_message_get_signature(message, 1).map { String(cString: $0) } ?? ""
      let names = method.inputs.map { "\($0.name): \($0.signature)" }.joined(separator: ", ")
      return refuse(
        message, method.name,
        .invalidArgument(
          "\(method.name) takes (\(names)), but was called with arguments of type '\(given)'. Fix the argument types of the call."
        ))
    }
    return 0
  }

  /// Refuses a call the handler never sees, and logs it (as the fronts log the calls they answer):
  /// at most `refusalsLoggedPerSecond` lines a second, then one line counting the rest, so a flood
  /// of bad calls can neither flood the journal nor churn the bus thread's memory.
  func refuse(_ message: OpaquePointer, _ member: String, _ failure: TesseraError) -> Int32 {
    var now = timespec()
    clock_gettime(CLOCK_MONOTONIC, &now)
    let (logThis, suppressed) = refusals.admit(second: Int(now.tv_sec))
    if suppressed > 0 {
      log(.notice, "\(suppressed) more calls were refused before being read (not logged one by one)")
    }
    if logThis {
      let caller = callerInfo(message)
      log(
        .notice,
        "\(member) refused before the request was read: \(failure.message) [caller \(caller.busName), pid \(caller.pid.map(String.init) ?? "?"), \(caller.exe ?? "?")]"
      )
    }
    return replyError(message, failure)
  }
  func exportedObject(of message: OpaquePointer) -> ExportedObject? {
    guard let path = sd_bus_message_get_path(message) else { return nil }
    let interface = sd_bus_message_get_interface(message)
    return objects.first { object in
      strcmp(object.path, path) == 0 && (interface.map { strcmp($0, object.interfaceName) == 0 } ?? true)
    }
  }

}

/// One exported interface: its description and the sd-bus vtable built from it. Lives as long as
/// the server (sd-bus keeps pointers to the vtable and its strings).
final class ExportedObject: @unchecked Sendable {
  // Invariant: `server` is set once, before the bus thread starts; the rest is immutable.
  let description: InterfaceDescription
  /// The same, for the calls made on it (BusServer.Call).
  let box: BusServer.InterfaceBox
  let vtable: UnsafeMutablePointer<sd_bus_vtable>
  /// C strings for the signature filter, which sees every message.
  let path: UnsafePointer<CChar>
  let interfaceName: UnsafePointer<CChar>
  let methodNames: [UnsafePointer<CChar>]
  let inputSignatures: [UnsafePointer<CChar>]
  unowned(unsafe) var server: BusServer!

  init(description: InterfaceDescription) {
    self.description = description
    box = BusServer.InterfaceBox(description)
    let count = 2 + description.methods.count + description.properties.count + description.signals.count
    let table = UnsafeMutablePointer<sd_bus_vtable>.allocate(capacity: count)
    func keep(_ s: String) -> UnsafePointer<CChar> { UnsafePointer(strdup(s)!) }
    func names(_ args: [InterfaceDescription.Argument]) -> UnsafePointer<CChar> {
      let bytes: [CChar] = args.flatMap { Array($0.name.utf8CString) } + [0]
      let buffer = UnsafeMutablePointer<CChar>.allocate(capacity: bytes.count)
      buffer.initialize(from: bytes, count: bytes.count)
      return UnsafePointer(buffer)
    }
    var i = 0
    tessera_vtable_start(table + i, 0)
    i += 1
    for method in description.methods {
      tessera_vtable_method(
        table + i, keep(method.name), keep(method.inputSignature), keep(method.outputSignature),
        names(method.inputs + method.outputs), methodHandler, 0)
      i += 1
    }
    for property in description.properties {
      tessera_vtable_property(
        table + i, keep(property.name), keep(property.signature), propertyGetter,
        property.emitsChange ? tessera_vtable_property_emits_change() : tessera_vtable_property_const())
      i += 1
    }
    for signal in description.signals {
      tessera_vtable_signal(table + i, keep(signal.name), keep(signal.signature), names(signal.arguments), 0)
      i += 1
    }
    tessera_vtable_end(table + i)
    vtable = table
    path = keep(description.objectPath)
    interfaceName = keep(description.name)
    methodNames = description.methods.map { keep($0.name) }
    inputSignatures = description.methods.map { keep($0.inputSignature) }
  }
}

func object(_ userdata: UnsafeMutableRawPointer?) -> ExportedObject {
  Unmanaged<ExportedObject>.fromOpaque(userdata!).takeUnretainedValue()
}

let methodHandler: sd_bus_message_handler_t = { message, userdata, _ in
  guard let message else { return 0 }
  let exported = object(userdata)
  return exported.server.handleMethodCall(message, object: exported)
}

let signatureFilter: sd_bus_message_handler_t = { message, userdata, _ in
  guard let message else { return 0 }
  return server(userdata).filter(message)
}
