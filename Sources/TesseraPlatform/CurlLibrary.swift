import CCurl
import CTesseraShim
import Glibc
import TesseraCore
import TesseraInterface

/// libcurl, loaded on the first HTTP request instead of linked into the daemon.
///
/// libcurl brings its TLS stack and a tree of libraries (OpenSSL, GnuTLS via librtmp, Kerberos,
/// LDAP, ssh2, nghttp2…): about 5 MiB resident, and their relocations at every start. A broker
/// answering from its cache needs none of it, so it is loaded, and set up with curl_global_init,
/// when the first request is made (the way systemd loads its optional libraries). Once loaded it
/// stays. A failure is not remembered: installing the library fixes the next request.
struct CurlLibrary: @unchecked Sendable {
  // Invariant for @unchecked Sendable: immutable C function pointers into a library never unloaded.
  let easyInit: @convention(c) () -> UnsafeMutableRawPointer?
  let easyCleanup: @convention(c) (UnsafeMutableRawPointer?) -> Void
  let easyReset: @convention(c) (UnsafeMutableRawPointer?) -> Void
  let easyPerform: @convention(c) (UnsafeMutableRawPointer?) -> CURLcode
  let easyStrerror: @convention(c) (CURLcode) -> UnsafePointer<CChar>?
  let slistAppend:
    @convention(c) (UnsafeMutablePointer<curl_slist>?, UnsafePointer<CChar>?) -> UnsafeMutablePointer<curl_slist>?
  let slistFreeAll: @convention(c) (UnsafeMutablePointer<curl_slist>?) -> Void
  /// The variadic curl_easy_setopt and curl_easy_getinfo, passed to the shim's wrappers on each
  /// call (Swift cannot call a variadic C function).
  let easySetopt: UnsafeMutableRawPointer
  let easyGetinfo: UnsafeMutableRawPointer

  /// The soname of libcurl 4 (the ABI every current libcurl has).
  static let soname = "libcurl.so.4"
  private static let loaded = Locked<CurlLibrary?>(nil)

  /// The loaded library, loading and setting it up on first use.
  static func shared() throws(TesseraError) -> CurlLibrary {
    try loaded.withLock { (library: inout CurlLibrary?) throws(TesseraError) -> CurlLibrary in
      if let library { return library }
      let new = try load(soname)
      library = new
      return new
    }
  }

  /// Loads `soname`, resolves what Tessera calls and sets libcurl up; used by `shared()`, and by
  /// tests with names that do not exist.
  static func load(_ soname: String) throws(TesseraError) -> CurlLibrary {
    guard let handle = dlopen(soname, RTLD_NOW | RTLD_LOCAL) else {
      let reason = dlerror().map { String(cString: $0) } ?? "unknown error"
      throw TesseraError.environment(
        "libcurl (\(soname)) could not be loaded: \(reason). Install the libcurl4 package, then retry.")
    }
    func symbol<T>(_ name: String, as type: T.Type) throws(TesseraError) -> T {
      guard let pointer = dlsym(handle, name) else {
        throw TesseraError.environment(
          "\(soname) has no \(name); it is not a usable libcurl 4. Reinstall the libcurl4 package, then retry.")
      }
      return unsafeBitCast(pointer, to: type)
    }
    let globalInit = try symbol("curl_global_init", as: (@convention(c) (CLong) -> CURLcode).self)
    let library = CurlLibrary(
      easyInit: try symbol("curl_easy_init", as: (@convention(c) () -> UnsafeMutableRawPointer?).self),
      easyCleanup: try symbol("curl_easy_cleanup", as: (@convention(c) (UnsafeMutableRawPointer?) -> Void).self),
      easyReset: try symbol("curl_easy_reset", as: (@convention(c) (UnsafeMutableRawPointer?) -> Void).self),
      easyPerform: try symbol("curl_easy_perform", as: (@convention(c) (UnsafeMutableRawPointer?) -> CURLcode).self),
      easyStrerror: try symbol("curl_easy_strerror", as: (@convention(c) (CURLcode) -> UnsafePointer<CChar>?).self),
      slistAppend: try symbol(
        "curl_slist_append",
        as: (@convention(c) (UnsafeMutablePointer<curl_slist>?, UnsafePointer<CChar>?) -> UnsafeMutablePointer<
          curl_slist
        >?).self),
      slistFreeAll: try symbol(
        "curl_slist_free_all", as: (@convention(c) (UnsafeMutablePointer<curl_slist>?) -> Void).self),
      easySetopt: try symbol("curl_easy_setopt", as: UnsafeMutableRawPointer.self),
      easyGetinfo: try symbol("curl_easy_getinfo", as: UnsafeMutableRawPointer.self))
    guard globalInit(CLong(CURL_GLOBAL_DEFAULT)) == CURLE_OK else {
      throw TesseraError.environment("libcurl could not initialise (curl_global_init failed; out of memory?). Retry.")
    }
    return library
  }
}
