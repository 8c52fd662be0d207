import CTss2
import Crypto
import Dispatch
import Glibc
import TesseraCore
import TesseraInterface

#if canImport(FoundationEssentials)
  import FoundationEssentials
#else
  import Foundation
#endif

/// DPoP keys made by the TPM 2.0 (tpm2-tss's ESAPI): an ECDSA P-256 signing key created under the
/// owner hierarchy's storage primary key, with fixedTPM, fixedParent and sensitiveDataOrigin set,
/// so that its private part never leaves the TPM. The store keeps only the TPM's wrapped copy
/// (TPM2B_PRIVATE and TPM2B_PUBLIC, marshalled), which only this TPM can load, and only while its
/// storage hierarchy is not cleared.
///
/// Every TPM call runs on a queue of its own, one at a time (a TPM takes one command at a time,
/// and a call blocks for its round trip), never on the caller's thread. Keys made in software
/// before the TPM was usable keep signing in software.
public final class TPMProofKeys: ProofKeySource, @unchecked Sendable {
  // Invariant for @unchecked Sendable: `state` is touched only on `queue`.
  private let usable: String
  /// Why the TPM could not make the last key (then it was made in software), until one is made.
  private let failure = Locked<String?>(nil)
  /// The TCTI tpm2-tss opens: "device:/dev/tpmrm0", or a swtpm's socket in the tests.
  let tcti: String
  private let queue = DispatchQueue(label: "tessera.tpm")
  private var state: (library: Tss2Library, tcti: OpaquePointer?, esys: OpaquePointer?, primary: ESYS_TR)?
  private let software = SoftwareProofKeys()

  /// `summary`: what `tessera status` says while the TPM works.
  public init(tcti: String, summary: String) {
    self.tcti = tcti
    self.usable = summary
  }

  public var summary: String {
    failure.withLock { $0 }.map {
      "software keys for now, kept in the store with the refresh tokens: the TPM (\(tcti)) failed to make one (\($0))"
    } ?? usable
  }

  deinit {
    if var opened = state {
      if opened.primary != ESYS_TR(ESYS_TR_NONE) { _ = opened.library.flush(opened.esys, opened.primary) }
      opened.library.finalize(&opened.esys)
      opened.library.tctiFinalize(&opened.tcti)
    }
  }

  /// `tpm`, or `software` while the TPM fails to make keys (then they are made in software).
  public var kind: ProofKeyKind { failure.withLock { $0 } == nil ? .tpm : .software }

  /// A key in the TPM; should the TPM fail, a software key, so that the sign-in goes on (and
  /// `tessera status` says why).
  public func create() async throws -> (kind: ProofKeyKind, jwk: ProofJWK, blob: String) {
    do {
      let made = try await run { try self.withTPM { try self.createKey($0, $1, $2) } }
      failure.withLock { $0 = nil }
      return (.tpm, made.jwk, made.blob)
    } catch {
      failure.withLock { $0 = TesseraError.wrap(error).message }
      return try await software.create()
    }
  }

  public func sign(_ input: [UInt8], kind: ProofKeyKind, blob: String) async throws -> [UInt8] {
    guard kind == .tpm else { return try await software.sign(input, kind: kind, blob: blob) }
    let digest = Array(SHA256.hash(data: input))
    return try await run { try self.withTPM { try self.signDigest(digest, blob: blob, $0, $1, $2) } }
  }

  private func run<T: Sendable>(_ body: @escaping @Sendable () throws -> T) async throws -> T {
    try await withCheckedThrowingContinuation { continuation in
      queue.async { continuation.resume(with: Result { try body() }) }
    }
  }

  // MARK: On the queue

  /// A TPM call that failed below the TPM itself (ESAPI, the TCTI, the resource manager), or with
  /// a handle the TPM no longer has (it restarted): the context is opened again and the call
  /// made once more.
  struct Stale: Error {
    var rc: TSS2_RC
    var what: String
  }

  /// Runs `body` with the opened TPM; on a stale context, opens it again and runs it once more.
  private func withTPM<T>(_ body: (Tss2Library, OpaquePointer?, ESYS_TR) throws -> T) throws -> T {
    var attempt = 0
    while true {
      do {
        let (library, esys, primary) = try opened()
        return try body(library, esys, primary)
      } catch let failure as Stale {
        reset()
        attempt += 1
        guard attempt < 2 else {
          throw TesseraError.environment(
            "The TPM could not \(failure.what) (tpm2-tss error 0x\(String(failure.rc, radix: 16))). Try again; `tessera status` says which keys are in use."
          )
        }
      }
    }
  }

