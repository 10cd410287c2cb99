// See include/CURLHandleRepair.h for what this repairs and why.
#if defined(__linux__)
#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "CURLHandleRepair.h"

#if defined(__linux__)

typedef void *(*curl_url_function)(void);
typedef void (*curl_release_function)(void *);
typedef int (*curl_url_get_function)(void *, int, char **, unsigned int);

// libcurl's functions, as libFoundationNetworking.so's own dependencies resolve them.
static curl_url_function libcurl_url;
static curl_release_function libcurl_url_cleanup;
static curl_release_function libcurl_free;
static curl_url_get_function libcurl_url_get;

// The handle this thread's Foundation made last and has not released yet. Foundation makes it,
// uses it and frees it on one thread within one function, so one slot per thread is enough. A
// handle Foundation never releases (it leaks one whole when `curl_url_set` fails) stays noted
// until the next `curl_url` on the thread; it is never freed, so its address cannot come back.
static __thread void *noted_handle;

static _Atomic unsigned long released_count;
static _Atomic int watched_port;
static _Atomic unsigned long watched_count;

// CURLUPART_PORT in <curl/urlapi.h> (URL, SCHEME, USER, PASSWORD, OPTIONS, HOST, PORT: a stable
// ABI value since libcurl 7.62).
#define CURL_HANDLE_REPAIR_PART_PORT 6

static void *repair_curl_url(void) {
    void *handle = libcurl_url();
    noted_handle = handle;
    return handle;
}

static void repair_curl_url_cleanup(void *handle) {
    if (handle != NULL && handle == noted_handle) noted_handle = NULL;
    libcurl_url_cleanup(handle);
}

static void count_if_watched(void *handle) {
    int port = atomic_load_explicit(&watched_port, memory_order_relaxed);
    if (port == 0 || libcurl_url_get == NULL) return;
    char *text = NULL;
    if (libcurl_url_get(handle, CURL_HANDLE_REPAIR_PART_PORT, &text, 0) == 0 && text != NULL) {
        if (atoi(text) == port) atomic_fetch_add_explicit(&watched_count, 1, memory_order_relaxed);
        libcurl_free(text);
    }
}

static void repair_curl_free(void *pointer) {
    if (pointer != NULL && pointer == noted_handle) {
        noted_handle = NULL;
        atomic_fetch_add_explicit(&released_count, 1, memory_order_relaxed);
        count_if_watched(pointer);
        libcurl_url_cleanup(pointer);
        return;
    }
    libcurl_free(pointer);
}

// A loaded object's address for a dynamic-section pointer: glibc rewrites most of them to absolute
// addresses when it loads the object, some platforms leave them relative to its base.
static uintptr_t absolute(uintptr_t base, uintptr_t pointer) {
    return pointer < base ? base + pointer : pointer;
}

// What is known of libFoundationNetworking.so once it is found.
struct foundation_networking {
    int found;
    char name[4096];
    struct dl_phdr_info info;
    const ElfW(Sym) *symbols;
    const char *names;
    const ElfW(Rela) *jump;
    size_t jump_count;
    const ElfW(Rela) *rela;
    size_t rela_count;
};

// Whether a loaded object is libFoundationNetworking.so (by its path).
static int is_foundation_networking(const struct dl_phdr_info *info) {
    return info->dlpi_name != NULL && strstr(info->dlpi_name, "libFoundationNetworking.so") != NULL;
}

