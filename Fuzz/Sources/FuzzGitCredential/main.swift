import TesseraFuzzTargets

/// libFuzzer's entry point for FuzzTarget.gitCredential (Tests/TesseraFuzzTargets says what it reads).
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
  FuzzTarget.gitCredential.run(data, size)
  return 0
}
