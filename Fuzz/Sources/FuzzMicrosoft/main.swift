import TesseraFuzzTargets

/// libFuzzer's entry point for FuzzTarget.microsoft (Tests/TesseraFuzzTargets says what it reads).
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
  FuzzTarget.microsoft.run(data, size)
  return 0
}
