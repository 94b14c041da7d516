// device::PrefetchLoader on the CPU: the producer thread, its bound, errors, stopping and
// restarting, nested batches, and equality with the inline path.
// Catch2 is not thread-safe: prefetch functions only record into atomics or locked vectors,
// and the checks run on the test's own thread.
#include <atomic>
#include <chrono>
#include <cstddef>
#include <map>
#include <mutex>
#include <optional>
#include <ranges>
#include <stdexcept>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include <c10/core/GradMode.h>
#include <torch/data/dataloader.h>
#include <torch/data/datasets/map.h>
#include <torch/data/datasets/tensor.h>
#include <torch/data/samplers/sequential.h>
#include <torch/data/transforms/stack.h>
#include "support/catch.hpp"

#include <loom/device/cpu.hpp>
#include <loom/device/prefetch.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/runtime.hpp>

using loom::device::Cpu;
using loom::device::Prefetch;
using loom::precision::Fp32;
using namespace std::chrono_literals;

namespace {

/// A device policy for the meta device: real moves, checked without an accelerator.
struct Meta : loom::device::Defaults<Meta> {
  static constexpr c10::DeviceType device_type() { return c10::kMeta; }
  static constexpr std::string_view name() { return "meta"; }
  static constexpr std::string_view ddp_backend() { return "gloo"; }
};

using Batch = std::tuple<at::Tensor, int>;

/// A source of `n` batches that counts how many it has made, optionally slowly, and throws
/// when making batch `throw_at`.
struct Source {
  explicit Source(int n, int throw_at = -1, std::chrono::milliseconds delay = 0ms)
      : n_(n), throw_at_(throw_at), delay_(delay) {}

  /// A lazy input range over this source (hand-written: Clang 14 cannot compile
  /// libstdc++ 12's views::iota).
  struct View {
    struct iterator {
      using value_type = Batch;
      using difference_type = std::ptrdiff_t;
      Source* source = nullptr;
      int i = 0;
      Batch operator*() const { return source->make(i); }
      iterator& operator++() {
        ++i;
        return *this;
      }
      void operator++(int) { ++i; }
      bool operator==(const iterator& other) const { return i == other.i; }
    };
    Source* source;
    iterator begin() const { return {source, 0}; }
    iterator end() const { return {source, source->n_}; }
  };
  View view() { return View{this}; }

  Batch make(int i) {
    if (delay_ > 0ms) std::this_thread::sleep_for(delay_);
    if (i == throw_at_) throw std::runtime_error("source failed at " + std::to_string(i));
    made.fetch_add(1);
    return Batch(at::full({2}, float(i)), i);
  }

  std::atomic<int> made{0};

 private:
  int n_, throw_at_;
  std::chrono::milliseconds delay_;
};

/// Records the thread it ran on and the grad mode it saw, then multiplies the label by 10.
struct Recorder {
  std::thread::id* thread;
  std::atomic<bool>* grad_seen;
  Batch operator()(Batch b) const {
    *thread = std::this_thread::get_id();
    if (c10::GradMode::is_enabled()) grad_seen->store(true);
    std::get<1>(b) *= 10;
    return b;
  }
};

}  // namespace

TEST_CASE("Prefetch yields every batch in order on a producer thread", "[data][prefetch]") {
  Source source(7);
  auto src = source.view();
  std::thread::id producer;
  std::atomic<bool> grad_seen{false};
  Meta meta;
  auto view = meta.dataloader_to_device(src, Recorder{&producer, &grad_seen}, Prefetch{});
  STATIC_REQUIRE(std::ranges::input_range<decltype(view)>);
  std::vector<int> labels;
  bool all_meta = true;
  for (auto& [x, y] : view) {
    labels.push_back(y);
    all_meta = all_meta && x.is_meta();
  }
  CHECK((labels == std::vector<int>{0, 10, 20, 30, 40, 50, 60}));  // the last batch kept
  CHECK(all_meta);  // moved before prefetch_fn, and prefetch_fn's output is what comes out
  CHECK(producer != std::thread::id());
  CHECK(producer != std::this_thread::get_id());
  CHECK_FALSE(grad_seen.load());       // prefetch_fn runs with grad disabled
  CHECK(c10::GradMode::is_enabled());  // and the consumer's grad mode is untouched
}

