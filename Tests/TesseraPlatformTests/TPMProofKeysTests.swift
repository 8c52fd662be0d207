import Crypto
import Foundation
import Glibc
import TesseraEngineFakes
import TesseraInterface
import XCTest

@testable import TesseraCore
@testable import TesseraPlatform

/// DPoP keys in a TPM (issue 40), against swtpm, a software TPM 2.0 that speaks the real
/// protocol: a key made there signs proofs that swift-crypto verifies with the key's public half,
/// its kept blob signs again after the TPM restarts, and a TPM whose storage hierarchy is new (as
/// after `tpm2_clear`) loads none of it: the account needs a sign-in, in words.
final class TPMProofKeysTests: XCTestCase {
  /// A swtpm on a socket of its own, with its state in `state`; stopped by `stop()`.
  final class SoftwareTPM {
    let directory: String
    let process = Process()

    init(state: String) throws {
      directory = state
      let socket = state + "/swtpm.sock"
      unlink(socket)
      guard let swtpm = ([String](["/usr/bin/swtpm", "/usr/local/bin/swtpm"])).first(where: { access($0, X_OK) == 0 })
      else {
        throw XCTSkip("swtpm is not installed here (scripts/test installs it: apt-get install swtpm)")
      }
      process.executableURL = URL(fileURLWithPath: swtpm)
      process.arguments = [
        "socket", "--tpm2", "--server", "type=unixio,path=\(socket)", "--ctrl", "type=unixio,path=\(socket).ctrl",
        "--tpmstate", "dir=\(state)", "--flags", "not-need-init,startup-clear",
      ]
      // Never the test runner's output: a swtpm left behind would hold `swift test`'s pipes open.
      process.standardOutput = FileHandle.nullDevice
      process.standardError = FileHandle.nullDevice
      try process.run()
      // Ready when its socket answers a connect (bounded against a hang only).
      let deadline = Date().addingTimeInterval(30)
      while !Self.accepts(socket) {
        guard process.isRunning, Date() < deadline else { throw TesseraError.internal("swtpm did not start") }
        usleep(10_000)
      }
    }

    var tcti: String { "swtpm:path=\(directory)/swtpm.sock" }

