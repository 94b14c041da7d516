// loom::Checkpoints: a run's checkpoints in a directory, what it keeps, `latest`, and resuming
// from the newest one that loads.
#include "support/catch.hpp"
#include "support/warnings.hpp"

#include <unistd.h>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <loom/checkpoint/dcp.hpp>
#include <loom/checkpoint/io.hpp>
#include <loom/checkpoint/shards.hpp>
#include <loom/loom.hpp>
#include <loom/state/checkpoints.hpp>

using Catch::Matchers::Contains;

namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path = fs::temp_directory_path() / ("loom_ckpt_dir_" + std::to_string(::getpid()));
  TempDir() {
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
};

std::string read_all(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

/// Every file of `dir` with its bytes.
std::map<std::string, std::string> snapshot(const fs::path& dir) {
  std::map<std::string, std::string> files;
  for (const auto& e : fs::directory_iterator(dir)) {
    files[e.path().filename().string()] = read_all(e.path());
  }
  return files;
}

/// The model's weight after `step` steps of this toy run: its value names the step.
void set_step(torch::nn::Linear& model, std::int64_t step) {
  at::NoGradGuard no_grad;
  model->weight.fill_(static_cast<double>(step));
}

/// A toy run: a runtime, a Linear model, SGD, and the state that names them.
struct ToyRun {
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  torch::nn::Linear model{3, 2};
  torch::optim::SGD opt{model->parameters(), 0.1};
  loom::State state;
  ToyRun() {
    rt.setup(model, opt);
    state = loom::State{{"model", model}, {"optimizer", opt}, {"runtime", rt}};
  }
};

}  // namespace

TEST_CASE("Checkpoints keeps the last K and every M-th, points latest at the newest, resumes",
          "[checkpoint][directory]") {
  TempDir tmp;
  const auto dir = tmp.path / "run";
  ToyRun run;
  auto& [rt, model, opt, state] = run;

  loom::Checkpoints ckpt(dir, {.keep_last = 2, .keep_every = 2});
  CHECK(ckpt.steps().empty());
  CHECK_FALSE(ckpt.resume(rt, state).has_value());  // a fresh run: nothing to resume
  // The files a sharded save (loom::Zero) writes beside a step's main file go with it.
  fs::create_directories(dir);
  for (const char* name : {"step-1.00ab.shard-1-of-2.pt", "step-2.00ab.shard-1-of-2.pt",
                           "step-3.00ab.shard-1-of-2.pt", "step-10.00ab.shard-1-of-2.pt"}) {
    std::ofstream(dir / name) << "a shard";
  }

  for (std::int64_t step = 1; step <= 5; ++step) {
    set_step(model, step);
    ckpt.save(rt, step, state, {.sync = false});
  }
  // The last two (4, 5) and the multiples of 2 (2, 4); 1 and 3 are gone.
  CHECK(ckpt.steps() == std::vector<std::int64_t>{2, 4, 5});
  CHECK(ckpt.latest() == 5);
  CHECK(fs::exists(dir / "step-5.pt"));
  CHECK_FALSE(fs::exists(dir / "step-3.pt"));
  CHECK_FALSE(fs::exists(dir / "step-1.00ab.shard-1-of-2.pt"));
  CHECK_FALSE(fs::exists(dir / "step-3.00ab.shard-1-of-2.pt"));
  CHECK(fs::exists(dir / "step-2.00ab.shard-1-of-2.pt"));   // step 2 is kept
  CHECK(fs::exists(dir / "step-10.00ab.shard-1-of-2.pt"));  // not step 1's

  set_step(model, -1);
  CHECK(ckpt.resume(rt, state) == 5);
  CHECK(model->weight.eq(5).all().item<bool>());

  SECTION("a truncated newest checkpoint is moved aside with a warning naming it") {
    const auto newest = dir / "step-5.pt";
    fs::resize_file(newest, fs::file_size(newest) / 2);
    const auto truncated = read_all(newest);
    set_step(model, -1);
    loom::testing::WarningCatcher warnings;
    CHECK(ckpt.resume(rt, state) == 4);
    CHECK(model->weight.eq(4).all().item<bool>());
    REQUIRE(warnings.messages.size() == 1);
    CHECK_THAT(warnings.messages[0],
               Contains("step-5.pt does not read") &&
                   Contains("moved it to " + newest.string() + ".unreadable"));
    CHECK_FALSE(fs::exists(newest));
    CHECK(read_all(dir / "step-5.pt.unreadable") == truncated);  // kept, byte for byte
    // Saving on from step 4 never touches it; pruning never counts it.
    set_step(model, 5);
    ckpt.save(rt, 5, state, {.sync = false});
    ckpt.save(rt, 6, state, {.sync = false});
    CHECK(read_all(dir / "step-5.pt.unreadable") == truncated);
    CHECK(ckpt.steps() == std::vector<std::int64_t>{2, 4, 5, 6});
  }
  SECTION("when no checkpoint reads, the error says so; every file is kept aside") {
    for (auto s : ckpt.steps()) std::ofstream(ckpt.path(s), std::ios::trunc) << "not a zip";
    loom::testing::WarningCatcher warnings;
    std::string what;
    try {
      ckpt.resume(rt, state);
    } catch (const loom::CheckpointUnreadable& e) {
      what = e.what();
    }
    CHECK_THAT(what, Contains("no checkpoint in " + dir.string() + " reads whole") &&
                         Contains("the oldest failed with"));
    CHECK(warnings.messages.size() == 3);
    for (std::int64_t s : {2, 4, 5}) {
      CHECK(read_all(fs::path(ckpt.path(s).string() + ".unreadable")) == "not a zip");
    }
    CHECK(ckpt.steps().empty());
  }
  SECTION("files that are not step-<N>.pt are ignored; a killed save's are removed on resume") {
    std::ofstream(dir / ".step-9.pt.tmp.123") << "a killed save";
    std::ofstream(dir / ".step-9.00ab.shard-1-of-2.pt.tmp.77") << "a killed shard save";
    std::ofstream(dir / ".step-9.pt.tmp.x") << "not a pid: not loom's";
    std::ofstream(dir / "step-x.pt") << "not a step";
    CHECK(ckpt.steps() == std::vector<std::int64_t>{2, 4, 5});
    loom::testing::WarningCatcher warnings;
    CHECK(ckpt.resume(rt, state) == 5);
    CHECK_FALSE(fs::exists(dir / ".step-9.pt.tmp.123"));
    CHECK_FALSE(fs::exists(dir / ".step-9.00ab.shard-1-of-2.pt.tmp.77"));
    CHECK(fs::exists(dir / ".step-9.pt.tmp.x"));
    CHECK(fs::exists(dir / "step-x.pt"));
    CHECK(warnings.messages.size() == 2);
  }
}

