// The executor: owns one job. It starts the job's ranks through a Backend,
// watches them (exits, the job channel's reports), fires fault injections,
// and carries out recovery.action events one at a time. All job state
// belongs to one supervising thread; the bus handlers only hand events to
// it through an inbox.
#pragma once

#include "actions.hpp"
#include "backend.hpp"
#include "channel.hpp"
#include "checkpoints.hpp"
#include "handover.hpp"
#include "job_config.hpp"
#include "job_report.hpp"

#include <ballast/events.h>
#include <ballast/plugin.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <set>
#include <thread>

namespace ballast::runner {

class Executor {
 public:
  Executor(const ballast_host_api* host, JobConfig config, std::unique_ptr<Backend> backend);
  ~Executor();
  Executor(const Executor&) = delete;
  Executor& operator=(const Executor&) = delete;

  // Make the job's folders, socket and slots, and start the supervising
  // thread (which starts the ranks). False with *error.
  bool start(std::string* error);
  // Choose the job's BALLAST_TRACE_DIR (job.trace_dir, else the
  // environment's, else a new folder in /dev/shm); start() calls it when it
  // was not called before.
  bool prepare_trace_dir(std::string* error);
  // Stop the ranks and the thread; write the report and the timeline.
  void stop();
  const std::string& trace_dir() const { return trace_dir_; }

  // A slot's network counters (metrics), by metric name, when read.
  struct NetCounters {
    std::map<std::string, double> counters;
    int64_t ns = 0;
  };

  // Bus handlers, any thread: copy what they need into the inbox.
  void post_action(const ballast_recovery_action& a, int64_t ts_ns);
  void post_fault(const std::string& topic, const ballast_fault_report& f, int64_t ts_ns);
  void post_straggler(const ballast_straggler_report& r, int64_t ts_ns);
  void post_plan(const ballast_placement_plan& p);
  void post_placement_error(const std::string& message);
  void post_back(const std::string& node);
  // controller.leader (a new term; JSON with the earlier leaders' `log`) and
  // node.connected (an agent connected to this controller).
  void post_leader(const std::string& json);
  void post_connected(const std::string& node);
  // job.rank_report: a rank's report relayed by its node's agent (relay.hpp).
  void post_relayed(const std::string& json);

 private:
  enum class State { starting, running, recovering, paused, finished, escalated, stopped, interrupted };
  struct RankState {
    bool hello = false, done = false, running = false;
    int64_t done_ns = 0;             // when it reported done
    bool killed_after_done = false;  // it did not exit within exit_grace_s
    int64_t last_step = 0;
    double last_end_s = 0;  // wall clock end of its last step
    std::string error_kind, error_message;
    int64_t error_step = -1;
  };
  struct SlotState {
    std::string name;
    enum Role { active, standby, evicted } role = standby;
    int64_t evicted_ns = 0;
    int64_t activated_ns = 0;      // when it last took an evicted node's place
    std::string replaced_by;       // the standby that took its place since its eviction
    bool back = false;             // evicted, and node.back said it is heard again since
    bool back_on_connect = false;  // drained by an earlier leader for node.silent: back once its agent connects
    int64_t retry_ns = 0;          // a failed restore is tried again from then
  };
  struct InFlight {
    Action action;
    int64_t start_ns = 0;
    enum Wait { none, hello, checkpoint, pause_end, placement } wait = none;
    int64_t deadline_ns = 0;
    int64_t min_step = 0;
    int incident = -1;
    int failed_slot = -1;
    std::string detail;
  };
  struct Message {
    enum Kind { action, fault, plan, plan_error, back, leader, connected, relayed } kind = action;
    Action act;
    std::string topic, subject, fault_kind, detector, evidence;
    int rank = -1;
    int64_t since_ns = 0, detected_ns = 0;
    std::vector<std::string> plan_nodes;
    std::string plan_job, text;
  };

  void post(Message m, bool wake_loop);
  void wake();
  void loop();
  int fence(const std::string& kind, const nlohmann::json& record, std::string* why);
  void try_to_lead();
  bool take_over(std::string* error);
  void carry_report(const nlohmann::json& report);
  Handover handover() const;
  bool open_channel(std::string* error, bool keep_commands);
  bool reattach(const nlohmann::json& attempt, std::string* error);
  void write_topology();
  void handle_term(const Message& m);
  void stand_down();
  void handle_report(const Report& r);
  void handle_relayed(const Message& m);
  void hold_relayed(Message m);
  std::deque<Message> take_held_relayed();
  std::string job_socket(int node) const;
  void handle_exit(const RankExit& e);
  void stop_lingering_ranks();
  void handle_message(Message& m);
  void on_fault(const Message& m);
  void fire_injections();
  void advance();
  void begin(Action a);
  void begin_replace(int failed, const Action& act);
  void finish(const std::string& outcome, const std::string& detail);
  bool start_attempt(const Checkpoint& from, std::string* error);
  void stop_ranks();
  int slot_of_subject(const std::string& subject) const;
  std::string eviction_reason(const Action& a) const;
  void publish_fault(int rank, const std::string& kind, const std::string& evidence);
  void publish_json(const char* topic, const nlohmann::json& j);
  void publish_step(const Report& r);
  void sample_metrics();
  void set_state(State s, const std::string& reason = "");
  void end_job(State s, const std::string& reason);
  int open_incident(const std::string& fault, const std::string& origin, int64_t injected_ns);
  int current_incident() const;
  void journal(const std::string& event, const InFlight& f, const std::string& outcome, const std::string& detail);
  void show_progress(bool force);
  void log(int level, const std::string& msg);
  int64_t now() const;
  static const char* state_name(State s);
  std::string pending_trainer_injections() const;
  std::string fault_signature() const { return last_fault_signature_; }
  Summary summary() const;

