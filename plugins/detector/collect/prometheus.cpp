#include "prometheus.hpp"

#include <ballast/events.h>

#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <unordered_map>

namespace ballast::collect {

namespace {

bool name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_' || c == ':'; }
bool name_char(char c) { return name_start(c) || std::isdigit(static_cast<unsigned char>(c)); }

// Go's ParseFloat spellings used by exporters: NaN, +Inf, -Inf (any case).
bool parse_value(const std::string& t, double* v) {
  if (t.empty()) return false;
  char* e = nullptr;
  *v = std::strtod(t.c_str(), &e);
  return *e == '\0';
}

std::string family_of(const std::string& name, const std::unordered_map<std::string, std::string>& types) {
  if (types.count(name)) return name;
  for (const char* suffix : {"_bucket", "_sum", "_count", "_created", "_total"}) {
    size_t n = std::strlen(suffix);
    if (name.size() > n && name.compare(name.size() - n, n, suffix) == 0) {
      std::string fam = name.substr(0, name.size() - n);
      if (types.count(fam)) return fam;
    }
  }
  return {};
}

}  // namespace

bool parse_exposition(const std::string& text, std::vector<PromSample>* out, std::string* error) {
  std::unordered_map<std::string, std::string> types;
  size_t line_no = 0, pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string::npos) end = text.size();
    std::string line = text.substr(pos, end - pos);
    pos = end + 1;
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.pop_back();
    size_t i = 0;
    auto fail = [&](const std::string& what) {
      *error = std::to_string(line_no) + ":" + std::to_string(i + 1) + ": " + what;
      return false;
    };
    auto skip_ws = [&] {
      while (i < line.size() && (line[i] == ' ' || line[i] == '\t')) ++i;
    };
    skip_ws();
    if (i == line.size()) continue;
    if (line[i] == '#') {
      // "# TYPE name type" matters; "# HELP" and other comments do not.
      if (line.compare(i, 7, "# TYPE ") == 0) {
        size_t b = i + 7, sp = line.find(' ', b);
        if (sp == std::string::npos) return fail("# TYPE without a type");
        std::string type = line.substr(sp + 1);
        while (!type.empty() && type.back() == ' ') type.pop_back();
        types[line.substr(b, sp - b)] = type;
      }
      continue;
    }
    PromSample s;
    if (!name_start(line[i])) return fail("expected a metric name");
    size_t b = i;
    while (i < line.size() && name_char(line[i])) ++i;
    s.name = line.substr(b, i - b);
    skip_ws();
    if (i < line.size() && line[i] == '{') {
      ++i;
      for (;;) {
        skip_ws();
        if (i < line.size() && line[i] == '}') {
          ++i;
          break;
        }
        if (i >= line.size() || !name_start(line[i])) return fail("expected a label name or '}'");
        b = i;
        while (i < line.size() && name_char(line[i])) ++i;
        std::string label = line.substr(b, i - b);
        skip_ws();
        if (i >= line.size() || line[i] != '=') return fail("expected '=' after label " + label);
        ++i;
        skip_ws();
        if (i >= line.size() || line[i] != '"') return fail("expected '\"' to open the value of label " + label);
        ++i;
        std::string value;
        for (;;) {
          if (i >= line.size()) return fail("unterminated value of label " + label);
          char c = line[i++];
          if (c == '"') break;
          if (c == '\\') {
            if (i >= line.size()) return fail("unterminated escape in label " + label);
            char e = line[i++];
            if (e == 'n') c = '\n';
            else if (e == '\\' || e == '"') c = e;
            else return fail(std::string("unknown escape \\") + e + " in label " + label);
          }
          value += c;
        }
        s.labels.emplace_back(std::move(label), std::move(value));
        skip_ws();
        if (i < line.size() && line[i] == ',') ++i;
        else if (i >= line.size() || line[i] != '}') return fail("expected ',' or '}' after a label");
      }
    }
    skip_ws();
    b = i;
    while (i < line.size() && line[i] != ' ' && line[i] != '\t') ++i;
    std::string value = line.substr(b, i - b);
    if (!parse_value(value, &s.value)) {
      i = b;
      return fail("not a sample value: '" + value + "'");
    }
    skip_ws();
    if (i < line.size()) {
      b = i;
      char* e = nullptr;
      long long ts = std::strtoll(line.c_str() + i, &e, 10);
      i = static_cast<size_t>(e - line.c_str());
      skip_ws();
      if (i == b || i != line.size()) return fail("expected a timestamp (ms) or the end of the line");
      s.ts_ms = ts;
    }
    std::string fam = family_of(s.name, types);
    s.type = fam.empty() ? "untyped" : types[fam];
    out->push_back(std::move(s));
  }
  return true;
}

std::string series_name(const PromSample& s) {
  if (s.labels.empty()) return s.name;
  std::string n = s.name + "{";
  for (size_t k = 0; k < s.labels.size(); ++k) {
    if (k) n += ',';
    n += s.labels[k].first + "=\"";
    for (char c : s.labels[k].second) {
      if (c == '\n') n += "\\n";
      else if (c == '"' || c == '\\') (n += '\\') += c;
      else n += c;
    }
    n += '"';
  }
  return n + "}";
}

