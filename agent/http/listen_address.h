/* A numeric IPv4 or IPv6 address and a port as the socket address libmicrohttpd listens
 * on (MHD_OPTION_SOCK_ADDR), shared by the agent's HTTP servers (/metrics, the OpenAI
 * API). Reentrant. */
#ifndef INA_AGENT_HTTP_LISTEN_ADDRESS_H
#define INA_AGENT_HTTP_LISTEN_ADDRESS_H

#include <sys/socket.h>

#include "core/status.h"

/* Fills *sa (zeroed first) and *ipv6 (1 for an IPv6 address, which libmicrohttpd needs
 * MHD_USE_IPv6 for). INA_ERR_INVALID_ARGUMENT, the message prefixed with `what`, for a
 * port outside 0..65535 or an address that is neither. */
ina_status_t ina_listen_sockaddr(const char *what, const char *address, int port, struct sockaddr_storage *sa,
                                 int *ipv6);

#endif
