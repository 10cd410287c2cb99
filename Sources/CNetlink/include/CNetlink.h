// CNetlink: the rtnetlink kernel headers for the OfflineQueue reachability monitor on Linux.
//
// Swift imports the structs and the simple constants of <linux/netlink.h> and
// <linux/rtnetlink.h> directly, but not their function-like macros (NLMSG_OK, RTA_NEXT, ...),
// so each macro used is wrapped here in a static inline function of the same meaning.
// On other platforms the module is empty apart from `cnetlink_is_supported`.
#ifndef CNETLINK_H
#define CNETLINK_H

/// 1 where this module wraps the Linux rtnetlink headers, 0 elsewhere.
int cnetlink_is_supported(void);

#if defined(__linux__)

#include <sys/socket.h>
#include <linux/netlink.h>
#include <linux/rtnetlink.h>

// MARK: Netlink messages (NLMSG_*)

/// NLMSG_ALIGN: a message length rounded up to the netlink alignment.
static inline unsigned int cnetlink_nlmsg_align(unsigned int length) {
    return NLMSG_ALIGN(length);
}

/// NLMSG_LENGTH: the `nlmsg_len` of a message with `payload` bytes of payload.
static inline unsigned int cnetlink_nlmsg_length(unsigned int payload) {
    return NLMSG_LENGTH(payload);
}

/// NLMSG_OK: whether a whole message starts at `message` within the `remaining` bytes.
/// (The macro's own test, with the int/unsigned comparison made explicit.)
static inline int cnetlink_nlmsg_ok(struct nlmsghdr *message, int remaining) {
    return remaining >= (int)sizeof(struct nlmsghdr)
        && message->nlmsg_len >= sizeof(struct nlmsghdr)
        && message->nlmsg_len <= (unsigned int)remaining;
}

/// NLMSG_NEXT: the message after `message`; decrements `*remaining` by the bytes skipped.
static inline struct nlmsghdr *cnetlink_nlmsg_next(struct nlmsghdr *message, int *remaining) {
    return NLMSG_NEXT(message, *remaining);
}

/// NLMSG_DATA: the payload of `message` (its family header: ifinfomsg, rtmsg, nlmsgerr, ...).
static inline void *cnetlink_nlmsg_data(struct nlmsghdr *message) {
    return NLMSG_DATA(message);
}

// MARK: Route attributes (RTA_*, IFLA_RTA, RTM_RTA)

/// IFLA_RTA: the first attribute after an RTM_NEWLINK message's ifinfomsg.
static inline struct rtattr *cnetlink_ifla_rta(struct ifinfomsg *info) {
    return IFLA_RTA(info);
}

/// IFLA_PAYLOAD: the bytes of attributes in an RTM_NEWLINK message (negative if too short).
static inline int cnetlink_ifla_payload(struct nlmsghdr *message) {
    return (int)message->nlmsg_len - (int)NLMSG_SPACE(sizeof(struct ifinfomsg));
}

/// RTM_RTA: the first attribute after an RTM_NEWROUTE message's rtmsg.
static inline struct rtattr *cnetlink_rtm_rta(struct rtmsg *route) {
    return RTM_RTA(route);
}

/// RTM_PAYLOAD: the bytes of attributes in an RTM_NEWROUTE message (negative if too short).
static inline int cnetlink_rtm_payload(struct nlmsghdr *message) {
    return (int)message->nlmsg_len - (int)NLMSG_SPACE(sizeof(struct rtmsg));
}

/// RTA_OK: whether a whole attribute starts at `attribute` within the `remaining` bytes.
static inline int cnetlink_rta_ok(struct rtattr *attribute, int remaining) {
    return RTA_OK(attribute, remaining);
}

/// RTA_NEXT: the attribute after `attribute`; decrements `*remaining` by the bytes skipped.
static inline struct rtattr *cnetlink_rta_next(struct rtattr *attribute, int *remaining) {
    return RTA_NEXT(attribute, *remaining);
}

/// RTA_DATA: the payload of `attribute`.
static inline void *cnetlink_rta_data(struct rtattr *attribute) {
    return RTA_DATA(attribute);
}

/// RTA_PAYLOAD: the payload length of `attribute` in bytes.
static inline int cnetlink_rta_payload(struct rtattr *attribute) {
    return (int)RTA_PAYLOAD(attribute);
}

// MARK: Multipath next hops (RTNH_*)

/// RTNH_OK: whether a whole next hop starts at `hop` within the `remaining` bytes.
static inline int cnetlink_rtnh_ok(struct rtnexthop *hop, int remaining) {
    return remaining >= (int)sizeof(struct rtnexthop) && RTNH_OK(hop, remaining);
}

/// RTNH_NEXT: the next hop after `hop`; decrements `*remaining` by the bytes skipped.
static inline struct rtnexthop *cnetlink_rtnh_next(struct rtnexthop *hop, int *remaining) {
    *remaining -= (int)RTNH_ALIGN(hop->rtnh_len);
    return RTNH_NEXT(hop);
}

// MARK: Namespaces

/// setns(fd, CLONE_NEWNET) for the calling thread: 0, or -1 with errno set.
/// (setns is declared by glibc only under _GNU_SOURCE, hence this wrapper.)
int cnetlink_setns_net(int fd);

#endif // __linux__

#endif // CNETLINK_H
