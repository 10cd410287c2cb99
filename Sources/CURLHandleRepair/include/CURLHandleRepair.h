// CURLHandleRepair: stops URLSession's per-transfer leak on Linux (swift-corelibs-foundation).
//
// For every transfer, FoundationNetworking's `CFURLSessionCurlHostIsEqual` parses the request's
// URL into a libcurl `CURLU` handle and releases it with `curl_free`. That frees the handle's own
// struct and loses every part `curl_url_set` copied into it: about 150-250 bytes a request, for as
// long as the process runs (Benchmarks/Repro/README.md). The function is internal to
// libFoundationNetworking.so, but its calls into libcurl go through the library's own table of
// imported functions (its GOT). `curl_handle_repair_install` points two of that library's entries,
// and no other library's, at wrappers: its `curl_url` remembers the handle it returns, and its
// `curl_free` releases a remembered handle with `curl_url_cleanup`, parts and all. Every other
// pointer goes to libcurl's `curl_free` unchanged, so a Foundation that releases its handles
// correctly is not affected.
//
// On other platforms, and where FoundationNetworking is linked statically, installing does
// nothing and reports so.
#ifndef CURL_HANDLE_REPAIR_H
#define CURL_HANDLE_REPAIR_H

/// Points libFoundationNetworking.so's `curl_url` and `curl_free` at the repair, once per process
/// (later calls return the first call's answer). 1 if the repair is in place, 0 if it is not
/// needed or not possible here (not Linux, no libFoundationNetworking.so loaded, libcurl not
/// found, or the entries not where they were expected).
int curl_handle_repair_install(void);

/// How many handles the repair has released in full that `curl_free` would have leaked, since the
/// process started. For tests and diagnostics.
unsigned long curl_handle_repair_released_count(void);

#endif
