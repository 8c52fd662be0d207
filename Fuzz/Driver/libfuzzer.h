// libFuzzer's entry for a program with a `main` of its own (SwiftPM gives every executable one),
// from the archive scripts/lib/sanitize.sh names in TESSERA_LIBFUZZER. libFuzzer ships no header
// for it; this is its declaration in compiler-rt's FuzzerInterface.h / FuzzerDriver.cpp.
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));
