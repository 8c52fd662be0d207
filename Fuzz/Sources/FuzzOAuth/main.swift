import TesseraCore

/// What an identity provider sends back, read as the engine reads it: the token endpoint's body
/// (success or error), Microsoft's client_info, a Retry-After header, base64url and form encoding.
/// The first byte chooses the parser, so one corpus reaches all of them.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
  guard size > 0 else { return 0 }
  let bytes = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
  let text = String(decoding: bytes, as: UTF8.self)
  switch data[0] % 6 {
  case 0:
    _ = try? TokenResponse.parse(bytes, endpoint: "https://idp.test/token")
    _ = TokenResponse.refreshToken(in: bytes)
  case 1: _ = ClientInfo.decode(text)
  case 2: _ = OAuthErrorResponse.retryAfterSeconds(text)
  case 3: _ = Base64URL.decode(text)
  case 4:
    _ = FormEncoding.decode(text)
    _ = FormEncoding.unescape(text)
  default: _ = try? Authority(parsing: text)
  }
  return 0
}
