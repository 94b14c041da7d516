// loom::Profiler (include/loom/profiler.hpp) on Kineto's C++ API: Python's schedule and its
// transitions (torch/profiler/profiler.py), the Kineto session prepared, enabled and
// disabled as Python's _KinetoProfile does it, each window's trace saved by Kineto itself,
// and the key averages Python's EventList computes.
#include <loom/profiler.hpp>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <map>
#include <set>
#include <string>
#include <system_error>
#include <utility>
#include <vector>

#include <ATen/Context.h>
#include <c10/util/Exception.h>
#include <torch/csrc/autograd/profiler_kineto.h>

#include <loom/detail/env.hpp>
#include <loom/detail/message_of.hpp>
#include <loom/error.hpp>

// Declared in torch/csrc/profiler/kineto_shim.h, which needs Kineto's own headers (the wheel
// ships none); exported by libtorch_cpu.
namespace torch::autograd::profiler {
TORCH_API void addMetadataJson(const std::string& key, const std::string& value);
}  // namespace torch::autograd::profiler

namespace loom {

namespace {

namespace kineto = torch::autograd::profiler;
namespace impl = torch::profiler::impl;

const char* action_name(ProfilerAction a) {
  switch (a) {
    case ProfilerAction::None:
      return "NONE";
    case ProfilerAction::Warmup:
      return "WARMUP";
    case ProfilerAction::Record:
      return "RECORD";
    case ProfilerAction::RecordAndSave:
      return "RECORD_AND_SAVE";
  }
  return "?";
}

/// Python's _format_time: microseconds as us, ms or s with three decimals.
std::string format_time(double us) {
  char text[64];
  if (us >= 1e6) {
    std::snprintf(text, sizeof text, "%.3fs", us / 1e6);
  } else if (us >= 1e3) {
    std::snprintf(text, sizeof text, "%.3fms", us / 1e3);
  } else {
    std::snprintf(text, sizeof text, "%.3fus", us);
  }
  return text;
}

/// Python's _format_time_share.
std::string format_share(double us, double total) {
  if (total == 0) return "NaN";
  char text[64];
  std::snprintf(text, sizeof text, "%.2f%%", us * 100.0 / total);
  return text;
}

/// Python's _rewrite_name(with_wildcard=True): every step's scope averaged as one.
std::string key_of(const std::string& name) {
  if (name.rfind("ProfilerStep#", 0) == 0) return "ProfilerStep*";
  return name;
}

}  // namespace

ProfilerAction ProfilerSchedule::operator()(int64_t step) const {
  if (wait < 0 || warmup < 0 || active <= 0 || repeat < 0 || skip_first < 0) {
    throw Error("loom::ProfilerSchedule: wait=" + std::to_string(wait) + " (need >= 0), warmup=" +
                std::to_string(warmup) + " (need >= 0), active=" + std::to_string(active) +
                " (need > 0), repeat=" + std::to_string(repeat) +
                " (need >= 0), skip_first=" + std::to_string(skip_first) + " (need >= 0)");
  }
  if (step < 0)
    throw Error("loom::ProfilerSchedule: the step must be >= 0, not " + std::to_string(step));
  if (step < skip_first) return ProfilerAction::None;
  step -= skip_first;
  if (skip_first_wait) step += wait;
  const int64_t cycle = wait + warmup + active;
  if (repeat > 0 && step / cycle >= repeat) return ProfilerAction::None;
  const int64_t at = step % cycle;
  if (at < wait) return ProfilerAction::None;
  if (at < wait + warmup) return ProfilerAction::Warmup;
  return at < cycle - 1 ? ProfilerAction::Record : ProfilerAction::RecordAndSave;
}

struct Profiler::Impl {
  ProfilerOptions options;
  Profiler* self = nullptr;
  int rank = 0, world = 1;
  bool running = false;  // between start() and stop()
  int64_t step = 0;
  int64_t ended = 0;  // the step that ended last: a window handed over ends with it
  ProfilerAction action = ProfilerAction::None;
  bool prepared = false, enabled = false;
  std::optional<at::RecordFunction> step_scope;  // "ProfilerStep#N"
  std::unique_ptr<kineto::ProfilerResult> result;
  std::vector<ProfilerEvent> events;
  std::filesystem::path last;
  std::vector<std::filesystem::path> traces;

  ProfilerAction scheduled(int64_t s) const {
    return options.schedule ? (*options.schedule)(s) : ProfilerAction::Record;
  }

  impl::ProfilerConfig config() const {
    return impl::ProfilerConfig(impl::ProfilerState::KINETO, options.record_shapes,
                                options.profile_memory, options.with_stack, options.with_flops,
                                /*with_modules=*/false);
  }
  std::set<impl::ActivityType> activities() const {
    std::set<impl::ActivityType> out{impl::ActivityType::CPU};
    if (options.cuda && at::globalContext().hasCUDA()) out.insert(impl::ActivityType::CUDA);
    return out;
  }

