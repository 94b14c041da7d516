// expect-error: Device does not model DevicePolicy. Common mistake: passing torch::Device
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