TEST_CASE("Prefetch runs no more than depth batches ahead", "[data][prefetch]") {
  for (std::size_t depth : {1u, 2u}) {
    CAPTURE(depth);
    const int n = 8;
    Source source(n);
    auto src = source.view();
    auto view = Cpu().dataloader_to_device(src, loom::device::NoPrefetch{}, Prefetch{depth});
    int i = 0;
    std::vector<int> made_while_holding;
    for (auto& b : view) {
      CHECK(std::get<1>(b) == i);
      std::this_thread::sleep_for(20ms);  // time for the producer to run as far as it may
      made_while_holding.push_back(source.made.load());
      ++i;
    }
    CHECK(i == n);
    int ahead = 0;
    for (int k = 0; k < n; ++k) {
      CAPTURE(k);
      // Holding batch k: batches 0..k handed out, at most `depth` more made.
      CHECK(made_while_holding[k] >= k + 1);
      CHECK(made_while_holding[k] <= std::min(n, k + 1 + int(depth)));
      ahead += made_while_holding[k] == std::min(n, k + 1 + int(depth));
    }
    CHECK(ahead >= n / 2);  // and it does run ahead (exact unless the machine is overloaded)
  }
}

TEST_CASE("Prefetch rethrows a source error at the batch where it happened", "[data][prefetch]") {
  for (int at : {0, 3}) {
    CAPTURE(at);
    Source source(6, at);
    auto src = source.view();
    auto view = Cpu().dataloader_to_device(src, loom::device::NoPrefetch{}, Prefetch{});
    std::vector<int> seen;
    auto loop = [&] {
      for (auto& b : view) seen.push_back(std::get<1>(b));
    };
    CHECK_THROWS_WITH(loop(), "source failed at " + std::to_string(at));
    std::vector<int> expected;
    for (int k = 0; k < at; ++k) expected.push_back(k);
    CHECK(seen == expected);
  }
}

TEST_CASE("Prefetch rethrows a prefetch_fn error at its batch", "[data][prefetch]") {
  Source source(6);
  auto src = source.view();
  auto fn = [](Batch b) {
    if (std::get<1>(b) == 4) throw std::invalid_argument("prefetch_fn refused 4");
    return b;
  };
  auto view = Cpu().dataloader_to_device(src, fn, Prefetch{2});
  std::vector<int> seen;
  auto it = view.begin();
  auto step = [&] {
    for (; it != std::default_sentinel; ++it) seen.push_back(std::get<1>(*it));
  };
  CHECK_THROWS_AS(step(), std::invalid_argument);
  CHECK((seen == std::vector<int>{0, 1, 2, 3}));
  CHECK(it == std::default_sentinel);  // the iterator is at its end after the error
  ++it;                                // and stays there
  CHECK(it == std::default_sentinel);
}

TEST_CASE("Leaving the loop early stops the producer", "[data][prefetch]") {
  Source source(1000, -1, 2ms);
  auto src = source.view();
  auto view = Cpu().dataloader_to_device(src, loom::device::NoPrefetch{}, Prefetch{1});
  auto start = std::chrono::steady_clock::now();
  int n = 0;
  for (auto& b : view) {
    (void)b;
    if (++n == 3) break;
  }
  int made = source.made.load();
  CHECK(made <= 3 + 1);
  std::this_thread::sleep_for(30ms);
  CHECK(source.made.load() == made);  // joined: nothing is made any more
  CHECK(std::chrono::steady_clock::now() - start < 2s);
}

TEST_CASE("Destroying the view mid-epoch stops and joins the producer", "[data][prefetch]") {
  Source source(1000, -1, 1ms);
  auto src = source.view();
  using View = decltype(Cpu().dataloader_to_device(src, loom::device::NoPrefetch{}, Prefetch{2}));
  std::optional<View> view(
      Cpu().dataloader_to_device(src, loom::device::NoPrefetch{}, Prefetch{2}));
  auto it = view->begin();
  ++it;
  view.reset();  // the iterator outlives its view
  int made = source.made.load();
  CHECK(made <= 2 + 1 + 2);
  std::this_thread::sleep_for(20ms);
  CHECK(source.made.load() == made);
  ++it;  // a stopped epoch ends: no deadlock
  CHECK(it == std::default_sentinel);
}

TEST_CASE("begin() again starts a new epoch from the first batch", "[data][prefetch]") {
  Source source(5);
  auto src = source.view();
  auto view = Cpu().dataloader_to_device(src, loom::device::NoPrefetch{}, Prefetch{});
  {
    auto it = view.begin();
    ++it;
    CHECK(std::get<1>(*it) == 1);
  }  // abandoned mid-epoch
  for (int epoch = 0; epoch < 3; ++epoch) {
    std::vector<int> seen;
    for (auto& b : view) seen.push_back(std::get<1>(b));
    CHECK((seen == std::vector<int>{0, 1, 2, 3, 4}));
  }
  // A new begin() while an old iterator is alive stops the old epoch.
  auto old = view.begin();
  auto fresh = view.begin();
  CHECK(std::get<1>(*fresh) == 0);
  ++old;
  CHECK(old == std::default_sentinel);
}

