// See include/CURLHandleRepair.h for what this repairs and why.
#if defined(__linux__)
#define _GNU_SOURCE
#include <dlfcn.h>
#include <elf.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#endif

#include "CURLHandleRepair.h"

#if defined(__linux__)

// The handles Foundation made with `curl_url` and has not released yet. It holds one for the
// length of a function call, so a few slots are plenty; a handle made while every slot is taken
// is simply not remembered, and `curl_free` then releases it as libcurl would (the leak, as before).
#define REMEMBERED_SLOTS 64

typedef void *(*curl_url_function)(void);
typedef void (*curl_release_function)(void *);

static curl_url_function libcurl_url;
static curl_release_function libcurl_url_cleanup;
static curl_release_function libcurl_free;

static pthread_mutex_t remembered_lock = PTHREAD_MUTEX_INITIALIZER;
static void *remembered[REMEMBERED_SLOTS];
static _Atomic unsigned long released_count;

static void *repair_curl_url(void) {
    void *handle = libcurl_url();
    if (handle == NULL) return NULL;
    pthread_mutex_lock(&remembered_lock);
    for (int slot = 0; slot < REMEMBERED_SLOTS; slot++) {
        if (remembered[slot] == NULL) {
            remembered[slot] = handle;
            break;
        }
    }
    pthread_mutex_unlock(&remembered_lock);
    return handle;
}

static void repair_curl_free(void *pointer) {
    int wasHandle = 0;
    if (pointer != NULL) {
        pthread_mutex_lock(&remembered_lock);
        for (int slot = 0; slot < REMEMBERED_SLOTS; slot++) {
            if (remembered[slot] == pointer) {
                remembered[slot] = NULL;
                wasHandle = 1;
                break;
            }
        }
        pthread_mutex_unlock(&remembered_lock);
    }
    if (wasHandle) {
        atomic_fetch_add_explicit(&released_count, 1, memory_order_relaxed);
        libcurl_url_cleanup(pointer);
    } else {
        libcurl_free(pointer);
    }
}

// A loaded object's address for a dynamic-section pointer: glibc rewrites most of them to absolute
// addresses when it loads the object, some platforms leave them relative to its base.
static uintptr_t absolute(uintptr_t base, uintptr_t pointer) {
    return pointer < base ? base + pointer : pointer;
}

struct patch_result {
    int found_library;
    int patched;
};

// Writes `function` into the GOT entry at `slot`, making a RELRO page writable for the moment.
static int write_entry(struct dl_phdr_info *info, uintptr_t slot, void *function) {
    uintptr_t relro_start = 0;
    uintptr_t relro_end = 0;
    for (int index = 0; index < info->dlpi_phnum; index++) {
        const ElfW(Phdr) *header = &info->dlpi_phdr[index];
        if (header->p_type == PT_GNU_RELRO) {
            relro_start = info->dlpi_addr + header->p_vaddr;
            relro_end = relro_start + header->p_memsz;
        }
    }
    int read_only = slot >= relro_start && slot < relro_end;
    uintptr_t page_size = (uintptr_t)sysconf(_SC_PAGESIZE);
    void *page = (void *)(slot & ~(page_size - 1));
    if (read_only && mprotect(page, page_size, PROT_READ | PROT_WRITE) != 0) return 0;
    __atomic_store_n((void **)slot, function, __ATOMIC_RELEASE);
    if (read_only) mprotect(page, page_size, PROT_READ);
    return 1;
}

// Finds the entries for `curl_url` and `curl_free` among `count` relocations and points them at
// the wrappers. Returns how many it pointed.
static int patch_relocations(struct dl_phdr_info *info, const ElfW(Rela) *relocations, size_t count,
                             const ElfW(Sym) *symbols, const char *names) {
    int patched = 0;
    for (size_t index = 0; index < count; index++) {
        uint32_t kind = (uint32_t)ELF64_R_TYPE(relocations[index].r_info);
#if defined(__x86_64__)
        if (kind != R_X86_64_JUMP_SLOT && kind != R_X86_64_GLOB_DAT) continue;
#elif defined(__aarch64__)
        if (kind != R_AARCH64_JUMP_SLOT && kind != R_AARCH64_GLOB_DAT) continue;
#else
        (void)kind;
        continue;
#endif
        const char *name = names + symbols[ELF64_R_SYM(relocations[index].r_info)].st_name;
        uintptr_t slot = info->dlpi_addr + relocations[index].r_offset;
        if (strcmp(name, "curl_url") == 0) {
            patched += write_entry(info, slot, (void *)repair_curl_url);
        } else if (strcmp(name, "curl_free") == 0) {
            patched += write_entry(info, slot, (void *)repair_curl_free);
        }
    }
    return patched;
}

static int patch_foundation_networking(struct dl_phdr_info *info, size_t size, void *context) {
    (void)size;
    struct patch_result *result = context;
    if (info->dlpi_name == NULL || strstr(info->dlpi_name, "libFoundationNetworking.so") == NULL) return 0;
    result->found_library = 1;
    const ElfW(Dyn) *dynamic = NULL;
    for (int index = 0; index < info->dlpi_phnum; index++) {
        if (info->dlpi_phdr[index].p_type == PT_DYNAMIC) {
            dynamic = (const ElfW(Dyn) *)(info->dlpi_addr + info->dlpi_phdr[index].p_vaddr);
        }
    }
    if (dynamic == NULL) return 1;
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
    int patched = 0;
    if (jump != 0 && jump_kind == DT_RELA) {
        patched += patch_relocations(info, (const ElfW(Rela) *)jump, jump_size / sizeof(ElfW(Rela)),
                                     (const ElfW(Sym) *)symbols, (const char *)names);
    }
    if (rela != 0) {
        patched += patch_relocations(info, (const ElfW(Rela) *)rela, rela_size / sizeof(ElfW(Rela)),
                                     (const ElfW(Sym) *)symbols, (const char *)names);
    }
    result->patched = patched;
    return 1;
}

static pthread_once_t install_once = PTHREAD_ONCE_INIT;
static int installed;

static void install(void) {
    libcurl_url = (curl_url_function)dlsym(RTLD_DEFAULT, "curl_url");
    libcurl_url_cleanup = (curl_release_function)dlsym(RTLD_DEFAULT, "curl_url_cleanup");
    libcurl_free = (curl_release_function)dlsym(RTLD_DEFAULT, "curl_free");
    if (libcurl_url == NULL || libcurl_url_cleanup == NULL || libcurl_free == NULL) return;
    struct patch_result result = {0, 0};
    dl_iterate_phdr(patch_foundation_networking, &result);
    // Both entries or neither would be pointed in a library built as expected; one alone is
    // still safe (a handle is only remembered by the repaired `curl_url`, and an unremembered
    // pointer goes to libcurl's `curl_free`).
    installed = result.patched > 0;
}

int curl_handle_repair_install(void) {
    pthread_once(&install_once, install);
    return installed;
}

unsigned long curl_handle_repair_released_count(void) {
    return atomic_load_explicit(&released_count, memory_order_relaxed);
}

#else

int curl_handle_repair_install(void) {
    return 0;
}

unsigned long curl_handle_repair_released_count(void) {
    return 0;
}

#endif
