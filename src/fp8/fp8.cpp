// loom::fp8's products (fp8/scaled_mm.hpp, fp8/delayed.hpp, fp8/linear.hpp, fp8/module.hpp)
// and the fp8-mixed precision's model conversion (precision/fp8.hpp): non-template code,
// compiled once here rather than in every translation unit that trains in fp8-mixed.
#include <cmath>
#include <cstdint>
#include <limits>
#include <memory>
#include <ostream>
#include <string>
#include <typeinfo>
#include <utility>
#include <vector>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>
#include <c10/util/Exception.h>
#include <torch/autograd.h>
#include <torch/nn/functional/linear.h>
#include <torch/nn/init.h>

#include <loom/error.hpp>
#include <loom/fp8/delayed.hpp>
#include <loom/fp8/linear.hpp>
#include <loom/fp8/module.hpp>
#include <loom/fp8/scaled_mm.hpp>
#include <loom/precision/fp8.hpp>

namespace loom::fp8 {

double max_value(c10::ScalarType dtype) {
  switch (dtype) {
    case c10::kFloat8_e4m3fn:
      return 448.0;
    case c10::kFloat8_e5m2:
      return 57344.0;
    default:
      throw Error(std::string("loom::fp8: ") + c10::toString(dtype) +
                  " is not an fp8 format loom casts to (float8_e4m3fn, float8_e5m2)");
  }
}

namespace detail {
namespace {

// The largest magnitude of `t` in fp32: 0-dim, or (rows, 1) per row. One pass over `t` in its
// own dtype and strides; exact (the largest magnitude is one of the values, and rounding to
// fp32 keeps their order). inf or nan when `t` holds one.
at::Tensor amax(const at::Tensor& t, bool per_row) {
  constexpr double inf = std::numeric_limits<double>::infinity();
  const at::Tensor m = per_row ? at::linalg_vector_norm(t, inf, at::IntArrayRef{1}, true)
                               : at::linalg_vector_norm(t, inf);
  return m.to(at::kFloat);
}

// clamp(t * scale, -top, top) cast to `dtype`, row-major whatever t's strides: t is read
// once in its own dtype and multiplied in fp32 (a 0-dim scale is given a dimension, so that
// it does not leave the product in t's dtype), clamped in place and cast.
at::Tensor cast(const at::Tensor& t, const at::Tensor& scale, c10::ScalarType dtype, double top) {
  const at::Tensor src = t.scalar_type() == at::kDouble ? t.to(at::kFloat) : t;
  at::Tensor x = at::empty(src.sizes(), src.options().dtype(at::kFloat));
  at::mul_out(x, src, scale.dim() == 0 ? scale.view({1, 1}) : scale);
  return x.clamp_(-top, top).to(dtype);
}

// On a CPU with AMX, _scaled_mm takes oneDNN's fp8 kernel, which is several hundred times
// slower than its emulated one (dequantise to fp32, then an fp32 matmul) and gives the same
// values; this guard selects the emulated one for the call. The flag it sets is LibTorch's
// process-wide "use oneDNN" switch, restored on exit: another thread's CPU convolutions run
// without oneDNN while it is held.
class [[nodiscard]] CpuEmulatedScaledMm {
 public:
  explicit CpuEmulatedScaledMm(bool cpu)
      : previous_(cpu && at::globalContext().userEnabledMkldnn()) {
    if (previous_) at::globalContext().setUserEnabledMkldnn(false);
  }
  CpuEmulatedScaledMm(const CpuEmulatedScaledMm&) = delete;
  CpuEmulatedScaledMm& operator=(const CpuEmulatedScaledMm&) = delete;
  ~CpuEmulatedScaledMm() {
    if (previous_) at::globalContext().setUserEnabledMkldnn(true);
  }

