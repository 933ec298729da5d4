#define INA_LOG_SUBSYS "rpc"
#include "agent/rpc/pem_file.h"

#include <errno.h>
#include <openssl/err.h>
#include <openssl/pem.h>
#include <openssl/x509.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/check.h"

/* Certificate chains and keys are a few KiB; anything this large is not one. */
#define PEM_MAX_BYTES (1 << 20)

ina_status_t rpc_read_pem_file(const char *what, const char *path, char **out) {
  ina_status_t st = INA_OK;
  FILE *f = NULL;
  char *text = NULL;
  *out = NULL;
  f = fopen(path, "rb");
  INA_REQUIRE(f, INA_ERR_IO, "%s file '%s': cannot open: %s", what, path, strerror(errno));
  long size = -1;
  if (fseek(f, 0, SEEK_END) == 0) size = ftell(f);
  INA_REQUIRE(size >= 0 && fseek(f, 0, SEEK_SET) == 0, INA_ERR_IO,
              "%s file '%s': cannot determine its size", what, path);
  INA_REQUIRE(size > 0 && size <= PEM_MAX_BYTES, INA_ERR_FORMAT,
              "%s file '%s': %ld bytes (expected 1 to %d)", what, path, size, PEM_MAX_BYTES);
  text = malloc((size_t)size + 1);
  INA_CHECK_ALLOC(text);
  size_t n = fread(text, 1, (size_t)size, f);
  INA_REQUIRE(n == (size_t)size, INA_ERR_IO, "%s file '%s': read %zu of %ld bytes", what, path,
              n, size);
  text[n] = '\0';
  INA_REQUIRE(strstr(text, "-----BEGIN ") != NULL, INA_ERR_FORMAT,
              "%s file '%s': no PEM block (%zu bytes without a '-----BEGIN' line)", what, path, n);
  fclose(f);
  *out = text;
  return INA_OK;
fail:
  if (f) fclose(f);
  free(text);
  return st;
}

/* OpenSSL's latest error as text, for messages; "" when it recorded none. */
static void last_ssl_error(char *buf, size_t size) {
  buf[0] = '\0';
  unsigned long e = ERR_peek_last_error();
  if (e) ERR_error_string_n(e, buf, size);
}

ina_status_t rpc_check_key_pair(const char *what, const char *cert_pem, const char *cert_path,
                                const char *key_pem, const char *key_path) {
  ina_status_t st = INA_OK;
  X509 *cert = NULL;
  EVP_PKEY *key = NULL;
  char reason[160];
  ERR_clear_error();
  BIO *bio = BIO_new_mem_buf(cert_pem, -1);
  INA_CHECK_ALLOC(bio);
  cert = PEM_read_bio_X509(bio, NULL, NULL, NULL);
  BIO_free(bio);
  last_ssl_error(reason, sizeof reason);
  INA_REQUIRE(cert, INA_ERR_FORMAT, "%s: TLS certificate file '%s': not a PEM X.509 certificate (%s)",
              what, cert_path, reason);
  bio = BIO_new_mem_buf(key_pem, -1);
  INA_CHECK_ALLOC(bio);
  key = PEM_read_bio_PrivateKey(bio, NULL, NULL, NULL);
  BIO_free(bio);
  last_ssl_error(reason, sizeof reason);
  INA_REQUIRE(key, INA_ERR_FORMAT,
              "%s: TLS private key file '%s': not an unencrypted PEM private key (%s)", what,
              key_path, reason);
  INA_REQUIRE(X509_check_private_key(cert, key) == 1, INA_ERR_INVALID_ARGUMENT,
              "%s: the TLS private key '%s' and the certificate '%s' do not match (the key is not "
              "the private half of the certificate's public key)",
              what, key_path, cert_path);
fail:
  ERR_clear_error();
  X509_free(cert);
  EVP_PKEY_free(key);
  return st;
}
