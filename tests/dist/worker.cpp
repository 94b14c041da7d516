// One rank of loom's multi-process tests (tests/dist/run_dist.py starts them, with torchrun or
// by hand, on free ports, and checks what each rank prints and how it exits).
//
//   loom_dist_worker <mode> [key=value ...]
//
// Modes: train, collectives, no_sync, hooks, join, scaler, fp8, fault, shapes, unused, recompute,
// parity, zero, cuda
// (a GPU: backend=nccl|gloo, gpu=<index>). Every rank prints "rank R/W: ..." lines; a loom::Error
// ends the rank with exit code 3 after printing "rank R/W: loom::Error: <what>".
#include <unistd.h>
#include <algorithm>
#include <chrono>
#include <csignal>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <limits>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <thread>
#include <tuple>
#include <type_traits>
#include <vector>

#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <torch/csrc/distributed/c10d/comm.hpp>

#include <loom/dist/collectives.hpp>
#include <loom/dist/ddp.hpp>
#include <loom/dist/rank_zero.hpp>
#include <loom/dist/zero.hpp>
#include <loom/loom.hpp>
#include <loom/nn/activation_checkpoint.hpp>

namespace {

std::map<std::string, std::string> args;

std::string arg(const std::string& key, const std::string& fallback) {
  auto it = args.find(key);
  return it == args.end() ? fallback : it->second;
}
int iarg(const std::string& key, int fallback) {
  return std::stoi(arg(key, std::to_string(fallback)));
}

std::string tag;  // "rank R/W"

void say(const std::string& line) { std::cout << tag << ": " << line << std::endl; }

/// `v` as printf's %g does.
std::string num(double v) {
  std::ostringstream out;
  out << v;
  return out.str();
}

torch::nn::Sequential mlp(int in, int hidden, int out) {
  return torch::nn::Sequential(torch::nn::Linear(in, hidden), torch::nn::Tanh(),
                               torch::nn::Linear(hidden, out));
}

torch::Tensor flat_params(torch::nn::Module& m) {
  std::vector<torch::Tensor> parts;
  for (auto& p : m.parameters()) parts.push_back(p.detach().reshape(-1).to(torch::kFloat));
  return torch::cat(parts);
}

/// Every rank's copy of `t` equals rank 0's, bit for bit.
template <class S>
bool same_on_all_ranks(S& strategy, const torch::Tensor& t) {
  auto all = strategy.all_gather(t);
  for (auto& other : all) {
    if (!torch::equal(other, all[0])) return false;
  }
  return true;
}

/// The buckets a hook reduced: each call's bucket index, and how many were the last.
struct HookCalls {
  std::vector<std::size_t> indices;
  int last = 0;
};

/// A user's communication hook: Python's allreduce_hook (default_hooks.py: the bucket divided
/// by the world size, then a sum all-reduce), counting the buckets it reduces.
class CountingHook final
    : public c10d::CppCommHookInterface<c10::intrusive_ptr<c10d::ProcessGroup>> {
 public:
  CountingHook(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
               std::shared_ptr<HookCalls> calls)
      : CppCommHookInterface(group), calls_(std::move(calls)) {}

  c10::intrusive_ptr<c10::ivalue::Future> runHook(c10d::GradBucket& bucket) override {
    calls_->indices.push_back(bucket.getIndex());
    if (bucket.isLast()) ++calls_->last;
    std::vector<at::Tensor> tensors{bucket.getBufferRef()};
    tensors[0].div_(state_->getSize());
    return state_->allreduce(tensors)->getFuture();
  }

 private:
  std::shared_ptr<HookCalls> calls_;
};

loom::CommHook counting_hook(std::shared_ptr<HookCalls> calls) {
  return loom::CommHook::user("allreduce_hook", [calls](const auto& group) {
    return std::make_unique<CountingHook>(group, calls);
  });
}

/// A loom::DistributedSampler built from the strategy `s` (12 samples, shuffled, seed 5,
/// epoch 2) takes the process group's rank and world size: this rank prints its indices
/// (tests/dist/run_dist.py compares them with Python's DistributedSampler for the same rank
/// and world), and the ranks' lists, gathered, are disjoint and cover the 12 samples.
template <class S>
void sampler_from_strategy(S& s) {
  constexpr std::size_t n = 12;  // a multiple of 1, 2, 3 and 4 ranks: no padding
  loom::DistributedSampler sampler(n, s, /*shuffle=*/true, /*seed=*/5);
  sampler.set_epoch(2);
  sampler.reset();
  std::vector<std::int64_t> mine(sampler.indices().begin(), sampler.indices().end());
  std::string list;
  for (const auto i : mine) {
    if (!list.empty()) list += ' ';
    list += std::to_string(i);
  }
  std::vector<int> seen(n, 0);
  for (const at::Tensor& other : s.all_gather(torch::tensor(mine, torch::kLong))) {
    for (std::int64_t k = 0; k < other.numel(); ++k) ++seen.at(other[k].item<std::int64_t>());
  }
  const bool partition = std::all_of(seen.begin(), seen.end(), [](int c) { return c == 1; });
  say("sampler from the strategy: " + std::to_string(mine.size()) + " of " + std::to_string(n) +
      " indices: [" + list + "]; the " + std::to_string(s.world_size()) + " ranks' lists " +
      (partition ? "disjoint and covering" : "NOT a partition of") + " the dataset");
}

template <class R>
void train_steps(R& rt, torch::nn::Sequential& model, torch::optim::Optimizer& opt, int steps,
                 int stop_at, const std::string& fault) {
  auto& s = rt.strategy();
  for (int step = 0; step < steps; ++step) {
    if (step == stop_at && s.rank() == 1) {
      say("raising " + fault);
      std::raise(fault == "kill" ? SIGKILL : SIGSTOP);
    }
    torch::manual_seed(1000 * step + s.rank());  // each rank its own batch
    auto x = torch::randn({16, 8});
    auto y = torch::randint(0, 4, {16}, torch::kLong);
    auto out = rt.forward(model, x);
    auto loss = torch::nn::functional::cross_entropy(out, y);
    opt.zero_grad();
    rt.backward(loss, model);
    rt.optimizer_step(opt);
  }
}

int run_train() {
  using R = loom::Runtime<loom::Cpu, loom::Fp32, loom::Ddp>;
  loom::DdpOptions o;
  o.timeout = std::chrono::milliseconds(iarg("timeout_ms", 60000));
  R rt(loom::Cpu{}, loom::Fp32{}, loom::Ddp(o));
  auto& s = rt.strategy();
  torch::manual_seed(s.rank() + 1);  // different initial weights on every rank
  auto model = mlp(8, iarg("hidden", 16), 4);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  rt.setup(model, opt);
  say("node " + std::to_string(s.node_rank()));
  say(std::string("setup: params from rank 0 ") +
      (same_on_all_ranks(s, flat_params(*model)) ? "equal" : "DIFFER"));
  sampler_from_strategy(s);
  // A write to a dead peer's socket must fail with an error, not end the process by SIGPIPE.
  struct sigaction on_pipe {};
  sigaction(SIGPIPE, nullptr, &on_pipe);
  say(std::string("setup: SIGPIPE ") + (on_pipe.sa_handler == SIG_IGN ? "ignored" : "NOT ignored"));
  const int steps = iarg("steps", 4);
  train_steps(rt, model, opt, steps, iarg("stop_at", -1), arg("fault", "kill"));
  // Gradients of the last step are averaged: equal everywhere.
  std::vector<torch::Tensor> grads;
  for (auto& p : model->parameters()) grads.push_back(p.grad().reshape(-1));
  say(std::string("grads ") + (same_on_all_ranks(s, torch::cat(grads)) ? "equal" : "DIFFER") +
      ", params " + (same_on_all_ranks(s, flat_params(*model)) ? "equal" : "DIFFER") + " after " +
      std::to_string(steps) + " steps");
  rt.teardown();
  say("done");
  return 0;
}

/// The collectives over nested batches, broadcast_object, a named barrier, rank_zero_first
/// and node_rank, on `s`'s ranks (one process too); prints what it found.
template <class S>
bool nested_collectives(S& s, const std::string& dir) {
  using loom::dist::ReduceOp;
  const int rank = s.rank(), world = s.world_size();
  const float r = static_cast<float>(rank), w = static_cast<float>(world);
  const float sum = w * (w - 1) / 2;
  std::map<std::string, torch::Tensor> metrics{{"a", torch::full({2}, r)},
                                               {"b", torch::full({1, 2}, r + 1)}};
  const auto batch = std::make_tuple(torch::tensor({r}), metrics, 7);
  bool ok = true;
  auto reduced = loom::dist::all_reduce(s, batch, ReduceOp::Sum);
  ok = ok && torch::equal(std::get<0>(reduced), torch::tensor({sum})) &&
       torch::equal(std::get<1>(reduced).at("a"), torch::full({2}, sum)) &&
       torch::equal(std::get<1>(reduced).at("b"), torch::full({1, 2}, sum + w)) &&
       std::get<2>(reduced) == 7 && std::get<0>(batch).item<float>() == r;  // a copy
  auto mean = loom::dist::all_reduce(s, metrics, ReduceOp::Mean);
  ok = ok && torch::equal(mean.at("a"), torch::full({2}, sum / w));
  auto gathered = loom::dist::all_gather(s, batch);
  const auto& b = std::get<1>(gathered).at("b");
  ok = ok && b.sizes() == torch::IntArrayRef({world, 1, 2});
  for (int i = 0; i < world; ++i) ok = ok && torch::equal(b[i], torch::full({1, 2}, i + 1.0f));
  auto from_last = loom::dist::broadcast(s, batch, world - 1);
  ok = ok && torch::equal(std::get<1>(from_last).at("a"), torch::full({2}, w - 1));
  std::string shapes = "no error";
  try {
    (void)loom::dist::all_gather(s, torch::zeros({rank + 1}));
  } catch (const loom::Error& e) {
    shapes = e.what();
  }
  const bool shapes_refused =
      world == 1 ? shapes == "no error"
                 : shapes.find("rank 1's tensor does not have rank 0's shape") != std::string::npos;
  const std::string text = s.broadcast_object(
      rank == world - 1 ? std::string("hello from the last rank") : "", world - 1);
  loom::StateDict state;
  if (rank == world - 1) {
    state = {{"step", c10::IValue(std::int64_t{42})},
             {"name", c10::IValue(std::string("ckpt"))},
             {"w", c10::IValue(torch::tensor({1.5f, 2.5f}))}};
  }
  auto got = s.broadcast_object(state, world - 1);
  const bool objects = text == "hello from the last rank" && got.size() == 3 &&
                       got.at("step").toInt() == 42 && got.at("name").toStringRef() == "ckpt" &&
                       torch::equal(got.at("w").toTensor(), torch::tensor({1.5f, 2.5f}));
  s.barrier("nested collectives");
  // rank_zero_first: rank 0 writes a file in the scope, after a pause; the others find it.
  bool first_ok = true;
  const std::string marker = dir + "/first.txt";
  {
    auto first = loom::dist::rank_zero_first(s);
    if (rank == 0) {
      std::this_thread::sleep_for(std::chrono::milliseconds(300));
      std::ofstream(marker) << "written by rank 0";
    } else {
      first_ok = std::ifstream(marker).good();
    }
  }
  say("nested collectives " + std::string(ok ? "ok" : "WRONG") + ", shapes " +
      (shapes_refused ? "refused" : "NOT refused: " + shapes) + ", objects " +
      (objects ? "ok" : "WRONG") + ", rank zero first " + (first_ok ? "ok" : "WRONG") + ", node " +
      std::to_string(s.node_rank()));
  return ok && shapes_refused && objects && first_ok;
}

int run_collectives() {
  loom::Runtime<loom::Cpu, loom::Fp32, loom::Ddp> rt;
  auto model = mlp(2, 2, 2);
  rt.setup(model);
  auto& s = rt.strategy();
  const float r = static_cast<float>(s.rank()), w = static_cast<float>(s.world_size());
  auto t = torch::tensor({r, -r});
  s.all_reduce(t, loom::dist::ReduceOp::Sum);
  const float sum = w * (w - 1) / 2;
  bool ok = torch::equal(t, torch::tensor({sum, -sum}));
  t = torch::tensor({r});
  s.all_reduce(t, loom::dist::ReduceOp::Mean);
  ok = ok && t.item<float>() == sum / w;
  t = torch::tensor({r});
  s.all_reduce(t, loom::dist::ReduceOp::Max);
  ok = ok && t.item<float>() == w - 1;
  t = torch::tensor({r});
  s.all_reduce(t, loom::dist::ReduceOp::Min);
  ok = ok && t.item<float>() == 0;
  t = torch::tensor({r * 10});
  s.broadcast(t, s.world_size() - 1);
  ok = ok && t.item<float>() == (w - 1) * 10;
  auto all = s.all_gather(torch::tensor({r, r}));
  ok = ok && static_cast<int>(all.size()) == s.world_size();
  for (int i = 0; i < s.world_size(); ++i) {
    ok = ok && torch::equal(all[i], torch::tensor({float(i), float(i)}));
  }
  s.barrier();
  say(std::string("collectives ") + (ok ? "ok" : "WRONG"));
  loom::dist::rank_zero_print(s, "rank-zero line");
  const bool nested = nested_collectives(s, arg("dir", "."));
  rt.teardown();
  // The same calls in one process (SingleProcess): the one-process results.
  loom::Runtime<loom::Cpu, loom::Fp32> one;
  auto small = mlp(2, 2, 2);
  one.setup(small);
  const bool alone = nested_collectives(one.strategy(), arg("dir", ".") + "/alone");
  return ok && nested && alone ? 0 : 1;
}

/// Two half batches under no_sync, then a synchronized one: the same gradients as one
/// synchronized step over the accumulated batch.
int run_no_sync() {
  auto make = [] {
    torch::manual_seed(7);
    return mlp(8, 16, 4);
  };
  loom::Runtime<loom::Cpu, loom::Fp64, loom::Ddp> rt;
  auto model = make();
  rt.setup(model);
  auto& s = rt.strategy();
  torch::manual_seed(100 + s.rank());
  auto x = torch::randn({8, 8}, torch::kDouble), y = torch::randint(0, 4, {8}, torch::kLong);
  auto loss_of = [&](torch::nn::Sequential& m, const torch::Tensor& xs, const torch::Tensor& ys) {
    return torch::nn::functional::cross_entropy(rt.forward(m, xs), ys);
  };
  {
    auto guard = s.no_sync();
    rt.backward(loss_of(model, x.slice(0, 0, 4), y.slice(0, 0, 4)), model);
  }
  auto local_first = model->parameters()[0].grad().clone();
  rt.backward(loss_of(model, x.slice(0, 4, 8), y.slice(0, 4, 8)), model);
  auto accumulated = flat_params(*model).clone();  // unchanged: no step yet
  std::vector<torch::Tensor> g1;
  for (auto& p : model->parameters()) g1.push_back(p.grad().reshape(-1).clone());
  // Reference: each rank's local gradient of both halves, summed, averaged by all_reduce.
  loom::Runtime<loom::Cpu, loom::Fp64> local;
  auto ref = make();
  local.setup(ref);
  local.backward(loss_of(ref, x.slice(0, 0, 4), y.slice(0, 0, 4)), ref);
  bool first_local = torch::equal(local_first, ref->parameters()[0].grad());
  local.backward(loss_of(ref, x.slice(0, 4, 8), y.slice(0, 4, 8)), ref);
  std::vector<torch::Tensor> g2;
  for (auto& p : ref->parameters()) g2.push_back(p.grad().reshape(-1).clone());
  auto expected = torch::cat(g2);
  s.all_reduce(expected, loom::dist::ReduceOp::Mean);
  auto got = torch::cat(g1);
  const double diff = (got - expected).abs().max().item<double>();
  // A step after a synchronized backward goes; one after backward passes that all ran under
  // no_sync (the gradients never reduced: the replicas would drift apart) is refused.
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1));
  rt.optimizer_step(opt);
  opt.zero_grad();
  for (int i = 0; i < 2; ++i) {
    auto scope = rt.no_backward_sync(model);
    rt.backward(loss_of(model, x.slice(0, 4 * i, 4 * i + 4), y.slice(0, 4 * i, 4 * i + 4)), model);
  }
  std::string refused = "no error";
  try {
    rt.optimizer_step(opt);
  } catch (const loom::Error& e) {
    refused = e.what();
  }
  const bool refused_ok =
      refused.find(
          "loom::Ddp::optimizer_step: none of the 2 backward pass(es) since the last "
          "step reduced the gradients") != std::string::npos;
  say("no_sync: first backward local " + std::string(first_local ? "yes" : "NO") +
      ", accumulated grads max|diff| " + std::to_string(diff) + ", unsynchronized step " +
      (refused_ok ? "refused" : "NOT refused: " + refused));
  rt.teardown();
  return first_local && diff < 1e-12 && refused_ok ? 0 : 1;
}

