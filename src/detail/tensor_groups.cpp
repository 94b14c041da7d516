// loom::detail::group_by_device_and_dtype and DeviceReplicas (detail/tensor_groups.hpp):
// compiled here so that ATen's native header stays out of the headers that use them.
#include <cstddef>
#include <optional>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <ATen/native/ForeachUtils.h>

#include <loom/detail/tensor_groups.hpp>

namespace loom::detail {

std::vector<TensorGroup> group_by_device_and_dtype(const std::vector<at::TensorList>& lists) {
  if (lists.empty() || lists.front().empty()) return {};  // ATen refuses an empty first list
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
