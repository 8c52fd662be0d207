# shellcheck shell=bash
# The one AddressSanitizer build that the unit tests (scripts/test) and the coverage-guided fuzzers
# (scripts/fuzz) share, in .build-address: BoringSSL and the rest compiled once for both rather than
# twice. Both scripts take its flags from here, so the second finds the first's build up to date.
#   - --sanitize=address for every module, C included;
#   - libFuzzer's coverage (inline 8-bit counters, the PC table, comparisons, indirect calls) in
#     every Swift module; outside the fuzzers its calls land in AddressSanitizer's empty defaults;
#   - TESSERA_LIBFUZZER names libFuzzer's archive without a `main`: Package.swift then adds the
#     Fuzz/ executables, which call its driver from a `main` of their own, and links it into them;
#   - TESSERA_SHARED_STDLIB: the `tessera` binary the CLI tests run keeps the shared Swift runtime,
#     as under ThreadSanitizer (Package.swift says why).
# Usage: source it, then `tessera_asan_env || exit` and swift build/test "${TESSERA_ASAN_ARGS[@]}".

TESSERA_ASAN_ARGS=(
    --sanitize=address
    -Xswiftc -sanitize-coverage=edge,indirect-calls,trace-cmp,inline-8bit-counters,pc-table
)

# libFuzzer's archive without a `main`, in the Swift toolchain's clang resource folder.
tessera_libfuzzer() {
    local swiftc candidates
    swiftc="$(readlink -f "$(command -v swiftc)")" || return 1
    candidates=("${swiftc%/bin/*}"/lib/clang/*/lib/linux/libclang_rt.fuzzer_no_main-x86_64.a
        "${swiftc%/bin/*}"/lib/clang/*/lib/x86_64-unknown-linux-gnu/libclang_rt.fuzzer_no_main.a)
    for candidate in "${candidates[@]}"; do
        [[ -f "$candidate" ]] && { printf '%s\n' "$candidate"; return 0; }
    done
    echo "no libFuzzer archive in the Swift toolchain at ${swiftc%/bin/*}/lib/clang" >&2
    return 1
}

tessera_asan_env() {
    TESSERA_LIBFUZZER="$(tessera_libfuzzer)" || return 1
    export TESSERA_LIBFUZZER TESSERA_SHARED_STDLIB=1
}