  const ballast_host_api* host_;
  JobConfig cfg_;
  std::unique_ptr<Backend> backend_;
  std::string job_dir_, trace_dir_, checkpoint_dir_, socket_path_;
  bool made_trace_dir_ = false;
  ReportSocket socket_;
  ControlFile control_;
  int wake_[2] = {-1, -1};

  std::mutex inbox_mu_;
  std::deque<Message> inbox_;
  std::thread thread_;
  std::atomic<bool> quit_{false};
  std::atomic<bool> ended_{false};

  // Owned by the supervising thread.
  State state_ = State::starting;
  bool state_published_ = false;
  std::string end_reason_;
  std::vector<RankState> ranks_;
  std::vector<SlotState> slots_;
  std::vector<int> node_slot_;  // job node -> slot
  int attempt_ = -1;
  int64_t first_start_ns_ = 0, attempt_start_ns_ = 0, last_restart_ns_ = 0, last_fresh_fault_ns_ = 0;
  int64_t attempt_start_wall_ns_ = 0;  // CLOCK_REALTIME, against the agents' receive times
  int64_t failed_ns_ = 0;              // when the current attempt lost a rank, 0 if it did not
  int64_t high_water_ = 0;
  int64_t resume_step_ = 0;
  int master_port_ = 0;
  ActionQueue queue_;
  RestartLoop loop_rule_;
  std::optional<InFlight> current_;
  uint64_t next_action_id_ = 1;
  std::string last_fault_signature_;
  int64_t nan_step_ = -1;
  std::string superseded_evict_;  // subject of the last fault-caused evict, when it was superseded
  bool silent_outside_ = false;   // the last node.silent named a node outside the job
  std::vector<bool> fired_;
  Lineage kept_;                    // the seconds of the steps the final lineage holds
  std::map<int64_t, double> loss_;  // step -> rank 0's loss, the final lineage (this term's)
  std::vector<Incident> incidents_;
  // Carried from an earlier leader's snapshot (carry_report): the figures
  // before this term. incidents_ begins with carried_incidents_ of theirs.
  bool carried_ = false;
  Handover carried_figures_;
  size_t carried_incidents_ = 0;
  int64_t incidents_omitted_ = 0;
  std::vector<Span> spans_;
  int64_t pause_until_ns_ = 0;
  int64_t next_metrics_ns_ = 0, next_progress_ns_ = 0;
  std::map<pid_t, double> cpu_prev_;     // metrics: cpu seconds per process at the last sample
  std::map<int, NetCounters> net_prev_;  // metrics: each slot's network counters at the last sample
  int64_t metrics_prev_ns_ = 0;
  std::vector<std::string> pending_plan_;  // the placement plugin's answer
  std::string placement_error_;
  bool plan_answered_ = false;
  bool tty_ = false;
  bool waiting_to_lead_ = false;  // the first start was fenced off: tried again until this controller leads
  int64_t next_lead_try_ns_ = 0;
  static constexpr int64_t kLeadRetryNs = 1000000000;
  // With high availability (the fence refused this candidate at its start):
  // what the controller.leader events brought, and what was taken over.
  bool ha_ = false;
  uint64_t terms_seen_ = 0, taken_over_ = 0;  // controller.leader events read; the one taken over
  nlohmann::json leader_log_ = nlohmann::json::array();
  nlohmann::json adopted_attempt_;   // take_over's TakeOver::attempt, until re-attached
  std::set<std::string> connected_;  // nodes whose agent connected in this term
  bool channel_open_ = false;        // the job channel's socket is bound and the control file made
  bool commands_kept_ = false;       // the control file was kept (running ranks may read on): emptied at a start
  bool channel_busy_ = false;        // the last start found another executor's socket answering
  uint64_t relay_refused_ = 0;       // relayed reports refused (handle_relayed), for the log's bound
  // Relayed reports that came while waiting to lead (hold_relayed): the
  // controller leads already and has acknowledged them to their agents.
  std::deque<Message> held_relayed_;
  size_t held_relayed_bytes_ = 0;
  static constexpr size_t kMaxHeldRelayedBytes = 64u << 20;
  uint64_t snapshots_refused_ = 0;  // backend snapshots the fence refused, for the log's bound
  Summary final_;
  bool summarised_ = false;
};

}  // namespace ballast::runner