/// Gradient accumulation counted by a communication hook: for k = 1, 2, 4 micro-batches per
/// step, every step reduces each bucket exactly once (one bucket in the first iteration, then
/// one per parameter: bucket_cap_mb is tiny), with one last bucket, whatever k is.
int run_hooks() {
  auto calls = std::make_shared<HookCalls>();
  loom::DdpOptions o;
  o.bucket_cap_mb = 1e-6;
  o.comm_hook = counting_hook(calls);
  loom::Runtime<loom::Cpu, loom::Fp32, loom::Ddp> rt(loom::Cpu{}, loom::Fp32{}, loom::Ddp(o));
  torch::manual_seed(11);
  auto model = mlp(8, 16, 4);
  torch::optim::SGD opt(model->parameters(), 0.05);
  rt.setup(model, opt);
  auto& s = rt.strategy();
  const std::size_t params = model->parameters().size();
  bool ok = true;
  std::string seen;
  int step = 0;
  for (int k : {1, 2, 4}) {
    if (!seen.empty()) seen += "; ";
    seen += "k=";
    seen += std::to_string(k);
    seen += ":";
    for (int i = 0; i < 3; ++i, ++step) {
      torch::manual_seed(100 * step + s.rank());
      auto micro = loom::split_microbatches(
          std::make_tuple(torch::randn({8, 8}), torch::randint(0, 4, {8}, torch::kLong)), k);
      calls->indices.clear();
      calls->last = 0;
      opt.zero_grad();
      for (int j = 0; j < k; ++j) {
        auto scope = rt.no_backward_sync(model, j + 1 < k);
        const auto& [x, y] = micro[static_cast<std::size_t>(j)];
        rt.backward(torch::nn::functional::cross_entropy(rt.forward(model, x), y) / k, model);
      }
      rt.optimizer_step(opt);
      const std::size_t buckets = step == 0 ? 1 : params;
      auto sorted = calls->indices;
      std::sort(sorted.begin(), sorted.end());
      bool once = sorted.size() == buckets && calls->last == 1;
      for (std::size_t b = 0; once && b < buckets; ++b) once = sorted[b] == b;
      ok = ok && once;
      seen += ' ';
      seen += std::to_string(calls->indices.size());
    }
  }
  const bool equal = same_on_all_ranks(s, flat_params(*model));
  say("hooks: buckets reduced per step " + seen + (ok ? " (each once)" : " (WRONG)") + ", params " +
      (equal ? "equal" : "DIFFER"));
  rt.teardown();
  return ok && equal ? 0 : 1;
}