TEST_CASE("A checkpoint that reads but does not fit the run stops the resume, changing nothing",
          "[checkpoint][directory]") {
  TempDir tmp;
  const auto dir = tmp.path / "run";
  loom::Checkpoints ckpt(dir, {.keep_last = 5});
  {
    ToyRun run;  // Linear(3, 2)
    for (std::int64_t step = 1; step <= 3; ++step) {
      set_step(run.model, step);
      ckpt.save(run.rt, step, run.state, {.sync = false});
    }
  }
  // An older file of another run (Linear(3, 4)) that would load: never a reason to fall back.
  {
    loom::Runtime<loom::Cpu, loom::Fp32> rt;
    torch::nn::Linear model{3, 4};
    torch::optim::SGD opt{model->parameters(), 0.1};
    rt.setup(model, opt);
    rt.save(dir / "step-0.pt", {{"model", model}, {"optimizer", opt}, {"runtime", rt}});
  }
  const auto before = snapshot(dir);

  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  torch::nn::Linear model{3, 4};  // the shapes differ from the newest checkpoints'
  torch::optim::SGD opt{model->parameters(), 0.1};
  rt.setup(model, opt);
  const loom::State state{{"model", model}, {"optimizer", opt}, {"runtime", rt}};
  loom::testing::WarningCatcher warnings;
  std::string what;
  try {
    ckpt.resume(rt, state);
  } catch (const loom::CheckpointMismatch& e) {
    what = e.what();
  }
  CHECK_THAT(what, Contains((dir / "step-3.pt").string() + " does not fit this run"));
  CHECK_THAT(what, Contains("'weight' has shape [2, 3] in the checkpoint and [4, 3]"));
  CHECK_THAT(what, Contains("nothing in " + dir.string() + " was changed"));
  CHECK_THAT(what, Contains("give this run a directory of its own"));
  CHECK(warnings.messages.empty());
  CHECK(snapshot(dir) == before);  // byte for byte
}

