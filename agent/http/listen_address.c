/* Listen addresses of the agent's HTTP servers (listen_address.h). */
#define INA_LOG_SUBSYS "http"
#include "agent/http/listen_address.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdint.h>
#include <string.h>

#include "core/check.h"

ina_status_t ina_listen_sockaddr(const char *what, const char *address, int port, struct sockaddr_storage *sa,
                                 int *ipv6) {
  ina_status_t st = INA_OK;
  memset(sa, 0, sizeof *sa);
  *ipv6 = 0;
  INA_REQUIRE(port >= 0 && port <= 65535, INA_ERR_INVALID_ARGUMENT, "%s: port %d is out of range 0..65535", what,
              port);
  struct sockaddr_in *v4 = (struct sockaddr_in *)sa;
  struct sockaddr_in6 *v6 = (struct sockaddr_in6 *)sa;
  if (inet_pton(AF_INET, address, &v4->sin_addr) == 1) {
    v4->sin_family = AF_INET;
    v4->sin_port = htons((uint16_t)port);
  } else if (inet_pton(AF_INET6, address, &v6->sin6_addr) == 1) {
    v6->sin6_family = AF_INET6;
    v6->sin6_port = htons((uint16_t)port);
    *ipv6 = 1;
  } else {
    INA_REQUIRE(0, INA_ERR_INVALID_ARGUMENT, "%s: address '%s' is not a numeric IPv4 or IPv6 address", what,
                address);
  }
fail:
  return st;
}