 private:
  bool previous_;
};

}  // namespace
}  // namespace detail

Quantized quantize(const at::Tensor& t, c10::ScalarType dtype, Scaling scaling) {
  if (t.dim() != 2) throw Error("loom::fp8::quantize: expected a matrix");
  if (scaling == Scaling::Delayed) {
    throw Error("loom::fp8::quantize: Scaling::Delayed takes its scale from a ScaleSlot");
  }
  const double top = max_value(dtype);
  const at::Tensor amax = detail::amax(t, scaling == Scaling::Rowwise).clamp_min_(amax_floor);
  const at::Tensor scale = at::reciprocal(amax).mul_(top);
  return {detail::cast(t, scale, dtype, top), at::reciprocal(scale)};
}

Quantized quantize(const at::Tensor& t, c10::ScalarType dtype, const ScaleSlot& slot) {
  if (t.dim() != 2) throw Error("loom::fp8::quantize: expected a matrix");
  const double top = max_value(dtype);
  const at::Tensor amax = detail::amax(t, false);
  at::Tensor recorded = slot.amax;  // the same tensor: maximum_out writes the slot in place
  at::maximum_out(recorded, slot.amax, amax);
  // amax - amax is 0, or nan when amax is inf or nan: then every element is nan.
  const at::Tensor scale = slot.scale + (amax - amax);
  return {detail::cast(t, scale, dtype, top), at::reciprocal(slot.scale)};
}

Quantized quantize(const at::Tensor& t, c10::ScalarType dtype, Scaling scaling,
                   const ScaleSlot& slot) {
  return scaling == Scaling::Delayed ? quantize(t, dtype, slot) : quantize(t, dtype, scaling);
}

at::Tensor mm(const Quantized& a, const Quantized& b, c10::ScalarType out_dtype, bool fast_accum) {
  // _scaled_mm: a row-major, b column-major (the transpose of a contiguous (n, k)); row-wise
  // scales (m, 1) and (1, n).
  const at::Tensor scale_b = b.inv_scale.dim() == 2 ? b.inv_scale.t().contiguous() : b.inv_scale;
  const detail::CpuEmulatedScaledMm emulated(a.data.is_cpu());
  return at::_scaled_mm(a.data, b.data.t(), a.inv_scale, scale_b, /*bias=*/std::nullopt,
                        /*scale_result=*/std::nullopt, out_dtype, fast_accum);
}

namespace detail {

Operands cast_operands(const at::Tensor& a, const at::Tensor& b, const MatmulOptions& o) {
  const int64_t pk = pad16(a.size(1)), pn = pad16(b.size(0));
  const at::Tensor ap = pk ? at::constant_pad_nd(a, {0, pk}) : a;
  const at::Tensor bp = (pk || pn) ? at::constant_pad_nd(b, {0, pk, 0, pn}) : b;
  return {quantize(ap, o.a_dtype, o.scaling, o.a_slot),
          quantize(bp, o.b_dtype, o.scaling, o.b_slot)};
}

}  // namespace detail

at::Tensor scaled_mm(const at::Tensor& a, const at::Tensor& b, const MatmulOptions& options) {
  if (a.dim() != 2 || b.dim() != 2 || a.size(1) != b.size(1)) {
    throw Error("loom::fp8::scaled_mm: expected a (m, k) and b (n, k)");
  }
  if (options.a_dtype == c10::kFloat8_e5m2 && options.b_dtype == c10::kFloat8_e5m2) {
    throw Error("loom::fp8::scaled_mm: e5m2 x e5m2 is not a product _scaled_mm runs");
  }
  if (options.scaling == Scaling::Delayed &&
      !(options.a_slot.scale.defined() && options.b_slot.scale.defined())) {
    throw Error("loom::fp8::scaled_mm: Scaling::Delayed needs both operands' scale slots");
  }
  const detail::Operands q = detail::cast_operands(a, b, options);
  const at::Tensor out = mm(q.a, q.b, options.out_dtype, options.fast_accum);
  const int64_t n = b.size(0);
  return out.size(1) != n ? out.narrow(1, 0, n) : out;
}

DelayedBlock DelayedBlock::make(int64_t layers, const DelayedOptions& options, c10::Device device) {
  if (options.history_len < 1) {
    throw Error("loom::fp8::DelayedOptions: history_len must be at least 1");
  }
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
  return {at::zeros({options.history_len, layers, 3}, f32), at::ones({layers, 3}, f32)};
}

void DelayedBlock::update(const DelayedOptions& options, c10::ScalarType grad_dtype) {
  if (layers() == 0) return;
  at::NoGradGuard no_grad;
  const at::Tensor amax = options.amax == DelayedOptions::Amax::Max
                              ? std::get<0>(amax_history.max(0))
                              : amax_history.select(0, 0).clone();
  const double e4m3 = max_value(c10::kFloat8_e4m3fn);
  at::Tensor sf = at::reciprocal(amax).mul_(e4m3 / std::ldexp(1.0, options.margin));
  sf.select(1, 2).mul_(max_value(grad_dtype) / e4m3);
  scale.copy_(at::where(at::isfinite(amax).logical_and_(amax > 0), sf, scale));
  if (amax_history.size(0) > 1) amax_history.copy_(at::roll(amax_history, -1, 0));
  amax_history.select(0, 0).zero_();
}

namespace detail {
namespace {

// The layer's slot of the block whose tensors forward saved.
ScaleSlot slot_of(torch::autograd::AutogradContext* ctx, Operand operand) {
  const DelayedBlock block{ctx->saved_data["history"].toTensor(),
                           ctx->saved_data["scale"].toTensor()};
  return block.slot(ctx->saved_data["layer"].toInt(), operand);
}

// Transposes a row-major fp8 matrix (rows, cols) into a row-major (cols, rows) one, with
// `pad` zero columns appended; moved as bytes (0 is +0 in both fp8 formats).
at::Tensor transposed(const at::Tensor& data, int64_t pad) {
  const at::Tensor bytes = data.view(at::kByte).t();
  const at::Tensor out =
      pad ? at::constant_pad_nd(bytes, {0, pad}).contiguous() : bytes.contiguous();
  return out.view(data.scalar_type());
}

// Under Scaling::Tensorwise and Scaling::Delayed one scale serves an operand in every
// product, so each operand is cast once: forward keeps its fp8 input and weight for
// backward, which casts the output gradient once and transposes the fp8 tensors it needs
// (bytes moved, not values cast again). Under Scaling::Rowwise the scales run along each
// product's own contraction dimension, so forward keeps x and the weight in their own
// dtypes and backward casts them again (scaled_mm). Both give the values of three
// independent scaled_mm calls, bit for bit.
struct LinearFunction : torch::autograd::Function<LinearFunction> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                            const at::Tensor& weight, int64_t scaling, int64_t grad_dtype,
                            DelayedRef delayed) {
    ctx->saved_data["scaling"] = scaling;
    ctx->saved_data["grad_dtype"] = grad_dtype;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    LinearRecipe r{static_cast<Scaling>(scaling), static_cast<c10::ScalarType>(grad_dtype)};
    MatmulOptions o = forward_options(r);
    if (r.scaling == Scaling::Delayed) {
      // The block's tensors themselves (not copies): backward records into the same history.
      ctx->saved_data["history"] = delayed.block->amax_history;
      ctx->saved_data["scale"] = delayed.block->scale;
      ctx->saved_data["layer"] = delayed.layer;
      o.a_slot = slot_of(ctx, Operand::Input);
      o.b_slot = slot_of(ctx, Operand::Weight);
    }
    if (r.scaling == Scaling::Rowwise) {
      ctx->save_for_backward({x, weight});
      return scaled_mm(x, weight, o);
    }
    // scaled_mm's operands, kept for backward: x8 (m, k'), w8 (n', k').
    const Operands q = cast_operands(x, weight, o);
    ctx->save_for_backward({q.a.data, q.a.inv_scale, q.b.data, q.b.inv_scale});
    const int64_t n = weight.size(0);
    ctx->saved_data["n"] = n;
    ctx->saved_data["k"] = x.size(1);
    const at::Tensor y = mm(q.a, q.b, o.out_dtype, o.fast_accum);
    return y.size(1) != n ? y.narrow(1, 0, n) : y;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const LinearRecipe r{static_cast<Scaling>(ctx->saved_data["scaling"].toInt()),
                         static_cast<c10::ScalarType>(ctx->saved_data["grad_dtype"].toInt())};
    const auto x_dtype = static_cast<c10::ScalarType>(ctx->saved_data["x_dtype"].toInt());
    const auto w_dtype = static_cast<c10::ScalarType>(ctx->saved_data["w_dtype"].toInt());
    const at::Tensor& dy = grads[0];
    MatmulOptions dx_options = grad_input_options(r), dw_options = grad_weight_options(r);
    if (r.scaling == Scaling::Delayed) {
      dx_options.a_slot = dw_options.a_slot = slot_of(ctx, Operand::GradOutput);
      dx_options.b_slot = slot_of(ctx, Operand::Weight);
      dw_options.b_slot = slot_of(ctx, Operand::Input);
    }
    at::Tensor dx, dw;
    if (r.scaling == Scaling::Rowwise) {
      const at::Tensor &x = saved[0], &weight = saved[1];
      if (ctx->needs_input_grad(0)) dx = scaled_mm(dy, weight.t(), dx_options).to(x_dtype);
      if (ctx->needs_input_grad(1)) dw = scaled_mm(dy.t(), x.t(), dw_options).to(w_dtype);
      return {dx, dw, at::Tensor(), at::Tensor(), at::Tensor()};
    }
    // x8 (m, k'), w8 (n', k'); dy (m, n) is cast once, padded along n to n'.
    const at::Tensor &x8 = saved[0], &x_inv = saved[1], &w8 = saved[2], &w_inv = saved[3];
    const int64_t n = ctx->saved_data["n"].toInt(), k = ctx->saved_data["k"].toInt();
    const int64_t m = dy.size(0), pn = w8.size(0) - n, pm = pad16(m);
    const at::Tensor dyp = pn ? at::constant_pad_nd(dy, {0, pn}) : dy;
    const Quantized qdy = quantize(dyp, r.grad_dtype, r.scaling, dx_options.a_slot);
    if (ctx->needs_input_grad(0)) {
      // dx = dy @ W: (m, n') x (k', n')^T.
      const at::Tensor out =
          mm(qdy, {transposed(w8, 0), w_inv}, dx_options.out_dtype, dx_options.fast_accum);
      dx = (out.size(1) != k ? out.narrow(1, 0, k) : out).to(x_dtype);
    }
    if (ctx->needs_input_grad(1)) {
      // dW = dy^T @ x: (n, m') x (k', m')^T, m padded with zeros to m'.
      at::Tensor dyt = transposed(qdy.data, pm);
      if (pn) dyt = dyt.narrow(0, 0, n).contiguous();
      const at::Tensor out = mm({dyt, qdy.inv_scale}, {transposed(x8, pm), x_inv},
                                dw_options.out_dtype, dw_options.fast_accum);
      dw = (out.size(1) != k ? out.narrow(1, 0, k) : out).to(w_dtype);
    }
    return {dx, dw, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace
}  // namespace detail

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  const LinearRecipe& recipe, DelayedRef delayed) {
  if (weight.dim() != 2 || x.dim() < 1 || x.size(-1) != weight.size(1)) {
    throw Error("loom::fp8::linear: the input's last dimension must be the weight's second");
  }
  if (recipe.scaling == Scaling::Delayed &&
      (delayed.block == nullptr || delayed.layer < 0 || delayed.layer >= delayed.block->layers())) {
    throw Error("loom::fp8::linear: Scaling::Delayed needs the layer's place in a DelayedBlock");
  }
  auto sizes = x.sizes().vec();
  sizes.back() = weight.size(0);
  at::Tensor y = detail::LinearFunction::apply(x.reshape({-1, x.size(-1)}), weight,
                                               static_cast<int64_t>(recipe.scaling),
                                               static_cast<int64_t>(recipe.grad_dtype), delayed)
                     .view(sizes);
  return bias.defined() ? y + bias.to(y.scalar_type()) : y;
}

LinearImpl::LinearImpl(const torch::nn::LinearOptions& options_) : options(options_) { reset(); }

LinearImpl::LinearImpl(const torch::nn::LinearImpl& other) : options(other.options) {
  weight = register_parameter("weight", other.weight);
  if (options.bias()) bias = register_parameter("bias", other.bias);
  train(other.is_training());
}

void LinearImpl::reset() {
  weight =
      register_parameter("weight", torch::empty({options.out_features(), options.in_features()}));
  if (options.bias()) bias = register_parameter("bias", torch::empty(options.out_features()));
  reset_parameters();
}

void LinearImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  torch::nn::init::kaiming_uniform_(weight, std::sqrt(5.0));
  if (bias.defined()) {
    const auto fan_in = std::get<0>(torch::nn::init::_calculate_fan_in_and_fan_out(weight));
    const double bound = 1.0 / std::sqrt(static_cast<double>(fan_in));
    torch::nn::init::uniform_(bias, -bound, bound);
  }
}

void LinearImpl::pretty_print(std::ostream& stream) const {
  stream << "loom::fp8::Linear(in_features=" << options.in_features()
         << ", out_features=" << options.out_features() << ", bias=" << std::boolalpha
         << options.bias() << ", fp8=" << (config_ ? "on" : "off") << ")";
}

at::Tensor LinearImpl::forward(const at::Tensor& input) {
  if (config_ && in_scope()) {
    return linear(input, weight, bias, config_->recipe, config_->delayed);
  }
  return torch::nn::functional::linear(input, weight, bias);
}

void LinearImpl::enable(const LayerConfig& config) {
  if (!eligible()) {
    throw Error(std::string("loom::fp8::Linear: fp8 needs both dimensions to be multiples of "
                            "16, not ") +
                dims(options));
  }
  config_ = std::make_shared<const LayerConfig>(config);
}

}  // namespace loom::fp8