  /// Forgets the opened context (a stale one): the next call opens the TPM again.
  private func reset() {
    dispatchPrecondition(condition: .onQueue(queue))
    guard var opened = state else { return }
    opened.library.finalize(&opened.esys)
    opened.library.tctiFinalize(&opened.tcti)
    state = nil
  }

  /// Whether `rc` is the TPM's own answer about the command's inputs (a key blob it will not
  /// load: integrity, binding, size...) rather than a layer below it or a handle it lost.
  static func isTPMAnswer(_ rc: TSS2_RC) -> Bool {
    let layer = (rc >> 16) & 0xFF
    let formatOne = rc & 0x80 != 0
    let handle = formatOne && rc & 0x3F == 0x0B  // TPM_RC_HANDLE: the parent is gone
    let initialize = rc & 0xFFF == 0x100  // TPM_RC_INITIALIZE: the TPM restarted
    return layer == 0 && !handle && !initialize
  }

  /// ESAPI and the storage primary key, opened once: the primary key is derived from the owner
  /// hierarchy's seed and the template, so the same TPM gives the same key at every start, and a
  /// cleared TPM another one (under which no kept blob loads).
  private func opened() throws -> (Tss2Library, OpaquePointer?, ESYS_TR) {
    dispatchPrecondition(condition: .onQueue(queue))
    if let state { return (state.library, state.esys, state.primary) }
    let library = try Tss2Library.shared()
    var tctiContext: OpaquePointer?
    try check(library.tctiInitialize(tcti, &tctiContext), "open the TPM (\(tcti))")
    var esys: OpaquePointer?
    do {
      try check(library.initialize(&esys, tctiContext, nil), "start ESAPI")
    } catch {
      library.tctiFinalize(&tctiContext)
      throw error
    }
    var template = TPM2B_PUBLIC()
    template.publicArea.type = TPM.algECC
    template.publicArea.nameAlg = TPM.algSHA256
    template.publicArea.objectAttributes =
      TPM.fixedTPM | TPM.fixedParent | TPM.sensitiveDataOrigin | TPM.userWithAuth | TPM.restricted | TPM.decrypt
      | TPM.noDA
    template.publicArea.parameters.eccDetail.symmetric.algorithm = TPM.algAES
    template.publicArea.parameters.eccDetail.symmetric.keyBits.aes = 128
    template.publicArea.parameters.eccDetail.symmetric.mode.aes = TPM.algCFB
    template.publicArea.parameters.eccDetail.scheme.scheme = TPM.algNull
    template.publicArea.parameters.eccDetail.curveID = TPM.curveP256
    template.publicArea.parameters.eccDetail.kdf.scheme = TPM.algNull
    var sensitive = TPM2B_SENSITIVE_CREATE()
    var outside = TPM2B_DATA()
    var pcrs = TPML_PCR_SELECTION()
    var primary = ESYS_TR(ESYS_TR_NONE)
    do {
      try check(
        library.createPrimary(
          esys, ESYS_TR(ESYS_TR_RH_OWNER), ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE),
          &sensitive, &template, &outside, &pcrs, &primary, nil, nil, nil, nil),
        "make the storage primary key")
    } catch {
      library.finalize(&esys)
      library.tctiFinalize(&tctiContext)
      throw error
    }
    state = (library, tctiContext, esys, primary)
    return (library, esys, primary)
  }

  private func createKey(_ library: Tss2Library, _ esys: OpaquePointer?, _ primary: ESYS_TR) throws -> (
    jwk: ProofJWK, blob: String
  ) {
    var template = TPM2B_PUBLIC()
    template.publicArea.type = TPM.algECC
    template.publicArea.nameAlg = TPM.algSHA256
    template.publicArea.objectAttributes =
      TPM.fixedTPM | TPM.fixedParent | TPM.sensitiveDataOrigin | TPM.userWithAuth | TPM.signEncrypt | TPM.noDA
    template.publicArea.parameters.eccDetail.symmetric.algorithm = TPM.algNull
    template.publicArea.parameters.eccDetail.scheme.scheme = TPM.algECDSA
    template.publicArea.parameters.eccDetail.scheme.details.ecdsa.hashAlg = TPM.algSHA256
    template.publicArea.parameters.eccDetail.curveID = TPM.curveP256
    template.publicArea.parameters.eccDetail.kdf.scheme = TPM.algNull
    var sensitive = TPM2B_SENSITIVE_CREATE()
    var outside = TPM2B_DATA()
    var pcrs = TPML_PCR_SELECTION()
    var outPrivate: UnsafeMutablePointer<TPM2B_PRIVATE>?
    var outPublic: UnsafeMutablePointer<TPM2B_PUBLIC>?
    try check(
      library.create(
        esys, primary, ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &sensitive, &template,
        &outside, &pcrs, &outPrivate, &outPublic, nil, nil, nil),
      "make a key")
    defer {
      library.free(outPrivate)
      library.free(outPublic)
    }
    guard let outPrivate, let outPublic else { throw TesseraError.internal("TPM2_Create returned no key.") }
    let point = outPublic.pointee.publicArea.unique.ecc
    let jwk = try ProofJWK(point: Self.bytes(point.x, width: 32) + Self.bytes(point.y, width: 32))
    var privateBytes = [UInt8](repeating: 0, count: MemoryLayout<TPM2B_PRIVATE>.size)
    var publicBytes = [UInt8](repeating: 0, count: MemoryLayout<TPM2B_PUBLIC>.size)
    var privateLength = 0
    var publicLength = 0
    try check(library.privateMarshal(outPrivate, &privateBytes, privateBytes.count, &privateLength), "keep the key")
    try check(library.publicMarshal(outPublic, &publicBytes, publicBytes.count, &publicLength), "keep the key")
    let blob =
      Base64URL.encode(privateBytes.prefix(privateLength)) + "." + Base64URL.encode(publicBytes.prefix(publicLength))
    return (jwk, blob)
  }

  private func signDigest(
    _ digest: [UInt8], blob: String, _ library: Tss2Library, _ esys: OpaquePointer?, _ primary: ESYS_TR
  ) throws -> [UInt8] {
    let parts = blob.split(separator: ".", omittingEmptySubsequences: false)
    guard parts.count == 2, let privateData = Base64URL.decode(String(parts[0])),
      let publicData = Base64URL.decode(String(parts[1]))
    else { throw Self.keyChanged }
    var inPrivate = TPM2B_PRIVATE()
    var inPublic = TPM2B_PUBLIC()
    var offset = 0
    guard
      Array(privateData).withUnsafeBufferPointer({
        library.privateUnmarshal($0.baseAddress, $0.count, &offset, &inPrivate)
      }) == 0
    else { throw Self.keyChanged }
    offset = 0
    guard
      Array(publicData).withUnsafeBufferPointer({
        library.publicUnmarshal($0.baseAddress, $0.count, &offset, &inPublic)
      }) == 0
    else { throw Self.keyChanged }
    var key = ESYS_TR(ESYS_TR_NONE)
    let loaded = library.load(
      esys, primary, ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &inPrivate, &inPublic,
      &key)
    if loaded != 0 {
      // The TPM will not load the blob: another TPM's, or this one's from before it was cleared.
      // Anything else (a layer below, a lost parent) is a stale context, opened again.
      if Self.isTPMAnswer(loaded) { throw Self.keyChanged }
      throw Stale(rc: loaded, what: "load a key")
    }
    defer { _ = library.flush(esys, key) }
    var toSign = TPM2B_DIGEST()
    toSign.size = UInt16(digest.count)
    withUnsafeMutableBytes(of: &toSign.buffer) { buffer in buffer.copyBytes(from: digest) }
    var scheme = TPMT_SIG_SCHEME()
    scheme.scheme = TPM.algECDSA
    scheme.details.ecdsa.hashAlg = TPM.algSHA256
    // A digest the TPM did not make itself needs no ticket: the null ticket.
    var validation = TPMT_TK_HASHCHECK()
    validation.tag = TPM.stHashCheck
    validation.hierarchy = TPM.rhNull
    var signature: UnsafeMutablePointer<TPMT_SIGNATURE>?
    try check(
      library.sign(
        esys, key, ESYS_TR(ESYS_TR_PASSWORD), ESYS_TR(ESYS_TR_NONE), ESYS_TR(ESYS_TR_NONE), &toSign, &scheme,
        &validation, &signature),
      "sign")
    defer { library.free(signature) }
    guard let ecdsa = signature?.pointee.signature.ecdsa else {
      throw TesseraError.internal("TPM2_Sign returned no signature.")
    }
    return Self.bytes(ecdsa.signatureR, width: 32) + Self.bytes(ecdsa.signatureS, width: 32)
  }

  static let keyChanged = TesseraError.interactionRequired(
    "needs sign-in: this machine's key changed (the TPM no longer has the key its tokens are bound to: it was cleared, or the store came from another machine). Sign in again."
  )

  /// A TPM2B_ECC_PARAMETER's value, left-padded to `width` bytes (a coordinate or half of a
  /// signature).
  static func bytes(_ parameter: TPM2B_ECC_PARAMETER, width: Int) -> [UInt8] {
    let size = min(Int(parameter.size), width)
    let value = withUnsafeBytes(of: parameter.buffer) { Array($0.prefix(size)) }
    return [UInt8](repeating: 0, count: width - size) + value
  }

  /// A failed call: the TPM's own refusal is said as it is; a failure below it (or a lost handle)
  /// is a stale context, opened again by withTPM.
  private func check(_ rc: TSS2_RC, _ what: String) throws {
    guard rc != 0 else { return }
    guard Self.isTPMAnswer(rc) else { throw Stale(rc: rc, what: what) }
    throw TesseraError.environment(
      "The TPM could not \(what) (tpm2-tss error 0x\(String(rc, radix: 16))). `tessera status` says which keys are in use; tokens keep working with software keys."
    )
  }
}