TEST_CASE("A sharded checkpoint loads whole under any strategy, and a missing shard is named",
          "[checkpoint][shards]") {
  namespace ck = loom::checkpoint;
  TempDir tmp;
  torch::manual_seed(3);
  loom::Runtime<loom::Cpu, loom::Fp32> rt;
  torch::nn::Linear model(3, 2);
  torch::optim::Adam opt(model->parameters(), 0.1);
  rt.setup(model, opt);
  for (int i = 0; i < 2; ++i) {
    opt.zero_grad();
    rt.backward(rt.forward(model, torch::randn({4, 3})).square().sum(), model);
    rt.optimizer_step(opt);
  }
  const loom::State state{{"model", model}, {"optimizer", opt}};
  const c10::IValue whole(loom::state::save_entries(state));
  // What two ranks of loom::Zero write: rank 0 owns parameter 0 (the weight), rank 1 the bias.
  auto main = whole.toGenericDict().copy();
  auto entry = main.at("optimizer").toGenericDict().copy();
  const auto states = entry.at("state").toGenericDict();
  c10::impl::GenericDict rank0(c10::IntType::get(), c10::AnyType::get());
  c10::impl::GenericDict rank1(c10::IntType::get(), c10::AnyType::get());
  rank0.insert(std::int64_t{0}, states.at(std::int64_t{0}));
  rank1.insert(std::int64_t{1}, states.at(std::int64_t{1}));
  entry.insert_or_assign("state", rank0);
  main.insert_or_assign("optimizer", entry);
  c10::impl::GenericDict shard(c10::StringType::get(), c10::AnyType::get());
  shard.insert("optimizer", rank1);

  const auto path = tmp.path / "ck.pt";
  const auto file = ck::shard_path(path, "00ab", 1, 2);
  CHECK(file == tmp.path / "ck.00ab.shard-1-of-2.pt");
  const ck::ShardIndex index{.world_size = 2,
                             .files = {file.filename().string()},
                             .owners = {0, 1},
                             .numels = {6, 2},
                             .slots = {},
                             .rows = {}};
  ck::save_value(path, ck::with_shard_index(c10::IValue(main), index));
  ck::save_value(file, c10::IValue(shard));

  const auto read = ck::shard_index(ck::load_value(path), path);
  CHECK(read.world_size == 2);
  CHECK(read.files == index.files);
  CHECK(read.owners == index.owners);
  CHECK(read.numels == index.numels);

  // A one-process runtime (the strategy's default load_checkpoint) reads every shard.
  torch::nn::Linear other(3, 2);
  torch::optim::Adam other_opt(other->parameters(), 0.1);
  loom::Runtime<loom::Cpu, loom::Fp32> rt2;
  rt2.setup(other, other_opt);
  const auto extra = rt2.load(path, loom::State{{"model", other}, {"optimizer", other_opt}});
  CHECK(extra.empty());  // the index is not handed back as an unknown entry
  REQUIRE(other_opt.state().size() == 2);
  for (std::size_t i = 0; i < 2; ++i) {
    const auto& p = opt.param_groups()[0].params()[i];
    const auto& q = other_opt.param_groups()[0].params()[i];
    const auto& a =
        static_cast<const torch::optim::AdamParamState&>(*opt.state().at(p.unsafeGetTensorImpl()));
    const auto& b = static_cast<const torch::optim::AdamParamState&>(
        *other_opt.state().at(q.unsafeGetTensorImpl()));
    CHECK(a.step() == b.step());
    CHECK(at::equal(a.exp_avg(), b.exp_avg()));
    CHECK(at::equal(a.exp_avg_sq(), b.exp_avg_sq()));
  }

  SECTION("a missing shard file is an error naming it") {
    fs::remove(file);
    CHECK_THROWS_WITH(rt2.load(path, loom::State{{"model", other}, {"optimizer", other_opt}}),
                      Contains("ck.00ab.shard-1-of-2.pt") && Contains("which is missing"));
  }
  SECTION("an index whose files do not fit its world size is refused") {
    const ck::ShardIndex bad{.world_size = 3,
                             .files = index.files,
                             .owners = {0, 1},
                             .numels = {6, 2},
                             .slots = {},
                             .rows = {}};
    ck::save_value(path, ck::with_shard_index(c10::IValue(main), bad));
    CHECK_THROWS_WITH(rt2.load(path, loom::State{{"model", other}, {"optimizer", other_opt}}),
                      Contains("names 1 files for a world of 3"));
  }
  SECTION("a shard of an entry the main file has no optimizer for is refused") {
    c10::impl::GenericDict stray(c10::StringType::get(), c10::AnyType::get());
    stray.insert("model", rank1);
    ck::save_value(file, c10::IValue(stray));
    CHECK_THROWS_WITH(rt2.load(path, loom::State{{"model", other}, {"optimizer", other_opt}}),
                      Contains("holds states of 'model'") && Contains("no optimizer entry"));
  }
}

