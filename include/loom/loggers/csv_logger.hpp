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
  /// version_N's N; unset: one more than the largest version_N under ROOT/NAME (0 if none).
  std::optional<int64_t> version = std::nullopt;
  /// Logger::flush after each step s with (s + 1) % flush_every == 0.
  int64_t flush_every = 100;
  /// Only rank 0 writes; unset: the RANK variable torchrun sets, else 0.
  std::optional<int64_t> rank = std::nullopt;
  /// A resumed run (its checkpoint's {"runtime", rt} entry loaded, with this logger added to
  /// the runtime before) writes on into the saved run's version_N, from the resumed step;
  /// false: it keeps the new version_N it opened (Lightning without version=).
  bool continue_on_resume = true;
};

/// Metrics as `ROOT/NAME/version_N/metrics.csv`, the file Lightning's CSVLogger writes: one row
/// per log / log_dict call, a `step` column, the columns sorted by name, a value missing from
/// a row left empty, numbers as Python writes them (`repr`), `\r\n` line ends (Python's csv
/// module); a new column rewrites the file with the new header. Hyper-parameters go to
/// `hparams.yaml` beside it. Read it with Python's `csv.DictReader` or pandas.
class CsvLogger : public Logger {
 public:
  explicit CsvLogger(std::filesystem::path root_dir, const LogDirOptions& options = {});
  ~CsvLogger() override { close(); }

  /// ROOT/NAME/version_N.
  const std::filesystem::path& log_dir() const noexcept { return log_dir_; }
  /// log_dir() / "metrics.csv".
  std::filesystem::path metrics_file() const { return log_dir_ / "metrics.csv"; }
  int64_t version() const noexcept { return version_; }

  int64_t version_in_use() const override { return writes() ? version_ : -1; }
  /// Writes on in ROOT/NAME/version_`version` (removing the folder this run opened, if
  /// nothing was written there), dropping the rows of steps after `step` from its
  /// metrics.csv: the resumed run logs those steps again.
  void continue_version(int64_t version, int64_t step) override;

 protected:
  void write_rows(const std::vector<Row>& rows) override;
  void write_hyperparams(const Hyperparams& params) override;

 private:
  std::filesystem::path log_dir_;
  int64_t version_;
  bool continue_on_resume_;
  std::vector<std::string> keys_;  // the header, sorted
};

namespace detail {
/// ROOT/NAME/version_N for `o` (the next free N where o.version is unset), as Lightning's
/// loggers pick it.
std::filesystem::path log_dir_of(const std::filesystem::path& root, const LogDirOptions& o,
                                 int64_t& version);
/// log_dir_of, and the folder made where `create` (rank 0); `owner` starts the error.
std::filesystem::path make_log_dir(const std::filesystem::path& root, const LogDirOptions& o,
                                   int64_t& version, bool create, const char* owner);
/// For continue_version: `current`'s sibling version_`version`, made, and `current` removed
/// when it is empty (the folder a resumed run opened before it knew); `owner` starts the error.
std::filesystem::path switch_log_dir(const std::filesystem::path& current, int64_t version,
                                     const char* owner);
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
