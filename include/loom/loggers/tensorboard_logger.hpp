#pragma once
// loom::TensorBoardLogger: TensorBoard event files (ROOT/NAME/version_N/events.out.tfevents.*),
// written with libprotobuf; part of the loom::tensorboard library (built where CMake finds
// Protobuf).
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <vector>

#include <loom/loggers/csv_logger.hpp>
#include <loom/loggers/logger.hpp>

namespace loom::loggers {

/// Scalars as a TensorBoard event file in `ROOT/NAME/version_N` (Lightning's TensorBoardLogger
/// layout), the records torch.utils.tensorboard's `SummaryWriter.add_scalar` writes: an
/// Event with the step, the wall time of the log call and a Summary value with the tag and
/// `simple_value` (an f32: a double is rounded to f32 as TensorBoard stores it). Hyper-
/// parameters go to `hparams.yaml` beside it (Lightning writes the same file). The folder and
/// the event file are made at the first write (a flush with rows, log_hyperparams,
/// continue_version), on rank 0 only; constructing one creates nothing. Link
/// `loom::tensorboard`.
class TensorBoardLogger : public Logger {
 public:
  explicit TensorBoardLogger(std::filesystem::path root_dir, const LogDirOptions& options = {});
  ~TensorBoardLogger() override;

  /// ROOT/NAME/version_N (the version decided if it is not yet; the folder is not made).
  const std::filesystem::path& log_dir() const { return dir_.path(); }
  /// The event file (`events.out.tfevents.TIME.HOST.PID.N`, as TensorBoard names it), made at
  /// the first write; empty before.
  const std::filesystem::path& event_file() const noexcept { return file_; }
  /// version_N's N: LogDirOptions::version, else the next free one when first needed.
  int64_t version() const { return dir_.version(); }

  int64_t version_in_use() const override { return writes() ? version() : -1; }
  /// Writes on in ROOT/NAME/version_`version` (a new event file there; the folder this run
  /// made is removed if it holds only its own empty event file), starting with the event
  /// Python's SummaryWriter(purge_step=step + 1) writes: TensorBoard then drops the events of
  /// steps after `step` that the stopped run wrote, and shows the resumed run's instead.
  void continue_version(int64_t version, int64_t step) override;

 protected:
  void write_rows(const std::vector<Row>& rows) override;
  void write_hyperparams(const Hyperparams& params) override;
  void sync_file() override;

 private:
  void write_record(const std::string& data);
  /// Before a write: the folder and the event file made, if they are not yet.
  void open();
  /// A new event file in log_dir(), its first event written.
  void open_event_file();

  detail::LogDir dir_;
  std::filesystem::path file_;
  bool continue_on_resume_;
  bool wrote_rows_ = false;
  std::FILE* out_ = nullptr;
};

namespace detail {
/// CRC-32C (Castagnoli) of `data`, masked as TFRecord files store it.
uint32_t masked_crc32c(const void* data, std::size_t size);
}  // namespace detail

}  // namespace loom::loggers

// The loggers' names in loom::, where users write them.
namespace loom {
using loggers::TensorBoardLogger;
}  // namespace loom
