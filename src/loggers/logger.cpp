// loom::Logger, loom::MetricValue and loom::Loggers (include/loom/loggers/logger.hpp).
#include <loom/loggers/logger.hpp>

#include <algorithm>
#include <chrono>
#include <iterator>
#include <string>
#include <utility>

#include <ATen/ATen.h>

#include <loom/error.hpp>

namespace loom::loggers {

namespace {

double now_s() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

MetricValue::MetricValue(const at::Tensor& t) : tensor_(t) {
  if (!t.defined()) throw Error("loom::Logger: a metric tensor is undefined");
  if (t.numel() != 1) {
    throw Error("loom::Logger: a metric tensor must hold one element, got " +
                std::to_string(t.numel()));
  }
  if (t.is_complex()) throw Error("loom::Logger: a metric tensor must be real, got complex");
  integral_ = at::isIntegralType(t.scalar_type(), /*includeBool=*/true);
}

Logger::Logger(const LoggerOptions& options)
    : rank_(options.rank.value_or(0)),
      explicit_rank_(options.rank),
      flush_every_(options.flush_every) {
  if (flush_every_ < 1) {
    throw Error("loom::Logger: flush_every must be at least 1, got " +
                std::to_string(flush_every_));
  }
}

void Logger::attach(int64_t rank) {
  if (explicit_rank_ && *explicit_rank_ != rank) {
    throw Error("loom::Logger: the logger was given rank " + std::to_string(*explicit_rank_) +
                " (LoggerOptions::rank) but is attached to a runtime of rank " +
                std::to_string(rank));
  }
  rank_ = rank;
  if (!writes()) rows_.clear();  // never to be written
}

void Logger::add_row(Row row) {
  const int64_t step = row.step;
  last_step_ = std::max(last_step_, step);
  for (auto& [name, v] : row.values) {
    if (v.tensor_.defined()) {  // a snapshot on the tensor's device: a copy, no sync
      v.tensor_ = v.tensor_.detach().reshape({}).to(at::kDouble, /*non_blocking=*/false,
                                                    /*copy=*/true);
    }
  }
  rows_.push_back(std::move(row));
  if ((step + 1) % flush_every_ == 0) flush();
}

void Logger::log(std::string_view name, const MetricValue& value, int64_t step) {
  if (!writes()) return;
  Row row{step, now_s(), {}};
  row.values.emplace_back(std::string(name), value);
  add_row(std::move(row));
}

void Logger::log_dict(std::initializer_list<std::pair<std::string_view, MetricValue>> metrics,
                      int64_t step) {
  if (!writes()) return;
  Row row{step, now_s(), {}};
  for (const auto& [name, v] : metrics) row.values.emplace_back(std::string(name), v);
  add_row(std::move(row));
}

void Logger::log_dict(const std::vector<std::pair<std::string, MetricValue>>& metrics,
                      int64_t step) {
  if (!writes()) return;
  add_row(Row{step, now_s(), metrics});
}

void Logger::log_hyperparams(const Hyperparams& params) {
  if (writes()) write_hyperparams(params);
}

void Logger::flush() {
  if (!writes() || rows_.empty()) return;
  // The buffered tensors, by device: one stack and one copy to the host per device.
  std::vector<std::pair<c10::Device, std::vector<MetricValue*>>> groups;
  for (auto& row : rows_) {
    for (auto& [name, v] : row.values) {
      if (!v.tensor_.defined()) continue;
      const auto d = v.tensor_.device();
      auto it = groups.begin();
      while (it != groups.end() && it->first != d) ++it;
      if (it == groups.end()) {
        groups.emplace_back(d, std::vector<MetricValue*>{});
        it = std::prev(groups.end());
      }
      it->second.push_back(&v);
    }
  }
  for (auto& [device, values] : groups) {
    std::vector<at::Tensor> ts;
    ts.reserve(values.size());
    for (auto* v : values) ts.push_back(v->tensor_);
    const at::Tensor host = at::stack(ts).cpu().contiguous();
    const double* data = host.const_data_ptr<double>();
    for (std::size_t i = 0; i < values.size(); ++i) {
      values[i]->number_ = data[i];
      values[i]->tensor_ = at::Tensor();
    }
  }
  write_rows(rows_);
  rows_.clear();
  sync_file();
}

void Logger::close() noexcept {
  try {
    flush();
  } catch (const std::exception& e) {
    TORCH_WARN("loom::Logger: the last flush failed: ", e.what());
  } catch (...) {
    TORCH_WARN("loom::Logger: the last flush failed");
  }
}

void Loggers::add(std::shared_ptr<Logger> logger) {
  if (!logger) throw Error("loom::Loggers: the logger is null");
  loggers_.push_back(std::move(logger));
}

void Loggers::log(std::string_view name, const MetricValue& value, int64_t step) {
  for (auto& l : loggers_) l->log(name, value, step);
}

void Loggers::log_dict(std::initializer_list<std::pair<std::string_view, MetricValue>> metrics,
                       int64_t step) {
  for (auto& l : loggers_) l->log_dict(metrics, step);
}

void Loggers::log_dict(const std::vector<std::pair<std::string, MetricValue>>& metrics,
                       int64_t step) {
  for (auto& l : loggers_) l->log_dict(metrics, step);
}

void Loggers::log_hyperparams(const Hyperparams& params) {
  for (auto& l : loggers_) l->log_hyperparams(params);
}

void Loggers::flush() {
  for (auto& l : loggers_) l->flush();
}

}  // namespace loom::loggers
