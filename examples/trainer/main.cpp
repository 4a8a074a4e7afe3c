// ballast-trainer: data-parallel training of a character-level language
// model (model.hpp) over the text of a file or folder, with its gradients
// summed by the ballast.comm UCX plugin inside an embedded Ballast host
// (runtime.hpp). Supervised, it speaks docs/job-channel.md; without
// BALLAST_JOB_SOCKET and BALLAST_CONTROL_FILE it simply trains. The README
// beside this file describes the options, the exit codes and the checks.
#include "checkpoint.hpp"
#include "corpus.hpp"
#include "job_channel.hpp"
#include "model.hpp"
#include "runtime.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <limits>
#include <optional>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include <CLI/CLI.hpp>

namespace {

using trainer::wall_seconds;

// Exit statuses (README.md, "Exit codes").
enum Exit { kOk = 0, kInternal = 1, kBadInput = 2, kUserError = 3, kNan = 4 };

struct Failure : std::runtime_error {
  Failure(Exit code, const char* kind, const std::string& message)
      : std::runtime_error(message), code(code), kind(kind) {}
  Exit code;
  const char* kind;  // the error report's kind: user, nan, internal
};

struct Options {
  uint64_t steps = 300;
  uint64_t seed = 1;
  int batch = 64;
  float lr = 0.003f;
  trainer::Shape shape;
  std::string data = "/usr/share/common-licenses";
  uint64_t max_data_bytes = 64ull << 20;
  std::string checkpoint_dir;
  uint64_t checkpoint_every = 50;
  std::string resume_from;
  uint64_t log_every = 10;
  trainer::Runtime::Options runtime;
};

std::string env(const char* name) {
  const char* v = std::getenv(name);
  return v ? v : "";
}

// One timed operation of a step, as the step report lists them.
struct Op {
  const char* type;
  double start_s, duration_s;
};

class Trainer {
 public:
  Trainer(const Options& o, trainer::Runtime& rt, trainer::JobChannel& channel, trainer::Injections inject,
          const trainer::Corpus& corpus)
      : o_(o),
        rt_(rt),
        channel_(channel),
        inject_(std::move(inject)),
        corpus_(corpus),
        model_(shape_of(o, corpus)),
        adam_(model_.parameter_count(), o.lr) {}

  // Fresh from the seed, or from the checkpoint o.resume_from.
  void start() {
    model_.init(o_.seed);
    if (!o_.resume_from.empty()) resume(o_.resume_from);
    channel_.report("hello",
                    {{"pid", getpid()}, {"step", step_ + 1}, {"attempt", std::atoll(env("BALLAST_ATTEMPT").c_str())}});
  }

