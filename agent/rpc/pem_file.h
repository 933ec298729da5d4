/* Reading TLS certificate and key files (PEM text) for the server and the client of
 * rpc/. Not a public header. */
#ifndef INA_AGENT_RPC_PEM_FILE_H
#define INA_AGENT_RPC_PEM_FILE_H

#include "core/status.h"

/* Reads the whole file at `path` into a malloc'd NUL-terminated string (*out, freed
 * by the caller). `what` names the file's role in error messages ("server
 * certificate"). Refuses empty files and files without a "-----BEGIN" line. */
ina_status_t rpc_read_pem_file(const char *what, const char *path, char **out);

/* Checks, with OpenSSL, that `key_pem` (a private key, PEM) parses and belongs to the
 * first certificate of `cert_pem` (a chain, PEM), so that a mismatch is reported as such
 * instead of as a failure to listen. `what` prefixes error messages ("rpc server"), which
 * name the files by their paths. */
ina_status_t rpc_check_key_pair(const char *what, const char *cert_pem, const char *cert_path, const char *key_pem,
                                const char *key_path);

#endif