TEST_CASE("Pieces on dim 0 merge whole, or into the rows a rank asks, from the files holding them",
          "[checkpoint][shards]") {
  namespace ck = loom::checkpoint;
  TempDir tmp;
  // A 5 x 2 tensor cut over 3 ranks as FSDP2 cuts it: chunk 2, rows 2, 2 and 1.
  CHECK(ck::rows_of(5, 0, 3).first == 0);
  CHECK(ck::rows_of(5, 1, 3).count == 2);
  CHECK(ck::rows_of(5, 2, 3).first == 4);
  CHECK(ck::rows_of(5, 2, 3).count == 1);
  CHECK(ck::rows_of(1, 1, 2).count == 0);  // a rank past the rows holds none
  const at::Tensor whole = at::arange(10, at::kFloat).reshape({5, 2});
  const std::vector<c10::IValue> slot{c10::IValue(std::string("model")),
                                      c10::IValue(std::string("w"))};
  c10::impl::GenericDict model(c10::StringType::get(), c10::AnyType::get());
  model.insert("w", whole.narrow(0, 0, 2).clone());
  model.insert("b", at::ones({3}));  // not indexed: left as it is
  c10::impl::GenericDict top(c10::StringType::get(), c10::AnyType::get());
  top.insert("model", model);
  const auto path = tmp.path / "ck.pt";
  ck::ShardIndex index;
  index.format = 2;
  index.world_size = 3;
  for (int r = 1; r < 3; ++r) {
    const auto file = ck::shard_path(path, "0f", r, 3);
    index.files.push_back(file.filename().string());
    ck::save_value(file, ck::pieces_file({slot}, {whole.narrow(0, 2 * r, r == 1 ? 2 : 1)}));
  }
  index.slots = {slot};
  index.rows = {5};
  ck::save_value(path, ck::with_shard_index(c10::IValue(top), index));
  const auto read = ck::shard_index(ck::load_value(path), path);
  CHECK(read.format == 2);
  REQUIRE(read.slots.size() == 1);
  CHECK(read.slots[0][1].toStringRef() == "w");
  CHECK(read.rows == std::vector<std::int64_t>{5});

  auto w = [](const c10::IValue& v) {
    return v.toGenericDict().at("model").toGenericDict().at("w");
  };
  const ck::TorchFile io;
  const auto merged = ck::merge_shards(path, ck::load_value(path), io, c10::kCPU);
  CHECK(at::equal(w(merged).toTensor(), whole));
  CHECK_FALSE(ck::has_shard_index(merged));
  CHECK(merged.toGenericDict().at("model").toGenericDict().at("b").toTensor().numel() == 3);
  // Rank 1 of 2 (rows 3 and 4) reads ranks 1's and 2's files, not rank 0's rows past its own.
  const auto upper = ck::merge_shards(path, ck::load_value(path), io, c10::kCPU, {},
                                      [](std::int64_t n) { return ck::rows_of(n, 1, 2); });
  CHECK(at::equal(w(upper).toTensor(), whole.narrow(0, 3, 2)));

  SECTION("only the files holding the rows asked are read") {
    fs::remove(tmp.path / index.files[0]);  // rank 1's rows 2 and 3
    const auto last =
        ck::merge_shards(path, ck::load_value(path), io, c10::kCPU, {}, [](std::int64_t) {
          return ck::Rows{4, 1};
        });
    CHECK(at::equal(w(last).toTensor(), whole.narrow(0, 4, 1)));
    CHECK_THROWS_WITH(ck::merge_shards(path, ck::load_value(path), io, c10::kCPU),
                      Contains("ck.0f.shard-1-of-3.pt") && Contains("which is missing"));
  }
  SECTION("a piece of the wrong rows is named") {
    ck::save_value(tmp.path / index.files[1], ck::pieces_file({slot}, {whole.narrow(0, 3, 2)}));
    CHECK_THROWS_WITH(ck::merge_shards(path, ck::load_value(path), io, c10::kCPU),
                      Contains("holds 2 rows of model/w where rank 2 of 3 has 1"));
  }
  SECTION("an index without its row counts is refused") {
    auto bad = index;
    bad.rows.clear();
    ck::save_value(path, ck::with_shard_index(c10::IValue(top), bad));
    CHECK_THROWS_WITH(ck::shard_index(ck::load_value(path), path),
                      Contains("has 1 slots and 0 row counts"));
  }
}

