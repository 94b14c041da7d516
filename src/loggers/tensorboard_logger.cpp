// loom::TensorBoardLogger (include/loom/loggers/tensorboard_logger.hpp): TFRecord framing of
// Event messages encoded by libprotobuf (tensorboard_event.proto); CRC-32C from Boost.CRC.
#include <loom/loggers/tensorboard_logger.hpp>

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>

#include <boost/crc.hpp>

#include <loom/error.hpp>

#include "tensorboard_event.pb.h"

namespace fs = std::filesystem;

namespace loom::loggers {

namespace detail {

uint32_t masked_crc32c(const void* data, std::size_t size) {
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data, size);
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

}  // namespace detail

namespace {

std::atomic<int> next_uid{0};  // TensorBoard's _global_uid: one more per file in a process

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

std::string host_name() {
  char buf[256] = {};
  if (::gethostname(buf, sizeof buf - 1) != 0) return "localhost";
  return buf;
}

}  // namespace

TensorBoardLogger::TensorBoardLogger(fs::path root_dir, const LogDirOptions& options)
    : Logger(LoggerOptions{options.flush_every, options.rank}),
      dir_(root_dir, options, "loom::TensorBoardLogger"),
      continue_on_resume_(options.continue_on_resume) {}

void TensorBoardLogger::open() {
  if (out_ != nullptr) return;
  dir_.make();
  open_event_file();
}

void TensorBoardLogger::continue_version(int64_t version, int64_t step) {
  if (!writes() || !continue_on_resume_) return;
  flush();
  if (out_ != nullptr && version != dir_.version()) {
    std::fclose(out_);
    out_ = nullptr;
    std::error_code ec;
    if (!wrote_rows_) fs::remove(file_, ec);  // only its first event: nothing to keep
    wrote_rows_ = false;
  }
  if (out_ == nullptr) {
    dir_.switch_to(version);
    open_event_file();
  }
  // SummaryWriter(purge_step): a START session log at the first step to come.
  tensorboard::Event purge;
  purge.set_wall_time(now_s());
  purge.set_step(step + 1);
  purge.mutable_session_log()->set_status(tensorboard::SessionLog::START);
  write_record(purge.SerializeAsString());
  sync_file();
}

void TensorBoardLogger::open_event_file() {
  const double t = now_s();
  char name[64];
  std::snprintf(name, sizeof name, "events.out.tfevents.%010lld.", static_cast<long long>(t));
  file_ = log_dir() / (name + host_name() + "." + std::to_string(::getpid()) + "." +
                       std::to_string(next_uid++));
  out_ = std::fopen(file_.c_str(), "wb");
  if (out_ == nullptr) {
    throw Error("loom::TensorBoardLogger: cannot create " + file_.string() + ": " +
                std::strerror(errno));
  }
  tensorboard::Event first;
  first.set_wall_time(t);
  first.set_file_version("brain.Event:2");
  write_record(first.SerializeAsString());
  sync_file();
}

TensorBoardLogger::~TensorBoardLogger() {
  close();
  if (out_ != nullptr) std::fclose(out_);
}

void TensorBoardLogger::write_record(const std::string& data) {
  // TFRecord: length (u64 LE), its masked CRC-32C, the data, the data's masked CRC-32C.
  unsigned char head[12];
  const uint64_t n = data.size();
  for (int i = 0; i < 8; ++i) head[i] = static_cast<unsigned char>(n >> (8 * i));
  const uint32_t len_crc = detail::masked_crc32c(head, 8);
  for (int i = 0; i < 4; ++i) head[8 + i] = static_cast<unsigned char>(len_crc >> (8 * i));
  const uint32_t data_crc = detail::masked_crc32c(data.data(), data.size());
  unsigned char tail[4];
  for (int i = 0; i < 4; ++i) tail[i] = static_cast<unsigned char>(data_crc >> (8 * i));
  if (std::fwrite(head, 1, sizeof head, out_) != sizeof head ||
      std::fwrite(data.data(), 1, data.size(), out_) != data.size() ||
      std::fwrite(tail, 1, sizeof tail, out_) != sizeof tail) {
    throw Error("loom::TensorBoardLogger: cannot write " + file_.string() + ": " +
                std::strerror(errno));
  }
}

void TensorBoardLogger::write_rows(const std::vector<Row>& rows) {
  open();
  wrote_rows_ = wrote_rows_ || !rows.empty();
  tensorboard::Event e;
  for (const auto& row : rows) {
    for (const auto& [name, v] : row.values) {
      e.Clear();
      e.set_wall_time(row.wall_time);
      e.set_step(row.step);
      auto* value = e.mutable_summary()->add_value();
      value->set_tag(name);
      value->set_simple_value(static_cast<float>(v.number()));
      write_record(e.SerializeAsString());
    }
  }
}

void TensorBoardLogger::write_hyperparams(const Hyperparams& params) {
  open();
  detail::write_hparams_yaml(log_dir() / "hparams.yaml", params);
}

void TensorBoardLogger::sync_file() {
  if (out_ != nullptr && std::fflush(out_) != 0) {
    throw Error("loom::TensorBoardLogger: cannot write " + file_.string() + ": " +
                std::strerror(errno));
  }
}

}  // namespace loom::loggers
