@testable import TesseraCore

/// The Microsoft broker front's requests: the JSON an MSAL client sends in each of the eight
/// methods, as MicrosoftRequest reads it (with and without an empty request allowed).
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
  guard size > 0 else { return 0 }
  let text = String(decoding: UnsafeBufferPointer(start: data + 1, count: size - 1), as: UTF8.self)
  _ = try? MicrosoftRequest.parse(text, allowEmpty: data[0] % 2 == 0)
  return 0
}
