// The module is only a header for libFuzzer's driver; SwiftPM wants a source file in a C target.
#include "CLibFuzzer.h"