    static func accepts(_ path: String) -> Bool {
      let fd = socket(AF_UNIX, Int32(SOCK_STREAM.rawValue), 0)
      defer { close(fd) }
      var address = sockaddr_un()
      address.sun_family = sa_family_t(AF_UNIX)
      withUnsafeMutableBytes(of: &address.sun_path) { buffer in
        buffer.copyBytes(from: Array(path.utf8.prefix(buffer.count - 1)))
      }
      return withUnsafePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) {
          connect(fd, $0, socklen_t(MemoryLayout<sockaddr_un>.size)) == 0
        }
      }
    }

    /// SIGKILL: swtpm waits for its client to hang up before it honours SIGTERM, and what a
    /// TPM keeps across a restart (its seeds) is written when it changes, not at exit.
    func stop() {
      guard process.isRunning else { return }
      kill(process.processIdentifier, SIGKILL)
      process.waitUntilExit()
    }
  }

  func temporaryDirectory() throws -> String {
    var template = Array("/tmp/tessera-tpm-XXXXXX".utf8CString)
    let path = template.withUnsafeMutableBufferPointer { String(cString: mkdtemp($0.baseAddress!)!) }
    addTeardownBlock { try? FileManager.default.removeItem(atPath: path) }
    return path
  }

  func verify(_ signature: [UInt8], _ input: [UInt8], jwk: ProofJWK) throws -> Bool {
    let point = [4] + Array(Base64URL.decode(jwk.x)!) + Array(Base64URL.decode(jwk.y)!)
    let key = try P256.Signing.PublicKey(x963Representation: point)
    return key.isValidSignature(try P256.Signing.ECDSASignature(rawRepresentation: signature), for: input)
  }

  func testAKeyMadeInTheTPMSignsProofsAndSignsAgainAfterTheTPMRestarts() async throws {
    let state = try temporaryDirectory()
    var tpm = try SoftwareTPM(state: state)
    defer { tpm.stop() }
    let keys = TPMProofKeys(tcti: tpm.tcti, summary: "the TPM")
    let made = try await keys.create()
    XCTAssertEqual(made.kind, .tpm, keys.summary)
    XCTAssertEqual(keys.summary, "the TPM")
    XCTAssertFalse(made.blob.isEmpty)
    let input = Array("header.claims".utf8)
    let signature = try await keys.sign(input, kind: .tpm, blob: made.blob)
    XCTAssertEqual(signature.count, 64)
    XCTAssertTrue(try verify(signature, input, jwk: made.jwk), "an ES256 signature by the key the JWK names")
    // A whole proof, as a server checks it (jwt-kit in FakeDPoPServer).
    let record = ProofKeyRecord(accountID: "a", kind: .tpm, jwk: made.jwk, blob: made.blob, createdAt: 0)
    let proof = try await ProofBuilder.proof(
      key: record, source: keys, method: "POST", url: "https://idp.test/token", now: Date(), nonce: "n")
    let (jkt, claims) = try await FakeDPoPServer.verify(proof)
    XCTAssertEqual(jkt, made.jwk.thumbprint)
    XCTAssertEqual(claims.nonce, "n")

    // The machine restarts: the same TPM, a new tesserad, the blob from the store.
    tpm.stop()
    tpm = try SoftwareTPM(state: state)
    let again = TPMProofKeys(tcti: tpm.tcti, summary: "the TPM")
    let second = try await again.sign(input, kind: .tpm, blob: made.blob)
    XCTAssertTrue(try verify(second, input, jwk: made.jwk))
    // The TPM restarted under a running tesserad: its context is stale, opened again, and it signs.
    let third = try await keys.sign(input, kind: .tpm, blob: made.blob)
    XCTAssertTrue(try verify(third, input, jwk: made.jwk))
    XCTAssertEqual(keys.kind, .tpm)
  }

  func testATPMClearedOrAnotherMachinesLoadsNoKeyAndSaysSignInAgain() async throws {
    let first = try SoftwareTPM(state: try temporaryDirectory())
    defer { first.stop() }
    let made = try await TPMProofKeys(tcti: first.tcti, summary: "").create()
    XCTAssertEqual(made.kind, .tpm)
    first.stop()
    // Another TPM (a fresh storage seed: what tpm2_clear leaves, or another machine).
    let other = try SoftwareTPM(state: try temporaryDirectory())
    defer { other.stop() }
    do {
      _ = try await TPMProofKeys(tcti: other.tcti, summary: "").sign([1, 2, 3], kind: .tpm, blob: made.blob)
      XCTFail("another TPM signed with the key")
    } catch let error as TesseraError {
      XCTAssertEqual(error.code, .interactionRequired)
      XCTAssertTrue(error.message.contains("this machine's key changed"), error.message)
    }
  }

  func testATPMThatCannotBeReachedMakesSoftwareKeysAndStatusSaysWhy() async throws {
    let keys = TPMProofKeys(tcti: "swtpm:path=/nonexistent/swtpm.sock", summary: "the TPM")
    let made = try await keys.create()
    XCTAssertEqual(made.kind, .software, "the sign-in goes on with a software key")
    XCTAssertTrue(keys.summary.hasPrefix("software keys for now"), keys.summary)
    let signature = try await keys.sign([1], kind: .software, blob: made.blob)
    XCTAssertTrue(try verify(signature, [1], jwk: made.jwk), "a software key still signs through the TPM's source")
  }

  func testTheMachinesKeysAreTheTPMsOnlyWhenTheUserMayUseIt() {
    let named = MachineKeys.source(environment: ["TESSERA_TPM_TCTI": "swtpm:path=/x"])
    XCTAssertEqual(named.kind, .tpm)
    let here = MachineKeys.source(environment: [:])
    if access(MachineKeys.device, F_OK) != 0 {
      XCTAssertEqual(here.kind, .software)
      XCTAssertTrue(here.summary.contains("has no TPM"), here.summary)
    } else if access(MachineKeys.device, R_OK | W_OK) != 0 {
      XCTAssertEqual(here.kind, .software)
      XCTAssertTrue(here.summary.contains("usermod -aG tss"), here.summary)
    } else {
      XCTAssertEqual(here.kind, .tpm)
    }
  }
}
