#pragma once
// loom::CsvLogger: Lightning's CSVLogger layout (ROOT/NAME/version_N/metrics.csv, hparams.yaml).
#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include <loom/loggers/logger.hpp>

namespace loom::loggers {

/// Where a logger writes and how often: Lightning's logger arguments.
struct LogDirOptions {
  /// The experiment's folder under the root ("" for none).
  std::string name = "lightning_logs";
  /// version_N's N; unset: one more than the largest version_N under ROOT/NAME (0 if none)
  /// when the version is first needed (the first write, or log_dir() / version() asked
  /// before it), as Lightning's `version` property decides it.
  std::optional<int64_t> version = std::nullopt;
  /// Logger::flush after each step s with (s + 1) % flush_every == 0.
  int64_t flush_every = 100;
  /// Only rank 0 writes; unset: the rank rt.add_logger gives (the strategy's), else 0
  /// (LoggerOptions::rank, Logger::attach).
  std::optional<int64_t> rank = std::nullopt;
  /// A resumed run (its checkpoint's {"runtime", rt} entry loaded, with this logger added to
  /// the runtime before) writes on into the saved run's version_N, from the resumed step;
  /// false: it keeps the new version_N it opened (Lightning without version=).
  bool continue_on_resume = true;
};

namespace detail {
/// A logger's ROOT/NAME/version_N, decided lazily as Lightning's loggers do: the version when
/// first asked (the next free one, listing ROOT/NAME, where none is given), the folder made
/// at the first write only. A logger on a rank that does not write never asks.
class LogDir {
 public:
  /// `owner` (a string literal) starts the errors; a negative options.version is one.
  LogDir(const std::filesystem::path& root, const LogDirOptions& options, const char* owner);

  /// version_N's N: options.version, else decided at the first call (nothing is created).
  int64_t version() const;
  /// ROOT/NAME/version_N (decides the version; nothing is created).
  const std::filesystem::path& path() const;
  /// Whether make() (or switch_to) has made the folder.
  bool made() const noexcept { return made_; }
  /// path(), the folder made if it is not yet.
  const std::filesystem::path& make();
  /// For continue_version: version `version` from now on, its folder made; the folder this
  /// logger had made for another version is removed when it is empty (the folder a resumed
  /// run opened before it knew).
  const std::filesystem::path& switch_to(int64_t version);

 private:
  std::filesystem::path base_;  // ROOT/NAME
  const char* owner_;
  mutable std::optional<int64_t> version_;
  mutable std::filesystem::path path_;
  bool made_ = false;
};
}  // namespace detail

/// Metrics as `ROOT/NAME/version_N/metrics.csv`, the file Lightning's CSVLogger writes: one row
/// per log / log_dict call, a `step` column, the columns sorted by name, a value missing from
/// a row left empty, numbers as Python writes them (`repr`), `\r\n` line ends (Python's csv
/// module); a new column rewrites the file with the new header. Hyper-parameters go to
/// `hparams.yaml` beside it. Read it with Python's `csv.DictReader` or pandas. The folder is
/// made at the first write (a flush with rows, log_hyperparams, continue_version), on rank 0
/// only; constructing one creates nothing.
class CsvLogger : public Logger {
 public:
  explicit CsvLogger(std::filesystem::path root_dir, const LogDirOptions& options = {});
  ~CsvLogger() override { close(); }

  /// ROOT/NAME/version_N (the version decided if it is not yet; the folder is not made).
  const std::filesystem::path& log_dir() const { return dir_.path(); }
  /// log_dir() / "metrics.csv".
  std::filesystem::path metrics_file() const { return log_dir() / "metrics.csv"; }
  /// version_N's N: LogDirOptions::version, else the next free one when first needed.
  int64_t version() const { return dir_.version(); }

  int64_t version_in_use() const override { return writes() ? version() : -1; }
  /// Writes on in ROOT/NAME/version_`version` (removing the folder this run made, if
  /// nothing was written there), dropping the rows of steps after `step` from its
  /// metrics.csv: the resumed run logs those steps again.
  void continue_version(int64_t version, int64_t step) override;

 protected:
  void write_rows(const std::vector<Row>& rows) override;
  void write_hyperparams(const Hyperparams& params) override;

 private:
  /// Before a write: the folder made, and the header of a metrics.csv already there (a
  /// version given again) read, to go on after its rows.
  void open();

  detail::LogDir dir_;
  bool continue_on_resume_;
  std::vector<std::string> keys_;  // the header, sorted
};

namespace detail {
/// Writes `params` to `file` as PyYAML writes Lightning's hparams.yaml (keys sorted).
void write_hparams_yaml(const std::filesystem::path& file, const Hyperparams& params);
/// A double as Python's repr() writes it ("0.1", "1e-05", "1e+16", "3.0", "nan", "-inf").
std::string python_repr(double v);
}  // namespace detail

}  // namespace loom::loggers

// The loggers' names in loom::, where users write them.
namespace loom {
using loggers::CsvLogger;
using loggers::LogDirOptions;
}  // namespace loom