TEST_CASE("Prefetch equals the inline path, nested batches included", "[data][prefetch]") {
  using Nested =
      std::map<std::string,
               std::vector<std::tuple<at::Tensor, std::optional<at::Tensor>, std::string>>>;
  std::vector<Nested> source;
  for (int i = 0; i < 6; ++i) {
    at::Tensor img = at::randn({2, 3});  // (2, 3) f32
    std::optional<at::Tensor> mask;
    if (i % 2) mask = at::randint(0, 5, {4});  // (4,) i64
    source.push_back(Nested{{"a", {{img, mask, "x" + std::to_string(i)}}},
                            {"b", {{img * 2, std::nullopt, "y"}, {at::arange(i + 1), mask, "z"}}}});
  }
  auto fn = [](Nested b) {
    for (auto& [k, v] : b) {
      for (auto& [t, m, s] : v) {
        t = t * 3 + 1;
        if (m) *m = *m + 1;
        s += "!";
      }
    }
    return b;
  };
  Cpu cpu;
  std::vector<Nested> inline_out, prefetch_out;
  for (auto& b : cpu.dataloader_to_device(source, fn)) inline_out.push_back(b);
  for (auto& b : cpu.dataloader_to_device(source, fn, Prefetch{2})) prefetch_out.push_back(b);
  REQUIRE(inline_out.size() == source.size());
  REQUIRE(prefetch_out.size() == source.size());
  for (std::size_t i = 0; i < source.size(); ++i) {
    for (auto& [k, v] : inline_out[i]) {
      auto& w = prefetch_out[i].at(k);
      REQUIRE(v.size() == w.size());
      for (std::size_t j = 0; j < v.size(); ++j) {
        CHECK(std::get<0>(v[j]).equal(std::get<0>(w[j])));  // bitwise
        CHECK(std::get<1>(v[j]).has_value() == std::get<1>(w[j]).has_value());
        if (std::get<1>(v[j])) CHECK(std::get<1>(v[j])->equal(*std::get<1>(w[j])));
        CHECK(std::get<2>(v[j]) == std::get<2>(w[j]));
      }
    }
  }
}

TEST_CASE("Prefetch wraps a torch::data loader through Runtime::dataloader", "[data][prefetch]") {
  for (std::size_t workers : {0u, 2u}) {
    CAPTURE(workers);
    auto dataset = torch::data::datasets::TensorDataset(at::arange(10).to(at::kFloat).unsqueeze(1))
                       .map(torch::data::transforms::Stack<torch::data::TensorExample>());
    auto loader = torch::data::make_data_loader(std::move(dataset),
                                                torch::data::samplers::SequentialSampler(10),
                                                torch::data::DataLoaderOptions(4).workers(workers));
    loom::Runtime<Cpu, Fp32> rt;
    auto view = rt.dataloader(*loader, loom::device::NoPrefetch{}, Prefetch{});
    for (int epoch = 0; epoch < 2; ++epoch) {
      std::vector<int64_t> sizes;
      float sum = 0;
      for (auto& b : view) {
        sizes.push_back(b.data.size(0));
        sum += b.data.sum().item<float>();
      }
      CHECK((sizes == std::vector<int64_t>{4, 4, 2}));
      CHECK(sum == 45.f);
    }
  }
}

TEST_CASE("Prefetch depth is 1 or 2", "[data][prefetch]") {
  std::vector<at::Tensor> source{at::ones({1})};
  Cpu cpu;
  CHECK_THROWS_WITH(cpu.dataloader_to_device(source, loom::device::NoPrefetch{}, Prefetch{0}),
                    Catch::Matchers::Contains("depth must be 1 or 2, not 0"));
  CHECK_THROWS_AS(cpu.dataloader_to_device(source, loom::device::NoPrefetch{}, Prefetch{3}),
                  loom::Error);
  auto view = cpu.dataloader_to_device(source, loom::device::NoPrefetch{}, Prefetch{2});
  CHECK(view.depth() == 2);
  auto moved = std::move(view);  // the view is movable, even between epochs
  std::size_t n = 0;
  for (auto& t : moved) n += std::size_t(t.numel());
  CHECK(n == 1);
}

TEST_CASE("An empty source yields nothing", "[data][prefetch]") {
  std::vector<at::Tensor> source;
  auto view = Cpu().dataloader_to_device(source, loom::device::NoPrefetch{}, Prefetch{});
  CHECK(view.begin() == std::default_sentinel);
}