/// Uneven inputs: rank 0 has 10 batches, the others 12, all inside a join scope. Without
/// throw=1 every rank finishes, holding the last joiner's parameters; with it, every rank
/// gets a loom::Error once rank 0 has run out.
int run_join() {
  loom::DdpOptions o;
  o.timeout = std::chrono::milliseconds(20000);
  loom::JoinOptions jo;
  jo.throw_on_early_termination = arg("throw", "0") == "1";
  jo.divide_by_initial_world_size = arg("divide_initial", "1") == "1";
  loom::Runtime<loom::Cpu, loom::Fp32, loom::Ddp> rt(loom::Cpu{}, loom::Fp32{}, loom::Ddp(o));
  torch::manual_seed(21);
  auto model = mlp(8, 16, 4);
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.05).momentum(0.9));
  rt.setup(model, opt);
  auto& s = rt.strategy();
  const int batches = s.rank() == 0 ? 10 : 12;
  int done = 0;
  try {
    auto joined = s.join(jo);
    for (; done < batches; ++done) {
      torch::manual_seed(1000 * done + s.rank());
      auto x = torch::randn({8, 8});
      auto y = torch::randint(0, 4, {8}, torch::kLong);
      opt.zero_grad();
      rt.backward(torch::nn::functional::cross_entropy(rt.forward(model, x), y), model);
      rt.optimizer_step(opt);
    }
  } catch (const loom::Error& e) {
    say("join: error after " + std::to_string(done) + " of " + std::to_string(batches) +
        " batches: " + e.what());
    rt.teardown();
    return 0;
  }
  say("join: " + std::to_string(done) + " batches, params " +
      (same_on_all_ranks(s, flat_params(*model)) ? "equal" : "DIFFER"));
  rt.teardown();
  return 0;
}