namespace loom::precision {

void Fp8Mixed::convert_module(torch::nn::Module& root) {
  std::vector<std::string> kept;
  // 1. torch::nn::Linear layers of Sequentials become loom::fp8::Linear layers.
  if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(&root)) swap_linears(*seq);
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    if (auto* seq = dynamic_cast<torch::nn::SequentialImpl*>(item.value().get())) {
      swap_linears(*seq);
    }
  }
  // 2. Every eligible loom::fp8::Linear is enabled; the others are reported.
  std::vector<std::pair<std::string, fp8::LinearImpl*>> layers;
  auto visit = [&](const std::string& name, torch::nn::Module& m) {
    const std::string shown = name.empty() ? "(the model)" : "'" + name + "'";
    if (auto* l = dynamic_cast<fp8::LinearImpl*>(&m)) {
      if (l->eligible()) {
        layers.emplace_back(name, l);
      } else {
        l->disable();
        kept.push_back(shown + " (" + fp8::dims(l->options) + "): not multiples of 16");
      }
    } else if (typeid(m) == typeid(torch::nn::LinearImpl)) {
      const auto& options = static_cast<torch::nn::LinearImpl&>(m).options;
      kept.push_back(shown + " (" + fp8::dims(options) + ")" +
                     (fp8::eligible(options) ? ": a torch::nn::Linear member, which cannot be "
                                               "swapped; declare it as loom::fp8::Linear"
                                             : ": not multiples of 16"));
    }
  };
  visit("", root);
  for (const auto& item : root.named_modules("", /*include_self=*/false)) {
    visit(item.key(), *item.value());
  }
  names_.clear();
  block_.reset();
  if (recipe_.scaling == fp8::Scaling::Delayed) {
    block_ = std::make_shared<fp8::DelayedBlock>(
        fp8::DelayedBlock::make(static_cast<int64_t>(layers.size()), recipe_.delayed, device_));
  }
  for (std::size_t i = 0; i < layers.size(); ++i) {
    layers[i].second->enable({recipe_, {block_, static_cast<int64_t>(i)}});
    names_.push_back(layers[i].first);
  }
  if (!kept.empty()) {
    std::string list;
    for (const auto& k : kept) list += (list.empty() ? "" : "; ") + k;
    TORCH_WARN("loom: fp8-mixed keeps ", kept.size(), " linear layer(s) in bf16: ", list);
  }
}

