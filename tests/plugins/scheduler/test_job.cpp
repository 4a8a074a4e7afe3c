// Job descriptions: the node matrix, alpha given or derived from the model,
// and every invalid shape with a clear error.
#include <doctest/doctest.h>

#include "job.hpp"

using namespace ballast::sched;

namespace {
std::string error_of(const std::string& json) {
  try {
    parse_job(json, "job.json");
  } catch (const InputError& e) {
    return e.what();
  }
  return "no error";
}
}  // namespace

TEST_CASE("the node matrix: dp*tp/gpus_per_node rows, pp columns") {
  Job j = parse_job(R"({"gpus_per_node": 8, "tp": 4, "pp": 2, "dp": 12, "alpha": 0.3})", "job.json");
  CHECK(j.rows() == 6);
  CHECK(j.cols() == 2);
  CHECK(j.nodes() == 12);
  CHECK(j.alpha == doctest::Approx(0.3));
  CHECK(j.alpha_source == "given");
  Job k = parse_job(R"({"gpus_per_node": 8, "tp": 8, "pp": 8, "dp": 46})", "job.json");
  CHECK(k.nodes() == 368);
  CHECK(k.alpha_source == "default");
}

TEST_CASE("alpha from a model description follows the DP and PP volumes") {
  ModelShape m{4096, 32, 4096, 1, 32000, 0};
  // Arnold's analytic volumes, elements per GPU.
  CHECK(dp_volume(m, 4) == doctest::Approx(4096.0 * (32000 + 4096) + 8 * (12.0 * 4096 * 4096 + 9 * 4096)));
  CHECK(pp_volume(m) == doctest::Approx(2.0 * 1 * 4096 * 4096));
  Job j = parse_job(R"({"gpus_per_node": 8, "tp": 4, "pp": 4, "dp": 16,
      "model": {"hidden": 4096, "layers": 32, "seq_len": 4096, "micro_batch": 1, "vocab": 32000}})",
                    "job.json");
  CHECK(j.alpha_source == "model");
  CHECK(j.alpha == doctest::Approx(derive_alpha(m, 4)));
  CHECK(j.alpha > 0);
  CHECK(j.alpha < 1);
  // More micro-batches per step means more PP traffic: alpha falls.
  ModelShape more = m;
  more.micro_batches = 64;
  CHECK(derive_alpha(more, 4) < derive_alpha(m, 4));
  // No pipeline: nothing but DP traffic.
  CHECK(derive_alpha(m, 1) == doctest::Approx(1.0));
}

TEST_CASE("invalid jobs are rejected naming the file and field") {
  CHECK(error_of(R"({"gpus_per_node": 8, "tp": 3, "pp": 2, "dp": 8})") ==
        "job.json: tp=3 does not divide gpus_per_node=8 (tensor parallelism stays inside a node)");
  CHECK(error_of(R"({"gpus_per_node": 8, "tp": 2, "pp": 2, "dp": 3})").find("dp*tp=6 is not a multiple") == 10);
  CHECK(error_of(R"({"gpus_per_node": 8, "tp": 2, "pp": 2})") == "job.json: missing field \"dp\"");
  CHECK(error_of(R"({"gpus_per_node": 8, "tp": 2, "pp": 0, "dp": 4})") ==
        "job.json: field \"pp\" must be a positive integer");
  CHECK(error_of(R"({"gpus_per_node": 8, "tp": 2, "pp": 2.5, "dp": 4})") ==
        "job.json: field \"pp\" must be a positive integer");
  CHECK(error_of(R"({"gpus_per_node": 8, "tp": 2, "pp": 2, "dp": 4, "alpha": 1.5})") ==
        "job.json: field \"alpha\" must be a number in [0, 1]");
  CHECK(error_of(R"({"gpus_per_node": 8, "tp": 2, "pp": 2, "dp": 4, "bogus": 1})") ==
        "job.json: unknown field \"bogus\"");
  CHECK(error_of(R"({"gpus_per_node": 8, "tp": 2, "pp": 2, "dp": 4, "model": {"hidden": 1}})") ==
        "job.json: missing field \"model.layers\"");
  CHECK(error_of("{\"tp\": 2,\n  \"pp\" 2}") == "job.json: line 2, column 8: malformed JSON");
  CHECK(error_of("[1]") == "job.json: a job must be a JSON object");
}