  // Trains up to step o.steps, or until a stop command.
  void run() {
    const size_t n = model_.parameter_count();
    // One all-reduce carries the gradients, the loss, the stop flag and each
    // rank's step in a slot of its own (so that a rank out of step is named).
    const size_t world = size_t(rt_.world_size());
    std::vector<float> buffer(n + 2 + world);
    std::vector<int32_t> inputs, targets;
    const int64_t started_ns = trainer::wall_ns();
    float first_loss = std::numeric_limits<float>::quiet_NaN(), loss = first_loss;
    bool stop_asked = false;
    while (step_ < o_.steps) {
      const uint64_t step = step_ + 1;
      for (const auto& c : channel_.poll()) {
        if (c.command == "checkpoint_now")
          save();
        else if (c.command == "stop")
          stop_asked = true;
        else if (c.command == "skip")
          skip_next_ = true;
        else if (c.command == "slow")
          slow_ = c.factor;
      }
      if (inject_.usererror.count(step))
        throw Failure(kUserError, "user",
                      "user code raised an error at step " + std::to_string(step) +
                          " (injected by BALLAST_INJECT usererror@" + std::to_string(step) + ")");
      std::vector<Op> ops;
      const double t0 = wall_seconds();
      corpus_.batch(o_.seed, step, rt_.rank(), o_.batch, &inputs, &targets);
      float local = model_.forward(inputs.data(), targets.data(), o_.batch);
      const double t1 = wall_seconds();
      ops.push_back({"forward-compute", t0, t1 - t0});
      model_.backward(buffer.data());
      if (inject_.nan.count(step)) {  // as a numerical blow-up would: the loss and every gradient
        local = std::numeric_limits<float>::quiet_NaN();
        std::fill(buffer.begin(), buffer.begin() + int64_t(n), local);
      }
      double delay = 0;
      if (slow_ > 1) {  // the whole step, all-reduce included, factor times as long as usual
        delay = (slow_ - 1) * usual_step(wall_seconds() - t0);
        std::this_thread::sleep_for(std::chrono::duration<double>(delay));
      }
      const double t2 = wall_seconds();
      ops.push_back({"backward-compute", t1, t2 - t1});
      buffer[n] = local;
      buffer[n + 1] = stop_asked ? 1.0f : 0.0f;
      std::fill(buffer.begin() + int64_t(n + 2), buffer.end(), 0.0f);
      buffer[n + 2 + size_t(rt_.rank())] = float(step);  // exact up to 2^24 steps
      const bool skip = skip_next_;
      if (skip) {  // fault injection: the others wait for this rank in the collective it leaves out
        skip_next_ = false;
        std::fprintf(stderr, "ballast-trainer: rank %d: leaving the all-reduce of step %llu out (skip)\n", rt_.rank(),
                     (unsigned long long)step);
      } else {
        try {
          rt_.allreduce_sum(buffer.data(), buffer.size());
        } catch (const trainer::CommError& e) {
          throw Failure(kInternal, "internal",
                        std::string("gradient all-reduce of step ") + std::to_string(step) + " failed: " + e.what());
        }
      }
      const double t3 = wall_seconds();
      ops.push_back({"grads-all-reduce", t2, t3 - t2});
      if (!skip) check_in_step(&buffer[n + 2], step);
      const float inv = 1.0f / float(rt_.world_size());
      loss = buffer[n] * inv;
      if (!std::isfinite(loss))
        throw Failure(kNan, "nan",
                      "the loss of step " + std::to_string(step) + " is not finite (" + std::to_string(loss) +
                          "); weights left as after step " + std::to_string(step - 1));
      for (size_t i = 0; i < n; ++i) buffer[i] *= inv;
      adam_.step(model_.params(), buffer.data(), step);
      const double t4 = wall_seconds();
      ops.push_back({"optimizer", t3, t4 - t3});
      recent_steps_.push_back(t4 - t0 - delay);
      if (recent_steps_.size() > 5) recent_steps_.pop_front();
      step_ = step;
      if (std::isnan(first_loss)) {
        first_loss = loss;
        rt_.stage("first_step", int64_t(t0 * 1e9), int64_t(t4 * 1e9), 0);
      }
      report_step(step, loss, t0, t4 - t0, ops);
      if (rt_.rank() == 0 && (step % o_.log_every == 0 || step == o_.steps))
        std::printf("step %llu loss %.4f (%.1f ms)\n", (unsigned long long)step, double(loss), (t4 - t0) * 1e3);
      if (o_.checkpoint_every && step % o_.checkpoint_every == 0) save();
      if (buffer[n + 1] > 0) break;  // a stop reached some rank before this step: every rank stops here
    }
    save();
    if (rt_.rank() == 0) {
      std::printf("done: step %llu, loss %.4f -> %.4f, %.2f s\n", (unsigned long long)step_, double(first_loss),
                  double(loss), double(trainer::wall_ns() - started_ns) * 1e-9);
      std::fflush(stdout);
    }
    channel_.report("done", {{"step", step_}});
  }

  uint64_t step() const { return step_; }

 private:
  // Every rank's slot must hold this step: a rank that left a collective out
  // (skip) meets the others' previous one with its next, one step ahead.
  void check_in_step(const float* steps, uint64_t step) const {
    float low = steps[0];
    for (int r = 1; r < rt_.world_size(); ++r) low = std::min(low, steps[r]);
    std::string ahead;
    for (int r = 0; r < rt_.world_size(); ++r)
      if (steps[r] != low)
        ahead += (ahead.empty() ? "rank " : ", rank ") + std::to_string(r) + " at step " +
                 std::to_string(uint64_t(steps[r]));
    if (ahead.empty()) return;
    throw Failure(kInternal, "internal",
                  "the gradient all-reduce of step " + std::to_string(step) + " joined ranks out of step: " + ahead +
                      ", the others at step " + std::to_string(uint64_t(low)) + " (a rank left a collective out)");
  }