TEST_CASE("Checkpoints refuses options that keep nothing", "[checkpoint][directory]") {
  CHECK_THROWS_WITH(loom::Checkpoints("d", {.keep_last = 0}),
                    Contains("keep_last must be at least 1"));
  CHECK_THROWS_WITH(loom::Checkpoints("d", {.keep_last = 1, .keep_every = -1}),
                    Contains("keep_every must be >= 0"));
}

TEST_CASE("An asynchronous save writes what the state held when it was called",
          "[checkpoint][directory][async]") {
  TempDir tmp;
  const auto dir = tmp.path / "run";
  ToyRun run;
  auto& [rt, model, opt, state] = run;
  loom::Checkpoints ckpt(dir, {.keep_last = 2});

  for (std::int64_t step = 1; step <= 3; ++step) {
    set_step(model, step);
    ckpt.save(rt, step, state, {.sync = false, .async = true});
    CHECK(ckpt.pending());
    set_step(model, 100 + step);  // training goes on while the copy is written
  }
  ckpt.wait(rt);
  CHECK_FALSE(ckpt.pending());
  CHECK(ckpt.steps() == std::vector<std::int64_t>{2, 3});  // pruned after each write
  CHECK(ckpt.latest() == 3);
  for (std::int64_t step : {2, 3}) {
    const c10::IValue v = loom::checkpoint::load_value(ckpt.path(step), c10::kCPU);
    const at::Tensor w = v.toGenericDict().at("model").toGenericDict().at("weight").toTensor();
    CHECK(w.eq(static_cast<double>(step)).all().item<bool>());
  }
  set_step(model, -1);
  CHECK(ckpt.resume(rt, state) == 3);
  CHECK(model->weight.eq(3).all().item<bool>());
}

TEST_CASE("A failed background write is thrown by the next wait, save or resume",
          "[checkpoint][directory][async]") {
  TempDir tmp;
  const auto dir = tmp.path / "run";
  ToyRun run;
  auto& [rt, model, opt, state] = run;
  loom::Checkpoints ckpt(dir);
  // A non-empty directory where step 2's file goes: the rename at the end of the write fails.
  fs::create_directories(dir / "step-2.pt" / "occupied");
  set_step(model, 1);
  ckpt.save(rt, 1, state, {.sync = false, .async = true});
  set_step(model, 2);
  ckpt.save(rt, 2, state, {.sync = false, .async = true});  // step 1 went well
  CHECK(ckpt.latest() == 1);
  SECTION("wait") {
    CHECK_THROWS_WITH(ckpt.wait(rt), Contains("the background save of") &&
                                         Contains("step-2.pt failed on rank 0: "));
  }
  SECTION("save") {
    CHECK_THROWS_WITH(ckpt.save(rt, 3, state, {.async = true}),
                      Contains("step-2.pt failed on rank 0"));
  }
  SECTION("resume") {
    CHECK_THROWS_WITH(ckpt.resume(rt, state), Contains("step-2.pt failed on rank 0"));
  }
  CHECK_FALSE(ckpt.pending());
  CHECK(ckpt.latest() == 1);  // latest never names a file that was not written
  fs::remove_all(dir / "step-2.pt");
  ckpt.save(rt, 4, state, {.sync = false, .async = true});  // the writer works again
  ckpt.wait(rt);
  CHECK(ckpt.latest() == 4);
}

