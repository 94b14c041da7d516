// expect-error: the Strategy argument is loom::DdpOptions, not a strategy policy. Common mistake
// reject-error: it lacks|must return the same type
// The options where with_runtime's strategy instance goes: ..., {}, loom::DdpOptions{...}).
#include <loom/dist/ddp.hpp>
#include <loom/select.hpp>

int world_size() {
  loom::DdpOptions options;
  options.find_unused_parameters = true;
  auto fn = [](auto& rt) { return rt.strategy().world_size(); };
  using Cpu = loom::devices<loom::Cpu>;
  using Fp32 = loom::precisions<loom::Fp32>;
#ifdef LOOM_FAIL
  loom::with_runtime<Cpu, Fp32>("cpu", "32-true", fn, {}, options);
  return 0;
#else
  return loom::with_runtime<Cpu, Fp32>("cpu", "32-true", fn, {}, loom::Ddp(options));
#endif
}
