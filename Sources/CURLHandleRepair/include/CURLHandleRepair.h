// CURLHandleRepair: stops URLSession's per-transfer leak on Linux (swift-corelibs-foundation).
//
// For every transfer, FoundationNetworking's `CFURLSessionCurlHostIsEqual` parses the request's
// URL into a libcurl `CURLU` handle and releases it with `curl_free`. That frees the handle's own
// struct and loses every part `curl_url_set` copied into it: about 150-250 bytes a request, for as
// long as the process runs (Benchmarks/Repro/README.md). The function is internal to
// libFoundationNetworking.so, but its calls into libcurl go through the library's own table of
// imported functions (its GOT). `curl_handle_repair_install` points that library's entries, and no
// other library's, at wrappers: `curl_url` notes the handle it returns in a slot of the calling
// thread (Foundation makes, uses and frees the handle on one thread, within one function), and
// `curl_free` releases the noted handle with `curl_url_cleanup`, parts and all. Every other pointer
// goes to libcurl's `curl_free` unchanged. Where the library imports `curl_url_cleanup` (a
// Foundation that frees the handle correctly), that entry is wrapped too and clears the note, so
// nothing is ever released twice.
//
// On other platforms, and where FoundationNetworking is linked statically, installing does
// nothing and reports so.
#ifndef CURL_HANDLE_REPAIR_H
#define CURL_HANDLE_REPAIR_H

/// Points libFoundationNetworking.so's `curl_free` (and `curl_url_cleanup`, if it imports it),
/// then its `curl_url`, at the repair, once per process (later calls return the first call's
/// answer). 1 if the repair is in place, 0 if it is not needed or not possible here (not Linux, no
/// libFoundationNetworking.so loaded, its libcurl not found, or its entries not where expected).
int curl_handle_repair_install(void);

/// 1 if libFoundationNetworking.so is loaded as a shared library (where the repair can work).
int curl_handle_repair_is_possible(void);

/// 1 if libFoundationNetworking.so's `curl_url` and `curl_free` entries point at the repair now.
int curl_handle_repair_is_in_place(void);

/// How many handles the repair has released in full that `curl_free` would have leaked, since the
/// process started.
unsigned long curl_handle_repair_released_count(void);

/// For tests: from now on, also count the released handles whose URL has this port (0 stops).
void curl_handle_repair_watch_port(int port);

/// For tests: how many released handles had the watched port.
unsigned long curl_handle_repair_watched_count(void);

#endif