TEST_CASE("Snapshot copies every storage once, views keep sharing, the copy is the program's",
          "[checkpoint][async]") {
  at::Tensor base = at::arange(12, at::kFloat);
  at::Tensor view = base.view({3, 4}).t();  // shares base's storage, strided
  c10::impl::GenericDict d(c10::StringType::get(), c10::AnyType::get());
  d.insert("base", base);
  d.insert("view", view);
  d.insert("list", c10::List<at::Tensor>({base.narrow(0, 2, 3)}));
  d.insert("step", int64_t{7});
  loom::checkpoint::Snapshot snap{c10::IValue(d)};
  CHECK(snap.bytes() == 12 * sizeof(float));  // one storage, copied once
  base.fill_(-1);                             // the program goes on
  const auto copy = snap.ready().toGenericDict();
  const at::Tensor b = copy.at("base").toTensor(), v = copy.at("view").toTensor();
  CHECK(b.equal(at::arange(12, at::kFloat)));
  CHECK(v.equal(at::arange(12, at::kFloat).view({3, 4}).t()));
  CHECK(v.strides() == view.strides());
  CHECK(b.storage().is_alias_of(v.storage()));
  CHECK_FALSE(b.storage().is_alias_of(base.storage()));
  const at::Tensor n = copy.at("list").toList().get(0).toTensor();
  CHECK(n.storage_offset() == 2);
  CHECK(n.equal(at::tensor({2.f, 3.f, 4.f})));
  CHECK(copy.at("step").toInt() == 7);
}

TEST_CASE("Checkpoints keeps DCP directories as it keeps files, and removes a killed save's",
          "[checkpoint][directory][dcp]") {
  TempDir tmp;
  const auto dir = tmp.path / "run";
  ToyRun run;
  auto& [rt, model, opt, state] = run;
  loom::Checkpoints ckpt(dir, {.keep_last = 2});
  // Step 1 a file; steps 2 and 3 DCP directories (what FsdpCheckpoint::Dcp writes), each
  // written by dcp::save from the file rt.save wrote (an optimizer keyed by ids, its empty
  // state gone in the flattening: the load makes both what optimizer.state_dict() gives).
  for (std::int64_t step = 1; step <= 3; ++step) {
    set_step(model, step);
    ckpt.save(rt, step, state, {.sync = false});
    if (step == 1) continue;
    const auto file = ckpt.path(step);
    const c10::IValue value = loom::checkpoint::load_value(file);
    fs::remove(file);
    loom::checkpoint::dcp::save(file, value);
    REQUIRE(fs::is_directory(file));
    REQUIRE(fs::exists(file / ".metadata"));
  }
  CHECK(ckpt.steps() == std::vector<std::int64_t>{2, 3});  // step 1's file pruned
  // A save killed while writing leaves its staged directory; resume removes it, saying so.
  fs::create_directories(dir / ".step-4.pt.partial-00ab");
  std::ofstream(dir / ".step-4.pt.partial-00ab" / "__0_0.distcp") << "part of a save";
  fs::create_directories(dir / "notes");  // another directory: no checkpoint, kept
  set_step(model, -1);
  loom::testing::WarningCatcher warnings;
  CHECK(ckpt.resume(rt, state) == 3);
  CHECK(model->weight.eq(3).all().item<bool>());
  CHECK_FALSE(fs::exists(dir / ".step-4.pt.partial-00ab"));
  CHECK(fs::exists(dir / "notes"));
  REQUIRE(warnings.messages.size() == 1);
  CHECK_THAT(warnings.messages[0], Contains(".step-4.pt.partial-00ab"));
  // Pruning removes a directory whole.
  set_step(model, 4);
  ckpt.save(rt, 4, state, {.sync = false});
  CHECK(ckpt.steps() == std::vector<std::int64_t>{3, 4});
  CHECK_FALSE(fs::exists(dir / "step-2.pt"));
  CHECK(fs::is_directory(dir / "step-3.pt"));
  // A DCP directory saved over the file of its path replaces it whole (one rename).
  const c10::IValue four = loom::checkpoint::load_value(ckpt.path(4));
  loom::checkpoint::dcp::save(ckpt.path(4), four);
  CHECK(fs::is_directory(ckpt.path(4)));
  CHECK(std::distance(fs::directory_iterator(dir), fs::directory_iterator()) == 4);
  set_step(model, -1);
  CHECK(ckpt.resume(rt, state) == 4);
  CHECK(model->weight.eq(4).all().item<bool>());
}
