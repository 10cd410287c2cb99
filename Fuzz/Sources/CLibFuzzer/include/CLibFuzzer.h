#ifndef RESILIENCE_FUZZ_CLIBFUZZER_H
#define RESILIENCE_FUZZ_CLIBFUZZER_H

#include <stddef.h>
#include <stdint.h>

/// libFuzzer's driver (compiler-rt's FuzzerDriver.cpp), linked in by `-sanitize=fuzzer`: parses
/// libFuzzer's command line and calls `callback` once per input.
int LLVMFuzzerRunDriver(int *argc, char ***argv, int (*callback)(const uint8_t *data, size_t size));

#endif
