#pragma once
// Every public loom header, and the shipped policies under their short names.
#include <loom/amp/autocast.hpp>
#include <loom/amp/grad_scaler.hpp>
#include <loom/batch/adapt.hpp>
#include <loom/batch/walk.hpp>
#include <loom/concepts/batch.hpp>
#include <loom/concepts/device_policy.hpp>
#include <loom/concepts/precision_policy.hpp>
#include <loom/concepts/scope_guard.hpp>
#include <loom/data/cuda_prefetch.hpp>
#include <loom/data/device_loader.hpp>
#include <loom/data/prefetch.hpp>
#include <loom/device/cpu.hpp>
#include <loom/device/cuda.hpp>
#include <loom/device/defaults.hpp>
#include <loom/device/optimizer_state.hpp>
#include <loom/device/select.hpp>
#include <loom/error.hpp>
#include <loom/guards.hpp>
#include <loom/precision/defaults.hpp>
#include <loom/precision/cast.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/precision/fp64.hpp>
#include <loom/precision/half.hpp>
#include <loom/precision/mixed.hpp>
#include <loom/precision/select.hpp>
#include <loom/precision/uniform.hpp>
#include <loom/runtime.hpp>
#include <loom/select.hpp>
#include <loom/state_dict.hpp>
#include <loom/version.hpp>

namespace loom {
using device::Cpu;
using device::Cuda;
using precision::Bf16Mixed;
using precision::Bf16True;
using precision::Fp16Mixed;
using precision::Fp16True;
using precision::Fp32;
using precision::Fp64;
}  // namespace loom