/// 16-mixed under DDP: a non-finite loss on one rank makes every rank skip the step, and the
/// scaler's state is the same on every rank after every step.
int run_scaler() {
  loom::Runtime<loom::Cpu, loom::Fp16Mixed, loom::Ddp> rt;
  torch::manual_seed(3);
  auto model = mlp(8, 16, 4);
  torch::optim::SGD opt(model->parameters(), 0.01);
  rt.setup(model, opt);
  auto& s = rt.strategy();
  const int steps = 8, poison = 3;
  bool same = true, skipped_together = true;
  for (int step = 0; step < steps; ++step) {
    torch::manual_seed(50 * step + s.rank());
    auto x = torch::randn({8, 8});
    if (step == poison && s.rank() == 1) x[0][0] = std::numeric_limits<float>::infinity();
    auto y = torch::randint(0, 4, {8}, torch::kLong);
    opt.zero_grad();
    rt.backward(torch::nn::functional::cross_entropy(rt.forward(model, x), y), model);
    const bool applied = rt.optimizer_step(opt).applied();
    auto flag = torch::tensor({applied ? 1.0f : 0.0f});
    auto flags = s.all_gather(flag);
    for (auto& f : flags) skipped_together = skipped_together && torch::equal(f, flag);
    if (step == poison && applied) skipped_together = false;
    auto state = rt.precision().state_dict();
    auto scale = torch::tensor(
        {state.at("scale").toDouble(), static_cast<double>(state.at("_growth_tracker").toInt())},
        torch::kDouble);
    same = same && same_on_all_ranks(s, scale);
  }
  say(std::string("scaler: skipped together ") + (skipped_together ? "yes" : "NO") +
      ", state equal " + (same ? "yes" : "NO") + ", scale " + std::to_string(rt.loss_scale()));
  same = same && same_on_all_ranks(s, flat_params(*model));
  rt.teardown();
  return same && skipped_together ? 0 : 1;
}

// fp8-mixed with delayed scaling: each rank sees inputs of its own magnitude; the amaxes are
// all-reduced (MAX) before every step, so the scales (and then the weights) stay equal, and
// the input's scale is the one of the largest rank's input.
int run_fp8() {
  loom::fp8::LinearRecipe recipe;
  recipe.scaling = loom::fp8::Scaling::Delayed;
  recipe.delayed.history_len = 4;
  loom::Runtime<loom::Cpu, loom::Fp8Mixed, loom::Ddp> rt(loom::Cpu{}, loom::Fp8Mixed(recipe));
  torch::manual_seed(3);
  auto model = mlp(16, 32, 16);
  torch::optim::SGD opt(model->parameters(), 0.01);
  rt.setup(model, opt);
  auto& s = rt.strategy();
  bool same = true;
  for (int step = 0; step < 5; ++step) {
    torch::manual_seed(50 * step + s.rank());
    auto x = torch::rand({8, 16}) * (s.rank() + 1);  // rank 1's inputs are twice as large
    x[0][0] = s.rank() + 1.0;                        // each rank's amax, exactly
    opt.zero_grad();
    rt.backward(torch::nn::functional::mse_loss(rt.forward(model, x), torch::zeros({8, 16})),
                model);
    rt.optimizer_step(opt);
    same = same && same_on_all_ranks(s, rt.precision().delayed_state()->scale.clone());
  }
  const double input_scale = rt.precision().delayed_state()->scale[0][0].item<double>();
  say(std::string("fp8: scales equal ") + (same ? "yes" : "NO") + ", input scale " +
      std::to_string(input_scale));
  same = same && same_on_all_ranks(s, flat_params(*model));
  rt.teardown();
  return same && input_scale == 448.0 / s.world_size() ? 0 : 1;
}

