#include "job.hpp"

#include <nlohmann/json.hpp>

#include "topology.hpp"

namespace ballast::sched {

double dp_volume(const ModelShape& m, int pp) {
  double h = m.hidden;
  return h * (m.vocab + m.seq_len) + (m.layers / pp) * (12 * h * h + 9 * h);
}

double pp_volume(const ModelShape& m) { return 2 * m.micro_batch * m.seq_len * m.hidden; }

double derive_alpha(const ModelShape& m, int pp) {
  constexpr double kCollectiveLoss = 0.17, kP2pLoss = 0.70;
  double micro = m.micro_batches > 0 ? m.micro_batches : 4.0 * pp;
  double dp_cost = dp_volume(m, pp) * kCollectiveLoss;
  double pp_cost = pp > 1 ? pp_volume(m) * micro * kP2pLoss : 0.0;
  if (dp_cost + pp_cost <= 0) return 0.5;
  return dp_cost / (dp_cost + pp_cost);
}

namespace {

int positive_int(const nlohmann::json& j, const char* key, const std::string& source, bool required, int def) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (required) throw InputError(source + ": missing field \"" + key + "\"");
    return def;
  }
  if (!it->is_number_integer() || it->get<long long>() <= 0 || it->get<long long>() > 1'000'000'000)
    throw InputError(source + ": field \"" + key + "\" must be a positive integer");
  return static_cast<int>(it->get<long long>());
}

double positive_number(const nlohmann::json& j, const char* key, const std::string& source, bool required) {
  auto it = j.find(key);
  if (it == j.end()) {
    if (required) throw InputError(source + ": missing field \"model." + std::string(key) + "\"");
    return 0;
  }
  if (!it->is_number() || it->get<double>() <= 0)
    throw InputError(source + ": field \"model." + std::string(key) + "\" must be a positive number");
  return it->get<double>();
}

}  // namespace

Job parse_job(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(source + ": " + line_col(text, e.byte) + ": malformed JSON");
  } catch (const nlohmann::json::out_of_range&) {
    throw InputError(source + ": a number too large for a double");
  }
  if (!j.is_object()) throw InputError(source + ": a job must be a JSON object");
  for (auto& [k, v] : j.items()) {
    (void)v;
    if (k != "name" && k != "gpus_per_node" && k != "tp" && k != "pp" && k != "dp" && k != "alpha" && k != "model")
      throw InputError(source + ": unknown field \"" + k + "\"");
  }
  Job job;
  if (auto it = j.find("name"); it != j.end()) {
    if (!it->is_string()) throw InputError(source + ": field \"name\" must be a string");
    job.name = it->get<std::string>();
  }
  job.gpus_per_node = positive_int(j, "gpus_per_node", source, true, 8);
  job.tp = positive_int(j, "tp", source, true, 1);
  job.pp = positive_int(j, "pp", source, true, 1);
  job.dp = positive_int(j, "dp", source, true, 1);
  if (job.gpus_per_node % job.tp != 0)
    throw InputError(source + ": tp=" + std::to_string(job.tp) + " does not divide gpus_per_node=" +
                     std::to_string(job.gpus_per_node) + " (tensor parallelism stays inside a node)");
  if ((static_cast<long long>(job.dp) * job.tp) % job.gpus_per_node != 0)
    throw InputError(source + ": dp*tp=" + std::to_string(static_cast<long long>(job.dp) * job.tp) +
                     " is not a multiple of gpus_per_node=" + std::to_string(job.gpus_per_node) +
                     " (each node holds gpus_per_node/tp whole DP replicas of one stage)");
  if (static_cast<long long>(job.dp) * job.tp / job.gpus_per_node * job.pp > 10'000'000)
    throw InputError(source + ": the job needs more than 10 million nodes");
  auto alpha = j.find("alpha");
  auto model = j.find("model");
  if (alpha != j.end()) {
    if (!alpha->is_number() || alpha->get<double>() < 0 || alpha->get<double>() > 1)
      throw InputError(source + ": field \"alpha\" must be a number in [0, 1]");
    job.alpha = alpha->get<double>();
    job.alpha_source = "given";
  } else if (model != j.end()) {
    if (!model->is_object()) throw InputError(source + ": field \"model\" must be an object");
    for (auto& [k, v] : model->items()) {
      (void)v;
      if (k != "hidden" && k != "layers" && k != "seq_len" && k != "micro_batch" && k != "vocab" &&
          k != "micro_batches")
        throw InputError(source + ": unknown field \"model." + k + "\"");
    }
    ModelShape m;
    m.hidden = positive_number(*model, "hidden", source, true);
    m.layers = positive_number(*model, "layers", source, true);
    m.seq_len = positive_number(*model, "seq_len", source, true);
    m.micro_batch = positive_number(*model, "micro_batch", source, true);
    m.vocab = positive_number(*model, "vocab", source, true);
    m.micro_batches = positive_number(*model, "micro_batches", source, false);
    job.alpha = derive_alpha(m, job.pp);
    job.alpha_source = "model";
  }
  return job;
}

Job load_job(const std::string& path) { return parse_job(read_file(path), path); }

}  // namespace ballast::sched
