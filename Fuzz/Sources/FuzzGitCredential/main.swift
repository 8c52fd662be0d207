import CLibFuzzer
import Glibc
import TesseraFuzzTargets

// libFuzzer runs FuzzTarget.gitCredential (Tests/TesseraFuzzTargets says what it reads) with this program's
// arguments: -max_total_time, the corpus folders, an input to replay.
var argc = CommandLine.argc
var argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>? = CommandLine.unsafeArgv
exit(
  LLVMFuzzerRunDriver(&argc, &argv) { data, size in
    guard let data else { return 0 }
    FuzzTarget.gitCredential.run(data, size)
    return 0
  })
