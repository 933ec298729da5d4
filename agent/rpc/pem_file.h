/* Reading TLS certificate and key files (PEM text) for the server and the client of
 * rpc/. Not a public header. */
#ifndef INA_AGENT_RPC_PEM_FILE_H
#define INA_AGENT_RPC_PEM_FILE_H

#include "core/status.h"

/* Reads the whole file at `path` into a malloc'd NUL-terminated string (*out, freed
 * by the caller). `what` names the file's role in error messages ("server
 * certificate"). Refuses empty files and files without a "-----BEGIN" line. */
ina_status_t rpc_read_pem_file(const char *what, const char *path, char **out);

#endif
