import CSystemd
import Glibc
import SystemPackage
import TesseraInterface

/// Properties: their current values, PropertiesChanged, and the getter sd-bus calls.
extension BusServer {
  /// Sets a changing property (see `InterfaceDescription.Property.emitsChange`) and emits
  /// PropertiesChanged when the value is new. Thread-safe.
  public func setProperty(_ interface: InterfaceDescription, _ name: String, _ value: BusValue) {
    let changed = propertyValues.withLock { values -> Bool in
      guard values[interface.name]?[name] != value else { return false }
      values[interface.name, default: [:]][name] = value
      return true
    }
    if changed { post(.property(path: interface.objectPath, interface: interface.name, name: name)) }
  }

  /// The current value of a changing property (its initial value until set).
  func propertyValue(_ interface: InterfaceDescription, _ name: String) -> BusValue? {
    propertyValues.withLock { $0[interface.name]?[name] }
      ?? interface.properties.first { $0.name == name }?.value
  }
}

let propertyGetter: sd_bus_property_get_t = { bus, _, _, property, reply, userdata, error in
  guard let reply, let property else { return -EINVAL }
  let name = String(cString: property)
  let exported = object(userdata)
  // A property that changes carries the user's data (AttentionNeeded: account ids): like every
  // method, it is not for another user's connection.
  // No current message: the daemon itself builds PropertiesChanged.
  if exported.description.properties.first(where: { $0.name == name })?.emitsChange == true,
    let asking = sd_bus_get_current_message(bus), let refusal = exported.server.refusalForAnotherUser(asking)
  {
    return sd_bus_error_set(error, TesseraError.Code.accessDenied.dbusName, refusal)
  }
  // A forwarded caller may read the version alone.
  if let asking = sd_bus_get_current_message(bus), let peer = exported.server.directPeer(of: asking),
    let forward = peer.forward, !BrokerInterface.forwardedProperties.contains(name)
  {
    return sd_bus_error_set(
      error, TesseraError.Code.accessDenied.dbusName,
      "A caller that comes through the forward \(forward) may only get tokens: the property \(name) is not served to it."
    )
  }
  guard let value = exported.server.propertyValue(exported.description, name) else { return -EINVAL }
  do {
    try BusCodec.append(reply, value)
    return 1
  } catch let failure as BusCodec.Failure {
    return -failure.errno
  } catch {
    return -EINVAL
  }
}
