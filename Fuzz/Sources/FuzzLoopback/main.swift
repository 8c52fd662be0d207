import TesseraCore

@testable import TesseraPlatform

/// What the browser's redirect brings to the loopback listener: the request head (request line,
/// headers), the redirect's query (code, state, error, iss); and /proc/net/tcp as LoopbackPeer
/// reads it to tell which user connected. The first byte chooses the reader.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
  guard size > 0 else { return 0 }
  let bytes = Array(UnsafeBufferPointer(start: data + 1, count: size - 1))
  if data[0] % 2 == 0 {
    if let head = HTTPRequestHead(bytes), let query = head.query {
      _ = FormEncoding.decode(query)
    }
  } else {
    let table = String(decoding: bytes, as: UTF8.self)
    _ = LoopbackPeer.uid(in: table, peerAddress: "0100007F:D431", ourAddress: "0100007F:8B3C")
  }
  return 0
}
