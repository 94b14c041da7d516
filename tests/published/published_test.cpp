// loom::Published (include/loom/published.hpp): versions, snapshots that stay whole, replicas
// recycled, casts, modules that cannot be cloned, publishes that allocate nothing after
// warm-up, and a learner with four actor threads whose every output is replayed bit for bit.
// Its own executable: it counts the program's heap allocations (count_new.cpp replaces
// operator new), and it is built again under ThreadSanitizer (tests/CMakeLists.txt), without
// the count (LOOM_COUNTS_NEW=0: the sanitizer's runtime defines operator new).
#include "support/catch.hpp"

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <ATen/record_function.h>
#include <c10/core/InferenceMode.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>

#include <loom/error.hpp>
#include <loom/optim/adam.hpp>
#include <loom/published.hpp>

#ifndef LOOM_COUNTS_NEW
#define LOOM_COUNTS_NEW 1
#endif
#if LOOM_COUNTS_NEW
#include "published/count_new.hpp"
#endif

namespace {

struct NetImpl : torch::nn::Module {
  torch::nn::Linear fc1{nullptr}, fc2{nullptr};
  NetImpl() : NetImpl(8, 32, 4) {}
  NetImpl(int64_t in, int64_t hidden, int64_t out) {
    fc1 = register_module("fc1", torch::nn::Linear(in, hidden));
    fc2 = register_module("fc2", torch::nn::Linear(hidden, out));
    register_buffer("scale", torch::ones({out}));
  }
  at::Tensor forward(const at::Tensor& x) {
    return fc2(torch::tanh(fc1(x))) * named_buffers()["scale"];
  }
};
TORCH_MODULE(Net);  // default-constructible, not Cloneable

// Neither Cloneable nor default-constructible: needs a Factory.
struct WideImpl : torch::nn::Module {
  explicit WideImpl(int64_t width) { w = register_parameter("w", torch::randn({width})); }
  at::Tensor forward(const at::Tensor& x) { return x * w; }
  at::Tensor w;
};
TORCH_MODULE(Wide);

// Counts the tensors the calling thread creates (the ATen factories every allocation of a new
// tensor goes through) while alive.
class TensorCounter {
 public:
  TensorCounter() {
    handle_ = at::addThreadLocalCallback(
        at::RecordFunctionCallback([](const at::RecordFunction& fn)
                                       -> std::unique_ptr<at::ObserverContext> {
          const std::string_view name = fn.name();
          if (name == "aten::empty" || name == "aten::empty_strided" ||
              name == "aten::empty_like" || name == "aten::resize_") {
            ++count();
          }
          return nullptr;
        }).scopes({at::RecordScope::FUNCTION}));
    count() = 0;
  }
  ~TensorCounter() { at::removeCallback(handle_); }
  TensorCounter(const TensorCounter&) = delete;
  TensorCounter& operator=(const TensorCounter&) = delete;
  static int64_t& count() {
    thread_local int64_t n = 0;
    return n;
  }

 private:
  at::CallbackHandle handle_;
};

std::vector<at::Tensor> weights_of(torch::nn::Module& m) {
  std::vector<at::Tensor> out;
  for (const auto& p : m.parameters()) out.push_back(p.detach().clone());
  for (const auto& b : m.buffers()) out.push_back(b.detach().clone());
  return out;
}

void train_step(Net& net, loom::optim::AdamW& opt, int64_t step) {
  const at::Tensor x = torch::full({16, 8}, 0.01 * static_cast<double>(step % 17)) +
                       torch::linspace(-1, 1, 128).view({16, 8});
  opt.zero_grad();
  net->forward(x).square().mean().backward();
  opt.step();
}

}  // namespace

TEST_CASE("Published: a snapshot keeps its version's weights while the learner moves on",
          "[published]") {
  torch::manual_seed(0);
  Net net;
  loom::optim::AdamW opt(net->parameters(), loom::optim::AdamWOptions(1e-2));
  loom::Published<Net> published(net);
  CHECK(published.version() == 0);
  auto v0 = published.latest();
  REQUIRE(v0);
  CHECK(v0.version() == 0);
  const auto w0 = weights_of(*net);
  const at::Tensor x = torch::randn({3, 8});
  const at::Tensor y0 = net->forward(x).detach();

  for (int64_t step = 1; step <= 5; ++step) {
    train_step(net, opt, step);
    CHECK(published.publish(net) == step);
  }
  CHECK(published.version() == 5);
  auto v5 = published.latest();
  CHECK(v5.version() == 5);
  {
    c10::InferenceMode guard;
    CHECK(at::equal(v0->forward(x), y0));  // untouched by five publishes
    CHECK(at::equal(v5->forward(x), net->forward(x)));
  }
  // The replicas: eval mode, no grad, the learner's names.
  CHECK_FALSE(v5->is_training());
  for (const auto& p : v5->parameters()) CHECK_FALSE(p.requires_grad());
  const auto held = weights_of(v0.module());
  for (std::size_t i = 0; i < w0.size(); ++i) CHECK(at::equal(held[i], w0[i]));
  // v0 and v5 held, one being written at a time: at most 3 replicas.
  CHECK(published.replicas() <= 3);
  v0.reset();
  CHECK_FALSE(v0);
}

TEST_CASE("Published recycles released replicas and makes new ones only for held snapshots",
          "[published]") {
  Net net;
  loom::Published<Net> published(net);
  for (int i = 0; i < 50; ++i) published.publish(net);
  CHECK(published.replicas() == 2);  // the latest and the one being written next

  std::vector<loom::Published<Net>::Snapshot> held;
  for (int i = 0; i < 4; ++i) {
    held.push_back(published.latest());
    published.publish(net);
  }
  CHECK(published.replicas() == 5);  // 4 held + the latest
  held.clear();
  for (int i = 0; i < 50; ++i) published.publish(net);
  CHECK(published.replicas() == 5);  // reused, none added
}

