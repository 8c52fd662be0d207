import Foundation
import TesseraCLI

@testable import TesseraCLI

/// What git and kubectl hand the CLI's helpers: git's credential protocol on standard input, and
/// the KUBERNETES_EXEC_INFO JSON. The first byte chooses the reader.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
  guard size > 0 else { return 0 }
  let text = String(decoding: UnsafeBufferPointer(start: data + 1, count: size - 1), as: UTF8.self)
  if data[0] % 2 == 0 {
    _ = try? GitCredentialRequest(parsing: text)
  } else {
    _ = try? JSONDecoder().decode(Tessera.KubeCredential.ExecInfo.self, from: Data(text.utf8))
  }
  return 0
}
