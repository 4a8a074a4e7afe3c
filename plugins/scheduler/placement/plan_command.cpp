#include "plan_command.hpp"

#include "command_line.hpp"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>

#include "replace.hpp"

namespace ballast::sched {
namespace {

// A missing option: a usage error, like the parser's own.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Args {
  std::string topology, job, state, algorithm = "arnold", hostfile, topology_name;
  std::string replace, failed, spares, faults;
  uint64_t seed = 0;
  int minipod_level = 1, nodes = 0, fleet = 0;
  double percentile = 99, window = 0;
  bool json = false, standby = false;
};

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
  out.close();
  if (!out) throw InputError(path + ": cannot write");
}

// SLURM_HOSTFILE for `srun --distribution=arbitrary`: one line per task
// (one task per GPU), in global-rank order; and PATH.env with the rank map.
void write_hostfile(const std::string& path, const Plan& p, const Topology& topo, const Job& job) {
  std::string hosts, order;
  for (size_t r = 0; r < p.nodes.size(); ++r) {
    const std::string& name = topo.nodes[p.nodes[r]];
    for (int g = 0; g < p.gpus_per_node; ++g) hosts += name + "\n";
    order += (r ? " " : "") + name;
  }
  write_text(path, hosts);
  std::string abs = std::filesystem::absolute(path).string();
  std::string env;
  env += "# Rank map of job " + job.name + " from `ballast plan` (" + p.algorithm + ").\n";
  env += "# srun: SLURM_HOSTFILE with --distribution=arbitrary. torchrun: --nnodes=BALLAST_NNODES,\n";
  env += "# --nproc-per-node=BALLAST_GPUS_PER_NODE, --node-rank = position of this host in BALLAST_NODES.\n";
  env += "export SLURM_HOSTFILE='" + abs + "'\n";
  env += "export BALLAST_NODES='" + order + "'\n";
  env += "export BALLAST_NNODES=" + std::to_string(p.nodes.size()) + "\n";
  env += "export BALLAST_GPUS_PER_NODE=" + std::to_string(job.gpus_per_node) + "\n";
  env += "export BALLAST_TP=" + std::to_string(job.tp) + " BALLAST_PP=" + std::to_string(job.pp) +
         " BALLAST_DP=" + std::to_string(job.dp) + "\n";
  env += "export BALLAST_RANK_ORDER=tp-dp-pp\n";
  write_text(path + ".env", env);
}

void print_plan(const nlohmann::json& j, bool json) {
  if (json) {
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
    return;
  }
  std::cout << "job " << j["job"].get<std::string>() << ": " << j["rows"] << " rows x " << j["stages"]
            << " stages, algorithm " << j["algorithm"].get<std::string>() << "\n"
            << "  max DP spread " << j["max_dp_spread"] << ", max PP spread " << j["max_pp_spread"] << ", objective "
            << j["objective"] << " (alpha " << j["alpha"] << ", lower bound " << j["lower_bound"] << ")\n";
  std::map<std::string, int> per;
  for (const auto& n : j["nodes"]) per[n["minipod"].get<std::string>()]++;
  std::cout << "  minipods:";
  for (auto& [m, c] : per) std::cout << " " << m << "=" << c;
  std::cout << "\n";
}

int run_place(const Args& a) {
  if (a.topology.empty() || a.job.empty()) throw UsageError("--topology and --job are required");
  TopologyOptions to{a.minipod_level, a.topology_name};
  Topology topo = load_topology(a.topology, to);
  Job job = load_job(a.job);
  std::vector<NodeState> st = a.state.empty() ? std::vector<NodeState>{} : load_state(topo, a.state);
  Cluster cl = make_cluster(topo, st);
  PlaceOptions po;
  po.algorithm = a.algorithm;
  po.seed = a.seed;
  Plan p = place(topo, cl, job, po);
  if (!a.hostfile.empty()) write_hostfile(a.hostfile, p, topo, job);
  print_plan(plan_to_json(p, topo, job), a.json);
  return 0;
}

