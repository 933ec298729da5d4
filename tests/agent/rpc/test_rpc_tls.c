/* TLS round trips. The certificates are made here, at test time, with libcrypto (OpenSSL,
 * which libgrpc-dev depends on, so no extra package): a self-signed P-256 certificate
 * for "localhost" / 127.0.0.1, one for a name only (node.ina.test) that the client
 * reaches through tls_target_name, and an unrelated one that must not be trusted.
 * Checks: unary and streaming calls over TLS, bearer tokens over TLS, a plaintext client
 * against the TLS server and a client trusting the wrong root both fail (UNAVAILABLE), and
 * a server given one certificate's key with another certificate refuses to start, saying
 * that they do not match. */
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <stdio.h>
#include <unistd.h>

#include "core/log.h"
#include "tests/agent/rpc/rpc_fixture.h"

#define CALL_DEADLINE_MS 10000

static fixture_t g_fx;

typedef struct cert_files {
  char cert[256];
  char key[256];
} cert_files_t;

static int add_extension(X509 *x, int nid, const char *value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, x, x, NULL, NULL, 0);
  X509_EXTENSION *ext = X509V3_EXT_conf_nid(NULL, &ctx, nid, value);
  if (!ext) return 0;
  int ok = X509_add_ext(x, ext, -1);
  X509_EXTENSION_free(ext);
  return ok;
}

/* Writes a self-signed certificate for `common_name` with the given subjectAltName, and
 * its key, as PEM files in `dir`. Returns whether it worked. */
static int make_cert(const char *dir, const char *stem, const char *common_name, const char *san,
                     uint64_t serial, cert_files_t *out) {
  snprintf(out->cert, sizeof out->cert, "%s/%s.crt", dir, stem);
  snprintf(out->key, sizeof out->key, "%s/%s.key", dir, stem);
  EVP_PKEY *key = EVP_EC_gen("P-256");
  X509 *x = X509_new();
  int ok = key && x;
  ok = ok && X509_set_version(x, 2);
  ok = ok && ASN1_INTEGER_set_uint64(X509_get_serialNumber(x), serial);
  ok = ok && X509_gmtime_adj(X509_getm_notBefore(x), -3600);
  ok = ok && X509_gmtime_adj(X509_getm_notAfter(x), 24 * 3600);
  ok = ok && X509_set_pubkey(x, key);
  X509_NAME *name = x ? X509_get_subject_name(x) : NULL;
  ok = ok && X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC,
                                        (const unsigned char *)common_name, -1, -1, 0);
  ok = ok && X509_set_issuer_name(x, name);
  /* Its own root: a CA certificate that also serves. */
  ok = ok && add_extension(x, NID_basic_constraints, "critical,CA:TRUE");
  ok = ok && add_extension(x, NID_key_usage, "critical,digitalSignature,keyCertSign");
  ok = ok && add_extension(x, NID_ext_key_usage, "serverAuth");
  ok = ok && add_extension(x, NID_subject_alt_name, san);
  ok = ok && X509_sign(x, key, EVP_sha256()) > 0;
  FILE *fc = ok ? fopen(out->cert, "w") : NULL;
  ok = ok && fc && PEM_write_X509(fc, x);
  if (fc) fclose(fc);
  FILE *fk = ok ? fopen(out->key, "w") : NULL;
  ok = ok && fk && PEM_write_PrivateKey(fk, key, NULL, NULL, 0, NULL, NULL);
  if (fk) fclose(fk);
  X509_free(x);
  EVP_PKEY_free(key);
  return ok;
}

static ina_rpc_server_t *start_tls_server(const cert_files_t *cert, const char *token) {
  ina_rpc_server_options_t o = INA_RPC_SERVER_OPTIONS_INIT;
  o.tls_cert_file = cert->cert;
  o.tls_key_file = cert->key;
  ina_rpc_server_t *s = NULL;
  CHECK_OK(ina_rpc_server_create(&o, &s));
  if (!s) return NULL;
  CHECK_OK(fx_register(s, &g_fx, token));
  CHECK_OK(ina_rpc_server_start(s));
  return s;
}

static ina_rpc_client_t *make_client(int port, int tls, const char *root, const char *name,
                                     const char *token) {
  char target[64];
  snprintf(target, sizeof target, "127.0.0.1:%d", port);
  ina_rpc_client_options_t o = INA_RPC_CLIENT_OPTIONS_INIT;
  o.target = target;
  o.tls = tls;
  o.tls_root_cert_file = root;
  o.tls_target_name = name;
  o.bearer_token = token;
  o.default_deadline_ms = CALL_DEADLINE_MS;
  ina_rpc_client_t *c = NULL;
  CHECK_OK(ina_rpc_client_create(&o, &c));
  return c;
}

/* An echo call; returns the gRPC code (and checks the echo when OK). */
static ina_rpc_code_t echo(ina_rpc_client_t *c, const char *method, test_rng_t *rng) {
  uint8_t *req = NULL, *resp = NULL;
  size_t req_size = 0, resp_size = 0;
  fx_random_health(rng, &req, &req_size, (size_t)test_rng_int(rng, 0, 2000));
  ina_rpc_status_t status;
  ina_rpc_client_unary(c, method, req, req_size, 0, &resp, &resp_size, &status);
  if (status.code == INA_RPC_OK) CHECK(fx_is_echo(req, req_size, resp, resp_size));
  free(req);
  free(resp);
  return status.code;
}

