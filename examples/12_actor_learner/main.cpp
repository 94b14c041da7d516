// Training inside a live application: actor threads play cart-pole with the latest policy a
// learner thread publishes (loom::Published), and the learner trains the policy by policy
// gradient (REINFORCE with normalized returns) on the episodes they send back.
//
//   actor_learner [--actors 4] [--target 475] [--max-seconds 300] [--batch-episodes 8]
//                 [--lr 0.01] [--seed 0] [--actor-dtype 32-true|bf16]
//
// The cart-pole is the classic control task (Barto, Sutton and Anderson; Gym's CartPole-v1
// dynamics): push a cart left or right to keep a pole upright, reward 1 a step, the episode
// ends when the pole leans past 12 degrees, the cart leaves [-2.4, 2.4] or after 500 steps.
// The program ends when the mean return of the last 50 episodes reaches --target ("solved"),
// and exits 1 when --max-seconds pass first. Each actor thread holds a snapshot of one policy
// version for a whole episode (under c10::InferenceMode, in --actor-dtype) and never waits for
// the learner; the learner never waits for an actor: it publishes after each update and goes
// on with the next batch of episodes.
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <deque>
#include <mutex>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <ATen/Parallel.h>
#include <c10/core/InferenceMode.h>
#include <torch/nn/functional/activation.h>
#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <CLI/CLI.hpp>

#include <loom/loom.hpp>
#include <loom/published.hpp>

namespace {

struct Options {
  int actors = 4;
  double target = 475.0;
  double max_seconds = 300.0;
  int batch_episodes = 8;
  double lr = 0.01;
  uint64_t seed = 0;
  std::string actor_dtype = "32-true";
};

/// Gym's CartPole-v1, step for step (Euler integration, tau 0.02 s).
class CartPole {
 public:
  explicit CartPole(uint64_t seed) : rng_(seed) {}

  /// A new episode: every state variable uniform in [-0.05, 0.05].
  std::array<float, 4> reset() {
    std::uniform_real_distribution<float> u(-0.05F, 0.05F);
    for (float& v : s_) v = u(rng_);
    steps_ = 0;
    return s_;
  }

  /// Pushes left (0) or right (1); whether the episode is over.
  bool step(int action) {
    constexpr float g = 9.8F, m_cart = 1.0F, m_pole = 0.1F, half_len = 0.5F, force_mag = 10.0F;
    constexpr float tau = 0.02F, total = m_cart + m_pole, pole_ml = m_pole * half_len;
    auto& [x, x_dot, theta, theta_dot] = s_;
    const float force = action == 1 ? force_mag : -force_mag;
    const float c = std::cos(theta), s = std::sin(theta);
    const float temp = (force + pole_ml * theta_dot * theta_dot * s) / total;
    const float theta_acc =
        (g * s - c * temp) / (half_len * (4.0F / 3.0F - m_pole * c * c / total));
    const float x_acc = temp - pole_ml * theta_acc * c / total;
    x += tau * x_dot;
    x_dot += tau * x_acc;
    theta += tau * theta_dot;
    theta_dot += tau * theta_acc;
    ++steps_;
    constexpr float theta_limit = 12.0F * 2.0F * 3.14159265F / 360.0F;
    return x < -2.4F || x > 2.4F || theta < -theta_limit || theta > theta_limit || steps_ >= 500;
  }
  const std::array<float, 4>& state() const { return s_; }

 private:
  std::mt19937_64 rng_;
  std::array<float, 4> s_{};
  int steps_ = 0;
};

/// One episode: the observations, the actions taken, the return from each step on
/// (undiscounted: every step's reward is 1), and the policy version that played it.
struct Episode {
  std::vector<float> obs;  // steps x 4
  std::vector<int64_t> actions;
  int64_t version = 0;
  int64_t length() const { return static_cast<int64_t>(actions.size()); }
};

/// Episodes from the actors to the learner (the program's own hand-over; loom::Published
/// carries the weights the other way). Holds at most `capacity`: an actor that finds it full
/// drops the oldest episode (actors never wait for the learner either).
class Inbox {
 public:
  explicit Inbox(std::size_t capacity) : capacity_(capacity) {}
  void put(Episode e) {
    {
      std::lock_guard<std::mutex> lock(m_);
      if (q_.size() == capacity_) q_.pop_front();
      q_.push_back(std::move(e));
    }
    cv_.notify_one();
  }
  /// Waits for `n` episodes (or `stop`) and takes them.
  std::vector<Episode> take(std::size_t n, const std::atomic<bool>& stop) {
    std::unique_lock<std::mutex> lock(m_);
    cv_.wait_for(lock, std::chrono::seconds(1), [&] { return q_.size() >= n || stop.load(); });
    std::vector<Episode> out;
    while (!q_.empty() && out.size() < n) {
      out.push_back(std::move(q_.front()));
      q_.pop_front();
    }
    return out;
  }

