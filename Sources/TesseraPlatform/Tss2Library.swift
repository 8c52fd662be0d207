import CTss2
import Glibc
import TesseraCore
import TesseraInterface

/// tpm2-tss (ESAPI, its marshalling and the TCTI loader), loaded on the first use of a TPM rather
/// than linked into the daemon: it brings OpenSSL's libcrypto, and a machine without a TPM (or a
/// user who may not use it) never needs it. Once loaded it stays, as libcurl does
/// (CurlLibrary.swift).
struct Tss2Library: @unchecked Sendable {
  // Invariant for @unchecked Sendable: immutable C function pointers into libraries never unloaded.
  typealias RC = TSS2_RC
  typealias Out<T> = UnsafeMutablePointer<UnsafeMutablePointer<T>?>?

  let tctiInitialize: @convention(c) (UnsafePointer<CChar>?, UnsafeMutablePointer<OpaquePointer?>?) -> RC
  let tctiFinalize: @convention(c) (UnsafeMutablePointer<OpaquePointer?>?) -> Void
  let initialize: @convention(c) (UnsafeMutablePointer<OpaquePointer?>?, OpaquePointer?, OpaquePointer?) -> RC
  let finalize: @convention(c) (UnsafeMutablePointer<OpaquePointer?>?) -> Void
  let createPrimary:
    @convention(c) (
      OpaquePointer?, ESYS_TR, ESYS_TR, ESYS_TR, ESYS_TR, UnsafePointer<TPM2B_SENSITIVE_CREATE>?,
      UnsafePointer<TPM2B_PUBLIC>?, UnsafePointer<TPM2B_DATA>?, UnsafePointer<TPML_PCR_SELECTION>?,
      UnsafeMutablePointer<ESYS_TR>?, Out<TPM2B_PUBLIC>, Out<TPM2B_CREATION_DATA>, Out<TPM2B_DIGEST>,
      Out<TPMT_TK_CREATION>
    ) -> RC
  let create:
    @convention(c) (
      OpaquePointer?, ESYS_TR, ESYS_TR, ESYS_TR, ESYS_TR, UnsafePointer<TPM2B_SENSITIVE_CREATE>?,
      UnsafePointer<TPM2B_PUBLIC>?, UnsafePointer<TPM2B_DATA>?, UnsafePointer<TPML_PCR_SELECTION>?,
      Out<TPM2B_PRIVATE>, Out<TPM2B_PUBLIC>, Out<TPM2B_CREATION_DATA>, Out<TPM2B_DIGEST>, Out<TPMT_TK_CREATION>
    ) -> RC
  let load:
    @convention(c) (
      OpaquePointer?, ESYS_TR, ESYS_TR, ESYS_TR, ESYS_TR, UnsafePointer<TPM2B_PRIVATE>?, UnsafePointer<TPM2B_PUBLIC>?,
      UnsafeMutablePointer<ESYS_TR>?
    ) -> RC
  let sign:
    @convention(c) (
      OpaquePointer?, ESYS_TR, ESYS_TR, ESYS_TR, ESYS_TR, UnsafePointer<TPM2B_DIGEST>?, UnsafePointer<TPMT_SIG_SCHEME>?,
      UnsafePointer<TPMT_TK_HASHCHECK>?, Out<TPMT_SIGNATURE>
    ) -> RC
  let flush: @convention(c) (OpaquePointer?, ESYS_TR) -> RC
  let free: @convention(c) (UnsafeMutableRawPointer?) -> Void
  let privateMarshal:
    @convention(c) (UnsafePointer<TPM2B_PRIVATE>?, UnsafeMutablePointer<UInt8>?, Int, UnsafeMutablePointer<Int>?) -> RC
  let privateUnmarshal:
    @convention(c) (UnsafePointer<UInt8>?, Int, UnsafeMutablePointer<Int>?, UnsafeMutablePointer<TPM2B_PRIVATE>?) -> RC
  let publicMarshal:
    @convention(c) (UnsafePointer<TPM2B_PUBLIC>?, UnsafeMutablePointer<UInt8>?, Int, UnsafeMutablePointer<Int>?) -> RC
  let publicUnmarshal:
    @convention(c) (UnsafePointer<UInt8>?, Int, UnsafeMutablePointer<Int>?, UnsafeMutablePointer<TPM2B_PUBLIC>?) -> RC

  /// The sonames of tpm2-tss 3 and 4 (Debian 12 ships 3.2).
  static let sonames = (esys: "libtss2-esys.so.0", mu: "libtss2-mu.so.0", tctildr: "libtss2-tctildr.so.0")
  private static let loaded = Locked<Tss2Library?>(nil)

  /// The loaded libraries, loading them on first use.
  static func shared() throws(TesseraError) -> Tss2Library {
    try loaded.withLock { (library: inout Tss2Library?) throws(TesseraError) -> Tss2Library in
      if let library { return library }
      let new = try load()
      library = new
      return new
    }
  }

  static func load() throws(TesseraError) -> Tss2Library {
    func open(_ soname: String) throws(TesseraError) -> UnsafeMutableRawPointer {
      guard let handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL) else {
        let reason = dlerror().map { String(cString: $0) } ?? "unknown error"
        throw TesseraError.environment(
          "tpm2-tss (\(soname)) could not be loaded: \(reason). Install the libtss2-esys-3.0.2-0, libtss2-mu0 and libtss2-tctildr0 packages to keep keys in the TPM."
        )
      }
      return handle
    }
    let esys = try open(sonames.esys)
    let mu = try open(sonames.mu)
    let tctildr = try open(sonames.tctildr)
    // Each symbol's C type is the field's it is stored in (the headers' declarations are not
    // linked, so they cannot be referenced, even for their types).
    func symbol<T>(_ handle: UnsafeMutableRawPointer, _ name: String) throws(TesseraError) -> T {
      guard let pointer = dlsym(handle, name) else {
        throw TesseraError.environment("tpm2-tss has no \(name); reinstall its packages (libtss2-esys and friends).")
      }
      return unsafeBitCast(pointer, to: T.self)
    }
    return Tss2Library(
      tctiInitialize: try symbol(tctildr, "Tss2_TctiLdr_Initialize"),
      tctiFinalize: try symbol(tctildr, "Tss2_TctiLdr_Finalize"),
      initialize: try symbol(esys, "Esys_Initialize"), finalize: try symbol(esys, "Esys_Finalize"),
      createPrimary: try symbol(esys, "Esys_CreatePrimary"), create: try symbol(esys, "Esys_Create"),
      load: try symbol(esys, "Esys_Load"), sign: try symbol(esys, "Esys_Sign"),
      flush: try symbol(esys, "Esys_FlushContext"), free: try symbol(esys, "Esys_Free"),
      privateMarshal: try symbol(mu, "Tss2_MU_TPM2B_PRIVATE_Marshal"),
      privateUnmarshal: try symbol(mu, "Tss2_MU_TPM2B_PRIVATE_Unmarshal"),
      publicMarshal: try symbol(mu, "Tss2_MU_TPM2B_PUBLIC_Marshal"),
      publicUnmarshal: try symbol(mu, "Tss2_MU_TPM2B_PUBLIC_Unmarshal"))
  }
}
