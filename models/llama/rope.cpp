#include "llama/rope.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>

#include "dtensor/core/error.h"

namespace llama {
namespace {

// base ** (arange(0, dim, 2) / dim), fp32: the unscaled wavelengths' inverse's inverse (HF's pos_freqs).
at::Tensor pos_freqs(double base, int64_t dim, const at::TensorOptions& on) {
  return at::pow(base, at::arange(0, dim, 2, on.dtype(at::kLong)).to(at::kFloat) / static_cast<double>(dim));
}

// Llama 3.1: long wavelengths slowed by `factor`, short ones kept, the band between blended.
at::Tensor llama3(const RopeScaling& s, at::Tensor inv_freq) {
  const double factor = *s.factor, old_len = static_cast<double>(s.original_max_position_embeddings);
  const double low_wavelen = old_len / s.low_freq_factor, high_wavelen = old_len / s.high_freq_factor;
  at::Tensor wavelen = 2 * M_PI / inv_freq;
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv_freq / factor, inv_freq);
  at::Tensor smooth = (old_len / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * scaled / factor + smooth * scaled;
  at::Tensor medium = (wavelen < high_wavelen).logical_not() & (wavelen > low_wavelen).logical_not();
  return at::where(medium, smoothed, scaled);
}

double yarn_mscale(double scale, double mscale = 1.0) { return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0; }

RopeFrequencies yarn(const LlamaConfig& c, int64_t dim, const at::TensorOptions& on) {
  const RopeScaling& s = c.rotary.rope_scaling;
  const double base = c.rotary.rope_theta, original = static_cast<double>(s.original_max_position_embeddings);
  const double factor = s.factor ? *s.factor : static_cast<double>(c.max_position_embeddings) / original;
  double attention = 0;
  if (s.attention_factor) {
    attention = *s.attention_factor;
  } else if (s.mscale && s.mscale_all_dim && *s.mscale != 0 && *s.mscale_all_dim != 0) {
    attention = yarn_mscale(factor, *s.mscale) / yarn_mscale(factor, *s.mscale_all_dim);
  } else {
    attention = yarn_mscale(factor);
  }
  // The dims whose wavelengths turn fewer than beta_slow / more than beta_fast times over the original length.
  auto correction_dim = [&](double rotations) {
    return (static_cast<double>(dim) * std::log(original / (rotations * 2 * M_PI))) / (2 * std::log(base));
  };
  double low = correction_dim(s.beta_fast), high = correction_dim(s.beta_slow);
  if (s.truncate) low = std::floor(low), high = std::ceil(high);
  low = std::max(low, 0.0), high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  at::Tensor freqs = pos_freqs(base, dim, on);
  at::Tensor extrapolation = 1.0 / freqs, interpolation = 1.0 / (factor * freqs);
  at::Tensor ramp = ((at::arange(dim / 2, on.dtype(at::kFloat)) - low) / (high - low)).clamp(0, 1);
  at::Tensor keep = 1 - ramp;  // 1: extrapolate (high frequencies), 0: interpolate
  return {interpolation * (1 - keep) + extrapolation * keep, attention};
}

RopeFrequencies longrope(const LlamaConfig& c, int64_t dim, int64_t seq_len, const at::TensorOptions& on) {
  const RopeScaling& s = c.rotary.rope_scaling;
  const double original = static_cast<double>(s.original_max_position_embeddings);
  const double factor = s.factor ? *s.factor : static_cast<double>(c.max_position_embeddings) / original;
  double attention = 1.0;
  if (s.attention_factor) {
    attention = *s.attention_factor;
  } else if (factor > 1.0) {
    attention = std::sqrt(1 + std::log(factor) / std::log(original));
  }
  const auto& ext = seq_len > s.original_max_position_embeddings ? s.long_factor : s.short_factor;
  at::Tensor ext_factors = at::tensor(std::vector<float>(ext.begin(), ext.end()), on.dtype(at::kFloat));
  return {1.0 / (ext_factors * pos_freqs(c.rotary.rope_theta, dim, on)), attention};
}

}  // namespace

bool rope_depends_on_length(const LlamaConfig& c) {
  return c.rotary.rope_scaling.rope_type == "dynamic" || c.rotary.rope_scaling.rope_type == "longrope";
}

RopeFrequencies rope_frequencies(const LlamaConfig& c, int64_t seq_len, c10::Device device) {
  const int64_t dim = c.rotary_dim();  // HF's int(head_dim * partial_rotary_factor)
  const auto on = at::TensorOptions().device(device);
  const RopeScaling& s = c.rotary.rope_scaling;
  const std::string& type = s.rope_type;
  if (type == "default" && !s.freq_factors.empty()) {  // llama.cpp's rope_freqs: theta_i / factor_i
    const std::vector<float> f(s.freq_factors.begin(), s.freq_factors.end());
    return {1.0 / pos_freqs(c.rotary.rope_theta, dim, on) / at::tensor(f, on.dtype(at::kFloat))};
  }
  if (type == "default") return {1.0 / pos_freqs(c.rotary.rope_theta, dim, on)};
  if (type == "linear") return {1.0 / pos_freqs(c.rotary.rope_theta, dim, on) / *s.factor};
  if (type == "llama3") return {llama3(s, 1.0 / pos_freqs(c.rotary.rope_theta, dim, on))};
  if (type == "yarn") return yarn(c, dim, on);
  if (type == "longrope") return longrope(c, dim, seq_len, on);
  if (type == "dynamic") {
    // NTK: the base grows with the length past max_position_embeddings (fp32, as HF computes it from the
    // tensor max(position_ids) + 1).
    const double factor = *s.factor;
    const int64_t len = std::max(seq_len, c.max_position_embeddings);
    at::Tensor ratio = at::scalar_tensor(len, on.dtype(at::kLong)) * factor / static_cast<double>(c.max_position_embeddings);
    at::Tensor base = c.rotary.rope_theta * (ratio - (factor - 1)).pow(static_cast<double>(dim) / static_cast<double>(dim - 2));
    return {1.0 / at::pow(base, at::arange(0, dim, 2, on.dtype(at::kLong)).to(at::kFloat) / static_cast<double>(dim))};
  }
  throw DTENSOR_ERROR("dtensor: rope_type '", type, "' is not supported");
}

std::pair<at::Tensor, at::Tensor> rotary_tables(const LlamaConfig& config, int64_t table_len, c10::Device device,
                                                 int64_t freq_len) {
  const RopeFrequencies f = rope_frequencies(config, freq_len < 0 ? table_len : freq_len, device);
  at::Tensor freqs = at::outer(at::arange(table_len, f.inv_freq.options()), f.inv_freq);  // [t, d/2]
  // [t, d]: frequency i at (i, i + d/2), or at (2i, 2i + 1) for interleaved pairs
  at::Tensor angles = config.rotary.interleaved ? at::repeat_interleave(freqs, 2, -1) : at::cat({freqs, freqs}, -1);
  if (f.attention_scaling == 1.0) return {angles.cos(), angles.sin()};
  return {angles.cos() * f.attention_scaling, angles.sin() * f.attention_scaling};
}

at::Tensor apply_rotary(const at::Tensor& x_in, const at::Tensor& cos, const at::Tensor& sin, bool interleaved,
                        bool in_fp32) {
  if (cos.size(-1) < x_in.size(-1)) {  // partial rotary: the first cos.size(-1) dims turn, the rest pass
    const int64_t r = cos.size(-1);
    return at::cat({apply_rotary(x_in.narrow(-1, 0, r), cos, sin, interleaved, in_fp32),
                    x_in.narrow(-1, r, x_in.size(-1) - r)}, -1);
  }
  const at::Tensor x = in_fp32 ? x_in.to(at::kFloat) : x_in;
  const int64_t d = x.size(-1), half = d / 2;
  at::Tensor rotated;
  if (interleaved) {  // pairs (x[2i], x[2i+1]) -> (-x[2i+1], x[2i])
    const at::Tensor even = x.slice(-1, 0, d, 2), odd = x.slice(-1, 1, d, 2);
    rotated = at::stack({-odd, even}, -1).flatten(-2);
  } else {  // halves (x[i], x[i + d/2]) -> (-x[i + d/2], x[i])
    rotated = at::cat({-x.narrow(-1, half, half), x.narrow(-1, 0, half)}, -1);
  }
  return (x * cos + rotated * sin).to(x_in.scalar_type());
}

LlamaConfig local_rope_config(const LlamaConfig& c) {
  LlamaConfig local = c;
  local.rotary.rope_theta = c.rotary.local_theta;
  local.rotary.rope_scaling = RopeScaling{};
  return local;
}

}  // namespace llama
