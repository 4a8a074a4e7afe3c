#include "certs.hpp"

#include <openssl/ec.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/x509v3.h>

#include <cstdio>

namespace bench_cluster {

namespace {

EVP_PKEY* new_key() { return EVP_EC_gen("P-256"); }

X509* new_cert(EVP_PKEY* key, const std::string& cn, X509* issuer, EVP_PKEY* issuer_key, const std::string& san,
               long serial) {
  X509* x = X509_new();
  X509_set_version(x, 2);
  ASN1_INTEGER_set(X509_get_serialNumber(x), serial);
  X509_gmtime_adj(X509_getm_notBefore(x), -60);
  X509_gmtime_adj(X509_getm_notAfter(x), 30L * 86400);
  X509_set_pubkey(x, key);
  X509_NAME* name = X509_get_subject_name(x);
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>(cn.c_str()), -1, -1, 0);
  X509_set_issuer_name(x, issuer ? X509_get_subject_name(issuer) : name);
  X509V3_CTX ctx;
  X509V3_set_ctx(&ctx, issuer ? issuer : x, x, nullptr, nullptr, 0);
  auto add = [&](int nid, const char* value) {
    X509_EXTENSION* e = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
    if (e) X509_add_ext(x, e, -1), X509_EXTENSION_free(e);
  };
  if (issuer == nullptr) {
    add(NID_basic_constraints, "critical,CA:TRUE");
    add(NID_key_usage, "critical,keyCertSign,cRLSign");
  } else {
    add(NID_subject_alt_name, san.c_str());
    add(NID_ext_key_usage, "serverAuth,clientAuth");
  }
  X509_sign(x, issuer_key ? issuer_key : key, EVP_sha256());
  return x;
}

bool write_cert(const std::string& path, X509* x) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  bool ok = PEM_write_X509(f, x) == 1;
  std::fclose(f);
  return ok;
}

bool write_key(const std::string& path, EVP_PKEY* k) {
  FILE* f = std::fopen(path.c_str(), "w");
  if (!f) return false;
  bool ok = PEM_write_PrivateKey(f, k, nullptr, nullptr, 0, nullptr, nullptr) == 1;
  std::fclose(f);
  return ok;
}

}  // namespace

bool make_certs(const std::string& dir, const std::vector<std::string>& nodes, std::string* error) {
  EVP_PKEY* ca_key = new_key();
  EVP_PKEY* ctl_key = new_key();
  EVP_PKEY* node_key = new_key();
  X509* ca = new_cert(ca_key, "ballast-bench-ca", nullptr, nullptr, "", 1);
  X509* ctl = new_cert(ctl_key, "ballast-controller", ca, ca_key, "DNS:ballast-controller,IP:127.0.0.1", 2);
  bool ok = write_cert(dir + "/ca.crt", ca) && write_cert(dir + "/controller.crt", ctl) &&
            write_key(dir + "/controller.key", ctl_key) && write_key(dir + "/node.key", node_key);
  long serial = 3;
  for (const auto& n : nodes) {
    if (!ok) break;
    X509* x = new_cert(node_key, n, ca, ca_key, "DNS:" + n, serial++);
    ok = write_cert(dir + "/" + n + ".crt", x);
    X509_free(x);
  }
  X509_free(ca);
  X509_free(ctl);
  EVP_PKEY_free(ca_key);
  EVP_PKEY_free(ctl_key);
  EVP_PKEY_free(node_key);
  if (!ok) *error = "cannot write certificates under " + dir;
  return ok;
}

}  // namespace bench_cluster
