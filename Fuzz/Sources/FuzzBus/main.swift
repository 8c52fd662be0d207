import TesseraFuzzTargets

/// libFuzzer's entry point for FuzzTarget.bus (Tests/TesseraFuzzTargets says what it reads).
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzz(_ data: UnsafePointer<UInt8>, _ size: Int) -> CInt {
  FuzzTarget.bus.run(data, size)
  return 0
}