 private:
  std::mutex m_;
  std::condition_variable cv_;
  std::deque<Episode> q_;
  std::size_t capacity_;
};

torch::nn::Sequential make_policy() {
  return torch::nn::Sequential(torch::nn::Linear(4, 64), torch::nn::Tanh(),
                               torch::nn::Linear(64, 2));
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  CLI::App app("Actor threads play cart-pole with the policy a learner thread publishes");
  app.add_option("--actors", o.actors, "actor threads")->check(CLI::Range(1, 64));
  app.add_option("--target", o.target, "mean return of the last 50 episodes that ends the run");
  app.add_option("--max-seconds", o.max_seconds, "give up (exit 1) after this long");
  app.add_option("--batch-episodes", o.batch_episodes, "episodes a policy update takes")
      ->check(CLI::Range(1, 1024));
  app.add_option("--lr", o.lr, "Adam's learning rate");
  app.add_option("--seed", o.seed, "the seed of the policy and of the actors' episodes");
  app.add_option("--actor-dtype", o.actor_dtype, "the actors' copy of the policy")
      ->check(CLI::IsMember({"32-true", "bf16"}));
  CLI11_PARSE(app, argc, argv);

  try {
    at::set_num_threads(1);  // every thread its own operators
    torch::manual_seed(o.seed);
    loom::Runtime<loom::Cpu, loom::Fp32> rt(loom::Cpu{});
    auto policy = make_policy();
    loom::optim::Adam opt(policy->parameters(), loom::optim::AdamOptions(o.lr));
    rt.setup(policy, opt);
    loom::PublishOptions publish_options;
    if (o.actor_dtype == "bf16") publish_options.dtype = at::kBFloat16;
    loom::Published<torch::nn::Sequential> published(policy, publish_options);

    Inbox inbox(2 * static_cast<std::size_t>(o.batch_episodes));
    std::atomic<bool> stop{false};
    std::vector<std::thread> actors;
    for (int a = 0; a < o.actors; ++a) {
      actors.emplace_back([&, a] {
        at::set_num_threads(1);
        c10::InferenceMode inference;
        CartPole env(o.seed * 1000 + static_cast<uint64_t>(a) + 1);
        std::mt19937_64 rng(o.seed * 7919 + static_cast<uint64_t>(a));
        std::uniform_real_distribution<float> u(0.0F, 1.0F);
        const auto dtype = publish_options.dtype.value_or(at::kFloat);
        while (!stop.load(std::memory_order_relaxed)) {
          auto snap = published.latest();  // one version for the whole episode
          Episode e;
          e.version = snap.version();
          env.reset();
          bool over = false;
          while (!over) {
            const auto& s = env.state();
            e.obs.insert(e.obs.end(), s.begin(), s.end());
            const at::Tensor x = torch::tensor({s[0], s[1], s[2], s[3]}).to(dtype).view({1, 4});
            const float p_right =
                torch::softmax(snap->forward(x).to(at::kFloat), 1)[0][1].item<float>();
            const int action = u(rng) < p_right ? 1 : 0;
            e.actions.push_back(action);
            over = env.step(action);
          }
          inbox.put(std::move(e));
        }
      });
    }

    const auto start = std::chrono::steady_clock::now();
    std::deque<double> recent;  // the last 50 returns
    int64_t episodes = 0, updates = 0, lag_sum = 0, used = 0, dropped = 0;
    bool solved = false;
    double mean = 0.0;
    for (;;) {
      const double elapsed =
          std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
      if (elapsed > o.max_seconds) break;
      std::vector<Episode> batch = inbox.take(static_cast<std::size_t>(o.batch_episodes), stop);
      if (batch.empty()) continue;
      // REINFORCE: minimize -log pi(a|s) * (G - mean G) / std G over the batch's steps, G the
      // undiscounted return from each step on.
      std::vector<float> obs, returns;
      std::vector<int64_t> actions;
      for (const Episode& e : batch) {
        // Policy gradient is on-policy: an episode played by a policy more than 2 versions old
        // is dropped (its return still counts in the mean).
        const int64_t lag = published.version() - e.version;
        recent.push_back(static_cast<double>(e.length()));
        if (recent.size() > 50) recent.pop_front();
        ++episodes;
        if (lag > 2) {
          ++dropped;
          continue;
        }
        lag_sum += lag;
        ++used;
        obs.insert(obs.end(), e.obs.begin(), e.obs.end());
        actions.insert(actions.end(), e.actions.begin(), e.actions.end());
        for (int64_t t = 0; t < e.length(); ++t) {
          returns.push_back(static_cast<float>(e.length() - t));
        }
      }
      if (actions.empty()) continue;
      const int64_t n = static_cast<int64_t>(actions.size());
      const at::Tensor x = torch::from_blob(obs.data(), {n, 4}).clone();
      const at::Tensor a = torch::from_blob(actions.data(), {n}, torch::kLong).clone();
      at::Tensor g = torch::from_blob(returns.data(), {n}).clone();
      g = (g - g.mean()) / (g.std() + 1e-6);
      opt.zero_grad();
      const at::Tensor logp = torch::log_softmax(rt.forward(policy, x), 1);
      const at::Tensor loss = -(logp.gather(1, a.view({n, 1})).view({n}) * g).mean();
      rt.backward(loss, policy);
      rt.optimizer_step(opt);
      published.publish(policy);  // the actors' next episodes play this version
      ++updates;
      mean =
          std::accumulate(recent.begin(), recent.end(), 0.0) / static_cast<double>(recent.size());
      if (updates % 25 == 0) {
        std::printf("update %lld: %lld episodes, mean return of the last %zu %.1f (%.1f s)\n",
                    static_cast<long long>(updates), static_cast<long long>(episodes),
                    recent.size(), mean, elapsed);
        std::fflush(stdout);
      }
      if (recent.size() == 50 && mean >= o.target) {
        solved = true;
        break;
      }
    }
    stop.store(true);
    for (auto& t : actors) t.join();
    const double seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    std::printf(
        "%s: mean return %.1f over the last 50 episodes after %lld updates, %lld episodes, "
        "%.1f s; %d actor threads, %lld episodes dropped (over 2 versions old), mean lag of the "
        "others %.2f versions, %zu replicas\n",
        solved ? "solved" : "not solved", mean, static_cast<long long>(updates),
        static_cast<long long>(episodes), seconds, o.actors, static_cast<long long>(dropped),
        used > 0 ? static_cast<double>(lag_sum) / static_cast<double>(used) : 0.0,
        published.replicas());
    return solved ? 0 : 1;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
}