int main(void) {
  test_rng_t rng = {test_seed("test_rpc_tls")};
  ina_log_set_quiet_errors(1); /* failures are provoked on purpose; checks read them */
  char dir[] = "/tmp/ina_rpc_tls_XXXXXX";
  if (!mkdtemp(dir)) {
    perror("mkdtemp");
    return 1;
  }
  cert_files_t local, named, stranger;
  uint64_t serial = test_rng_next(&rng) >> 2;
  CHECK(make_cert(dir, "local", "localhost", "DNS:localhost,IP:127.0.0.1", serial, &local));
  CHECK(make_cert(dir, "named", "node.ina.test", "DNS:node.ina.test", serial + 1, &named));
  CHECK(make_cert(dir, "stranger", "localhost", "DNS:localhost,IP:127.0.0.1", serial + 2,
                  &stranger));
  char token[40];
  snprintf(token, sizeof token, "tls-%016llx", (unsigned long long)test_rng_next(&rng));

  ina_rpc_server_t *server = start_tls_server(&local, token);
  if (server) {
    int port = ina_rpc_server_port(server);
    ina_rpc_client_t *c = make_client(port, 1, local.cert, NULL, token);
    for (int i = 0; i < 5; i++) CHECK(echo(c, ECHO_METHOD, &rng) == INA_RPC_OK);
    CHECK(echo(c, SECURE_METHOD, &rng) == INA_RPC_OK);
    uint8_t *req = NULL;
    size_t req_size = 0;
    fx_stream_request_bytes("tls", 50, &req, &req_size);
    stream_sink_t sink = {.request_id = "tls", .n_expected = 50};
    CHECK_OK(
        ina_rpc_client_stream(c, COUNT_METHOD, req, req_size, 0, fx_sink_message, &sink, NULL));
    CHECK(sink.received == 50 && sink.bad == 0 && sink.saw_last);
    free(req);
    ina_rpc_client_destroy(c);

    c = make_client(port, 1, local.cert, NULL, "wrong");
    CHECK(echo(c, SECURE_METHOD, &rng) == INA_RPC_UNAUTHENTICATED);
    ina_rpc_client_destroy(c);

    /* Plaintext against TLS, and TLS trusting another root: no connection. */
    c = make_client(port, 0, NULL, NULL, NULL);
    CHECK(echo(c, ECHO_METHOD, &rng) == INA_RPC_UNAVAILABLE);
    ina_rpc_client_destroy(c);
    c = make_client(port, 1, stranger.cert, NULL, NULL);
    CHECK(echo(c, ECHO_METHOD, &rng) == INA_RPC_UNAVAILABLE);
    ina_rpc_client_destroy(c);
    CHECK(atomic_load(&g_fx.unary_runs) == 5);
    ina_rpc_server_destroy(server);
  }

  /* A certificate naming a host the client does not dial: tls_target_name bridges it. */
  server = start_tls_server(&named, NULL);
  if (server) {
    int port = ina_rpc_server_port(server);
    ina_rpc_client_t *c = make_client(port, 1, named.cert, "node.ina.test", NULL);
    CHECK(echo(c, ECHO_METHOD, &rng) == INA_RPC_OK);
    ina_rpc_client_destroy(c);
    c = make_client(port, 1, named.cert, NULL, NULL); /* 127.0.0.1 is not in the cert */
    CHECK(echo(c, ECHO_METHOD, &rng) == INA_RPC_UNAVAILABLE);
    ina_rpc_client_destroy(c);
    ina_rpc_server_destroy(server);
  }

  /* local's certificate with stranger's key: refused before binding, the message naming
   * the mismatch and both files (not "cannot listen"). */
  {
    ina_rpc_server_options_t o = INA_RPC_SERVER_OPTIONS_INIT;
    o.tls_cert_file = local.cert;
    o.tls_key_file = stranger.key;
    ina_rpc_server_t *s = NULL;
    CHECK(ina_rpc_server_create(&o, &s) == INA_ERR_INVALID_ARGUMENT && s == NULL);
    const char *msg = ina_last_error();
    CHECKF(strstr(msg, "do not match") && strstr(msg, local.cert) && strstr(msg, stranger.key) &&
               !strstr(msg, "cannot listen"),
           "mismatched key and certificate: '%s'", msg);
    /* A key file that holds no key at all: said so, too. */
    o.tls_key_file = stranger.cert;
    CHECK(ina_rpc_server_create(&o, &s) == INA_ERR_FORMAT && s == NULL);
    msg = ina_last_error();
    CHECKF(strstr(msg, "not an unencrypted PEM private key") && strstr(msg, stranger.cert),
           "certificate as the key: '%s'", msg);
  }

  const cert_files_t *all[] = {&local, &named, &stranger};
  for (int i = 0; i < 3; i++) {
    unlink(all[i]->cert);
    unlink(all[i]->key);
  }
  rmdir(dir);
  CHECK(atomic_load(&g_fx.bad_requests) == 0);
  return test_finish("test_rpc_tls");
}
