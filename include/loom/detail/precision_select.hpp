#pragma once
// The one list of precision names: each name loom accepts and the policy it selects, read by
// precision_t<"..."> (select_precision), by with_precision(name, fn) and by the allowed-names
// text of their errors (precision/select.hpp).
#include <array>
#include <cstddef>
#include <string_view>
#include <type_traits>

#include <loom/detail/precision_names.hpp>
#include <loom/precision/fp32.hpp>
#include <loom/precision/fp64.hpp>
#include <loom/precision/fp8.hpp>
#include <loom/precision/half.hpp>
#include <loom/precision/mixed.hpp>

namespace loom {
/// A list of precision policies (precision/select.hpp).
template <class... Policies>
struct precisions;
}  // namespace loom

namespace loom::detail {

/// What a name is to with_precision: the policy's own name, an alias it accepts silently, or
/// a discouraged alias it warns about (naming the policy's own name).
enum class NameUse { Canonical, Alias, Discouraged };

/// One row of the list: `Name` selects `Policy`.
template <PrecisionName Name, class Policy, NameUse Use = NameUse::Canonical>
struct precision_name_row {
  using policy = Policy;
  static constexpr std::string_view name() { return Name.view(); }
  static constexpr NameUse use = Use;
  static_assert(Use != NameUse::Canonical || Name.view() == Policy::precision(),
                "a canonical name is the policy's precision()");
};

template <class... Rows>
struct precision_name_table {};

/// Every name loom accepts, canonical ones first, then the aliases. The text
/// LOOM_DETAIL_PRECISION_NAMES (precision_names.hpp) lists the same, checked below.
using precision_name_list =
    precision_name_table<precision_name_row<"32-true", precision::Fp32>,
                         precision_name_row<"64-true", precision::Fp64>,
                         precision_name_row<"16-true", precision::Fp16True>,
                         precision_name_row<"bf16-true", precision::Bf16True>,
                         precision_name_row<"16-mixed", precision::Fp16Mixed>,
                         precision_name_row<"bf16-mixed", precision::Bf16Mixed>,
                         precision_name_row<"fp8-mixed", precision::Fp8Mixed>,
                         precision_name_row<"32", precision::Fp32, NameUse::Alias>,
                         precision_name_row<"64", precision::Fp64, NameUse::Alias>,
                         precision_name_row<"16", precision::Fp16Mixed, NameUse::Discouraged>,
                         precision_name_row<"bf16", precision::Bf16Mixed, NameUse::Discouraged>>;

/// The policies of the canonical rows, in order: loom::precisions<Fp32, Fp64, ...>.
template <class List, class Table>
struct canonical_policies {
  using type = List;
};
template <class... Ps, class Row, class... Rows>
struct canonical_policies<precisions<Ps...>, precision_name_table<Row, Rows...>>
    : canonical_policies<
          std::conditional_t<Row::use == NameUse::Canonical,
                             precisions<Ps..., typename Row::policy>, precisions<Ps...>>,
          precision_name_table<Rows...>> {};
using all_precisions = typename canonical_policies<precisions<>, precision_name_list>::type;

/// Whether the list `Allowed` (a loom::precisions<...>) holds `Policy`.
template <class Allowed, class Policy>
inline constexpr bool allows_precision = false;
template <class... Ps, class Policy>
inline constexpr bool allows_precision<precisions<Ps...>, Policy> = (std::is_same_v<Ps, Policy> ||
                                                                     ...);

/// Whether `List` is a loom::precisions<...> of one or more of loom's precision policies.
template <class List>
inline constexpr bool is_precision_list = false;
template <class... Ps>
inline constexpr bool is_precision_list<precisions<Ps...>> =
    sizeof...(Ps) > 0 && (allows_precision<all_precisions, Ps> && ...);
#define LOOM_DETAIL_PRECISION_LIST_MESSAGE                                                \
  "loom::precisions<...>: name one or more of loom's precision policies (Fp32, Fp64, "    \
  "Fp16True, Bf16True, Fp16Mixed, Bf16Mixed, Fp8Mixed), as loom::precisions<loom::Fp32, " \
  "loom::Bf16Mixed>"

/// The policy of the row named `S`, void when none is.
template <PrecisionName S, class Table>
struct policy_named {
  using type = void;
};
template <PrecisionName S, class Row, class... Rows>
struct policy_named<S, precision_name_table<Row, Rows...>>
    : std::conditional_t<Row::name() == S.view(), std::type_identity<typename Row::policy>,
                         policy_named<S, precision_name_table<Rows...>>> {};

/// The policy a name selects; an unknown name fails to compile, listing the allowed names.
template <PrecisionName S, class Policy = typename policy_named<S, precision_name_list>::type>
struct select_precision {
  using type = Policy;
};
template <PrecisionName S>
struct select_precision<S, void> {
  static_assert(S.view().substr(0, 18) != "transformer-engine",
                "loom::precision_t: \"transformer-engine\" precision is not supported by loom; "
                "its native alternative is \"fp8-mixed\"");
  static_assert(
      S.view().substr(0, 18) == "transformer-engine",
      "loom::precision_t<Name>: unknown precision name. Allowed: " LOOM_DETAIL_PRECISION_NAMES);
};
// The discouraged aliases: at run time with_precision warns about them; at compile time no
// compiler reliably reports a [[deprecated]] reached through an alias template, so precision_t
// accepts them silently.

/// A list's names as the errors print them: `"32-true", "bf16-mixed" (aliases: 32, "32",
/// "bf16")`, the rows of `Allowed`'s policies in the list's order.
struct NamesText {
  std::array<char, 512> chars{};
  std::size_t size = 0;
  constexpr void add(std::string_view s) {
    for (char c : s) chars[size++] = c;
  }
  constexpr std::string_view view() const { return {chars.data(), size}; }
};
template <class Allowed, class... Rows>
constexpr NamesText names_text(precision_name_table<Rows...>) {
  struct Row {
    std::string_view name;
    NameUse use;
    bool allowed;
  };
  const Row rows[] = {
      {Rows::name(), Rows::use, allows_precision<Allowed, typename Rows::policy>}...};
  NamesText t;
  bool first = true;
  for (const Row& r : rows) {
    if (!r.allowed || r.use != NameUse::Canonical) continue;
    t.add(first ? "\"" : ", \"");
    t.add(r.name);
    t.add("\"");
    first = false;
  }
  bool first_alias = true;
  for (const Row& r : rows) {
    if (!r.allowed || r.use == NameUse::Canonical) continue;
    t.add(first_alias ? " (aliases: " : ", ");
    if (r.name.find_first_not_of("0123456789") == std::string_view::npos) {
      t.add(r.name);  // Lightning's integer form, with_precision(32, fn)
      t.add(", ");
    }
    t.add("\"");
    t.add(r.name);
    t.add("\"");
    first_alias = false;
  }
  if (!first_alias) t.add(")");
  return t;
}

static_assert(names_text<all_precisions>(precision_name_list{}).view() ==
                  std::string_view(LOOM_DETAIL_PRECISION_NAMES),
              "LOOM_DETAIL_PRECISION_NAMES (precision_names.hpp) lists precision_name_list");

}  // namespace loom::detail