int run_shapes() {
  loom::Runtime<loom::Cpu, loom::Fp32, loom::Ddp> rt;
  auto& s = rt.strategy();
  auto model = mlp(8, s.rank() == 0 ? 16 : 17, 4);
  rt.setup(model);
  return 0;
}

/// Activation checkpointing under Ddp without static_graph or find_unused_parameters: a model
/// with dropout checkpointed in 2 segments, 3 backwards; each time every gradient equals the
/// plain local gradient of the same data and dropout masks, divided by the world size and
/// summed over the ranks (what the reducer does), bit for bit.
int run_recompute() {
  auto make = [] {
    torch::manual_seed(7);
    return torch::nn::Sequential(torch::nn::Linear(8, 16), torch::nn::Tanh(),
                                 torch::nn::Dropout(0.2), torch::nn::Linear(16, 16),
                                 torch::nn::Tanh(), torch::nn::Dropout(0.2),
                                 torch::nn::Linear(16, 4));
  };
  loom::Runtime<loom::Cpu, loom::Fp32, loom::Ddp> rt;
  auto model = make();
  rt.setup(model);
  loom::Runtime<loom::Cpu, loom::Fp32> local;
  auto ref = make();
  local.setup(ref);
  auto& s = rt.strategy();
  const auto world = static_cast<double>(s.world_size());
  bool same = true;
  for (int step = 0; step < 3; ++step) {
    torch::manual_seed(100 + 10 * s.rank() + step);
    const auto x = torch::randn({8, 8});
    torch::manual_seed(1000 + 10 * s.rank() + step);  // the dropout masks of this rank's step
    const auto out = rt.forward(
        [&](const torch::Tensor& in) { return loom::checkpoint_sequential(model, 2, in); }, x);
    rt.backward(out.square().mean(), model);
    torch::manual_seed(1000 + 10 * s.rank() + step);
    local.backward(local.forward(ref, x).square().mean(), ref);
    const auto got = model->parameters(), want = ref->parameters();
    for (std::size_t i = 0; i < got.size(); ++i) {
      auto averaged = want[i].grad() / world;
      s.all_reduce(averaged, loom::dist::ReduceOp::Sum);
      same = same && got[i].grad().defined() && torch::equal(got[i].grad(), averaged);
    }
    model->zero_grad();
    ref->zero_grad();
  }
  say(std::string("recompute: gradients equal the averaged plain ones ") + (same ? "yes" : "NO"));
  rt.teardown();
  return same ? 0 : 1;
}

int run_unused() {
  loom::DdpOptions o;
  o.find_unused_parameters = arg("find_unused", "0") == "1";
  o.timeout = std::chrono::milliseconds(20000);
  loom::Runtime<loom::Cpu, loom::Fp32, loom::Ddp> rt(loom::Cpu{}, loom::Fp32{}, loom::Ddp(o));
  torch::manual_seed(5);
  auto model = mlp(8, 16, 4);
  model->push_back(torch::nn::Linear(4, 4));  // its parameters never reach the loss
  torch::optim::SGD opt(model->parameters(), 0.01);
  rt.setup(model, opt);
  auto& s = rt.strategy();
  for (int step = 0; step < 3; ++step) {
    auto x = torch::randn({4, 8});
    auto y = torch::randint(0, 4, {4}, torch::kLong);
    auto out = rt.forward(
        [&](const torch::Tensor& in) {
          return model[2]->as<torch::nn::Linear>()->forward(
              model[1]->as<torch::nn::Tanh>()->forward(
                  model[0]->as<torch::nn::Linear>()->forward(in)));
        },
        x);
    opt.zero_grad();
    rt.backward(torch::nn::functional::cross_entropy(out, y), model);
    rt.optimizer_step(opt);
  }
  say(std::string("unused: trained, params ") +
      (same_on_all_ranks(s, flat_params(*model)) ? "equal" : "DIFFER"));
  rt.teardown();
  return 0;
}

/// Five steps of fused AdamW with clipping on `rt`'s CUDA device, each rank its own batches.
/// The weights start from seed `rank + 1` (a strategy's setup makes them rank 0's).
template <class R>
void train_cuda(R& rt, torch::nn::Sequential& model, loom::optim::AdamW& opt, int rank) {
  for (int step = 0; step < 5; ++step) {
    torch::manual_seed(1000 * step + rank);
    auto x = rt.to_device(torch::randn({16, 8}));
    auto y = rt.to_device(torch::randint(0, 4, {16}, torch::kLong));
    opt.zero_grad();
    rt.backward(torch::nn::functional::cross_entropy(rt.forward(model, x), y), model);
    rt.clip_gradients(opt, 1.0);
    rt.optimizer_step(opt);
  }
}

