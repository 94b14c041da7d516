#pragma once
// Every public loom header, and the shipped policies under their short names.
#include <loom/batch/adapt.hpp>
#include <loom/batch/walk.hpp>
#include <loom/concepts/batch.hpp>
#include <loom/concepts/device_policy.hpp>
#include <loom/concepts/precision_policy.hpp>
#include <loom/concepts/scope_guard.hpp>
#include <loom/data/device_loader.hpp>
#include <loom/device/cpu.hpp>
#include <loom/device/defaults.hpp>
#include <loom/device/optimizer_state.hpp>
#include <loom/error.hpp>
#include <loom/guards.hpp>
#include <loom/precision/defaults.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/runtime.hpp>
#include <loom/state_dict.hpp>
#include <loom/version.hpp>

namespace loom {
using device::Cpu;
using precision::Fp32;
}  // namespace loom
