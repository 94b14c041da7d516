// expect-error: loom::Runtime::save and load need #include <loom/state/checkpoint.hpp>
// runtime.hpp leaves the checkpoint file format out; rt.save without the opt-in header says
// which header to include. (With runtime.hpp alone, loom::State is incomplete: the compiler's
// note then shows rt.save's declaration, whose comment names the same header.)
#include <filesystem>

#include <torch/nn/modules/linear.h>

#include <loom/device/cpu.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/runtime.hpp>
#include <loom/state/entry.hpp>
#ifndef LOOM_FAIL
#include <loom/state/checkpoint.hpp>
#endif

void save(loom::Runtime<loom::Cpu, loom::Fp32>& rt, torch::nn::Linear& model,
          const std::filesystem::path& path) {
  rt.save(path, {{"model", model}, {"runtime", rt}});
}