TEST_CASE("Published casts the snapshots to the readers' dtype", "[published]") {
  torch::manual_seed(1);
  Net net;
  loom::Published<Net> published(net, {.dtype = at::kBFloat16});
  auto snap = published.latest();
  for (const auto& p : snap->named_parameters()) {
    INFO(p.key());
    CHECK(p.value().scalar_type() == at::kBFloat16);
    CHECK(at::equal(p.value(), net->named_parameters()[p.key()].to(at::kBFloat16)));
  }
}

TEST_CASE("Published replicates modules that cannot be cloned, given a Factory when needed",
          "[published]") {
  Wide wide(5);
  CHECK_THROWS_WITH(loom::Published<Wide>(wide),
                    Catch::Matchers::Contains("give Published a Factory"));
  loom::Published<Wide> published(wide, {}, [] { return Wide(5); });
  CHECK(at::equal(published.latest()->w, wide->w));
  CHECK_THROWS_WITH(loom::Published<Wide>(wide, {}, [] { return Wide(6); }),
                    Catch::Matchers::Contains("does not match the model's 'w'"));
  Wide other(5);
  CHECK_THROWS_WITH(published.publish(other),
                    Catch::Matchers::Contains("not the module this Published was built from"));

  // Cloneable modules are cloned (LibTorch's own layers).
  torch::nn::Linear linear(3, 2);
  loom::Published<torch::nn::Linear> pl(linear);
  CHECK(at::equal(pl.latest()->weight, linear->weight));
}

#if LOOM_COUNTS_NEW  // not under ThreadSanitizer, whose runtime owns operator new
TEST_CASE("After warm-up a publish allocates nothing", "[published]") {
  Net net;
  loom::Published<Net> published(net, {.dtype = at::kBFloat16});
  auto held = published.latest();
  for (int i = 0; i < 3; ++i) published.publish(net);  // warm-up: the replicas are made
  const std::size_t replicas = published.replicas();
  TensorCounter tensors;
  const int64_t before = loom::testing::heap_allocations();
  for (int i = 0; i < 100; ++i) published.publish(net);
  CHECK(loom::testing::heap_allocations() - before == 0);
  CHECK(TensorCounter::count() == 0);
  CHECK(published.replicas() == replicas);
}
#endif

TEST_CASE(
    "A learner and four actor threads: every output is the output of one published "
    "version, bit for bit",
    "[published][threads]") {
  // One intra-op thread: the actors' and the learner's operators run on their own threads
  // (and ThreadSanitizer sees every access).
  at::set_num_threads(1);
  torch::manual_seed(2);
  Net net;
  loom::optim::AdamW opt(net->parameters(), loom::optim::AdamWOptions(1e-2));
  loom::Published<Net> published(net);
  constexpr int64_t kSteps = 2000;
  constexpr int kActors = 4;
  std::vector<std::vector<at::Tensor>> versions;  // the learner's weights at each version
  versions.push_back(weights_of(*net));

  struct Record {
    int64_t version;
    at::Tensor out;
  };
  std::vector<std::vector<Record>> records(kActors);
  std::vector<at::Tensor> inputs;
  for (int a = 0; a < kActors; ++a) inputs.push_back(torch::randn({2, 8}));
  std::atomic<bool> done{false}, went_back{false};
  std::vector<std::thread> actors;
  for (int a = 0; a < kActors; ++a) {
    actors.emplace_back([&, a] {
      c10::InferenceMode guard;
      int64_t last = -1;
      while (!done.load(std::memory_order_acquire)) {
        auto snap = published.latest();
        if (snap.version() < last) went_back.store(true);  // versions never go back
        last = snap.version();
        records[static_cast<std::size_t>(a)].push_back(
            {snap.version(), snap->forward(inputs[static_cast<std::size_t>(a)])});
      }
    });
  }
  for (int64_t step = 1; step <= kSteps; ++step) {
    train_step(net, opt, step);
    published.publish(net);
    versions.push_back(weights_of(*net));
  }
  done.store(true, std::memory_order_release);
  for (auto& t : actors) t.join();

  CHECK_FALSE(went_back.load());

  // Replayed: each recorded output against the weights of its version, version by version.
  std::map<int64_t, std::vector<std::pair<int, at::Tensor>>> by_version;
  for (int a = 0; a < kActors; ++a) {
    for (auto& r : records[static_cast<std::size_t>(a)]) {
      by_version[r.version].emplace_back(a, std::move(r.out));
    }
  }
  Net replay;
  int64_t checked = 0, mismatched = 0;
  for (const auto& [version, outs] : by_version) {
    {
      torch::NoGradGuard no_grad;
      const auto& w = versions[static_cast<std::size_t>(version)];
      std::size_t i = 0;
      for (const auto& p : replay->parameters()) p.copy_(w[i++]);
      for (const auto& b : replay->buffers()) b.copy_(w[i++]);
    }
    c10::InferenceMode guard;
    std::vector<at::Tensor> want;
    for (const auto& x : inputs) want.push_back(replay->forward(x));
    for (const auto& [a, out] : outs) {
      if (!at::equal(want[static_cast<std::size_t>(a)], out)) ++mismatched;
      ++checked;
    }
  }
  const auto& seen = by_version;
  INFO(checked << " outputs of " << seen.size() << " versions replayed; " << published.replicas()
               << " replicas");
  CHECK(mismatched == 0);
  CHECK(checked >= kActors);
  CHECK(seen.size() > 1);  // the actors saw the weights change
  CHECK(published.replicas() <= kActors + 2);
}
