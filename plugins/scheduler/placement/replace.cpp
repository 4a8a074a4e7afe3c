#include "replace.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <map>
#include <set>

namespace ballast::sched {

nlohmann::json plan_to_json(const Plan& p, const Topology& topo, const Job& job) {
  nlohmann::json nodes = nlohmann::json::array();
  for (size_t r = 0; r < p.nodes.size(); ++r) {
    int id = p.nodes[r];
    nodes.push_back({{"name", topo.nodes[id]},
                     {"pp_stage", static_cast<int>(r) / p.shape.R},
                     {"dp_row", static_cast<int>(r) % p.shape.R},
                     {"first_rank", static_cast<long long>(r) * p.gpus_per_node},
                     {"minipod", topo.minipods[topo.node_minipod[id]]}});
  }
  return {{"job", p.job},
          {"algorithm", p.algorithm},
          // Absolute: a plan read from another folder (--replace) still finds it.
          {"topology", topo.source.empty() ? "" : std::filesystem::absolute(topo.source).lexically_normal().string()},
          {"gpus_per_node", job.gpus_per_node},
          {"tp", job.tp},
          {"pp", job.pp},
          {"dp", job.dp},
          {"alpha", job.alpha},
          {"alpha_source", job.alpha_source},
          {"rows", p.shape.R},
          {"stages", p.shape.P},
          {"nodes", nodes},
          {"max_dp_spread", p.score.dp},
          {"max_pp_spread", p.score.pp},
          {"objective", p.score.objective},
          {"lower_bound", p.lower_bound},
          {"optimal", p.optimal},
          {"seconds", p.seconds}};
}

LoadedPlan parse_plan(const std::string& text, const std::string& source) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(source + ": " + line_col(text, e.byte) + ": malformed JSON");
  } catch (const nlohmann::json::out_of_range&) {
    throw InputError(source + ": a number too large for a double");
  }
  if (!j.is_object()) throw InputError(source + ": a plan must be a JSON object");
  if (!j.contains("nodes") || !j["nodes"].is_array()) throw InputError(source + ": missing list \"nodes\"");
  nlohmann::json jobj;
  if (j.contains("gpus_per_node") || j.contains("tp") || j.contains("pp") || j.contains("dp")) {
    for (const char* key : {"gpus_per_node", "tp", "pp", "dp"}) {
      if (!j.contains(key)) throw InputError(source + ": missing field \"" + key + "\"");
      jobj[key] = j[key];
    }
  } else {
    // A placement.plan event rendered as JSON carries only the nodes: the
    // matrix is (max dp_row + 1) x (max pp_stage + 1), GPUs per node from
    // the first ranks, one DP replica per node.
    long long rows = 0, stages = 0, gpn = 8;
    for (const auto& e : j["nodes"]) {
      if (e.is_object() && e.contains("dp_row") && e["dp_row"].is_number_integer())
        rows = std::max(rows, e["dp_row"].get<long long>() + 1);
      if (e.is_object() && e.contains("pp_stage") && e["pp_stage"].is_number_integer())
        stages = std::max(stages, e["pp_stage"].get<long long>() + 1);
    }
    const auto& nodes = j["nodes"];
    if (nodes.size() >= 2 && nodes[0].contains("first_rank") && nodes[1].contains("first_rank") &&
        nodes[0]["first_rank"].is_number_integer() && nodes[1]["first_rank"].is_number_integer())
      gpn = nodes[1]["first_rank"].get<long long>() - nodes[0]["first_rank"].get<long long>();
    jobj = {{"gpus_per_node", gpn}, {"tp", gpn}, {"pp", std::max(1LL, stages)}, {"dp", std::max(1LL, rows)}};
  }
  if (j.contains("alpha")) jobj["alpha"] = j["alpha"];
  if (j.contains("job")) jobj["name"] = j["job"];
  LoadedPlan lp;
  lp.job = parse_job(jobj.dump(), source);
  if (j.contains("topology") && j["topology"].is_string()) lp.topology = j["topology"].get<std::string>();
  if (j.contains("algorithm") && j["algorithm"].is_string()) lp.algorithm = j["algorithm"].get<std::string>();
  const auto& nodes = j["nodes"];
  int R = lp.job.rows(), n = lp.job.nodes();
  if (static_cast<int>(nodes.size()) != n)
    throw InputError(source + ": \"nodes\" has " + std::to_string(nodes.size()) + " entries, the job needs " +
                     std::to_string(n));
  lp.names.assign(n, "");
  for (size_t x = 0; x < nodes.size(); ++x) {
    const auto& e = nodes[x];
    std::string where = source + ": nodes[" + std::to_string(x) + "]";
    if (!e.is_object() || !e.contains("name") || !e["name"].is_string() || !e.contains("pp_stage") ||
        !e["pp_stage"].is_number_integer() || !e.contains("dp_row") || !e["dp_row"].is_number_integer())
      throw InputError(where + ": want {\"name\": string, \"pp_stage\": int, \"dp_row\": int}");
    long long st = e["pp_stage"].get<long long>(), row = e["dp_row"].get<long long>();
    if (st < 0 || st >= lp.job.cols() || row < 0 || row >= R)
      throw InputError(where + ": pp_stage/dp_row out of the job's " + std::to_string(R) + "x" +
                       std::to_string(lp.job.cols()) + " matrix");
    auto cell = static_cast<size_t>(st * R + row);
    if (!lp.names[cell].empty()) throw InputError(where + ": cell (pp_stage, dp_row) given twice");
    lp.names[cell] = e["name"].get<std::string>();
  }
  return lp;
}

