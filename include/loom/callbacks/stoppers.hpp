#pragma once
// Composer's stoppers on the metrics logged through the runtime (on_log): EarlyStopper (with
// Lightning's EarlyStopping rule) and ThresholdStopper; each decision agreed over the ranks.
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <string_view>
#include <utility>

#include <loom/callbacks/with_callbacks.hpp>
#include <loom/error.hpp>
#include <loom/state_dict.hpp>
#include <loom/state_reader.hpp>

namespace loom {

namespace callbacks {

/// Whether a smaller or a larger value of a metric is better.
enum class Mode {
  Min,  ///< a loss, an error, a perplexity
  Max,  ///< an accuracy
};

/// EarlyStopper's settings (Lightning's EarlyStopping arguments).
struct EarlyStopperOptions {
  /// The metric watched, as logged through rt.log / rt.log_dict.
  std::string metric = "val/loss";
  Mode mode = Mode::Min;
  /// How many logged values without improvement end the run.
  int64_t patience = 3;
  /// An improvement is a value better than the best by more than this (its absolute value).
  double min_delta = 0.0;
  /// A value that is nan or infinite ends the run at once (Lightning's check_finite).
  bool check_finite = true;
};

/// Composer's EarlyStopper with Lightning's EarlyStopping rule: each value of the metric logged
/// through the runtime (on_log) is an improvement when it is better than the best so far by
/// more than min_delta (the first value always is); otherwise the wait grows by one, and at
/// `patience` values without improvement the stopper calls rt.stop(reason).
///
/// The decision is agreed over the ranks: with more than one, each value logged costs one
/// all-reduce (Max of a 0/1 vote) and one read, and every rank stops if one would. Every rank
/// must therefore log the metric at the same steps (the usual pattern: reduce it first, then
/// log on every rank; rt.log reaches callbacks on all ranks and loggers on rank 0 only). A
/// tensor value is read to the host (one sync for each value of the metric logged).
/// State: best, wait.
class EarlyStopper {
 public:
  static constexpr std::string_view kind = "EarlyStopper";

  explicit EarlyStopper(EarlyStopperOptions options = {}) : o_(std::move(options)) {
    if (o_.patience < 1) throw Error("loom::EarlyStopper: patience must be at least 1");
    o_.min_delta = std::abs(o_.min_delta);
    best_ = initial_best();
  }

  template <class R>
  void on(Event<"on_log">, R& rt, std::string_view name, const MetricValue& value, int64_t) {
    if (name != o_.metric) return;
    const double x = value.is_tensor() ? value.tensor().item<double>() : value.number();
    std::string why;
    if (!std::isfinite(x) && o_.check_finite) {
      why = "EarlyStopper: '" + o_.metric + "' is " + detail::number_text(x) +
            ", not finite (best: " + detail::number_text(best_) + ")";
    } else if (o_.mode == Mode::Min ? x < best_ - o_.min_delta : x > best_ + o_.min_delta) {
      best_ = x;
      wait_ = 0;
    } else if (++wait_ >= o_.patience) {
      why = "EarlyStopper: '" + o_.metric + "' did not improve by more than " +
            detail::number_text(o_.min_delta) + " for " + std::to_string(wait_) +
            " checks (best: " + detail::number_text(best_) + ")";
    }
    if (detail::any_rank(rt, !why.empty())) {
      rt.stop(why.empty() ? "EarlyStopper: another rank's '" + o_.metric + "' ended the run" : why);
    }
  }

  /// The best value so far (+inf for Min, -inf for Max before the first).
  double best() const noexcept { return best_; }
  /// Values logged since the last improvement.
  int64_t wait() const noexcept { return wait_; }
  const EarlyStopperOptions& options() const noexcept { return o_; }

  StateDict state_dict() const {
    return {{"best", c10::IValue(best_)}, {"wait", c10::IValue(wait_)}};
  }
  void load_state_dict(const StateDict& state) {
    state::Reader r("loom::EarlyStopper::load_state_dict", state);
    const double best = r.number("best");
    const int64_t wait = r.integer("wait");
    r.finish();
    best_ = best;
    wait_ = wait;
  }

 private:
  double initial_best() const {
    const double inf = std::numeric_limits<double>::infinity();
    return o_.mode == Mode::Min ? inf : -inf;
  }

  EarlyStopperOptions o_;
  double best_;
  int64_t wait_ = 0;
};

/// ThresholdStopper's settings (Composer's arguments).
struct ThresholdStopperOptions {
  std::string metric = "val/loss";
  double threshold = 0.0;
  /// Min: stop once a value is below the threshold (a loss low enough); Max: above it (an
  /// accuracy high enough).
  Mode mode = Mode::Min;
};

/// Composer's ThresholdStopper: stops the run (rt.stop) at the first value of the metric
/// logged through the runtime that crosses the threshold: value < threshold under Min,
/// value > threshold under Max (strictly, as Composer's torch.less / torch.greater; nan never
/// crosses). Agreed over the ranks as EarlyStopper's decision is (one all-reduce per value
/// logged when there is more than one rank; every rank logs the metric at the same steps).
/// No state.
class ThresholdStopper {
 public:
  static constexpr std::string_view kind = "ThresholdStopper";

  explicit ThresholdStopper(ThresholdStopperOptions options = {}) : o_(std::move(options)) {}

  template <class R>
  void on(Event<"on_log">, R& rt, std::string_view name, const MetricValue& value, int64_t) {
    if (name != o_.metric) return;
    const double x = value.is_tensor() ? value.tensor().item<double>() : value.number();
    const bool crossed = o_.mode == Mode::Min ? x < o_.threshold : x > o_.threshold;
    if (detail::any_rank(rt, crossed)) {
      rt.stop(crossed
                  ? "ThresholdStopper: '" + o_.metric + "' = " + detail::number_text(x) +
                        (o_.mode == Mode::Min ? " < " : " > ") + detail::number_text(o_.threshold)
                  : "ThresholdStopper: another rank's '" + o_.metric + "' ended the run");
    }
  }

  const ThresholdStopperOptions& options() const noexcept { return o_; }

 private:
  ThresholdStopperOptions o_;
};

}  // namespace callbacks

// The stoppers' names in loom::, where users write them.
using callbacks::EarlyStopper;
using callbacks::EarlyStopperOptions;
using callbacks::ThresholdStopper;
using callbacks::ThresholdStopperOptions;
using MetricMode = callbacks::Mode;

}  // namespace loom