/// The TPM 2.0 values the keys above use (TPM 2.0 Library, Part 2: Structures).
enum TPM {
  static let algAES: TPM2_ALG_ID = 0x0006
  static let algSHA256: TPM2_ALG_ID = 0x000B
  static let algNull: TPM2_ALG_ID = 0x0010
  static let algECDSA: TPM2_ALG_ID = 0x0018
  static let algECC: TPM2_ALG_ID = 0x0023
  static let algCFB: TPM2_ALG_ID = 0x0043
  static let curveP256: TPM2_ECC_CURVE = 0x0003
  static let stHashCheck: TPM2_ST = 0x8024
  static let rhNull: TPMI_RH_HIERARCHY = 0x4000_0007
  static let fixedTPM: TPMA_OBJECT = 0x0000_0002
  static let fixedParent: TPMA_OBJECT = 0x0000_0010
  static let sensitiveDataOrigin: TPMA_OBJECT = 0x0000_0020
  static let userWithAuth: TPMA_OBJECT = 0x0000_0040
  static let noDA: TPMA_OBJECT = 0x0000_0400
  static let restricted: TPMA_OBJECT = 0x0001_0000
  static let decrypt: TPMA_OBJECT = 0x0002_0000
  static let signEncrypt: TPMA_OBJECT = 0x0004_0000
}

