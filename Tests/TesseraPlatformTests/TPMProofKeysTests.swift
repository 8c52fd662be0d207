import Crypto
import Foundation
import Glibc
import TesseraEngineFakes
import TesseraInterface
import TesseraTestSupport
import XCTest

@testable import TesseraCore
@testable import TesseraPlatform

/// DPoP keys in a TPM (issue 40), against swtpm, a software TPM 2.0 that speaks the real
/// protocol: a key made there signs proofs that swift-crypto verifies with the key's public half,
/// its kept blob signs again after the TPM restarts, and a TPM whose storage hierarchy is new (as
/// after `tpm2_clear`) loads none of it: the account needs a sign-in, in words.
final class TPMProofKeysTests: XCTestCase {
  /// A swtpm (TesseraTestSupport), or a skip where none is installed.
  func softwareTPM(state: String) throws -> SoftwareTPM {
    do { return try SoftwareTPM(state: state) } catch let error as SoftwareTPM.NotInstalled {
      throw XCTSkip(error.description)
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
    var tpm = try softwareTPM(state: state)
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
    tpm = try softwareTPM(state: state)
    let again = TPMProofKeys(tcti: tpm.tcti, summary: "the TPM")
    let second = try await again.sign(input, kind: .tpm, blob: made.blob)
    XCTAssertTrue(try verify(second, input, jwk: made.jwk))
    // The TPM restarted under a running tesserad: its context is stale, opened again, and it signs.
    let third = try await keys.sign(input, kind: .tpm, blob: made.blob)
    XCTAssertTrue(try verify(third, input, jwk: made.jwk))
    XCTAssertEqual(keys.kind, .tpm)
  }

  func testATPMClearedOrAnotherMachinesLoadsNoKeyAndSaysSignInAgain() async throws {
    let first = try softwareTPM(state: try temporaryDirectory())
    defer { first.stop() }
    let made = try await TPMProofKeys(tcti: first.tcti, summary: "").create()
    XCTAssertEqual(made.kind, .tpm)
    first.stop()
    // Another TPM (a fresh storage seed: what tpm2_clear leaves, or another machine).
    let other = try softwareTPM(state: try temporaryDirectory())
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

  func testTheMachinesKeysAreTheTPMsOnlyWhenTheUserMayUseIt() throws {
    let named = MachineKeys.source(environment: ["TESSERA_TPM_TCTI": "swtpm:path=/x"])
    XCTAssertEqual(named.kind, .tpm)
    // No TPM at all.
    let directory = try temporaryDirectory()
    let none = MachineKeys.source(environment: [:], device: directory + "/tpmrm0")
    XCTAssertEqual(none.kind, .software)
    XCTAssertTrue(none.summary.contains("has no TPM at \(directory)/tpmrm0"), none.summary)
    // A TPM this user may not open (not in group tss): software, and what to run.
    let device = directory + "/tpmrm0-present"
    XCTAssertTrue(FileManager.default.createFile(atPath: device, contents: nil))
    var asked: [String] = []
    let refused = MachineKeys.source(environment: [:], device: device) {
      asked.append($0)
      return false
    }
    XCTAssertEqual(asked, [device])
    XCTAssertEqual(refused.kind, .software)
    XCTAssertTrue(refused.summary.contains("has a TPM (\(device)), but you may not use it"), refused.summary)
    XCTAssertTrue(refused.summary.contains("sudo usermod -aG tss $USER"), refused.summary)
    XCTAssertTrue(refused.summary.contains("systemctl --user restart tessera"), refused.summary)
    // One the user may open: keys in it.
    let allowed = MachineKeys.source(environment: [:], device: device) { _ in true }
    XCTAssertEqual(allowed.kind, .tpm)
    XCTAssertTrue(allowed.summary.contains("this machine's TPM (\(device))"), allowed.summary)
  }
}