/// Training on a CUDA device: NCCL (one rank per GPU: gpu=local takes LOCAL_RANK's) or gloo
/// on CUDA tensors (several ranks may share a GPU). With 2 or more ranks, each rank starts
/// from other weights and batches: the parameters must be rank 0's after setup and equal on
/// every rank after 5 steps, and an all-reduce of ones must sum the ranks. With one rank
/// nothing can be compared across ranks (a smoke test: it says so); the run is compared with
/// the same 5 steps on the same GPU without a strategy (a one-process Runtime<Cuda, Fp32>),
/// which one rank's averaging (by 1) and collectives must leave unchanged: within 1e-6
/// (expected bitwise; the bound leaves room for a cuBLAS algorithm chosen differently).
template <class S>
int run_cuda_with(S strategy) {
  using R = loom::Runtime<loom::Cuda, loom::Fp32, S>;
  const auto gpu = arg("gpu", "0");
  auto device =
      gpu == "local" ? loom::Cuda() : loom::Cuda(static_cast<c10::DeviceIndex>(iarg("gpu", 0)));
  R rt(device, loom::Fp32{}, std::move(strategy));
  auto& s = rt.strategy();
  torch::manual_seed(s.rank() + 1);
  auto model = mlp(8, 64, 4);
  loom::optim::AdamW opt(model->parameters(), loom::optim::AdamWOptions(0.01));  // fused
  rt.setup(model, opt);
  const int world = s.world_size();
  const bool start_equal = same_on_all_ranks(s, flat_params(*model));
  train_cuda(rt, model, opt, s.rank());
  at::Tensor t = torch::ones({3}, torch::TensorOptions().device(rt.device().device()));
  s.all_reduce(t, loom::dist::ReduceOp::Sum);
  const bool sum_ok = t.sum().item<float>() == 3.0f * static_cast<float>(world);
  const auto mine = flat_params(*model).cpu();
  const bool end_equal = same_on_all_ranks(s, flat_params(*model));
  std::string backend;
  if constexpr (std::is_same_v<S, loom::Zero>) {
    backend = std::string(s.ddp().backend()) + " zero" + std::to_string(s.stage());
  } else {
    backend = std::string(s.backend());
  }
  const std::string where = model->parameters()[0].device().str();
  if (world >= 2) {
    say("cuda " + backend + ": " + std::to_string(world) + " ranks, params on " + where +
        ", equal across ranks at setup " + (start_equal ? "yes" : "NO") + ", after 5 steps " +
        (end_equal ? "yes" : "NO") + ", all_reduce " + (sum_ok ? "ok" : "WRONG"));
    rt.teardown();
    return start_equal && end_equal && sum_ok ? 0 : 1;
  }
  rt.teardown();
  // One rank: the same steps by a one-process runtime on the same device.
  loom::Runtime<loom::Cuda, loom::Fp32> one(device);
  torch::manual_seed(1);
  auto ref = mlp(8, 64, 4);
  loom::optim::AdamW ref_opt(ref->parameters(), loom::optim::AdamWOptions(0.01));
  one.setup(ref, ref_opt);
  train_cuda(one, ref, ref_opt, 0);
  const auto want = flat_params(*ref).cpu();
  const double diff = (mine - want).abs().max().item<double>();
  const bool bitwise = torch::equal(mine.view(torch::kInt), want.view(torch::kInt));
  const bool close = diff <= 1e-6;
  say("cuda " + backend + ": 1 rank, params on " + where +
      " (smoke test only: 1 GPU, nothing compared across ranks); against the same 5 steps "
      "without a strategy: max|diff| " +
      num(diff) + (bitwise ? " (bitwise equal)" : " (not bitwise)") + ", within 1e-6 " +
      (close ? "yes" : "NO"));
  return close ? 0 : 1;
}

int run_cuda() {
  loom::DdpOptions o;
  o.backend = arg("backend", "nccl");
  o.timeout = std::chrono::milliseconds(iarg("timeout_ms", 120000));
  if (const int stage = iarg("zero", 0); stage > 0) {
    loom::ZeroOptions z;
    z.stage = stage;
    z.ddp = o;
    return run_cuda_with(loom::Zero(z));
  }
  return run_cuda_with(loom::Ddp(o));
}

/// Reads `n` values of T from a raw little-endian file.
template <class T>
std::vector<T> read_raw(const std::string& path, std::size_t n) {
  std::vector<T> v(n);
  std::ifstream in(path, std::ios::binary);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
  if (!in) throw loom::Error("worker: cannot read " + std::to_string(n) + " values from " + path);
  return v;
}

/// The loom side of the parity test with Python's DistributedDataParallel
/// (tests/dist/ddp_parity.py writes the inputs and runs the Python side).
template <class P>
int run_parity_with() {
  const std::string dir = arg("dir", ".");
  const int n = iarg("samples", 0), epochs = iarg("epochs", 2), batch = iarg("batch", 8);
  const int k = iarg("accumulate", 1);
  loom::DdpOptions ddp_options;
  ddp_options.static_graph = iarg("static_graph", 0) != 0;
  const std::string hook = arg("comm_hook", "none");
  ddp_options.comm_hook =
      hook == "user" ? counting_hook(std::make_shared<HookCalls>()) : loom::CommHook::parse(hook);
  auto rt = [&] {
    if constexpr (std::is_same_v<P, loom::Fp16Mixed>) {
      loom::amp::GradScalerOptions o;
      o.growth_interval = iarg("growth_interval", 2000);
      return loom::Runtime<loom::Cpu, P, loom::Ddp>(loom::Cpu(), P(o), loom::Ddp(ddp_options));
    } else {
      return loom::Runtime<loom::Cpu, P, loom::Ddp>(loom::Cpu(), P(), loom::Ddp(ddp_options));
    }
  }();
  auto& s = rt.strategy();
  auto model = mlp(8, 16, 4);
  {
    torch::NoGradGuard g;
    auto init = read_raw<float>(dir + "/init.bin", 8 * 16 + 16 + 16 * 4 + 4);
    std::size_t at = 0;
    for (auto& p : model->parameters()) {
      auto numel = static_cast<std::size_t>(p.numel());
      p.copy_(torch::from_blob(init.data() + at, p.sizes(), torch::kFloat));
      at += numel;
    }
  }
  if (iarg("unused", 0) != 0) {
    // A layer that no forward uses (Sequential's forward runs only what push_back added).
    auto unused = model->register_module("unused", torch::nn::Linear(4, 4));
    torch::NoGradGuard g;
    for (auto& p : unused->parameters()) p.fill_(0.5);
  }
  auto xs = read_raw<float>(dir + "/x.bin", static_cast<std::size_t>(n) * 8);
  auto ys = read_raw<std::int64_t>(dir + "/y.bin", static_cast<std::size_t>(n));
  auto X = torch::from_blob(xs.data(), {n, 8}, torch::kFloat).clone();
  auto Y = torch::from_blob(ys.data(), {n}, torch::kLong).clone();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(0.1).momentum(0.9));
  rt.setup(model, opt);
  loom::DistributedSampler sampler(static_cast<std::size_t>(n), s, /*shuffle=*/true, /*seed=*/0);
  // Uneven inputs: rank 0 stops after join_steps steps, inside a join scope.
  const int join_steps = iarg("join_steps", -1);
  const int stop = join_steps >= 0 && s.rank() == 0 ? join_steps : -1;
  auto train = [&] {
    int step = 0;
    for (int epoch = 0; epoch < epochs; ++epoch) {
      sampler.set_epoch(static_cast<std::uint64_t>(epoch));
      sampler.reset();
      while (auto idx = sampler.next(static_cast<std::size_t>(batch))) {
        if (step++ == stop) return;
        std::vector<std::int64_t> i64(idx->begin(), idx->end());
        auto index = torch::tensor(i64, torch::kLong);
        opt.zero_grad();
        // k micro-batches: the first k - 1 backwards stay local, the last reduces their sum.
        const auto micro = loom::split_microbatches(
            std::make_tuple(X.index_select(0, index), Y.index_select(0, index)), k);
        for (int j = 0; j < k; ++j) {
          auto scope = rt.no_backward_sync(model, j + 1 < k);
          const auto& [x, y] = micro[static_cast<std::size_t>(j)];
          auto loss = torch::nn::functional::cross_entropy(rt.forward(model, x), y);
          rt.backward(k > 1 ? loss / k : loss, model);
        }
        rt.optimizer_step(opt);
      }
    }
  };
  if (join_steps >= 0) {
    auto joined = s.join();
    train();
  } else {
    train();
  }
  auto flat = flat_params(*model).contiguous();
  std::ofstream out(dir + "/loom_rank" + std::to_string(s.rank()) + ".bin", std::ios::binary);
  out.write(reinterpret_cast<const char*>(flat.data_ptr<float>()),
            static_cast<std::streamsize>(flat.numel() * 4));
  if constexpr (std::is_same_v<P, loom::Fp16Mixed>) {
    const auto& scaler = rt.precision().scaler();
    std::ofstream(dir + "/loom_rank" + std::to_string(s.rank()) + ".scaler")
        << std::to_string(scaler.get_scale()) << " " << scaler.get_growth_tracker();
  }
  say("parity: wrote " + std::to_string(flat.numel()) + " parameters");
  rt.teardown();
  return 0;
}

