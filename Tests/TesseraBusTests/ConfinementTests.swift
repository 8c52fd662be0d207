import Glibc
import TesseraInterface
import Testing

@testable import TesseraBus

/// Issue 37 §14: BusServer's confinement to its bus thread is checked, not only written in
/// comments: an entry point that only the bus thread may run traps on any other thread (in debug
/// and test builds), as swift-nio's `preconditionInEventLoop` does.
@Suite struct ConfinementTests {
  @Test func aBusThreadEntryPointCalledFromAnotherThreadTraps() async {
    await #expect(processExitsWith: .failure) {
      let server = BusServer(interfaces: [], onCall: { _, _ in })
      server.drainMailbox()
    }
    await #expect(processExitsWith: .failure) {
      let server = BusServer(interfaces: [], onCall: { _, _ in })
      server.closePeers()
    }
  }

  @Test func theBusThreadItselfPassesTheCheck() async {
    await #expect(processExitsWith: .success) {
      let server = BusServer(interfaces: [], onCall: { _, _ in })
      // As the loop's own thread does: the check passes there, and posting from here is fine.
      server.busThread.withLock { $0 = pthread_self() }
      server.closePeers()
      server.post(.exit)
      exit(0)
    }
  }
}