/// Where this machine's DPoP keys are made: its TPM when the user may use it, else software, and
/// that said in words for `tessera status`.
public enum MachineKeys {
  /// The kernel's TPM resource manager: several programs may use the TPM through it at once.
  public static let device = "/dev/tpmrm0"

  /// `TESSERA_TPM_TCTI` names another TPM (the tests' swtpm: `swtpm:path=SOCKET`). `mayOpen` is
  /// whether this user may read and write `device` (Debian's udev rule: 0660 for user and group
  /// tss); a parameter so that the tests, which run as root, can take the refused branch.
  public static func source(
    environment: [String: String], device: String = device,
    mayOpen: (String) -> Bool = { access($0, R_OK | W_OK) == 0 }
  ) -> any ProofKeySource {
    if let tcti = environment["TESSERA_TPM_TCTI"], !tcti.isEmpty {
      return TPMProofKeys(tcti: tcti, summary: "keys made and kept by the TPM at \(tcti): they cannot be copied off it")
    }
    guard access(device, F_OK) == 0 else {
      return SoftwareProofKeys(
        summary: "software keys, kept in the store with the refresh tokens (this machine has no TPM at \(device))")
    }
    guard mayOpen(device) else {
      return SoftwareProofKeys(
        summary:
          "software keys, kept in the store with the refresh tokens: this machine has a TPM (\(device)), but you may not use it. To keep keys in it, run `sudo usermod -aG tss $USER`, log in again, and restart tesserad (`systemctl --user restart tessera`)"
      )
    }
    return TPMProofKeys(
      tcti: "device:\(device)",
      summary: "keys made and kept by this machine's TPM (\(device)): they cannot be copied off it")
  }
}
