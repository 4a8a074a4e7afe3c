#include "handover.hpp"

#include <cmath>

namespace ballast::runner {

namespace {

constexpr size_t kMaxText = 256;   // bytes of each text of an incident
constexpr size_t kMaxActions = 8;  // of an incident: the first ones

// At most n bytes of s, not cutting a UTF-8 character; invalid UTF-8 (a
// trainer's message) replaced, as the record's JSON is written strictly.
std::string clip(const std::string& s, size_t n) {
  const nlohmann::json raw = s.substr(0, 4 * n);
  std::string valid =
      nlohmann::json::parse(raw.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)).get<std::string>();
  if (valid.size() <= n) return valid;
  while (n > 0 && (static_cast<unsigned char>(valid[n]) & 0xC0) == 0x80) --n;
  return valid.substr(0, n);
}

nlohmann::json number_or_null(double v) { return std::isfinite(v) ? nlohmann::json(v) : nlohmann::json(); }

nlohmann::json incident_json(const Incident& i) {
  nlohmann::json actions = nlohmann::json::array();
  for (size_t a = 0; a < i.actions.size() && a < kMaxActions; ++a) actions.push_back(clip(i.actions[a], kMaxText));
  return {{"fault", clip(i.fault, kMaxText)},
          {"origin", clip(i.origin, kMaxText)},
          {"injected_ns", i.injected_ns},
          {"detected_ns", i.detected_ns},
          {"detector", clip(i.detector, kMaxText)},
          {"verdict", clip(i.verdict, kMaxText)},
          {"decided_ns", i.decided_ns},
          {"actions", actions},
          {"resumed_ns", i.resumed_ns},
          {"step_at_fault", i.step_at_fault},
          {"resumed_from", i.resumed_from},
          {"outcome", clip(i.outcome, kMaxText)},
          {"message", clip(i.message, kMaxText)}};
}

// A reader of one object's fields that names the first bad one.
struct Fields {
  const nlohmann::json& j;
  std::string where;
  std::string* error;
  bool ok = true;

  bool fail(const std::string& key, const char* what) {
    if (ok) *error = where + "." + key + " is missing or not " + what;
    ok = false;
    return false;
  }
  const nlohmann::json* get(const std::string& key) {
    auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
  }
  void integer(const std::string& key, int64_t min, int64_t* out) {
    const auto* v = get(key);
    if (!v || !v->is_number_integer() || v->get<int64_t>() < min) {
      fail(key, ("a whole number of at least " + std::to_string(min)).c_str());
      return;
    }
    *out = v->get<int64_t>();
  }
  void seconds(const std::string& key, double* out) {
    const auto* v = get(key);
    if (!v || !v->is_number() || !std::isfinite(v->get<double>()) || v->get<double>() < 0) {
      fail(key, "a number of seconds (0 or more)");
      return;
    }
    *out = v->get<double>();
  }
  void text(const std::string& key, std::string* out) {
    const auto* v = get(key);
    if (!v || !v->is_string() || v->get_ref<const std::string&>().size() > kMaxText) {
      fail(key, ("a text of at most " + std::to_string(kMaxText) + " bytes").c_str());
      return;
    }
    *out = v->get<std::string>();
  }
};

bool incident_from_json(const nlohmann::json& j, const std::string& where, Incident* out, std::string* error) {
  if (!j.is_object()) {
    *error = where + " is not an object";
    return false;
  }
  Fields f{j, where, error};
  f.text("fault", &out->fault);
  f.text("origin", &out->origin);
  f.integer("injected_ns", 0, &out->injected_ns);
  f.integer("detected_ns", 0, &out->detected_ns);
  f.text("detector", &out->detector);
  f.text("verdict", &out->verdict);
  f.integer("decided_ns", 0, &out->decided_ns);
  f.integer("resumed_ns", 0, &out->resumed_ns);
  f.integer("step_at_fault", -1, &out->step_at_fault);
  f.integer("resumed_from", -1, &out->resumed_from);
  f.text("outcome", &out->outcome);
  f.text("message", &out->message);
  const auto* actions = f.get("actions");
  if (f.ok && (!actions || !actions->is_array() || actions->size() > kMaxActions))
    return f.fail("actions", ("a list of at most " + std::to_string(kMaxActions) + " texts").c_str());
  for (size_t a = 0; f.ok && a < actions->size(); ++a) {
    const auto& t = (*actions)[a];
    if (!t.is_string() || t.get_ref<const std::string&>().size() > kMaxText)
      return f.fail("actions[" + std::to_string(a) + "]", "a text");
    out->actions.push_back(t.get<std::string>());
  }
  return f.ok;
}

}  // namespace

void Lineage::add(int64_t step, double seconds) {
  if (step <= base_step_) return;
  auto [it, fresh] = steps_.emplace(step, seconds);
  if (!fresh) {
    term_s_ -= it->second;
    it->second = seconds;
  }
  term_s_ += seconds;
}

void Lineage::checkpoint(int64_t step) {
  if (step < base_step_) return;  // an earlier leader's: carried, or not known
  double s = seconds();
  for (auto it = steps_.upper_bound(step); it != steps_.end(); ++it) s -= it->second;
  at_checkpoint_[step] = s;
  while (at_checkpoint_.size() > kCheckpoints) at_checkpoint_.erase(at_checkpoint_.begin());
}

