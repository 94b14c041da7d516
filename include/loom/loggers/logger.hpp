#pragma once
// loom::Logger: the base of loom's metric loggers (CsvLogger, TensorBoardLogger): Fabric's
// log / log_dict / log_hyperparams, rank 0 only, device tensors buffered and read once per
// flush. MetricValue, Hyperparams, LoggerOptions. Light: the runtime includes it.
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include <ATen/core/Tensor.h>

namespace loom::loggers {

/// A metric's value: a number on the host, or a one-element tensor on any device, copied
/// when logged (no sync) and read to the host when the logger flushes.
class MetricValue {
 public:
  MetricValue(double v) : number_(v) {}                                         // NOLINT
  MetricValue(float v) : number_(static_cast<double>(v)) {}                     // NOLINT
  MetricValue(int v) : number_(static_cast<double>(v)), integral_(true) {}      // NOLINT
  MetricValue(int64_t v) : number_(static_cast<double>(v)), integral_(true) {}  // NOLINT
  MetricValue(const at::Tensor& t);                                             // NOLINT

  bool is_tensor() const noexcept { return tensor_.defined(); }
  /// The tensor's snapshot (0-dim, f64, on the tensor's device); undefined for a number.
  const at::Tensor& tensor() const noexcept { return tensor_; }
  /// The number (for a tensor: only once read, see Logger::flush).
  double number() const noexcept { return number_; }
  /// Whether the value is an integer (an int, or a tensor of an integral dtype or bool).
  bool integral() const noexcept { return integral_; }

 private:
  friend class Logger;
  double number_ = 0.0;
  bool integral_ = false;
  at::Tensor tensor_;
};

/// A hyper-parameter's value.
using HyperValue = std::variant<bool, int64_t, double, std::string>;
/// Hyper-parameters by name, logged once (Lightning's log_hyperparams).
using Hyperparams = std::vector<std::pair<std::string, HyperValue>>;

/// What every logger takes.
struct LoggerOptions {
  /// A flush after each logged step s with (s + 1) % flush_every == 0 (Lightning's
  /// flush_logs_every_n_steps); a flush reads the buffered tensors with one copy per device.
  int64_t flush_every = 100;
  /// The process's rank; only rank 0 writes. Unset: 0 until rt.add_logger gives the logger
  /// its runtime's strategy's rank (Logger::attach). No environment variable is read.
  std::optional<int64_t> rank = std::nullopt;
};

/// The base of loom's loggers: Fabric's logging calls with Lightning's buffering, rank 0 only.
///
///   auto csv = std::make_shared<loom::CsvLogger>("logs");
///   rt.add_logger(csv);                     // or call csv->log(...) directly
///   rt.log("train/loss", loss, step);       // a device tensor: copied, read at the flush
///   rt.log_dict({{"lr", lr}, {"epoch", epoch}}, step);
///
/// Its rank is the strategy's, given by rt.add_logger (attach), or LoggerOptions::rank; a logger
/// with neither is rank 0. On other ranks every call returns at once and nothing is read,
/// written or created. A derived logger writes rows (write_rows) and hyper-parameters
/// (write_hyperparams), makes its files at the first of those (never in its constructor), and
/// calls close() in its destructor, which flushes what is left.
class Logger {
 public:
  virtual ~Logger() = default;
  Logger(const Logger&) = delete;
  Logger& operator=(const Logger&) = delete;

  /// One metric at `step` (Fabric's log(name, value, step)): one row.
  void log(std::string_view name, const MetricValue& value, int64_t step);
  /// Several metrics at `step` (Fabric's log_dict): one row.
  void log_dict(std::initializer_list<std::pair<std::string_view, MetricValue>> metrics,
                int64_t step);
  void log_dict(const std::vector<std::pair<std::string, MetricValue>>& metrics, int64_t step);
  /// Hyper-parameters, written at once (rank 0).
  void log_hyperparams(const Hyperparams& params);
  /// Reads the buffered tensors (one copy to the host per device) and writes every buffered
  /// row, then the writer's own flush.
  void flush();

  /// Whether this process writes (rank 0).
  bool writes() const noexcept { return rank_ == 0; }
  int64_t rank() const noexcept { return rank_; }
  /// Gives the logger the process's rank: rt.add_logger calls it with the runtime's strategy's
  /// rank (Lightning's loggers take rank_zero_only.rank from the strategy). Without
  /// LoggerOptions::rank the logger takes `rank`; with it, `rank` must be that rank, else a
  /// loom::Error naming both (a logger built for one rank added to another rank's runtime).
  /// A logger that stops writing drops the rows it buffered; call it before logging.
  void attach(int64_t rank);
  int64_t flush_every() const noexcept { return flush_every_; }
  /// How many rows wait for the next flush.
  std::size_t buffered() const noexcept { return rows_.size(); }

  /// The highest step logged so far (-1: none).
  int64_t last_step() const noexcept { return last_step_; }
  /// The N of the ROOT/NAME/version_N folder this logger writes into (decided when first
  /// asked, the folder made at the first write); -1 when it has none (a logger that writes
  /// elsewhere, or a rank other than 0). A checkpoint's runtime entry
  /// ({"runtime", rt}) records it, with last_step(), for each logger of the runtime.
  virtual int64_t version_in_use() const { return -1; }
  /// A resumed run (that entry loaded): writes on into version `version` after step `step`,
  /// as Lightning's loggers do given version=N, instead of a new version_N. What the logger
  /// wrote after `step` before the run stopped is its own to drop (CsvLogger removes those
  /// rows, TensorBoardLogger marks them purged); a logger without folders does nothing.
  virtual void continue_version(int64_t version, int64_t step) {
    (void)version;
    (void)step;
  }

 protected:
  /// One logged row, its tensors read: (name, value) in the order logged.
  struct Row {
    int64_t step = 0;
    double wall_time = 0.0;  ///< seconds since the epoch, when it was logged
    std::vector<std::pair<std::string, MetricValue>> values;
  };

  explicit Logger(const LoggerOptions& options);

  virtual void write_rows(const std::vector<Row>& rows) = 0;
  virtual void write_hyperparams(const Hyperparams& params) = 0;
  /// After write_rows: push what was written to the file.
  virtual void sync_file() {}

  /// For a derived destructor: flush, never throwing.
  void close() noexcept;

 private:
  void add_row(Row row);

  int64_t rank_;
  std::optional<int64_t> explicit_rank_;  // LoggerOptions::rank
  int64_t flush_every_;
  int64_t last_step_ = -1;
  std::vector<Row> rows_;
};

/// Several loggers fed as one (the runtime's list).
class Loggers {
 public:
  void add(std::shared_ptr<Logger> logger);
  const std::vector<std::shared_ptr<Logger>>& all() const noexcept { return loggers_; }
  bool empty() const noexcept { return loggers_.empty(); }

  void log(std::string_view name, const MetricValue& value, int64_t step);
  void log_dict(std::initializer_list<std::pair<std::string_view, MetricValue>> metrics,
                int64_t step);
  void log_dict(const std::vector<std::pair<std::string, MetricValue>>& metrics, int64_t step);
  void log_hyperparams(const Hyperparams& params);
  void flush();

 private:
  std::vector<std::shared_ptr<Logger>> loggers_;
};

}  // namespace loom::loggers

// The loggers' names in loom::, where users write them.
namespace loom {
using loggers::Hyperparams;
using loggers::HyperValue;
using loggers::Logger;
using loggers::LoggerOptions;
using loggers::Loggers;
using loggers::MetricValue;
}  // namespace loom
