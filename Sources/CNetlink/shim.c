// Out-of-line parts of CNetlink; the macro wrappers are static inline in include/CNetlink.h.
#if defined(__linux__)
#define _GNU_SOURCE
#include <sched.h>
#endif

#include "CNetlink.h"

int cnetlink_is_supported(void) {
#if defined(__linux__)
    return 1;
#else
    return 0;
#endif
}

#if defined(__linux__)
int cnetlink_setns_net(int fd) {
    return setns(fd, CLONE_NEWNET);
}
#endif
