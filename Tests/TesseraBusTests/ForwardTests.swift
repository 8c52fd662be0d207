import Glibc
import TesseraInterface
import TesseraTestSupport
import Testing

@testable import TesseraBus

/// Forwards of the socket (`tessera forward`, issue 24) in the bus layer: a forward's listener
/// makes every caller `forward:NAME` (the engine lets it only get tokens; the bus thread serves it
/// no property but the version), ends with the connection that made it (its socket file
/// too), or, lasting, when it is closed (its callers' connections with it). And the client's rule
/// for a forward's socket in a shared sticky directory (/tmp on the remote host).
extension ServerTests {
  /// A harness that answers each call with its method's reply type.
  func forwardHarness() async throws -> DirectHarness {
    try await DirectHarness(reply: { call in .success(call.member == "AcquireTokenSilent" ? [.dict([:])] : []) })
  }

  /// The handler's record of a call from `client` (a Cancel, answered by the harness).
  func callerOf(_ client: BusClient, _ h: DirectHarness) throws -> CallerInfo {
    _ = try h.call(client, "Cancel", [.string("none")])
    return try #require(h.calls.withLock { $0.last }?.caller)
  }

  @Test func aForwardsCallersMayOnlyGetTokensAndItEndsWithItsOwner() async throws {
    let h = try await forwardHarness()
    var owner: BusClient? = try BusClient(directSocket: h.path)
    let ownerInfo = try callerOf(owner!, h)
    let path = h.directory + "/tessera/forward/build01"
    let made = try await h.server.openForward(
      BusServer.ForwardRequest(
        name: "build01", host: "build01.example", path: path, makeDirectory: true, lasting: false, owner: ownerInfo),
      now: 1_800_000_000)
    #expect(made == path)
    var st = stat()
    #expect(lstat(path, &st) == 0 && st.st_mode & 0o777 == 0o600, "the forward's socket is the user's alone")
    #expect(lstat(h.directory + "/tessera/forward", &st) == 0 && st.st_mode & 0o777 == 0o700)

    let remote = try BusClient(directSocket: path)
    // A token request reaches the handler as the forward's app, whatever process connected.
    _ = try h.call(remote, "AcquireTokenSilent", [.string("c"), .strings([]), .string(""), .dict([:])])
    let caller = try #require(h.calls.withLock { $0.last }?.caller)
    #expect(caller.app?.key == "forward:build01@build01.example", "the forward and the host it leads to")
    #expect(caller.app?.display == "build01 (forwarded over ssh to build01.example)")
    // The version may be read; the accounts that need a sign-in may not.
    let version = try remote.call(
      interface: "org.freedesktop.DBus.Properties", member: "Get",
      arguments: [.string(BrokerInterface.interfaceName), .string("Version")])
    #expect(version.first == .string(BrokerInterface.version))
    #expect(throws: BusCallError.self) {
      _ = try remote.call(
        interface: "org.freedesktop.DBus.Properties", member: "Get",
        arguments: [.string(BrokerInterface.interfaceName), .string(BrokerInterface.attentionNeeded)])
    }
    let listed = await h.server.forwardList()
    #expect(listed.map(\.name) == ["build01"])
    #expect(
      listed.first?.connections == 1 && listed.first?.lasting == false && listed.first?.ownerPID == UInt32(getpid()))

    // The `tessera forward` that made it goes: the forward goes, its socket file with it.
    owner = nil
    // Asked until it shows, without holding a pool thread (30 s only bounds a hang).
    var gone = false
    let deadline = ContinuousClock.now + .seconds(30)
    while !gone && ContinuousClock.now < deadline {
      gone = await h.server.forwardList().isEmpty && lstat(path, &st) != 0
      if !gone { try await Task.sleep(for: .milliseconds(10)) }
    }
    #expect(gone, "the forward ends with the connection that made it")
    _ = owner
  }

  @Test func aLastingForwardEndsWhenClosedWithItsCallersAndTellsNoOne() async throws {
    let h = try await forwardHarness()
    let owner = try BusClient(directSocket: h.path)
    let ownerInfo = try callerOf(owner, h)
    let directory = h.directory + "/ctr"
    mkdir(directory, 0o755)
    let path = directory + "/tessera.sock"
    _ = try await h.server.openForward(
      BusServer.ForwardRequest(
        name: "devbox", host: "", path: path, makeDirectory: false, lasting: true, owner: ownerInfo), now: 0)
    let remote = try BusClient(directSocket: path)
    _ = try h.call(remote, "AcquireTokenSilent", [.string("c"), .strings([]), .string(""), .dict([:])])
    #expect(h.calls.withLock { $0.last }?.caller.app?.display == "devbox (forwarded socket \(path))")
    // A second forward of the same name is refused, saying how to end the first.
    await #expect {
      _ = try await h.server.openForward(
        BusServer.ForwardRequest(
          name: "devbox", host: "", path: path + "2", makeDirectory: false, lasting: true, owner: ownerInfo), now: 0)
    } throws: { error in
      (error as! TesseraError).message.contains("tessera forward --stop devbox")
    }
    #expect(await h.server.closeForward("devbox", reason: "test"))
    var st = stat()
    #expect(lstat(path, &st) != 0, "its socket file is removed")
    #expect(throws: BusCallError.self, "its callers' connections are closed") {
      _ = try h.call(remote, "AcquireTokenSilent", [.string("c"), .strings([]), .string(""), .dict([:])])
    }
    #expect(await h.server.closeForward("devbox", reason: "test") == false)
    rmdir(directory)
  }

  @Test func aForwardInADirectoryOthersMayWriteIsRefused() throws {
    var template = Array("/tmp/tessera-fwd-dir-XXXXXX".utf8CString)
    let directory = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    defer { rmdir(directory) }
    chmod(directory, 0o777)
    #expect {
      _ = try DirectSocket.listen(at: directory + "/s", purpose: .forward(makeDirectory: false))
    } throws: { error in
      (error as! DirectSocket.ListenError).description.contains("chmod go-w")
    }
    var st = stat()
    #expect(lstat(directory, &st) == 0 && st.st_mode & 0o777 == 0o777, "a directory the user chose is left as it is")
  }

  /// As ssh leaves a forward's socket on the remote host: in /tmp (sticky, anyone may write).
  @Test func theClientTrustsItsOwnPrivateSocketInASharedStickyDirectoryAndNoOtherThere() throws {
    var template = Array("/tmp/tessera-sticky-XXXXXX".utf8CString)
    let directory = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    defer { rmdir(directory) }
    // sshd binds it there itself; here it is made in a private directory and moved in.
    let made = try DirectSocket.listen(at: directory + "/private/mine.sock", purpose: .forward(makeDirectory: true))
    let path = directory + "/mine.sock"
    #expect(rename(made.path, path) == 0)
    rmdir(directory + "/private")
    chmod(directory, 0o1777)
    let listener = DirectSocket.Listener(fd: made.fd, path: path, fromSystemd: false)
    defer {
      close(listener.fd)
      unlink(listener.path)
    }
    #expect(try DirectSocket.checkOwnership(listener.path) == nil)
    #expect(DirectSocket.isInSharedDirectory(listener.path))
    chmod(listener.path, 0o666)
    #expect(try DirectSocket.checkOwnership(listener.path)?.contains("others may connect") == true)
    chmod(listener.path, 0o600)
    if getuid() == 0 {
      // Another user's socket there, and a sticky directory of another user's.
      chown(listener.path, 65534, 65534)
      #expect(try DirectSocket.checkOwnership(listener.path)?.contains("belongs to user 65534") == true)
      chown(listener.path, 0, 0)
      chown(directory, 65534, 65534)
      #expect(try DirectSocket.checkOwnership(listener.path)?.contains("belongs to user 65534") == true)
      chown(directory, 0, 0)
    }
    // Without the sticky bit, a directory others may write is refused as before.
    chmod(directory, 0o777)
    #expect(try DirectSocket.checkOwnership(listener.path)?.contains("may be written by others") == true)
    #expect(!DirectSocket.isInSharedDirectory(listener.path))
  }
}
