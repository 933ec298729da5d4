/* How the `ina` client commands (info, health, generate --server, load, place) reach a
 * running ina-agent: the connection options (--server, --tls, --tls-ca, --tls-name,
 * --token, --timeout-ms), their help text, connecting, and the messages for a failed
 * call. Every message goes to stderr and starts "ina CMD: ", CMD being the command's name.
 *
 * Ownership: a client_connection_t points into the strings it was given (argv), copying
 * nothing; a client from client_connect is the caller's, to free with
 * ina_rpc_client_destroy; a message from client_call is the caller's, to free with
 * protobuf_c_message_free_unpacked. No pointer argument may be NULL unless said so.
 * Thread safety: none needed: a command parses its arguments and calls on one thread. */
#ifndef INA_TOOLS_CLIENT_CONNECTION_H
#define INA_TOOLS_CLIENT_CONNECTION_H

#include <getopt.h>
#include <protobuf-c/protobuf-c.h>
#include <stdint.h>
#include <stdio.h>

#include "agent/rpc/rpc_client.h"

/* getopt_long values of the connection options; a command's own options stay below. */
enum {
  CLIENT_OPT_SERVER = 512,
  CLIENT_OPT_TLS,
  CLIENT_OPT_TLS_CA,
  CLIENT_OPT_TLS_NAME,
  CLIENT_OPT_TOKEN,
  CLIENT_OPT_TIMEOUT,
};

/* The connection options' entries of a command's `struct option` array. */
#define CLIENT_CONNECTION_OPTIONS                                                           \
  {"server", required_argument, 0, CLIENT_OPT_SERVER}, {"tls", no_argument, 0, CLIENT_OPT_TLS}, \
      {"tls-ca", required_argument, 0, CLIENT_OPT_TLS_CA},                                  \
      {"tls-name", required_argument, 0, CLIENT_OPT_TLS_NAME},                              \
      {"token", required_argument, 0, CLIENT_OPT_TOKEN},                                    \
      {"timeout-ms", required_argument, 0, CLIENT_OPT_TIMEOUT}

typedef struct client_connection {
  ina_rpc_client_options_t options; /* target NULL until --server */
  int64_t timeout_ms;               /* --timeout-ms; -1 when not given */
} client_connection_t;

#define CLIENT_CONNECTION_INIT {INA_RPC_CLIENT_OPTIONS_INIT, -1}

/* Prints the help of the connection options and then of -h, --help. Only the default
 * deadline differs between commands, so `timeout_help` is the description of
 * --timeout-ms: lines that each end in "\n", written without indentation (the lines
 * after the first are indented to the description column here). */
void client_connection_help(FILE *f, const char *timeout_help);

/* Takes option `c` of getopt_long with its argument: returns 1 when it was a connection
 * option, -1 when it was one with a bad value (after printing why), 0 when it was not. */
int client_connection_option(client_connection_t *conn, int c, const char *arg);

/* The deadline_ms of a call (see ina_rpc_client_unary): --timeout-ms when it was given,
 * else the command's `default_ms`. */
int64_t client_connection_deadline(const client_connection_t *conn, int64_t default_ms);

/* A client for conn; NULL after printing why not (no --server, bad TLS files). Creating
 * does not connect: the first call does. */
ina_rpc_client_t *client_connect(const char *cmd, const client_connection_t *conn);

/* Prints "ina CMD: METHOD: CODE: message" for a call that ended with `status`; returns 1
 * (the exit code of a failed call). */
int client_call_failed(const char *cmd, const char *method, const ina_rpc_status_t *status);

/* One unary call of /ina.v1.SERVICE/NAME: packs `request`, calls and unpacks the answer
 * as a message of `answer_type`. Returns the answer, or NULL after printing why (an
 * error status as client_call_failed does, with NAME as the method). */
ProtobufCMessage *client_call(ina_rpc_client_t *client, const char *cmd, const char *service,
                              const char *name, const ProtobufCMessage *request,
                              int64_t deadline_ms, const ProtobufCMessageDescriptor *answer_type);

#endif