static int find_foundation_networking(struct dl_phdr_info *info, size_t size, void *context) {
    (void)size;
    struct foundation_networking *found = context;
    if (!is_foundation_networking(info)) return 0;
    const ElfW(Dyn) *dynamic = NULL;
    for (int index = 0; index < info->dlpi_phnum; index++) {
        if (info->dlpi_phdr[index].p_type == PT_DYNAMIC) {
            dynamic = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[index].p_vaddr);
        }
    }
    if (dynamic == NULL || strlen(info->dlpi_name) >= sizeof found->name) return 1;
    uintptr_t base = info->dlpi_addr;
    uintptr_t symbols = 0, names = 0, rela = 0, rela_size = 0, jump = 0, jump_size = 0, jump_kind = 0;
    for (const ElfW(Dyn) *entry = dynamic; entry->d_tag != DT_NULL; entry++) {
        switch (entry->d_tag) {
        case DT_SYMTAB: symbols = absolute(base, entry->d_un.d_ptr); break;
        case DT_STRTAB: names = absolute(base, entry->d_un.d_ptr); break;
        case DT_RELA: rela = absolute(base, entry->d_un.d_ptr); break;
        case DT_RELASZ: rela_size = entry->d_un.d_val; break;
        case DT_JMPREL: jump = absolute(base, entry->d_un.d_ptr); break;
        case DT_PLTRELSZ: jump_size = entry->d_un.d_val; break;
        case DT_PLTREL: jump_kind = entry->d_un.d_val; break;
        default: break;
        }
    }
    if (symbols == 0 || names == 0) return 1;
    found->found = 1;
    strcpy(found->name, info->dlpi_name);
    found->info = *info;
    found->symbols = (const ElfW(Sym) *)symbols;
    found->names = (const char *)names;
    if (jump != 0 && jump_kind == DT_RELA) {
        found->jump = (const ElfW(Rela) *)jump;
        found->jump_count = jump_size / sizeof(ElfW(Rela));
    }
    if (rela != 0) {
        found->rela = (const ElfW(Rela) *)rela;
        found->rela_count = rela_size / sizeof(ElfW(Rela));
    }
    return 1;
}

static int is_function_entry(const ElfW(Rela) *relocation) {
    uint32_t kind = (uint32_t)ELF64_R_TYPE(relocation->r_info);
#if defined(__x86_64__)
    return kind == R_X86_64_JUMP_SLOT || kind == R_X86_64_GLOB_DAT;
#elif defined(__aarch64__)
    return kind == R_AARCH64_JUMP_SLOT || kind == R_AARCH64_GLOB_DAT;
#else
    (void)kind;
    return 0;
#endif
}

// Writes `function` into the entry at `slot`. A slot on a page that glibc made read-only after
// relocation (RELRO: only the whole pages below the segment's end) is made writable for the write.
static int write_entry(const struct dl_phdr_info *info, uintptr_t slot, void *function) {
    uintptr_t page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t relro_start = 0;
    uintptr_t relro_end = 0;
    for (int index = 0; index < info->dlpi_phnum; index++) {
        const ElfW(Phdr) *header = &info->dlpi_phdr[index];
        if (header->p_type == PT_GNU_RELRO) {
            relro_start = (info->dlpi_addr + header->p_vaddr) & ~(page_size - 1);
            relro_end = (info->dlpi_addr + header->p_vaddr + header->p_memsz) & ~(page_size - 1);
        }
    }
    int read_only = slot >= relro_start && slot < relro_end;
    void *page = (void *)(slot & ~(page_size - 1));
    if (read_only && mprotect(page, page_size, PROT_READ | PROT_WRITE) != 0) return 0;
    __atomic_store_n((void **)slot, function, __ATOMIC_RELEASE);
    if (read_only) mprotect(page, page_size, PROT_READ);
    return 1;
}