ReplaceResult replace_nodes(const Topology& topo, const std::vector<NodeState>& state, const LoadedPlan& lp,
                            const std::vector<std::string>& failed, const std::vector<std::string>& spares) {
  Shape s = shape_of(lp.job);
  int n = s.cells(), k = static_cast<int>(topo.minipods.size());
  std::vector<int> nodes(n), color(n);
  std::map<int, int> cell_of;
  for (int r = 0; r < n; ++r) {
    nodes[r] = topo.find(lp.names[r]);
    if (nodes[r] < 0) throw InputError("plan node " + lp.names[r] + " is not in " + topo.source);
    color[r] = topo.node_minipod[nodes[r]];
    cell_of[nodes[r]] = r;
  }
  std::vector<int> failed_cells;
  std::set<int> failed_ids;
  for (const auto& f : failed) {
    int id = topo.find(f);
    auto it = id < 0 ? cell_of.end() : cell_of.find(id);
    if (it == cell_of.end()) throw InputError("failed node " + f + " is not in the plan");
    if (failed_ids.insert(id).second) failed_cells.push_back(it->second);
  }
  // Spares per minipod, in node order.
  std::vector<std::vector<int>> pool(k);
  if (!spares.empty()) {
    for (const auto& sp : spares) {
      int id = topo.find(sp);
      if (id < 0) throw InputError("spare " + sp + " is not in " + topo.source);
      if (cell_of.count(id)) throw InputError("spare " + sp + " is already in the plan");
      if (!state.empty() && state[id] == kFaulty) throw InputError("spare " + sp + " is marked faulty");
      pool[topo.node_minipod[id]].push_back(id);
    }
  } else {
    for (size_t id = 0; id < topo.nodes.size(); ++id)
      if ((state.empty() || state[id] == kFree) && !cell_of.count(static_cast<int>(id)))
        pool[topo.node_minipod[id]].push_back(static_cast<int>(id));
  }
  for (auto& p : pool) {
    std::sort(p.begin(), p.end());
    p.erase(std::unique(p.begin(), p.end()), p.end());
  }
  size_t avail = 0;
  for (auto& p : pool) avail += p.size();
  if (avail < failed_cells.size())
    throw InputError(std::to_string(failed_cells.size()) + " failed nodes but only " + std::to_string(avail) +
                     " spares");
  ReplaceResult res;
  std::vector<size_t> used(k, 0);
  // Greedy, one failed cell at a time in rank order: the spare minipod with
  // the lowest objective; ties keep the failed node's own minipod, then the
  // minipod with the most spares left.
  for (int cell : failed_cells) {
    int orig = color[cell], best = -1;
    double best_obj = 0;
    for (int m = 0; m < k; ++m) {
      if (used[m] >= pool[m].size()) continue;
      color[cell] = m;
      double obj = evaluate(s, color, k).objective;
      auto left = [&](int x) { return pool[x].size() - used[x]; };
      bool better = best < 0 || obj < best_obj - 1e-12 ||
                    (obj < best_obj + 1e-12 && best != orig && (m == orig || left(m) > left(best)));
      if (better) {
        best = m;
        best_obj = obj;
      }
    }
    color[cell] = best;
    int spare = pool[best][used[best]++];
    res.replaced.push_back({cell, topo.nodes[nodes[cell]], topo.nodes[spare]});
    nodes[cell] = spare;
  }
  Plan& p = res.plan;
  p.job = lp.job.name;
  p.algorithm = "replace";
  p.shape = s;
  p.gpus_per_node = lp.job.gpus_per_node;
  p.nodes = nodes;
  p.score = evaluate(s, color, k);
  p.lower_bound = 0;  // a bound for the fixed survivors is not computed
  return res;
}

