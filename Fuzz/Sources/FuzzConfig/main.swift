import TesseraInterface

/// config.toml as tesserad and the CLI read it: the TOML subset reader, the broker's settings and
/// the `[[git]]` rules. Any input must end in a value or a named error, never a crash or a hang.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
  let bytes = Array(UnsafeBufferPointer(start: data, count: size))
  if let file = try? ConfigFile(parsing: bytes) {
    _ = try? GitCredentialRule.rules(in: file)
  }
  _ = try? BrokerConfig.parse(bytes: bytes)
  return 0
}
