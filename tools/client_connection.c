#include "tools/client_connection.h"

#include <stdlib.h>

#include "core/log.h"
#include "agent/rpc/rpc_pb.h"
#include "tools/cli.h"

/* The column where the option descriptions of every `ina` help start. */
#define DESCRIPTION_INDENT "                       "

void client_connection_help(FILE *f, const char *timeout_help) {
  fputs("  --server HOST:PORT   the agent's gRPC address (required)\n"
        "  --tls                use TLS (server certificate checked against --tls-ca or the\n"
        "                       system roots)\n"
        "  --tls-ca FILE        PEM root certificate(s) for --tls\n"
        "  --tls-name NAME      name the server certificate must carry (default: the host)\n"
        "  --token TOKEN        bearer token sent with every call\n"
        "  --timeout-ms N       ",
        f);
  for (const char *p = timeout_help; *p; p++) {
    fputc(*p, f);
    if (*p == '\n' && p[1]) fputs(DESCRIPTION_INDENT, f);
  }
  fputs("  -h, --help           this help\n", f);
}

int client_connection_option(client_connection_t *conn, int c, const char *arg) {
  switch (c) {
  case CLIENT_OPT_SERVER: conn->options.target = arg; return 1;
  case CLIENT_OPT_TLS: conn->options.tls = 1; return 1;
  case CLIENT_OPT_TLS_CA: conn->options.tls_root_cert_file = arg; return 1;
  case CLIENT_OPT_TLS_NAME: conn->options.tls_target_name = arg; return 1;
  case CLIENT_OPT_TOKEN: conn->options.bearer_token = arg; return 1;
  case CLIENT_OPT_TIMEOUT:
    return cli_parse_int("--timeout-ms", arg, 1, INT64_MAX, &conn->timeout_ms) ? -1 : 1;
  default: return 0;
  }
}

int64_t client_connection_deadline(const client_connection_t *conn, int64_t default_ms) {
  return conn->timeout_ms > 0 ? conn->timeout_ms : default_ms;
}

ina_rpc_client_t *client_connect(const char *cmd, const client_connection_t *conn) {
  ina_rpc_client_t *client = NULL;
  if (!conn->options.target) {
    fprintf(stderr, "ina %s: --server HOST:PORT is required\n", cmd);
    return NULL;
  }
  if (ina_rpc_client_create(&conn->options, &client) != INA_OK)
    fprintf(stderr, "ina %s: %s\n", cmd, ina_last_error());
  return client;
}

int client_call_failed(const char *cmd, const char *method, const ina_rpc_status_t *status) {
  fprintf(stderr, "ina %s: %s: %s: %s\n", cmd, method, ina_rpc_code_name(status->code), status->message);
  return 1;
}

ProtobufCMessage *client_call(ina_rpc_client_t *client, const char *cmd, const char *service,
                              const char *name, const ProtobufCMessage *request,
                              int64_t deadline_ms, const ProtobufCMessageDescriptor *answer_type) {
  char method[128];
  uint8_t *bytes = NULL, *resp = NULL;
  size_t size = 0, resp_size = 0;
  ina_rpc_status_t status;
  ProtobufCMessage *answer = NULL;
  snprintf(method, sizeof method, "/ina.v1.%s/%s", service, name);
  if (ina_rpc_pack(request, &bytes, &size) != INA_OK) {
    fprintf(stderr, "ina %s: %s\n", cmd, ina_last_error());
    return NULL;
  }
  if (ina_rpc_client_unary(client, method, bytes, size, deadline_ms, &resp, &resp_size, &status) != INA_OK)
    client_call_failed(cmd, name, &status);
  else if (!(answer = protobuf_c_message_unpack(answer_type, NULL, resp_size, resp)))
    fprintf(stderr, "ina %s: %s: the answer (%zu bytes) is not an %s\n", cmd, name, resp_size,
            answer_type->name);
  free(bytes);
  free(resp);
  return answer;
}
