// loom::state::Reader: typed getters, optional keys, finish(), and the one error wording
// (owner, key path) for missing, mistyped and unexpected keys.
#include "support/catch.hpp"

#include <cstdint>
#include <string>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/Dict.h>
#include <ATen/core/ivalue.h>

#include <loom/error.hpp>
#include <loom/state/values.hpp>
#include <loom/state_dict.hpp>
#include <loom/state_reader.hpp>

namespace {

constexpr const char* owner = "loom::Thing::load_state_dict";

// The message of the loom::Error `f` throws ("" when it throws none).
template <class F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const loom::Error& e) {
    return e.what();
  }
  return "";
}

loom::state::Dict nested() {
  auto inner = loom::state::new_dict();
  inner.insert("lr", c10::IValue(0.5));
  inner.insert("name", c10::IValue(std::string("adam")));
  c10::impl::GenericList phases(c10::AnyType::get());
  auto phase = loom::state::new_dict();
  phase.insert("end_step", c10::IValue(int64_t{3}));
  phases.push_back(phase);
  auto top = loom::state::new_dict();
  top.insert("group", inner);
  top.insert("phases", phases);
  return top;
}

}  // namespace

TEST_CASE("state::Reader reads every kind and refuses what it did not read", "[state][reader]") {
  const loom::StateDict sd{{"f", 1.5},           {"i", int64_t{7}},
                           {"b", true},          {"s", std::string("x")},
                           {"t", at::ones({2})}, {"l", c10::List<double>({1.0, 2.0})}};
  loom::state::Reader r(owner, sd);
  CHECK(r.size() == 6);
  CHECK(r.has("f"));
  CHECK_FALSE(r.has("g"));
  CHECK(r.number("f") == 1.5);
  CHECK(r.number("i") == 7.0);  // an int is a number
  CHECK(r.integer("i") == 7);
  CHECK(r.boolean("b"));
  CHECK(r.string("s") == "x");
  CHECK(r.tensor("t").equal(at::ones({2})));
  CHECK(r.numbers("l") == std::vector<double>{1.0, 2.0});
  CHECK(!r.optional_number("g").has_value());
  r.finish();
}

TEST_CASE("state::Reader's errors name the owner and the key path", "[state][reader]") {
  const loom::StateDict sd{{"scale", std::string("big")}, {"foo", 1}, {"bar", 2}};

  SECTION("a missing key") {
    loom::state::Reader r(owner, sd);
    CHECK(error_of([&] { r.number("growth_tracker"); }) ==
          "loom::Thing::load_state_dict: missing key \"growth_tracker\"");
  }
  SECTION("a value of another kind") {
    loom::state::Reader r(owner, sd);
    CHECK(error_of([&] { r.number("scale"); }) ==
          "loom::Thing::load_state_dict: key \"scale\": expected a number, got a str");
    CHECK(error_of([&] { r.integer("foo"); }).empty());
    CHECK(error_of([&] { r.tensor("foo"); }) ==
          "loom::Thing::load_state_dict: key \"foo\": expected a tensor, got an int");
    CHECK(error_of([&] { r.optional_string("bar"); }) ==
          "loom::Thing::load_state_dict: key \"bar\": expected a str, got an int");
  }
  SECTION("keys nothing read, in the dict's order") {
    loom::state::Reader r(owner, sd);
    (void)r.value("scale");
    CHECK(error_of([&] { r.finish(); }) ==
          "loom::Thing::load_state_dict: unexpected key(s) \"bar\", \"foo\"");
    r.ignore("bar");
    CHECK(error_of([&] { r.finish(); }) ==
          "loom::Thing::load_state_dict: unexpected key(s) \"foo\"");
  }
  SECTION("a check of the owner's own") {
    loom::state::Reader r(owner, sd);
    CHECK(error_of([&] { r.fail("foo", "expected 2 values, got 1"); }) ==
          "loom::Thing::load_state_dict: key \"foo\": expected 2 values, got 1");
  }
  SECTION("a value that is not a dict") {
    CHECK(error_of([] { (void)loom::state::Reader(owner, c10::IValue(3)); }) ==
          "loom::Thing::load_state_dict: expected a dict, got an int");
  }
}

TEST_CASE("state::Reader names nested keys by their path", "[state][reader]") {
  loom::state::Reader r(owner, c10::IValue(nested()));
  auto group = r.child("group");
  CHECK(group.number("lr") == 0.5);
  CHECK(error_of([&] { group.number("momentum"); }) ==
        "loom::Thing::load_state_dict: missing key \"group.momentum\"");
  CHECK(error_of([&] { group.number("name"); }) ==
        "loom::Thing::load_state_dict: key \"group.name\": expected a number, got a str");
  CHECK(error_of([&] { group.finish(); }).empty());
  auto phases = r.children("phases");
  REQUIRE(phases.size() == 1);
  CHECK(phases[0].integer("end_step") == 3);
  CHECK(error_of([&] { phases[0].string("end_step"); }) ==
        "loom::Thing::load_state_dict: key \"phases.0.end_step\": expected a str, got an int");
  CHECK(error_of([&] { r.child("phases"); }) ==
        "loom::Thing::load_state_dict: key \"phases\": expected a dict, got a list");
  r.finish();
  // A number list names the element.
  loom::state::Reader lists(owner, loom::StateDict{{"lrs", c10::List<int64_t>({1})}});
  CHECK(lists.numbers("lrs") == std::vector<double>{1.0});
  c10::impl::GenericList mixed(c10::AnyType::get());
  mixed.push_back(c10::IValue(1.0));
  mixed.push_back(c10::IValue(std::string("x")));
  loom::state::Reader bad(owner, loom::StateDict{{"lrs", mixed}});
  CHECK(error_of([&] { bad.numbers("lrs"); }) ==
        "loom::Thing::load_state_dict: key \"lrs.1\": expected a number, got a str");
}

TEST_CASE("rt.load's lookups word their errors as the reader does", "[state][reader]") {
  const auto d = nested();
  CHECK(error_of([&] { loom::state::at(d, "model", "checkpoint"); }) ==
        "loom::load: missing key \"checkpoint.model\"");
  CHECK(error_of([&] { loom::state::as_int(c10::IValue(0.5), "optimizer.state.0.step"); }) ==
        "loom::load: key \"optimizer.state.0.step\": expected an int, got a float");
}