  void prepare() {
    kineto::prepareProfiler(config(), activities());
    prepared = true;
  }
  void start_trace() {
    if (!prepared) prepare();
    kineto::enableProfiler(config(), activities());
    enabled = true;
    // The metadata Python's start_trace adds.
    if (options.profile_memory) kineto::addMetadataJson("profile_memory", "1");
    if (options.with_stack) kineto::addMetadataJson("with_stack", "1");
    if (options.record_shapes) kineto::addMetadataJson("record_shapes", "1");
    if (options.with_flops) kineto::addMetadataJson("with_flops", "1");
    if (world > 1) {
      kineto::addMetadataJson("distributedInfo", "{\"backend\": \"" + options.backend +
                                                     "\", \"rank\": " + std::to_string(rank) +
                                                     ", \"world_size\": " + std::to_string(world) +
                                                     "}");
    }
  }
  void stop_trace() {
    if (!enabled) return;
    enabled = false;
    prepared = false;
    result = kineto::disableProfiler();
  }
  void trace_ready() {
    events.clear();
    last.clear();
    if (!result) return;
    for (const auto& e : result->events()) {
      events.push_back(ProfilerEvent{e.name(), e.startThreadId(), static_cast<int64_t>(e.startNs()),
                                     static_cast<int64_t>(e.endNs()), e.deviceType(), e.isAsync()});
    }
    if (!options.dir.empty()) {
      std::error_code ec;
      std::filesystem::create_directories(options.dir, ec);
      if (ec) {
        throw Error("loom::Profiler: cannot create " + options.dir.string() + ": " + ec.message());
      }
      last = options.dir /
             ("rank-" + std::to_string(rank) + ".step-" + std::to_string(ended) + ".pt.trace.json");
      result->save(last.string());
      traces.push_back(last);
    }
    if (options.on_trace_ready) options.on_trace_ready(*self);
  }

  /// Python's action_map: what a change of action does.
  void transit(ProfilerAction from, std::optional<ProfilerAction> to) {
    using A = ProfilerAction;
    auto warn = [&] {
      TORCH_WARN("loom::Profiler: incorrect schedule: ", action_name(from), " followed by ",
                 action_name(*to));
    };
    if (!to) {  // stop()
      if (from == A::Warmup) {
        start_trace();
        stop_trace();
      } else if (from == A::Record || from == A::RecordAndSave) {
        stop_trace();
        trace_ready();
      }
      return;
    }
    switch (from) {
      case A::None:
        if (*to == A::Warmup) prepare();
        if (*to == A::Record || *to == A::RecordAndSave) start_trace();
        return;
      case A::Warmup:
        if (*to == A::None) {
          warn();
          start_trace();
          stop_trace();
        }
        if (*to == A::Record || *to == A::RecordAndSave) start_trace();
        return;
      case A::Record:
        if (*to == A::None || *to == A::Warmup) {
          warn();
          stop_trace();
        }
        return;
      case A::RecordAndSave:
        stop_trace();
        trace_ready();
        if (*to == A::Warmup) prepare();
        if (*to == A::Record || *to == A::RecordAndSave) start_trace();
        return;
    }
  }

