// loom::detail::group_by_device_and_dtype and DeviceReplicas (detail/tensor_groups.hpp):
// compiled here so that ATen's native header stays out of the headers that use them. Tensors
// of one (device, dtype) are one group without ATen's map (its answer, found cheaper); any
// other case, the invalid ones included, is ATen's.
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/native/ForeachUtils.h>

#include <loom/detail/tensor_groups.hpp>

namespace loom::detail {

namespace {

// Whether every tensor of `lists` is on the first list's first tensor's device with its dtype
// (another list's may be undefined, or the list empty), so that ATen's grouping would give one
// group of the lists as they are: the case of nearly every step, answered without its map.
bool one_group(const std::vector<at::TensorList>& lists) {
  const at::TensorList first = lists.front();
  if (!first.front().defined()) return false;
  const c10::Device device = first.front().device();
  const c10::ScalarType dtype = first.front().scalar_type();
  for (const auto& list : lists) {
    if (list.size() != first.size() && !list.empty()) return false;
    const bool first_list = &list == &lists.front();
    for (const auto& t : list) {
      if (!t.defined()) {
        if (first_list) return false;  // ATen's error
        continue;
      }
      if (t.device() != device || t.scalar_type() != dtype) return false;
    }
  }
  return true;
}

}  // namespace

std::vector<TensorGroup> group_by_device_and_dtype(const std::vector<at::TensorList>& lists) {
  if (lists.empty() || lists.front().empty()) return {};  // ATen refuses an empty first list
  if (one_group(lists)) {
    std::vector<TensorGroup> groups;
    auto& group = groups.emplace_back(
        TensorGroup{lists.front().front().device(), lists.front().front().scalar_type(), {}, {}});
    group.lists.reserve(lists.size());
    for (const auto& list : lists) group.lists.emplace_back(list.begin(), list.end());
    group.indices.resize(lists.front().size());
    for (std::size_t i = 0; i < group.indices.size(); ++i) group.indices[i] = i;
    return groups;
  }
  at::native::nested_optional_tensorvec_t nested;
  nested.reserve(lists.size());
  for (const auto& list : lists) {
    auto& optionals = nested.emplace_back();
    optionals.reserve(list.size());
    for (const auto& t : list) {
      optionals.push_back(t.defined() ? std::optional<at::Tensor>(t) : std::nullopt);
    }
  }
  std::vector<TensorGroup> groups;
  for (auto& [key, value] : at::native::_group_tensors_by_first_tensors_device_and_dtype(
           nested, /*with_indices=*/true)) {
    auto& group = groups.emplace_back(TensorGroup{key.first, key.second, {}, {}});
    group.lists.reserve(value.first.size());
    for (auto& optionals : value.first) {
      auto& list = group.lists.emplace_back();
      list.reserve(optionals.size());
      for (auto& t : optionals) list.push_back(t.has_value() ? std::move(*t) : at::Tensor());
    }
    group.indices = std::move(value.second);
  }
  return groups;
}

const at::Tensor& DeviceReplicas::get(const c10::Device& device) {
  return get(device,
             [&] { return master_.to(device, master_.scalar_type(), /*non_blocking=*/true); });
}

}  // namespace loom::detail