int run_parity() {
  const auto p = arg("precision", "32-true");
  if (p == "32-true") return run_parity_with<loom::Fp32>();
  if (p == "bf16-mixed") return run_parity_with<loom::Bf16Mixed>();
  if (p == "16-mixed") return run_parity_with<loom::Fp16Mixed>();
  throw loom::Error("worker: parity runs 32-true, bf16-mixed or 16-mixed, not " + p);
}

/// The loom side of the ZeRO tests (tests/dist/zero_parity.py writes the inputs, runs Python's
/// DistributedDataParallel + ZeroRedundancyOptimizer(AdamW or SGD, fused=True) and compares):
/// an MLP 8-32-32-4 trained by fused AdamW (`optimizer=sgd`: fused SGD, lr 0.05, momentum 0.9;
/// StepLR: halved every 6 steps, not after a resume) under Ddp (stage=0) or Zero (stage=1, 2).
/// Step i takes rows [8i, 8i + 8) of x.bin, each rank its contiguous part; `accumulate`
/// micro-batches; `clip` > 0 clips the norm; `load` resumes from a checkpoint at step `start`;
/// `save_at` writes one to `save` (`sharded=1`: ZeroCheckpoint::Sharded). Writes
/// <tag>_rank<r>.bin (the final parameters), .scaler, and with `clip` .norms: the GradNorm
/// rt.clip_gradients returned at each step (its value(), 17 significant digits, one a line).
template <class P, class S>
int run_zero_with(S strategy) {
  const std::string dir = arg("dir", ".");
  const int steps = iarg("steps", 20), k = iarg("accumulate", 1), start = iarg("start", 0);
  const int save_at = iarg("save_at", -1), global = 8;
  const double clip = std::stod(arg("clip", "0"));
  auto rt = [&] {
    if constexpr (std::is_same_v<P, loom::Fp16Mixed>) {
      loom::amp::GradScalerOptions o;
      o.init_scale = std::stod(arg("init_scale", "1024"));
      o.growth_interval = iarg("growth_interval", 2000);
      return loom::Runtime<loom::Cpu, P, S>(loom::Cpu(), P(o), std::move(strategy));
    } else {
      return loom::Runtime<loom::Cpu, P, S>(loom::Cpu(), P(), std::move(strategy));
    }
  }();
  auto& s = rt.strategy();
  torch::nn::Sequential model(torch::nn::Linear(8, 32), torch::nn::Tanh(),
                              torch::nn::Linear(32, 32), torch::nn::Tanh(),
                              torch::nn::Linear(32, 4));
  {
    torch::NoGradGuard g;
    auto init = read_raw<float>(dir + "/init.bin", 8 * 32 + 32 + 32 * 32 + 32 + 32 * 4 + 4);
    std::size_t at = 0;
    for (auto& p : model->parameters()) {
      p.copy_(torch::from_blob(init.data() + at, p.sizes(), torch::kFloat));
      at += static_cast<std::size_t>(p.numel());
    }
  }
  const int n = iarg("samples", 0);
  auto xs = read_raw<float>(dir + "/x.bin", static_cast<std::size_t>(n) * 8);
  auto ys = read_raw<std::int64_t>(dir + "/y.bin", static_cast<std::size_t>(n));
  auto X = torch::from_blob(xs.data(), {n, 8}, torch::kFloat).clone();
  auto Y = torch::from_blob(ys.data(), {n}, torch::kLong).clone();
  std::unique_ptr<torch::optim::Optimizer> made;
  if (const auto o = arg("optimizer", "adamw"); o == "sgd") {
    made = std::make_unique<loom::optim::SGD>(model->parameters(),
                                              loom::optim::SGDOptions(0.05).momentum(0.9));
  } else if (o == "adamw") {
    made = std::make_unique<loom::optim::AdamW>(model->parameters(),
                                                loom::optim::AdamWOptions(1e-2).weight_decay(0.01));
  } else {
    throw loom::Error("worker: zero runs optimizer=adamw or optimizer=sgd, not " + o);
  }
  torch::optim::Optimizer& opt = *made;
  rt.setup(model, opt);
  // The lr halves every 6 steps (Python's StepLR); a resumed run starts from the saved lr.
  const bool schedule = arg("load", "").empty();
  loom::optim::StepLR sched(opt, 6, 0.5);
  loom::State state{{"model", model}, {"optimizer", opt}, {"runtime", rt}};
  if (const auto from = arg("load", ""); !from.empty()) {
    // The weights and the optimizer's state; the runtime's entry holds every rank's RNG of the
    // run that saved, for that world size only.
    rt.load(from, loom::State{{"model", model}, {"optimizer", opt}});
  }
  const int world = s.world_size(), per = global / world;
  std::vector<double> norms;  // what clip_gradients returned, step by step
  for (int step = start; step < steps; ++step) {
    opt.zero_grad();
    auto x = X.narrow(0, step * global + s.rank() * per, per);
    auto y = Y.narrow(0, step * global + s.rank() * per, per);
    auto xm = x.tensor_split(k), ym = y.tensor_split(k);
    for (int j = 0; j < k; ++j) {
      auto scope = rt.no_backward_sync(model, j + 1 < k);
      auto loss = torch::nn::functional::cross_entropy(
          rt.forward(model, xm[static_cast<std::size_t>(j)]), ym[static_cast<std::size_t>(j)]);
      rt.backward(k > 1 ? loss / k : loss, model);
    }
    if (clip > 0) norms.push_back(rt.clip_gradients(opt, clip).value());
    rt.optimizer_step(opt);
    if (schedule) sched.step();
    if (step + 1 == save_at) rt.save(arg("save", dir + "/zero.pt"), state);
  }
  if constexpr (std::is_same_v<S, loom::Zero>) {
    const auto m = s.memory(opt);
    say("zero memory: stage " + std::to_string(s.stage()) + " parameters " +
        std::to_string(m.parameters) + " gradients " + std::to_string(m.gradients) +
        " optimizer_state " + std::to_string(m.optimizer_state));
  }
  const std::string name = dir + "/" + arg("tag", "loom") + "_rank" + std::to_string(s.rank());
  auto flat = flat_params(*model).contiguous();
  std::ofstream out(name + ".bin", std::ios::binary);
  out.write(reinterpret_cast<const char*>(flat.data_ptr<float>()),
            static_cast<std::streamsize>(flat.numel() * 4));
  if constexpr (std::is_same_v<P, loom::Fp16Mixed>) {
    const auto& scaler = rt.precision().scaler();
    std::ofstream(name + ".scaler")
        << std::to_string(scaler.get_scale()) << " " << scaler.get_growth_tracker();
  }
  if (clip > 0) {
    std::ofstream file(name + ".norms");
    file << std::setprecision(17);
    for (const double v : norms) file << v << "\n";
  }
  say("zero: wrote " + std::to_string(flat.numel()) + " parameters, params " +
      (same_on_all_ranks(s, flat) ? "equal" : "DIFFER") + " on every rank");
  rt.teardown();
  return 0;
}