bool Lineage::rewind(int64_t step) {
  at_checkpoint_.erase(at_checkpoint_.upper_bound(step), at_checkpoint_.end());
  if (step >= base_step_) {
    for (auto it = steps_.upper_bound(step); it != steps_.end();) {
      term_s_ -= it->second;
      it = steps_.erase(it);
    }
    return true;
  }
  steps_.clear();
  term_s_ = 0;
  auto it = at_checkpoint_.find(step);
  const bool known = it != at_checkpoint_.end() || step <= 0;
  base_s_ = it != at_checkpoint_.end() ? it->second : 0;
  base_step_ = step;
  return known;
}

nlohmann::json Lineage::to_json() const {
  nlohmann::json checkpoints = nlohmann::json::array();
  for (const auto& [step, s] : at_checkpoint_) checkpoints.push_back({step, s});
  return {{"step", last_step()}, {"seconds", seconds()}, {"checkpoints", checkpoints}};
}

bool Lineage::from_json(const nlohmann::json& j, Lineage* out, std::string* error) {
  if (!j.is_object()) {
    *error = "report.kept is missing or not an object";
    return false;
  }
  Lineage l;
  Fields f{j, "report.kept", error};
  f.integer("step", -1, &l.base_step_);
  f.seconds("seconds", &l.base_s_);
  const auto* cps = f.get("checkpoints");
  if (f.ok && (!cps || !cps->is_array() || cps->size() > kCheckpoints))
    return f.fail("checkpoints", ("a list of at most " + std::to_string(kCheckpoints) + " [step, seconds]").c_str());
  for (size_t c = 0; f.ok && c < cps->size(); ++c) {
    const auto& p = (*cps)[c];
    const std::string key = "checkpoints[" + std::to_string(c) + "]";
    if (!p.is_array() || p.size() != 2 || !p[0].is_number_integer() || p[0].get<int64_t>() < 0 ||
        p[0].get<int64_t>() > l.base_step_ || !p[1].is_number() || !std::isfinite(p[1].get<double>()) ||
        p[1].get<double>() < 0 || p[1].get<double>() > l.base_s_ * (1 + 1e-9) + 1e-9)  // sums' rounding
      return f.fail(key, "[step, seconds] up to the kept step and seconds");
    l.at_checkpoint_[p[0].get<int64_t>()] = p[1].get<double>();
  }
  if (f.ok) *out = std::move(l);
  return f.ok;
}

nlohmann::json handover_json(const Handover& h, const Lineage& kept) {
  const size_t n = h.incidents.size();
  size_t first = n > Handover::kIncidents ? n - Handover::kIncidents : 0;
  auto make = [&] {
    nlohmann::json incidents = nlohmann::json::array();
    for (size_t i = first; i < n; ++i) incidents.push_back(incident_json(h.incidents[i]));
    return nlohmann::json{{"start_ns", h.start_ns},
                          {"attempts", h.attempts},
                          {"loss_first", h.have_loss ? number_or_null(h.loss_first) : nlohmann::json()},
                          {"loss_last", h.have_loss ? number_or_null(h.loss_last) : nlohmann::json()},
                          {"have_loss", h.have_loss},
                          {"incidents", incidents},
                          {"incidents_omitted", h.incidents_omitted + int64_t(first)},
                          {"kept", kept.to_json()}};
  };
  nlohmann::json j = make();
  // Texts of escaped characters can be six times their length: the oldest incidents go first.
  while (first < n && j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace).size() > Handover::kMaxBytes) {
    first += std::max<size_t>(1, (n - first) / 4);
    first = std::min(first, n);
    j = make();
  }
  return j;
}

bool handover_from_json(const nlohmann::json& j, Handover* out, Lineage* kept, std::string* error) {
  if (!j.is_object()) {
    *error = "report is not an object";
    return false;
  }
  Handover h;
  Fields f{j, "report", error};
  int64_t attempts = 0;
  f.integer("start_ns", 1, &h.start_ns);
  f.integer("attempts", 0, &attempts);
  if (f.ok && attempts > INT32_MAX) f.fail("attempts", "a number of attempts");
  h.attempts = int(attempts);
  f.integer("incidents_omitted", 0, &h.incidents_omitted);
  const auto* have = f.get("have_loss");
  if (f.ok && (!have || !have->is_boolean())) f.fail("have_loss", "true or false");
  if (f.ok) h.have_loss = have->get<bool>();
  auto loss = [&](const char* key, double* out) {
    const auto* v = f.get(key);
    if (f.ok && (!v || !(v->is_number() || v->is_null()))) f.fail(key, "a number or null (not a number)");
    if (f.ok) *out = v->is_number() ? v->get<double>() : NAN;
  };
  loss("loss_first", &h.loss_first);
  loss("loss_last", &h.loss_last);
  const auto* incidents = f.get("incidents");
  if (f.ok && (!incidents || !incidents->is_array() || incidents->size() > Handover::kIncidents))
    f.fail("incidents", ("a list of at most " + std::to_string(Handover::kIncidents) + " incidents").c_str());
  for (size_t i = 0; f.ok && i < incidents->size(); ++i) {
    Incident inc;
    if (!incident_from_json((*incidents)[i], "report.incidents[" + std::to_string(i) + "]", &inc, error)) return false;
    inc.id = int(i) + 1;
    h.incidents.push_back(std::move(inc));
  }
  Lineage l;
  if (f.ok && !Lineage::from_json(j.contains("kept") ? j["kept"] : nlohmann::json(), &l, error)) return false;
  if (!f.ok) return false;
  *out = std::move(h);
  *kept = std::move(l);
  return true;
}

}  // namespace ballast::runner
