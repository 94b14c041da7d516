// expect-error: the Device argument is torch::Device \(or c10::DeviceType\), not a device policy. Common mistake
// reject-error: it lacks
#include <c10/core/Device.h>
#include <loom/device/cpu.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/runtime.hpp>
#ifdef LOOM_FAIL
using R = loom::Runtime<c10::Device, loom::precision::Fp32>;
#else
using R = loom::Runtime<loom::device::Cpu, loom::precision::Fp32>;
#endif
static_assert(sizeof(R) > 0);