template <class P>
int run_zero_precision() {
  const int stage = iarg("stage", 1);
  if (stage == 0) return run_zero_with<P>(loom::Ddp());
  loom::ZeroOptions o;
  o.stage = stage;
  o.bucket_bytes = static_cast<std::size_t>(iarg("bucket_bytes", 4 << 20));
  if (iarg("sharded", 0) != 0) o.checkpoint = loom::ZeroCheckpoint::Sharded;
  if (const auto c = arg("collective", "automatic"); c == "reduce") {
    o.gradient_collective = loom::ZeroCollective::Reduce;
  } else if (c == "all_reduce") {
    o.gradient_collective = loom::ZeroCollective::AllReduce;
  }
  return run_zero_with<P>(loom::Zero(o));
}

int run_zero() {
  const auto p = arg("precision", "32-true");
  if (p == "32-true") return run_zero_precision<loom::Fp32>();
  if (p == "bf16-mixed") return run_zero_precision<loom::Bf16Mixed>();
  if (p == "16-mixed") return run_zero_precision<loom::Fp16Mixed>();
  throw loom::Error("worker: zero runs 32-true, bf16-mixed or 16-mixed, not " + p);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) {
    std::cerr << "usage: loom_dist_worker <mode> [key=value ...]\n";
    return 2;
  }
  for (int i = 2; i < argc; ++i) {
    std::string a = argv[i];
    auto eq = a.find('=');
    if (eq != std::string::npos) args[a.substr(0, eq)] = a.substr(eq + 1);
  }
  const char* rank = std::getenv("RANK");
  const char* world = std::getenv("WORLD_SIZE");
  tag = std::string("rank ") + (rank ? rank : "0") + "/" + (world ? world : "1");
  const std::string mode = argv[1];
  try {
    if (mode == "train" || mode == "fault") return run_train();
    if (mode == "collectives") return run_collectives();
    if (mode == "no_sync") return run_no_sync();
    if (mode == "hooks") return run_hooks();
    if (mode == "join") return run_join();
    if (mode == "scaler") return run_scaler();
    if (mode == "fp8") return run_fp8();
    if (mode == "shapes") return run_shapes();
    if (mode == "unused") return run_unused();
    if (mode == "recompute") return run_recompute();
    if (mode == "parity") return run_parity();
    if (mode == "zero") return run_zero();
    if (mode == "cuda") return run_cuda();
    if (mode == "env") {
      const std::string hook = arg("hook", "none");
      if (hook == "empty") (void)loom::CommHook::user("mine", {});
      loom::DdpOptions o;
      o.comm_hook = loom::CommHook::parse(hook);
      loom::Ddp ddp(o);
      say("env ok");
      return 0;
    }
  } catch (const loom::Error& e) {
    say(std::string("loom::Error: ") + e.what());
    return 3;
  } catch (const std::exception& e) {
    say(std::string("other exception: ") + e.what());
    return 4;
  }
  std::cerr << "loom_dist_worker: unknown mode " << mode << "\n";
  return 2;
}