StandbyResult standby_size(const std::string& text, const std::string& source, int nodes, double percentile,
                           double window_hours, int fleet) {
  if (nodes <= 0) throw InputError("--nodes must be positive");
  if (!(percentile > 0 && percentile <= 100)) throw InputError("--percentile must be in (0, 100]");
  if (window_hours < 0) throw InputError("--window must be >= 0 hours");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    throw InputError(source + ": " + line_col(text, e.byte) + ": malformed JSON");
  } catch (const nlohmann::json::out_of_range&) {
    throw InputError(source + ": a number too large for a double");
  }
  if (!j.is_array() || j.empty()) throw InputError(source + ": expected a non-empty list of fault events");
  // Down intervals per node (a node is down while any of its faults is open).
  struct Ev {
    double t;
    std::string node;
    int delta;
  };
  std::vector<Ev> evs;
  double t_end = 0;
  for (size_t i = 0; i < j.size(); ++i) {
    const auto& e = j[i];
    std::string where = source + ": event " + std::to_string(i);
    if (!e.is_object() || !e.contains("node_id") || !e["node_id"].is_string() || !e.contains("event_time") ||
        !e["event_time"].is_number() || !e.contains("event_type") || !e["event_type"].is_string())
      throw InputError(where + ": want {\"node_id\": string, \"event_time\": days, \"event_type\": string}");
    std::string type = e["event_type"].get<std::string>();
    if (type != "fault_start" && type != "fault_end")
      throw InputError(where + ": event_type \"" + type + "\" (want fault_start or fault_end)");
    double t = e["event_time"].get<double>();
    if (t < 0) throw InputError(where + ": negative event_time");
    evs.push_back({t, e["node_id"].get<std::string>(), type == "fault_start" ? 1 : -1});
    t_end = std::max(t_end, t);
  }
  std::stable_sort(evs.begin(), evs.end(), [](const Ev& a, const Ev& b) { return a.t < b.t; });
  std::map<std::string, int> open;
  std::map<std::string, double> since;
  std::map<std::string, std::vector<std::pair<double, double>>> down;  // per node, days
  for (const auto& e : evs) {
    int& o = open[e.node];
    if (e.delta > 0) {
      if (o++ == 0) since[e.node] = e.t;
    } else if (o > 0 && --o == 0) {
      down[e.node].push_back({since[e.node], e.t});
    }  // an end without a start began before the trace: nothing to count
  }
  for (auto& [node, o] : open)
    if (o > 0) down[node].push_back({since[node], t_end});
  StandbyResult r;
  r.traced_nodes = static_cast<int>(open.size());
  r.fleet = fleet > 0 ? fleet : r.traced_nodes;
  if (r.fleet < r.traced_nodes)
    throw InputError("--fleet " + std::to_string(fleet) + " is smaller than the " + std::to_string(r.traced_nodes) +
                     " nodes in the trace");
  r.days = t_end;
  // A node counts at time t when it is down at some point of [t, t + window):
  // widen each interval backwards by the window and merge a node's overlaps.
  double w = window_hours / 24.0;
  std::vector<std::pair<double, int>> sweep;
  for (auto& [node, iv] : down) {
    std::sort(iv.begin(), iv.end());
    double a = -1, b = -1;
    for (auto [s0, e0] : iv) {
      double s1 = std::max(0.0, s0 - w);
      if (b >= 0 && s1 <= b) {
        b = std::max(b, e0);
        continue;
      }
      if (b >= 0) {
        sweep.push_back({a, 1});
        sweep.push_back({b, -1});
      }
      a = s1;
      b = e0;
    }
    if (b >= 0) {
      sweep.push_back({a, 1});
      sweep.push_back({b, -1});
    }
  }
  std::sort(sweep.begin(), sweep.end());
  std::map<int, double> time_at;  // affected nodes -> days
  int cur = 0;
  double last = 0;
  for (auto [t, d] : sweep) {
    if (t > last) time_at[cur] += t - last;
    last = std::max(last, t);
    cur += d;
    r.max_down = std::max(r.max_down, cur);
  }
  if (t_end > last) time_at[cur] += t_end - last;
  double total = 0;
  for (auto [kk, d] : time_at) {
    total += d;
    r.mean_down += kk * d;
  }
  if (total <= 0) throw InputError(source + ": the trace spans no time");
  r.mean_down /= total;
  // Mixture over time of Binomial(nodes, affected / fleet).
  std::vector<double> cdf(static_cast<size_t>(nodes) + 1, 0.0);
  for (auto [kk, d] : time_at) {
    double p = static_cast<double>(kk) / r.fleet, wgt = d / total;
    r.expected += wgt * nodes * p;
    for (int x = 0; x <= nodes; ++x) {
      double pmf;
      if (p <= 0)
        pmf = x == 0 ? 1 : 0;
      else if (p >= 1)
        pmf = x == nodes ? 1 : 0;
      else
        pmf = std::exp(std::lgamma(nodes + 1.0) - std::lgamma(x + 1.0) - std::lgamma(nodes - x + 1.0) +
                       x * std::log(p) + (nodes - x) * std::log1p(-p));
      cdf[x] += wgt * pmf;
    }
  }
  double acc = 0;
  r.spares = nodes;
  for (int x = 0; x <= nodes; ++x) {
    acc += cdf[x];
    if (acc >= percentile / 100.0 - 1e-12) {
      r.spares = x;
      break;
    }
  }
  return r;
}

}  // namespace ballast::sched