bool http_get(const std::string& url, int timeout_ms, std::string* body, std::string* error) {
  auto fail = [&](const std::string& what) {
    *error = url + ": " + what;
    return false;
  };
  if (url.rfind("http://", 0) != 0) return fail("only http:// URLs are supported");
  std::string rest = url.substr(7);
  size_t slash = rest.find('/');
  std::string hostport = rest.substr(0, slash), path = slash == std::string::npos ? "/" : rest.substr(slash);
  size_t colon = hostport.rfind(':');
  std::string host = hostport.substr(0, colon), port = colon == std::string::npos ? "80" : hostport.substr(colon + 1);
  if (!host.empty() && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  auto deadline = std::chrono::steady_clock::now() + std::chrono::milliseconds(timeout_ms);
  auto left_ms = [&] {
    auto d = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - std::chrono::steady_clock::now()).count();
    return d < 0 ? 0 : static_cast<int>(d);
  };
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  int rc = getaddrinfo(host.c_str(), port.c_str(), &hints, &res);
  if (rc != 0) return fail(std::string("cannot resolve: ") + gai_strerror(rc));
  int fd = -1;
  std::string why = "cannot connect";
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    if (connect(fd, a->ai_addr, a->ai_addrlen) != 0 && errno != EINPROGRESS) {
      why = std::string("cannot connect: ") + std::strerror(errno);
      close(fd);
      fd = -1;
      continue;
    }
    pollfd p{fd, POLLOUT, 0};
    int err = 0;
    socklen_t len = sizeof err;
    if (poll(&p, 1, left_ms()) != 1 || getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0 || err) {
      why = err ? std::string("cannot connect: ") + std::strerror(err) : "connect timed out";
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd < 0) return fail(why);
  std::string req = "GET " + path + " HTTP/1.0\r\nHost: " + hostport +
                    "\r\nAccept: text/plain;version=0.0.4\r\nUser-Agent: ballast-collect\r\n\r\n";
  size_t sent = 0;
  while (sent < req.size()) {
    pollfd p{fd, POLLOUT, 0};
    if (poll(&p, 1, left_ms()) != 1) {
      close(fd);
      return fail("timed out sending the request");
    }
    ssize_t n = send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n < 0 && errno != EAGAIN && errno != EINTR) {
      close(fd);
      return fail(std::string("send failed: ") + std::strerror(errno));
    }
    if (n > 0) sent += static_cast<size_t>(n);
  }
  std::string resp;
  char buf[65536];
  for (;;) {
    pollfd p{fd, POLLIN, 0};
    int ready = poll(&p, 1, left_ms());
    if (ready != 1) {
      close(fd);
      return fail("timed out reading the response");
    }
    ssize_t n = recv(fd, buf, sizeof buf, 0);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      close(fd);
      return fail(std::string("recv failed: ") + std::strerror(errno));
    }
    resp.append(buf, static_cast<size_t>(n));
    if (resp.size() > (64u << 20)) {
      close(fd);
      return fail("response larger than 64 MiB");
    }
  }
  close(fd);
  size_t head_end = resp.find("\r\n\r\n");
  if (resp.rfind("HTTP/", 0) != 0 || head_end == std::string::npos) return fail("malformed HTTP response");
  int status = std::atoi(resp.c_str() + resp.find(' ') + 1);
  if (status != 200) return fail("HTTP status " + std::to_string(status));
  std::string head = resp.substr(0, head_end);
  for (char& c : head) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  *body = resp.substr(head_end + 4);
  if (head.find("transfer-encoding: chunked") != std::string::npos) {
    std::string plain;
    size_t at = 0;
    for (;;) {
      size_t eol = body->find("\r\n", at);
      if (eol == std::string::npos) return fail("truncated chunked body");
      size_t size = std::strtoul(body->c_str() + at, nullptr, 16);
      if (size == 0) break;
      if (eol + 2 + size > body->size()) return fail("truncated chunked body");
      plain.append(*body, eol + 2, size);
      at = eol + 2 + size + 2;
    }
    *body = std::move(plain);
  }
  return true;
}

bool Scraper::scrape(int64_t ts, std::vector<Sample>* out, std::string* error) {
  std::string body;
  if (!http_get(url_, timeout_ms_, &body, error)) return false;
  std::vector<PromSample> series;
  if (!parse_exposition(body, &series, error)) {
    *error = url_ + ":" + *error;
    return false;
  }
  for (const PromSample& s : series) {
    int64_t at = s.ts_ms ? s.ts_ms * 1000000 : ts;
    if (map_names_) {
      detector_names::Mapping m;
      if (detector_names::map_series(s.name, s.labels, &m)) {
        if (std::isfinite(s.value)) names_.add("", series_name(s), s.name, s.labels, at, s.value);
        else out->push_back(Sample{m.name, 0.0, static_cast<uint32_t>(BALLAST_SAMPLE_INVALID) | (m.counter ? static_cast<uint32_t>(BALLAST_SAMPLE_COUNTER) : 0u)});
        continue;
      }
    }
    std::string name = prefix_ + series_name(s);
    bool cumulative = s.type == "counter" ||
                      ((s.type == "histogram" || s.type == "summary") &&
                       (s.name.ends_with("_sum") || s.name.ends_with("_count") || s.name.ends_with("_bucket")));
    if (!cumulative) {
      add_gauge(out, name, s.value);
    } else if (!std::isfinite(s.value)) {
      out->push_back(Sample{name, 0.0, BALLAST_SAMPLE_COUNTER | BALLAST_SAMPLE_INVALID});
    } else {
      rates_.add(out, name, s.value, at);
    }
  }
  rates_.sweep();
  std::vector<detector_names::Normaliser::Out> mapped;
  names_.flush(&mapped);
  for (const auto& m : mapped) add_gauge(out, m.metric, m.value);
  return true;
}

}  // namespace ballast::collect