  // What a step takes on this machine now without an injected delay: the
  // median of the last few. On a busy machine the all-reduce is most of a
  // step, so a delay in proportion to the compute alone would hardly slow
  // the job. Before the first step: the compute so far.
  double usual_step(double compute) const {
    if (recent_steps_.empty()) return compute;
    std::vector<double> v(recent_steps_.begin(), recent_steps_.end());
    std::nth_element(v.begin(), v.begin() + std::ptrdiff_t(v.size() / 2), v.end());
    return v[v.size() / 2];
  }

  static trainer::Shape shape_of(const Options& o, const trainer::Corpus& corpus) {
    trainer::Shape s = o.shape;
    s.vocab = corpus.vocab_size();
    return s;
  }

  void resume(const std::string& path) {
    auto file = rt_.load(path);
    const trainer::CheckpointMeta meta = trainer::read_meta(file->view());
    auto mismatch = [&](const char* what, long long have, long long want) {
      if (have != want)
        throw Failure(kBadInput, "internal",
                      "checkpoint " + path + ": " + what + " is " + std::to_string(have) + ", this run has " +
                          std::to_string(want));
    };
    mismatch("context", meta.shape.context, o_.shape.context);
    mismatch("embed", meta.shape.embed, o_.shape.embed);
    mismatch("hidden", meta.shape.hidden, o_.shape.hidden);
    if (meta.vocab != corpus_.vocab())
      throw Failure(kBadInput, "internal",
                    "checkpoint " + path + ": trained on a text with another vocabulary (" +
                        std::to_string(meta.vocab.size()) + " distinct bytes, " + o_.data + " has " +
                        std::to_string(corpus_.vocab().size()) + ")");
    if (meta.step > o_.steps)
      throw Failure(kBadInput, "internal",
                    "checkpoint " + path + " is at step " + std::to_string(meta.step) + ", past --steps " +
                        std::to_string(o_.steps));
    if (rt_.rank() == 0 && (meta.seed != o_.seed || meta.world_size != rt_.world_size() || meta.batch != o_.batch))
      std::fprintf(stderr,
                   "ballast-trainer: %s was written with seed %llu, %d ranks, batch %d; going on with seed %llu, "
                   "%d ranks, batch %d (not bit-identical to an uninterrupted run)\n",
                   path.c_str(), (unsigned long long)meta.seed, meta.world_size, meta.batch,
                   (unsigned long long)o_.seed, rt_.world_size(), o_.batch);
    trainer::read_tensors(file->view(), model_, adam_);
    step_ = meta.step;
    saved_ = meta.step;
  }

  // Rank 0 writes the checkpoint of the current step, once.
  void save() {
    if (rt_.rank() != 0 || o_.checkpoint_dir.empty() || saved_ == step_) return;
    trainer::CheckpointMeta meta;
    meta.step = step_;
    meta.seed = o_.seed;
    meta.world_size = rt_.world_size();
    meta.batch = o_.batch;
    meta.lr = o_.lr;
    meta.shape = model_.shape();
    meta.vocab = corpus_.vocab();
    const double t0 = wall_seconds();
    trainer::Written w;
    try {
      w = trainer::write_checkpoint(o_.checkpoint_dir, meta, model_, adam_);
    } catch (const std::exception& e) {
      throw Failure(kInternal, "internal", e.what());
    }
    saved_ = step_;
    channel_.report("checkpoint",
                    {{"step", step_}, {"path", w.path}, {"bytes", w.bytes}, {"seconds", wall_seconds() - t0}});
  }

  void report_step(uint64_t step, float loss, double start, double duration, const std::vector<Op>& ops) {
    if (!channel_.supervised()) return;
    nlohmann::json list = nlohmann::json::array();
    for (const auto& op : ops)
      list.push_back({{"optype", op.type}, {"start_s", op.start_s}, {"duration_s", op.duration_s}});
    channel_.report("step",
                    {{"step", step}, {"loss", loss}, {"start_s", start}, {"duration_s", duration}, {"ops", list}});
  }

