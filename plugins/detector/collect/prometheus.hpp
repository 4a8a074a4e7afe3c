// Prometheus text exposition (format 0.0.4, what node-exporter and the DCGM
// exporter serve): a parser, and a scraper turning series into collector
// samples, over HTTP or HTTPS (http_client.hpp, libcurl).
#pragma once

#include "http_client.hpp"
#include "metric_names.hpp"
#include "samples.hpp"

#include <string>
#include <utility>
#include <vector>

namespace ballast::collect {

struct PromSample {
  std::string name;
  std::vector<std::pair<std::string, std::string>> labels;  // unescaped, in exposition order
  double value = 0;                                         // may be NaN or +-Inf, as exposed
  int64_t ts_ms = 0;                                        // 0 when the line has none
  std::string type;  // from # TYPE of its family: counter, gauge, histogram, summary, untyped
};

// Parse an exposition. False with *error "LINE:COL: what" at the first bad line.
bool parse_exposition(const std::string& text, std::vector<PromSample>* out, std::string* error);

// `name{k="v",...}` with the label values escaped again: the sample's metric name.
std::string series_name(const PromSample& s);

// Scrapes one endpoint each round: counters (and the _sum/_count/_bucket of
// histograms and summaries) become per-second rates, gauges stay values;
// NaN/Inf are flagged BALLAST_SAMPLE_INVALID, counters going backwards
// BALLAST_SAMPLE_COUNTER_RESET. Metric names are `PREFIX` + series_name(),
// except, with map_names, for series the detectors' name table knows
// (plugins/detector/common: DCGM exporter, node-exporter, plain names):
// those get the detector's name (`gpu0.util`, `net.eth0.tx_bytes`, `cpu.user`),
// in its unit, combined as the table says, without the prefix.
// The endpoint's connection is kept open between scrapes.
class Scraper {
 public:
  Scraper(std::string url, std::string prefix, HttpOptions http, bool map_names)
      : url_(std::move(url)), prefix_(std::move(prefix)), http_(std::move(http)), map_names_(map_names) {}
  explicit Scraper(std::string url, std::string prefix = "", int timeout_ms = 500, bool map_names = false)
      : Scraper(std::move(url), std::move(prefix), timeout_only(timeout_ms), map_names) {}
  bool scrape(int64_t ts_ns, std::vector<Sample>* out, std::string* error);
  const std::string& url() const { return url_; }
  long connections() const { return http_.connections(); }

 private:
  static HttpOptions timeout_only(int timeout_ms) {
    HttpOptions o;
    o.timeout_ms = timeout_ms;
    return o;
  }
  std::string url_, prefix_;
  HttpClient http_;
  bool map_names_;
  Rates rates_;
  detector_names::Normaliser names_;
};

}  // namespace ballast::collect
