// loom's optimizer table (optim/optimizer_table.hpp): the table itself, its LibTorch rows
// (optim/libtorch_traits.hpp: LibTorch's six optimizers, three of them in Python's layout) and the
// lookups, compiled once here rather than in every translation unit that steps an optimizer.
#include <atomic>
#include <cstdint>
#include <mutex>
#include <typeindex>
#include <typeinfo>
#include <utility>

#include <torch/optim/adagrad.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/lbfgs.h>
#include <torch/optim/rmsprop.h>
#include <torch/optim/sgd.h>

#include <loom/optim/libtorch_traits.hpp>
#include <loom/optim/optimizer_table.hpp>

namespace loom::optim {
namespace detail {

Table::Table() {
  add(make_info<torch::optim::SGD>());
  add(make_info<torch::optim::Adam>());
  add(make_info<torch::optim::AdamW>());
  add(make_info<torch::optim::RMSprop>());
  add(make_info<torch::optim::Adagrad>());
  add(make_info<torch::optim::LBFGS>());
}

void Table::add(OptimizerInfo info) {
  const OptimizerInfo& row = rows.emplace_back(std::move(info));
  by_type.insert_or_assign(row.type, &row);
  movers.try_emplace(row.state_type, row.move_state);
  by_subclass.clear();
  generation.fetch_add(1, std::memory_order_release);
}

Table& table() {
  static Table t;
  return t;
}

StateMover state_mover(const std::type_info& state) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.movers.find(std::type_index(state));
  return it == t.movers.end() ? StateMover() : it->second;
}

void add_state_mover(std::type_index state, StateMover mover) {
  auto& t = table();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.movers.insert_or_assign(state, std::move(mover));
}

}  // namespace detail

const OptimizerInfo* find_optimizer(const torch::optim::Optimizer& optimizer) {
  auto& t = detail::table();
  const std::type_info& type = typeid(optimizer);
  struct Last {
    const std::type_info* type = nullptr;
    std::uint64_t generation = 0;
    const OptimizerInfo* info = nullptr;
  };
  thread_local Last last;
  const auto generation = t.generation.load(std::memory_order_acquire);
  if (last.type != nullptr && *last.type == type && last.generation == generation) {
    return last.info;
  }
  const OptimizerInfo* info = nullptr;
  {
    std::lock_guard<std::mutex> lock(t.mutex);
    const std::type_index key(type);
    if (auto it = t.by_type.find(key); it != t.by_type.end()) {
      info = it->second;
    } else if (auto sub = t.by_subclass.find(key); sub != t.by_subclass.end()) {
      info = sub->second;
    } else {
      for (auto row = t.rows.rbegin(); row != t.rows.rend(); ++row) {
        if (t.by_type.at(row->type) == &*row && row->is(optimizer)) {
          info = &*row;
          break;
        }
      }
      t.by_subclass.emplace(key, info);
    }
    last = Last{&type, t.generation.load(std::memory_order_relaxed), info};
  }
  return info;
}

}  // namespace loom::optim
