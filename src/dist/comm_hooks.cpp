// loom::CommHook: the communication hooks Ddp's reducer runs on each bucket (c10d's own
// builtin, Python's bf16_compress_hook, the user's), as c10d's default_comm_hooks.cpp.
#include <loom/dist/ddp.hpp>

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>
#include <torch/csrc/distributed/c10d/default_comm_hooks.hpp>

#include <loom/error.hpp>

#include "common.hpp"

namespace loom::dist {

namespace {

/// Python's bf16_compress_hook (torch.distributed.algorithms.ddp_comm_hooks.default_hooks):
/// the bucket cast to bf16 and divided by the world size there, a sum all-reduce in bf16, the
/// result copied back into the bucket. c10d has no builtin bf16 hook.
class Bf16CompressHook final
    : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  explicit Bf16CompressHook(const c10::intrusive_ptr<c10d::ProcessGroup>& group)
      : CppCommHookInterface(group) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    at::Tensor buffer = bucket.getBufferRef();
    std::vector<at::Tensor> compressed{buffer.to(at::kBFloat16).div_(state_->getSize())};
    auto reduced = state_->allreduce(compressed)->getFuture();
    return reduced->then(
        [buffer](c10::ivalue::Future& done) {
          buffer.copy_(done.value().toTensorVector()[0]);
          return c10::IValue(buffer);
        },
        reduced->elementType());
  }
};

}  // namespace

CommHook CommHook::user(std::string name, Factory make) {
  if (!make) throw Error("loom::CommHook::user(\"" + name + "\"): the factory is empty");
  return CommHook(Kind::User, std::move(name), std::move(make));
}

CommHook CommHook::parse(std::string_view name) {
  if (name == "none" || name == "allreduce") return all_reduce();
  if (name == "fp16") return fp16_compress();
  if (name == "bf16") return bf16_compress();
  throw Error("loom::CommHook: unknown communication hook \"" + std::string(name) +
              "\"; choose none, fp16 or bf16");
}

namespace detail {

/// DdpOptions::comm_hook on the reducer, named in the logger as Python names it.
void register_comm_hook(detail::DdpState& s) {
  const CommHook& hook = s.options.comm_hook;
  switch (hook.kind()) {
    case CommHook::Kind::AllReduce:
      return;
    case CommHook::Kind::Fp16Compress:
      s.logger->set_comm_hook("BuiltinCommHookType.FP16_COMPRESS");
      s.reducer->register_builtin_comm_hook(c10d::BuiltinCommHookType::FP16_COMPRESS);
      return;
    case CommHook::Kind::Bf16Compress:
      s.logger->set_comm_hook("bf16_compress_hook");
      s.reducer->register_comm_hook(std::make_unique<Bf16CompressHook>(s.g.group));
      return;
    case CommHook::Kind::User: {
      auto made = hook.factory()(s.g.group);
      if (!made) {
        throw Error(s.g.name + ": the communication hook \"" + hook.name() +
                    "\"'s factory returned no hook");
      }
      s.logger->set_comm_hook(hook.name());
      s.reducer->register_comm_hook(std::move(made));
      return;
    }
  }
}

}  // namespace detail

}  // namespace loom::dist
