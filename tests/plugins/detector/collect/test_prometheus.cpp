// The Prometheus text-exposition parser and the scraper's sample rules.
#include <doctest/doctest.h>

#include "prometheus.hpp"

#include <cmath>
#include <string>
#include <vector>

using namespace ballast::collect;

TEST_CASE("labels, escapes, comments, timestamps, +Inf and NaN") {
  const std::string text =
      "# HELP node_network_receive_bytes_total Network device statistic receive_bytes.\n"
      "# TYPE node_network_receive_bytes_total counter\n"
      "node_network_receive_bytes_total{device=\"eth0\"} 1.5e+09\n"
      "# a free comment\n"
      "\n"
      "# TYPE weird gauge\n"
      "weird{path=\"C:\\\\dir\",msg=\"say \\\"hi\\\"\\nbye\",} -Inf 1700000000123\n"
      "weird{path=\"x\"} NaN\n"
      "# TYPE rpc_duration_seconds summary\n"
      "rpc_duration_seconds{quantile=\"0.5\"} +Inf\n"
      "rpc_duration_seconds_sum 17\n"
      "rpc_duration_seconds_count 3\n"
      "no_type_here 4\r\n";
  std::vector<PromSample> s;
  std::string error;
  REQUIRE(parse_exposition(text, &s, &error));
  REQUIRE(s.size() == 7);
  CHECK(s[0].name == "node_network_receive_bytes_total");
  CHECK(s[0].type == "counter");
  CHECK(s[0].labels[0] == std::make_pair(std::string("device"), std::string("eth0")));
  CHECK(s[0].value == 1.5e9);
  CHECK(s[1].labels[0].second == "C:\\dir");
  CHECK(s[1].labels[1].second == "say \"hi\"\nbye");
  CHECK(std::isinf(s[1].value));
  CHECK(s[1].value < 0);
  CHECK(s[1].ts_ms == 1700000000123);
  CHECK(std::isnan(s[2].value));
  CHECK(s[3].type == "summary");
  CHECK(std::isinf(s[3].value));
  CHECK(s[4].type == "summary");  // _sum belongs to its family
  CHECK(s[6].type == "untyped");
  CHECK(s[6].value == 4);
  CHECK(series_name(s[1]) == "weird{path=\"C:\\\\dir\",msg=\"say \\\"hi\\\"\\nbye\"}");
}

TEST_CASE("malformed lines are errors naming the line and the column") {
  std::vector<PromSample> s;
  std::string error;
  CHECK_FALSE(parse_exposition("ok 1\nbad{x=\"1\" 2\n", &s, &error));
  CHECK(error == "2:11: expected ',' or '}' after a label");
  CHECK_FALSE(parse_exposition("a{x=1} 2\n", &s, &error));
  CHECK(error == "1:5: expected '\"' to open the value of label x");
  CHECK_FALSE(parse_exposition("a 1 2 3\n", &s, &error));
  CHECK(error.rfind("1:", 0) == 0);
  CHECK_FALSE(parse_exposition("a abc\n", &s, &error));
  CHECK(error == "1:3: not a sample value: 'abc'");
  CHECK_FALSE(parse_exposition("a{x=\"\\q\"} 1\n", &s, &error));
  CHECK(error.find("unknown escape") != std::string::npos);
  CHECK_FALSE(parse_exposition("9a 1\n", &s, &error));
  CHECK(error == "1:1: expected a metric name");
}