int run_replace(const Args& a) {
  if (a.failed.empty()) throw UsageError("--failed is required with --replace");
  LoadedPlan lp = parse_plan(read_file(a.replace), a.replace);
  std::string topo_path = a.topology.empty() ? lp.topology : a.topology;
  if (topo_path.empty()) throw InputError(a.replace + ": the plan names no topology; give --topology");
  Topology topo = load_topology(topo_path, {a.minipod_level, a.topology_name});
  std::vector<NodeState> st = a.state.empty() ? std::vector<NodeState>{} : load_state(topo, a.state);
  auto failed = expand_hostlist(a.failed);
  auto spares = a.spares.empty() ? std::vector<std::string>{} : expand_hostlist(a.spares);
  ReplaceResult r = replace_nodes(topo, st, lp, failed, spares);
  nlohmann::json j = plan_to_json(r.plan, topo, lp.job);
  nlohmann::json rep = nlohmann::json::array();
  for (const auto& x : r.replaced)
    rep.push_back({{"failed", x.failed},
                   {"spare", x.spare},
                   {"pp_stage", x.cell / r.plan.shape.R},
                   {"dp_row", x.cell % r.plan.shape.R},
                   {"first_rank", static_cast<long long>(x.cell) * r.plan.gpus_per_node}});
  j["replaced"] = rep;
  j["changed_nodes"] = r.replaced.size();
  if (!a.hostfile.empty()) write_hostfile(a.hostfile, r.plan, topo, lp.job);
  if (a.json) {
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    for (const auto& x : r.replaced)
      std::cout << "replace " << x.failed << " -> " << x.spare << " (pp_stage " << x.cell / r.plan.shape.R
                << ", dp_row " << x.cell % r.plan.shape.R << ")\n";
    print_plan(j, false);
  }
  return 0;
}

int run_standby(const Args& a) {
  if (a.faults.empty() || a.nodes <= 0) throw UsageError("--faults and a positive --nodes are required with --standby");
  StandbyResult r = standby_size(read_file(a.faults), a.faults, a.nodes, a.percentile, a.window, a.fleet);
  nlohmann::json j{{"nodes", a.nodes},
                   {"percentile", a.percentile},
                   {"window_hours", a.window},
                   {"spares", r.spares},
                   {"expected_down", r.expected},
                   {"fleet", r.fleet},
                   {"traced_nodes", r.traced_nodes},
                   {"trace_days", r.days},
                   {"fleet_mean_down", r.mean_down},
                   {"fleet_max_down", r.max_down}};
  if (a.json) {
    std::cout << j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << "\n";
  } else {
    std::cout << "standby for " << a.nodes << " nodes: " << r.spares << " spares (p" << a.percentile;
    if (a.window > 0)
      std::cout << ", failing within " << a.window << " h";
    else
      std::cout << ", down at once";
    std::cout << "; expected " << r.expected << "; fleet of " << r.fleet << " over " << r.days << " days: mean "
              << r.mean_down << ", max " << r.max_down << " down at once)\n";
  }
  return 0;
}

}  // namespace

int plan_command(int argc, char** argv) {
  CLI::App app{"Topology-aware placement (after Arnold), replacement of failed nodes, standby sizing", "ballast plan"};
  Args a;
  app.add_option("--topology", a.topology, "Slurm topology.conf or topology.yaml");
  app.add_option("--job", a.job, "job JSON: gpus_per_node, tp, pp, dp, alpha or model");
  app.add_option("--state", a.state, "JSON {\"busy\": [hostlists], \"faulty\": [hostlists]}; others are free");
  app.add_option("--algorithm", a.algorithm, "arnold (default), exact, heuristic, best-fit, random-fit, slurm-tree");
  app.add_option("--seed", a.seed, "seed (random-fit; the plan is deterministic per input and seed)");
  app.add_option("--minipod-level", a.minipod_level, "tree depth below the top switch whose subtrees are minipods")
      ->check(CLI::NonNegativeNumber);
  app.add_option("--topology-name", a.topology_name, "topology.yaml: the topology to use");
  app.add_flag("--json", a.json, "print one JSON object");
  app.add_option("--hostfile", a.hostfile, "write SLURM_HOSTFILE (rank order) and FILE.env with the rank map");
  app.add_option("--replace", a.replace, "PLAN.json: replace failed nodes of this plan");
  app.add_option("--failed", a.failed, "hostlist of failed nodes (with --replace)");
  app.add_option("--spares", a.spares, "hostlist of allowed spares (with --replace; default every free node)");
  app.add_flag("--standby", a.standby, "recommend standby nodes from a fault trace");
  app.add_option("--faults", a.faults, "fault trace JSON (InfiniteHBD format) (with --standby)");
  app.add_option("--nodes", a.nodes, "nodes of the job (with --standby)");
  app.add_option("--fleet", a.fleet, "nodes in the traced fleet (default: nodes seen in the trace)");
  app.add_option("--percentile", a.percentile, "percentile of time covered (default 99)");
  app.add_option("--window", a.window, "hours: count nodes failing within a window (default 0: down at once)");
  if (int rc = util::parse_command_line(app, argc, argv); rc >= 0) return rc;
  try {
    if (a.standby) return run_standby(a);
    if (!a.replace.empty()) return run_replace(a);
    return run_place(a);
  } catch (const UsageError& e) {
    return util::usage_error(app, e.what());
  } catch (const InputError& e) {
    std::cerr << "ballast plan: " << e.what() << "\n";
    return 1;
  } catch (const std::exception& e) {
    std::cerr << "ballast plan: " << e.what() << "\n";
    return 1;
  }
}

}  // namespace ballast::sched
