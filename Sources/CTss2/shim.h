// tpm2-tss's types and declarations only: its libraries are loaded on the first use of a TPM
// (Tss2Library.swift), not linked into the daemon.
#include <tss2/tss2_esys.h>
#include <tss2/tss2_mu.h>
#include <tss2/tss2_tctildr.h>