  void enter_step() {
    step_scope.emplace(at::RecordScope::USER_SCOPE);
    if (step_scope->isActive()) step_scope->before("ProfilerStep#" + std::to_string(step));
  }
};

Profiler::Profiler(ProfilerOptions options) : impl_(std::make_unique<Impl>()) {
  auto& s = *impl_;
  s.options = std::move(options);
  s.self = this;
  if (s.options.schedule) (void)(*s.options.schedule)(0);  // a wrong schedule fails here
  const auto env_rank =
      detail::parse_env_index(std::getenv("RANK"), "loom::Profiler", "RANK", 1 << 20);
  const auto env_world =
      detail::parse_env_index(std::getenv("WORLD_SIZE"), "loom::Profiler", "WORLD_SIZE", 1 << 20);
  s.rank = s.options.rank.value_or(env_rank.value_or(0));
  s.world = s.options.world_size.value_or(env_world.value_or(1));
}

Profiler::~Profiler() {
  if (!impl_ || !impl_->running) return;
  try {
    stop();
  } catch (...) {
    TORCH_WARN("loom::Profiler: stopping it at its destruction failed: ",
               detail::message_of(std::current_exception()));
  }
}

void Profiler::start() {
  auto& s = *impl_;
  if (s.running) throw Error("loom::Profiler: start() while it runs; stop() it first");
  s.running = true;
  s.step = 0;
  s.action = s.scheduled(0);
  s.transit(ProfilerAction::None, s.action);
  s.enter_step();
}

void Profiler::step() {
  auto& s = *impl_;
  if (!s.running) throw Error("loom::Profiler: step() before start()");
  s.step_scope.reset();  // the step's scope ends
  const ProfilerAction before = s.action;
  const ProfilerAction next = s.scheduled(s.step + 1);
  s.ended = s.step++;
  s.action = next;
  s.transit(before, next);
  s.enter_step();
}

void Profiler::stop() {
  auto& s = *impl_;
  if (!s.running) return;
  s.step_scope.reset();
  s.running = false;
  s.ended = s.step;
  s.transit(s.action, std::nullopt);
}

int64_t Profiler::step_num() const { return impl_->step; }
ProfilerAction Profiler::current_action() const { return impl_->action; }
const std::vector<ProfilerEvent>& Profiler::events() const { return impl_->events; }
const std::filesystem::path& Profiler::last_trace() const { return impl_->last; }
const std::vector<std::filesystem::path>& Profiler::traces() const { return impl_->traces; }

std::vector<KeyAverage> Profiler::key_averages(std::string_view sort_by) const {
  // The CPU events on each thread, outer before inner: an event's self time is its time less
  // that of the events directly inside it (Python's _populate_cpu_children).
  std::map<uint64_t, std::vector<const ProfilerEvent*>> by_thread;
  for (const auto& e : impl_->events) {
    if (e.device != c10::DeviceType::CPU || e.async || e.name == "[memory]") continue;
    by_thread[e.thread].push_back(&e);
  }
  std::map<std::string, KeyAverage> out;
  for (auto& [thread, list] : by_thread) {
    (void)thread;
    std::stable_sort(list.begin(), list.end(), [](const auto* a, const auto* b) {
      return a->start_ns != b->start_ns ? a->start_ns < b->start_ns : a->end_ns > b->end_ns;
    });
    std::vector<std::pair<const ProfilerEvent*, double>> open;  // an event, its children's us
    auto close = [&](const ProfilerEvent* e, double children) {
      const double us = static_cast<double>(e->end_ns - e->start_ns) / 1e3;
      auto& k = out[key_of(e->name)];
      k.key = key_of(e->name);
      ++k.count;
      k.cpu_time_total_us += us;
      k.self_cpu_time_total_us += us - children;
    };
    for (const auto* e : list) {
      while (!open.empty() && open.back().first->end_ns <= e->start_ns) {
        close(open.back().first, open.back().second);
        open.pop_back();
      }
      if (!open.empty()) open.back().second += static_cast<double>(e->end_ns - e->start_ns) / 1e3;
      open.emplace_back(e, 0.0);
    }
    while (!open.empty()) {
      close(open.back().first, open.back().second);
      open.pop_back();
    }
  }
  std::vector<KeyAverage> sorted;
  for (auto& [key, k] : out) sorted.push_back(std::move(k));
  auto by = [&](auto value) {
    std::stable_sort(sorted.begin(), sorted.end(),
                     [&](const KeyAverage& a, const KeyAverage& b) { return value(a) > value(b); });
  };
  if (sort_by == "cpu_time_total") {
    by([](const KeyAverage& k) { return k.cpu_time_total_us; });
  } else if (sort_by == "self_cpu_time_total") {
    by([](const KeyAverage& k) { return k.self_cpu_time_total_us; });
  } else if (sort_by == "cpu_time") {
    by([](const KeyAverage& k) { return k.cpu_time_avg_us(); });
  } else if (sort_by == "count") {
    by([](const KeyAverage& k) { return static_cast<double>(k.count); });
  } else {
    throw Error("loom::Profiler: cannot sort by \"" + std::string(sort_by) +
                "\"; sort by cpu_time_total, self_cpu_time_total, cpu_time or count");
  }
  return sorted;
}

std::string Profiler::table(std::string_view sort_by, int row_limit) const {
  const auto rows = key_averages(sort_by);
  double self_total = 0;
  for (const auto& k : rows) self_total += k.self_cpu_time_total_us;
  constexpr std::size_t max_name = 55, width = 12;
  std::size_t name_width = 4;
  for (const auto& k : rows) name_width = std::max(name_width, k.key.size() + 4);
  name_width = std::min(name_width, max_name + 4);
  const std::vector<std::string> heads{"Self CPU %", "Self CPU",     "CPU total %",
                                       "CPU total",  "CPU time avg", "# of Calls"};
  auto pad = [](std::string text, std::size_t n, bool left) {
    if (text.size() >= n) return text;
    return left ? text + std::string(n - text.size(), ' ')
                : std::string(n - text.size(), ' ') + text;
  };
  std::string rule = std::string(name_width, '-');
  for (std::size_t i = 0; i < heads.size(); ++i) rule += "  " + std::string(width, '-');
  rule += "  \n";
  std::string out = rule + pad("Name", name_width, true);
  for (const auto& h : heads) out += "  " + pad(h, width, false);
  out += "  \n" + rule;
  int n = 0;
  for (const auto& k : rows) {
    if (row_limit > 0 && n++ >= row_limit) break;
    std::string name = k.key;
    if (name.size() > max_name) name = name.substr(0, max_name - 3) + "...";
    out += pad(name, name_width, true);
    for (const auto& cell :
         {format_share(k.self_cpu_time_total_us, self_total), format_time(k.self_cpu_time_total_us),
          format_share(k.cpu_time_total_us, self_total), format_time(k.cpu_time_total_us),
          format_time(k.cpu_time_avg_us()), std::to_string(k.count)}) {
      out += "  " + pad(cell, width, false);
    }
    out += "  \n";
  }
  out += rule + "Self CPU time total: " + format_time(self_total) + "\n";
  return out;
}

}  // namespace loom
