import CSystemd
import Glibc
import SystemPackage
import TesseraInterface

/// Who is calling: each connection's uid, pid, executable and app, read once per connection (its
/// process pinned through `identify` and rechecked at every later call), forgotten when it leaves
/// the bus; and the refusal of another user's connection.
extension BusServer {
  /// The AccessDenied text for a message from another user's connection; nil for our own user.
  func refusalForAnotherUser(_ message: OpaquePointer) -> String? {
    refusalForAnotherUser(callerInfo(message))
  }

  /// The same, for a caller already looked up (each lookup rechecks its process: once per call).
  func refusalForAnotherUser(_ caller: CallerInfo) -> String? {
    guard caller.uid != ownUID else { return nil }
    return
      "This broker serves user \(ownUID) only; the caller runs as \(caller.uid.map { "user \($0)" } ?? "an unknown user")."
  }

  func callerInfo(_ message: OpaquePointer) -> CallerInfo {
    preconditionOnBusThread()
    let sender: String
    if let messageBus = sd_bus_message_get_bus(message), messageBus != bus {
      // A direct connection has no bus daemon to stamp the sender, and its peer may write any
      // name there (another caller's, to take its identity): it is known by its connection
      // alone. A connection already let go is nobody (refused as an unknown user).
      guard let peer = peers[messageBus] else { return CallerInfo(busName: "") }
      sender = peer.name
    } else {
      sender = sd_bus_message_get_sender(message).map { String(cString: $0) } ?? ""
    }
    if var cached = callerCache[sender] {
      // The process that connected has ended, or now runs another program: identified anew.
      if let process = cached.process, process.recheck() {
        let before = cached.info.app?.display ?? "unidentified"
        cached.info.app = process.app
        callerCache[sender] = cached
        log(
          .notice,
          "Caller \(sender) (pid \(cached.info.pid.map(String.init) ?? "?")) is no longer \(before): \(process.app.map { "it now runs \($0.display)" } ?? "the process that connected has ended")"
        )
      }
      return cached.info
    }
    var info = CallerInfo(busName: sender)
    var process: (any CallerProcess)?
    var creds: OpaquePointer?
    let mask = UInt64(
      SD_BUS_CREDS_PID | SD_BUS_CREDS_EUID | SD_BUS_CREDS_EXE | SD_BUS_CREDS_SELINUX_CONTEXT | SD_BUS_CREDS_AUGMENT)
    if sd_bus_query_sender_creds(message, mask, &creds) >= 0, let creds {
      var pid: pid_t = 0
      if sd_bus_creds_get_pid(creds, &pid) >= 0 { info.pid = UInt32(pid) }
      var uid: uid_t = 0
      if sd_bus_creds_get_euid(creds, &uid) >= 0 { info.uid = uid }
      var exe: UnsafePointer<CChar>?
      if sd_bus_creds_get_exe(creds, &exe) >= 0, let exe { info.exe = String(cString: exe) }
      // The LSM label (AppArmor's for snaps): what the bus daemon saw at connect time.
      var label: UnsafePointer<CChar>?
      let hasLabel = sd_bus_creds_get_selinux_context(creds, &label) >= 0 && label != nil
      if let identify, let pid = info.pid {
        process = identify(pid, hasLabel ? String(cString: label!) : nil)
        info.app = process?.app
      }
      sd_bus_creds_unref(creds)
    }
    // Entries leave with their callers (NameOwnerChanged). Each pin holds a pidfd, so they are
    // bounded by the descriptors there are: a caller past that is not identified (it could not
    // be rechecked). A live caller's entry is never dropped: it would be identified again by a
    // pid that may by then name another process.
    if callerCache.count >= pinLimit {
      process = nil
      info.app = nil
    }
    callerCache[sender] = (info, process)
    return info
  }
}

/// A caller's process as identified at its connection's first call (TesseraPlatform pins it with
/// a pidfd), rechecked at every later call.
public protocol CallerProcess: AnyObject, Sendable {
  /// Who the process is; nil when it could not be identified or has ended.
  var app: AppIdentity? { get }
  /// The program it ran when identified (a hint for the log), read once with the rest.
  var executable: String? { get }
  /// Looks again; true when `app` changed (the process ended, or exec'd another program).
  func recheck() -> Bool
}

extension CallerProcess {
  public var executable: String? { nil }
}