// Points every entry of the library for the function called `name` at `function`, or (with NULL)
// checks that each already does. Returns how many entries there are, or -1 when one failed.
static int visit_entries(const struct foundation_networking *library, const char *name, void *function, void *expected) {
    int entries = 0;
    const ElfW(Rela) *tables[2] = {library->jump, library->rela};
    size_t counts[2] = {library->jump_count, library->rela_count};
    for (int table = 0; table < 2; table++) {
        for (size_t index = 0; index < counts[table]; index++) {
            const ElfW(Rela) *relocation = &tables[table][index];
            if (!is_function_entry(relocation)) continue;
            const char *symbol = library->names + library->symbols[ELF64_R_SYM(relocation->r_info)].st_name;
            if (strcmp(symbol, name) != 0) continue;
            uintptr_t slot = library->info.dlpi_addr + relocation->r_offset;
            if (function != NULL) {
                if (!write_entry(&library->info, slot, function)) return -1;
            } else if (__atomic_load_n((void **)slot, __ATOMIC_ACQUIRE) != expected) {
                return -1;
            }
            entries++;
        }
    }
    return entries;
}

static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static struct foundation_networking library;
static int installed;

static void install(void) {
    dl_iterate_phdr(find_foundation_networking, &library);
    if (!library.found) return;
    // libcurl as libFoundationNetworking.so's dependencies resolve it (not whichever libcurl
    // happens to be first in the process).
    void *handle = dlopen(library.name, RTLD_NOLOAD | RTLD_NOW);
    if (handle == NULL) return;
    libcurl_url = (curl_url_function)dlsym(handle, "curl_url");
    libcurl_url_cleanup = (curl_release_function)dlsym(handle, "curl_url_cleanup");
    libcurl_free = (curl_release_function)dlsym(handle, "curl_free");
    libcurl_url_get = (curl_url_get_function)dlsym(handle, "curl_url_get");
    dlclose(handle);  // NOLOAD: only the reference dlopen took; the library stays loaded
    if (libcurl_url == NULL || libcurl_url_cleanup == NULL || libcurl_free == NULL) return;
    // The releasing side first, the noting side last: a thread that passes through a noting
    // `curl_url` always finds the releasing wrappers in place.
    if (visit_entries(&library, "curl_free", (void *)repair_curl_free, NULL) <= 0) return;
    if (visit_entries(&library, "curl_url_cleanup", (void *)repair_curl_url_cleanup, NULL) < 0) return;
    if (visit_entries(&library, "curl_url", (void *)repair_curl_url, NULL) <= 0) return;
    installed = curl_handle_repair_is_in_place();
}

int curl_handle_repair_install(void) {
    pthread_once(&install_once, install);
    return installed;
}

static int note_presence(struct dl_phdr_info *info, size_t size, void *context) {
    (void)size;
    if (is_foundation_networking(info)) {
        *(int *)context = 1;
        return 1;
    }
    return 0;
}

int curl_handle_repair_is_possible(void) {
    int present = 0;
    dl_iterate_phdr(note_presence, &present);
    return present;
}

int curl_handle_repair_is_in_place(void) {
    if (!library.found) return 0;
    // Read again after writing: with lazy binding, a concurrent first call's resolver can write
    // libcurl's address over a wrapper.
    return visit_entries(&library, "curl_free", NULL, (void *)repair_curl_free) > 0
        && visit_entries(&library, "curl_url", NULL, (void *)repair_curl_url) > 0;
}

unsigned long curl_handle_repair_released_count(void) {
    return atomic_load_explicit(&released_count, memory_order_relaxed);
}

void curl_handle_repair_watch_port(int port) {
    atomic_store_explicit(&watched_count, 0, memory_order_relaxed);
    atomic_store_explicit(&watched_port, port, memory_order_relaxed);
}

unsigned long curl_handle_repair_watched_count(void) {
    return atomic_load_explicit(&watched_count, memory_order_relaxed);
}

#else

int curl_handle_repair_install(void) {
    return 0;
}

int curl_handle_repair_is_possible(void) {
    return 0;
}

int curl_handle_repair_is_in_place(void) {
    return 0;
}

unsigned long curl_handle_repair_released_count(void) {
    return 0;
}

void curl_handle_repair_watch_port(int port) {
    (void)port;
}

unsigned long curl_handle_repair_watched_count(void) {
    return 0;
}

#endif
