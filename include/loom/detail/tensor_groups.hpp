#pragma once
// Tensors grouped by (device, dtype), and a tensor kept once per device: what every foreach or
// fused call over many tensors needs (src/detail/tensor_groups.cpp). The grouping is ATen's,
// the one Python's `torch.utils._foreach_utils._group_tensors_by_device_and_dtype` calls; the
// per-device tensors are torch's `_MultiDeviceReplicator` and the per-device dicts of its
// GradScaler and fused optimizers. Users: the GradScaler, loom::optim's fused optimizers, the
// gradient clip and loom::Zero.
#include <cstddef>
#include <utility>
#include <vector>

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

namespace loom::detail {

/// One group of group_by_device_and_dtype: the tensors at `indices` of every list.
struct TensorGroup {
  c10::Device device;                          // of the first list's tensors
  c10::ScalarType dtype;                       // of the first list's tensors
  std::vector<std::vector<at::Tensor>> lists;  // lists[k][j]: list k's tensor at indices[j]
  std::vector<std::size_t> indices;            // ascending
};

/// `lists` (parallel: the same index in each is one item) split by the device and dtype of
/// the first list's tensors, by ATen's `_group_tensors_by_first_tensors_device_and_dtype`. The
/// groups come in the order of that function's hash map, the order Python's foreach and fused
/// code sees: neither first-seen nor sorted. Each group keeps the given order. A list may be
/// empty (its lists[k] stay empty); otherwise it is as long as the first. The first list's
/// tensors must be defined; another list's may be undefined (passed through). Another list's
/// tensor must share the first one's device and dtype, or be f32, f64 or bf16 on that device,
/// or f32 or f64 on the CPU (optimizer steps); ATen throws c10::Error otherwise. An empty first
/// list gives no groups.
std::vector<TensorGroup> group_by_device_and_dtype(const std::vector<at::TensorList>& lists);

/// A tensor per device, made on its first request and then looked up; kept in request order.
/// A returned reference holds until the next request.
class DeviceReplicas {
 public:
  /// No master: tensors come only from get(device, make).
  DeviceReplicas() = default;

  /// Copies of `master` (an undefined one: none to copy).
  explicit DeviceReplicas(at::Tensor master) : master_(std::move(master)) {}

  /// The master given, or an undefined tensor.
  const at::Tensor& master() const noexcept { return master_; }

  /// The master on `device`, copied without a sync on the first request. Replicas are only
  /// read, so on the master's own device it is the master itself: no copy there.
  const at::Tensor& get(const c10::Device& device);

  /// The tensor on `device`, made by `make()` on the first request.
  template <class Make>
  at::Tensor& get(const c10::Device& device, Make&& make) {
    for (auto& entry : per_device_) {
      if (entry.first == device) return entry.second;
    }
    per_device_.emplace_back(device, std::forward<Make>(make)());
    return per_device_.back().second;
  }

  /// The tensors made, with their devices, in request order.
  std::vector<std::pair<c10::Device, at::Tensor>> release() && { return std::move(per_device_); }

 private:
  at::Tensor master_;
  std::vector<std::pair<c10::Device, at::Tensor>> per_device_;
};

}  // namespace loom::detail
