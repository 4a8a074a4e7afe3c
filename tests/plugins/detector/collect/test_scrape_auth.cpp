// The scraper against real servers that want TLS and credentials: a
// prometheus-node-exporter serving HTTPS with basic auth (its
// --web.config.file), and a Python http.server that wants a bearer token.
// Exits 77 (skipped) when the exporter, openssl or python3 is missing.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include "prometheus.hpp"
#include "test_ports.hpp"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>

using namespace ballast::collect;

namespace {

std::string g_dir, g_https, g_bearer;
const char* kPassword = "s3cret";
const char* kToken = "tok-31";

HttpOptions tls_options() {
  HttpOptions o;
  o.timeout_ms = 5000;
  o.ca_file = g_dir + "/ca.crt";
  o.username = "prom";
  o.password = kPassword;
  return o;
}

}  // namespace

TEST_CASE("HTTPS with basic auth: the CA verifies the exporter, the password is checked") {
  std::string body, error;
  HttpClient ok(tls_options());
  REQUIRE_MESSAGE(ok.get(g_https, &body, &error), error);
  CHECK(body.find("node_load1") != std::string::npos);

  HttpOptions wrong = tls_options();
  wrong.password = "guess";
  CHECK_FALSE(HttpClient(wrong).get(g_https, &body, &error));
  CHECK(error == g_https + ": HTTP status 401");

  HttpOptions none = tls_options();
  none.username.clear();
  CHECK_FALSE(HttpClient(none).get(g_https, &body, &error));
  CHECK(error == g_https + ": HTTP status 401");

  HttpOptions system_cas = tls_options();
  system_cas.ca_file.clear();  // the test CA is not among the system's
  CHECK_FALSE(HttpClient(system_cas).get(g_https, &body, &error));
  CHECK(error.rfind(g_https + ": ", 0) == 0);
  CHECK(error.find("certificate") != std::string::npos);

  HttpOptions insecure = system_cas;
  insecure.insecure = true;
  CHECK_MESSAGE(HttpClient(insecure).get(g_https, &body, &error), error);

  std::string plain = g_https;
  plain.replace(0, 5, "http");  // plain HTTP to the TLS port
  CHECK_FALSE(HttpClient(tls_options()).get(plain, &body, &error));
  CHECK(error.rfind(plain + ": ", 0) == 0);
}

TEST_CASE("the scraper keeps one connection open across scrapes") {
  Scraper scraper(g_https, "ne.", tls_options(), false);
  std::vector<Sample> out;
  std::string error;
  for (int i = 0; i < 3; ++i) {
    out.clear();
    REQUIRE_MESSAGE(scraper.scrape(int64_t(i + 1) * 1000000000, &out, &error), error);
  }
  CHECK(out.size() > 100);
  CHECK(scraper.connections() == 1);
}

TEST_CASE("a bearer token reaches a server that wants one; without it, 401") {
  HttpOptions o;
  o.timeout_ms = 5000;
  o.bearer_token = kToken;
  Scraper scraper(g_bearer, "", o, false);
  std::vector<Sample> out;
  std::string error;
  REQUIRE_MESSAGE(scraper.scrape(1000000000, &out, &error), error);
  bool gauge = false;
  for (const auto& s : out) gauge = gauge || (s.metric == "demo_temperature" && s.value == 21.5);
  CHECK(gauge);
  std::string body;
  CHECK_FALSE(http_get(g_bearer, 5000, &body, &error));
  CHECK(error == g_bearer + ": HTTP status 401");
}

TEST_CASE("errors name the URL: another scheme, nobody listening") {
  std::string body, error;
  CHECK_FALSE(http_get("ftp://127.0.0.1:1/metrics", 200, &body, &error));
  CHECK(error == "ftp://127.0.0.1:1/metrics: only http:// and https:// URLs are supported");
  CHECK_FALSE(http_get("http://127.0.0.1:1/metrics", 500, &body, &error));
  CHECK(error.rfind("http://127.0.0.1:1/metrics: ", 0) == 0);
  CHECK(error.find("onnect") != std::string::npos);
}

namespace {

// Waits until get() succeeds (the server is up) or the child died; bounded.
bool wait_up(pid_t pid, const std::string& url, const HttpOptions& o) {
  for (int i = 0; i < 100; ++i) {
    std::string body, error;
    if (HttpClient(o).get(url, &body, &error)) return true;
    int st;
    if (waitpid(pid, &st, WNOHANG) == pid) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  return false;
}

}  // namespace

int main(int argc, char** argv) {
  const char* exporter = "/usr/bin/prometheus-node-exporter";
  if (access(exporter, X_OK) != 0 || std::system("openssl version > /dev/null 2>&1") != 0 ||
      std::system("python3 --version > /dev/null 2>&1") != 0) {
    std::puts("prometheus-node-exporter, openssl or python3 is missing: skipped");
    return 77;
  }
  g_dir = (std::filesystem::temp_directory_path() / ("scrape-auth-" + std::to_string(getpid()))).string();
  const std::string certs = std::string(BALLAST_SOURCE_DIR) + "/tools/engines/make-certs " + g_dir + " 127.0.0.1";
  if (std::system(certs.c_str()) != 0) {
    std::puts("cannot make certificates: skipped");
    return 77;
  }
  // exporter-toolkit's web config: TLS, and basic auth with a bcrypt hash of kPassword.
  std::ofstream(g_dir + "/web.yml") << "tls_server_config:\n  cert_file: " << g_dir << "/controller.crt\n"
                                    << "  key_file: " << g_dir << "/controller.key\n"
                                    << "basic_auth_users:\n"
                                    << "  prom: $2b$04$QsjLjxqsXCKOTvJEyVQ18uX2R7IslLiF8J/0zYZ7Kq/sxheppL0PG\n";
  const int port = test::reserve_ports(1);
  const std::string listen = "--web.listen-address=127.0.0.1:" + std::to_string(port);
  const std::string config = "--web.config.file=" + g_dir + "/web.yml";
  const pid_t ne = fork();
  if (ne == 0) {
    freopen("/dev/null", "w", stderr);
    execl(exporter, exporter, listen.c_str(), config.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  g_https = "https://127.0.0.1:" + std::to_string(port) + "/metrics";

  int fds[2];
  if (pipe(fds) != 0) return 1;
  const std::string script = std::string(BALLAST_SOURCE_DIR) + "/tests/plugins/detector/collect/bearer_server.py";
  const pid_t py = fork();
  if (py == 0) {
    dup2(fds[1], 1);
    close(fds[0]);
    execlp("python3", "python3", script.c_str(), kToken, static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  char line[32] = {};
  FILE* from = fdopen(fds[0], "r");
  const bool got_port = from && std::fgets(line, sizeof line, from) != nullptr;
  g_bearer = "http://127.0.0.1:" + std::string(line, std::strlen(line) - (got_port ? 1 : 0)) + "/metrics";
  HttpOptions bearer;
  bearer.bearer_token = kToken;
  int rc = 77;
  if (!wait_up(ne, g_https, tls_options())) {
    std::puts("node-exporter with TLS did not come up: skipped");
  } else if (!got_port || !wait_up(py, g_bearer, bearer)) {
    std::puts("the bearer-token server did not come up: skipped");
  } else {
    doctest::Context ctx(argc, argv);
    rc = ctx.run();
  }
  kill(ne, SIGTERM);
  kill(py, SIGTERM);
  waitpid(ne, nullptr, 0);
  waitpid(py, nullptr, 0);
  if (from) std::fclose(from);
  std::filesystem::remove_all(g_dir);
  return rc;
}
