// Ddp::join: uneven inputs, as Python's Join context manager and DDP's join hooks
// (torch.distributed.algorithms.join): the ranks that ran out shadow the others' collectives.
#include <loom/dist/ddp.hpp>

#include <exception>
#include <string>
#include <vector>

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/reducer.hpp>

#include <loom/error.hpp>

#include "common.hpp"

namespace loom::dist {

JoinGuard::JoinGuard(Ddp* ddp) : ddp_(ddp), exceptions_(std::uncaught_exceptions()) {}

JoinGuard::~JoinGuard() noexcept(false) {
  if (!ddp_) return;
  auto& s = *ddp_->state_;
  if (std::uncaught_exceptions() != exceptions_ || s.g.failed) {
    s.joining = false;
    return;
  }
  ddp_->finish_join();
}

JoinGuard Ddp::join(JoinOptions options) {
  auto& s = *state_;
  if (!s.module) {
    throw Error(s.g.name + "::join: call rt.setup(model) first; join needs the reducer it builds");
  }
  if (s.joining) throw Error(s.g.name + "::join: already inside a join scope");
  if (!s.reducer) return JoinGuard(nullptr);  // one process: nobody to wait for
  s.joining = true;
  s.join_options = options;
  s.logger->set_uneven_input_join();
  return JoinGuard(this);
}

void Ddp::join_main_hook() {
  auto& s = *state_;
  s.reducer->rebuild_buckets();
  if (detail::syncs_buffers_before_forward(s))
    detail::broadcast_buffers_from(s, detail::find_common_rank(s, false));
  at::Tensor sync = detail::flag(s.g, 0);
  detail::all_reduce(s.g, sync, ReduceOp::Sum).wait();
  const bool should_sync = sync.cpu().item<float>() != 0;
  s.forward_param_sync = should_sync;
  if (!should_sync) return;
  // One all-reduce per bucket, of zeros, in the reducer's bucket order and through its hook.
  auto buckets = s.reducer->get_grad_buckets(/*return_zero_tensors=*/true);
  std::vector<c10::intrusive_ptr<c10::ivalue::Future>> pending;
  for (auto& bucket : buckets) pending.push_back(s.reducer->run_comm_hook(bucket));
  for (auto& f : pending) {
    f->wait();
    if (f->hasError()) f->value();  // rethrows the hook's error
  }
  if (s.options.find_unused_parameters) {
    at::Tensor used = s.reducer->get_local_used_map_on_device();
    detail::all_reduce(s.g, used, ReduceOp::Sum).wait();
  }
  s.reducer->push_rebuilt_params_for_all_indices();
}

void Ddp::finish_join() {
  auto& s = *state_;
  try {
    bool last = true;
    for (;;) {
      // Python's Join.__exit__: shadow the notification all-reduce of the ranks still in.
      at::Tensor still_in = detail::flag(s.g, 0);
      detail::all_reduce(s.g, still_in, ReduceOp::Sum).wait();
      if (still_in.cpu().item<float>() == 0) break;
      if (s.join_options.throw_on_early_termination) {
        at::Tensor ones = detail::flag(s.g, 1);
        detail::all_reduce(s.g, ones, ReduceOp::Sum).wait();
        s.joining = false;
        throw Error(s.g.name + "::join: rank " + std::to_string(s.g.env.rank) +
                    " has run out of inputs before the others "
                    "(JoinOptions::throw_on_early_termination)");
      }
      join_main_hook();
      last = false;
    }
    // The post-hook: the parameters (and buffers) of the rank that joined last, everywhere.
    detail::broadcast_module_state(s, *s.module, detail::find_common_rank(s, last));
  } catch (const Error&) {
    s.joining = false;
    throw;
  } catch (...) {
    s.joining = false;
    fail("joining the ranks with uneven inputs", std::current_exception());
  }
  s.joining = false;
}

}  // namespace loom::dist