  const Options& o_;
  trainer::Runtime& rt_;
  trainer::JobChannel& channel_;
  trainer::Injections inject_;
  const trainer::Corpus& corpus_;
  trainer::Model model_;
  trainer::Adam adam_;
  uint64_t step_ = 0;  // steps completed
  uint64_t saved_ = std::numeric_limits<uint64_t>::max();
  bool skip_next_ = false;
  double slow_ = 1;
  std::deque<double> recent_steps_;  // the last steps' durations without the injected delay
};

int fail(trainer::JobChannel* channel, int rank, uint64_t step, const Failure& f) {
  std::fprintf(stderr, "ballast-trainer: rank %d: %s\n", rank, f.what());
  if (channel) channel->report("error", {{"step", step}, {"kind", f.kind}, {"message", f.what()}});
  return f.code;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  o.checkpoint_dir = env("BALLAST_CHECKPOINT_DIR");
  o.resume_from = env("BALLAST_RESUME_FROM");
  CLI::App app{"ballast-trainer: data-parallel training of a character-level language model through Ballast"};
  app.add_option("--steps", o.steps, "train until this step (counted from 1, a resume included)")
      ->check(CLI::PositiveNumber);
  app.add_option("--seed", o.seed, "seed of the weights and the batches");
  app.add_option("--batch", o.batch, "windows per rank and step")->check(CLI::Range(1, 1 << 16));
  app.add_option("--lr", o.lr, "Adam's learning rate")->check(CLI::Range(1e-6, 1.0));
  app.add_option("--context", o.shape.context, "bytes of context")->check(CLI::Range(1, 256));
  app.add_option("--embed", o.shape.embed, "embedding width")->check(CLI::Range(1, 1024));
  app.add_option("--hidden", o.shape.hidden, "hidden units")->check(CLI::Range(1, 8192));
  app.add_option("--data", o.data, "a text file, or a folder whose regular files are read in name order");
  app.add_option("--max-data-bytes", o.max_data_bytes, "refuse more text than this")->check(CLI::PositiveNumber);
  app.add_option("--checkpoint-dir", o.checkpoint_dir,
                 "where rank 0 writes checkpoints (default $BALLAST_CHECKPOINT_DIR; none: no checkpoints)");
  app.add_option("--checkpoint-every", o.checkpoint_every,
                 "steps between checkpoints (0: only on checkpoint_now, stop and the end)");
  app.add_option("--resume-from", o.resume_from, "checkpoint to start from (default $BALLAST_RESUME_FROM)");
  app.add_option("--log-every", o.log_every, "rank 0 prints the loss every this many steps")
      ->check(CLI::PositiveNumber);
  app.add_option("--comm-plugin", o.runtime.comm_plugin,
                 "the UCX comm plugin: a path or a name in the plugin search path");
  app.add_option("--startup-plugin", o.runtime.startup_plugin, "the start-up plugin: a path or a name");
  app.add_option("--comm-timeout-ms", o.runtime.comm_timeout_ms,
                 "deadline of a collective (0: BALLAST_COMM_TIMEOUT_MS, else 300 s)")
      ->check(CLI::NonNegativeNumber);
  CLI11_PARSE(app, argc, argv);
  std::setvbuf(stdout, nullptr, _IOLBF, 0);

  const int env_rank = std::atoi(env("RANK").c_str());
  std::optional<trainer::JobChannel> channel;
  int rank = env_rank;
  uint64_t step = 0;
  try {
    channel.emplace(env("BALLAST_JOB_SOCKET"), env("BALLAST_CONTROL_FILE"), env_rank);
    trainer::Injections inject;
    try {
      inject = trainer::parse_injections(env("BALLAST_INJECT"));
    } catch (const std::exception& e) {
      throw Failure(kBadInput, "internal", e.what());
    }
    std::optional<trainer::Corpus> corpus;
    try {
      corpus.emplace(o.data, o.shape.context, o.max_data_bytes);
    } catch (const std::exception& e) {
      throw Failure(kBadInput, "internal", e.what());
    }
    std::optional<trainer::Runtime> rt;
    try {
      rt.emplace(o.runtime);
    } catch (const std::exception& e) {
      throw Failure(kInternal, "internal", e.what());
    }
    rank = rt->rank();
    Trainer t(o, *rt, *channel, std::move(inject), *corpus);
    try {
      t.start();
    } catch (const Failure&) {
      throw;
    } catch (const std::exception& e) {
      throw Failure(kBadInput, "internal", e.what());
    }
    step = t.step();
    try {
      t.run();
    } catch (...) {
      step = t.step() + 1;  // the step it happened in
      throw;
    }
    return kOk;
  } catch (const Failure& f) {
    return fail(channel ? &*channel : nullptr, rank, step, f);
  } catch (const std::exception& e) {
    return fail(channel ? &*channel : nullptr, rank, step, Failure(kInternal, "internal", e.what()));
  }
}