StateDict Fp8Mixed::state_dict() const {
  StateDict state;
  if (!block_) return state;
  for (std::size_t i = 0; i < names_.size(); ++i) {
    const auto l = static_cast<int64_t>(i);
    state[key(names_[i], "amax_history")] = block_->amax_history.select(1, l).clone();
    state[key(names_[i], "scale")] = block_->scale.select(0, l).clone();
  }
  return state;
}

void Fp8Mixed::load_state_dict(const StateDict& state) {
  if (recipe_.scaling != fp8::Scaling::Delayed) {
    Mixed::load_state_dict(state);  // no state: refuses any key
    return;
  }
  static constexpr std::string_view owner = "loom::precision::Fp8Mixed::load_state_dict";
  if (!block_) {
    if (state.empty()) return;
    state::fail_key(owner, "",
                    "fp8-mixed state loads after setup(): the layers it belongs to are "
                    "converted there");
  }
  state::Reader r(std::string(owner), state);
  for (std::size_t i = 0; i < names_.size(); ++i) {
    const auto l = static_cast<int64_t>(i);
    load_one(r, key(names_[i], "amax_history"), block_->amax_history.select(1, l));
    load_one(r, key(names_[i], "scale"), block_->scale.select(0, l));
  }
  r.finish();
}

void Fp8Mixed::swap_linears(torch::nn::SequentialImpl& seq) {
  const auto children = seq.named_children();
  if (children.size() != seq.size()) return;  // not built by push_back: leave it alone
  bool any = false;
  for (const auto& c : children) {
    const auto& m = *c.value();
    any = any || (typeid(m) == typeid(torch::nn::LinearImpl) &&
                  fp8::eligible(static_cast<const torch::nn::LinearImpl&>(m).options));
  }
  if (!any) return;
  torch::nn::SequentialImpl rebuilt;
  std::size_t i = 0;
  for (const torch::nn::AnyModule& a : seq) {
    const auto& c = children[i++];
    const auto& m = *c.value();
    if (typeid(m) == typeid(torch::nn::LinearImpl) &&
        fp8::eligible(static_cast<const torch::nn::LinearImpl&>(m).options)) {
      rebuilt.push_back(std::string(c.key()), fp8::Linear(std::make_shared<fp8::LinearImpl>(
                                                  static_cast<const torch::nn::LinearImpl&>(m))));
    } else {
      rebuilt.push_back(std::string(c.key()), a);
    }
  }
  if (!seq.is_training()) rebuilt.train(false);
  seq = std::move(rebuilt);
}

void Fp8Mixed::load_one(state::Reader& r, const std::string& k, at::Tensor target) {
  const at::Tensor t = r.tensor(k);
  if (t.sizes() != target.sizes()) {
    r.fail(k, "expected a tensor of shape " + c10::str(target.sizes()) + ", got " +
                  c10::str(t.sizes()) + " (a different history_len, or another model)");
  }
  at::NoGradGuard no_grad;
  target.copy_(t);
}

void Fp8Mixed::probe_cuda(c10::Device device) {
  try {
    const auto f32 = at::TensorOptions().dtype(at::kFloat).device(device);
    const at::Tensor a = at::zeros({16, 16}, f32).to(c10::kFloat8_e4m3fn);
    const at::Tensor one = at::ones({}, f32);
    (void)at::_scaled_mm(a, a.t(), one, one, std::nullopt, std::nullopt, c10::kBFloat16, false);
  } catch (const c10::Error& e) {
    std::string what =
        "loom: fp8-mixed needs a CUDA device of compute capability 8.9 or newer (Ada, Hopper, "
        "Blackwell) for its fp8 products; ";
    what += device.str();
    what += " cannot run them: ";
    what += e.what_without_backtrace();
    throw Error(what);
  }
}

}  // namespace loom::precision
