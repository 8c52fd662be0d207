import TesseraCLI

// The command's logic is the TesseraCLI library (tested through this binary by TesseraCLITests).
runTessera()
