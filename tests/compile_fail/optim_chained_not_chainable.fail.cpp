// expect-error: a scheduler after the first must be chainable
#include <vector>

#include <ATen/ATen.h>
#include <loom/optim/chained_scheduler.hpp>
#include <loom/optim/exponential_lr.hpp>
#include <loom/optim/lambda_lr.hpp>
#include <loom/optim/sgd.hpp>

void chain() {
  loom::optim::SGD opt(std::vector<at::Tensor>{at::zeros({2})}, loom::optim::SGDOptions(0.1));
  loom::optim::ExponentialLR decay(opt, 0.9);
  loom::optim::LambdaLR lambda(opt, [](int64_t) { return 1.0; });
#ifdef LOOM_FAIL
  loom::optim::ChainedScheduler sched(decay, lambda);  // LambdaLR sets lrs from base_lrs
#else
  loom::optim::ChainedScheduler sched(lambda, decay);
#endif
  sched.step();
}
