// What the weight-only passes (int8_weight_only.h, int4_weight_only.h) and the weight prepack (weight_prepack.h)
// share: which Linear layers a pass may convert, and the record of the layers each pass converted (weakly: a dead
// model's entries expire).
#pragma once

#include <torch/nn/module.h>

#include <string>
#include <utility>
#include <vector>

#include "dtensor/nn/layers.h"
#include "dtensor/tensor/placement.h"

namespace dtensor::quant::detail {

enum class Scheme { int8_weight_only, int4_weight_only, bf16_prepacked };
const char* scheme_name(Scheme scheme);  // "int8 weight-only", "int4 weight-only", "prepacked bf16"

// The Linear layers of `model` (named, in module order) that `accept` takes (null: all) and no pass converted yet. A
// layer another override computes (float8, async TP), one with an adapter or a non-floating weight: one error naming it.
template <class Filter>
std::vector<std::pair<std::string, nn::LinearImpl*>> linears_to_convert(torch::nn::Module& model, Scheme scheme,
                                                                       const Filter& accept);
bool is_converted(const torch::nn::Module& module, Scheme scheme);
bool is_converted(const torch::nn::Module& module);  // by any scheme
void mark_converted(torch::nn::Module& module, Scheme scheme);  // a Linear (or a packed tied embedding)

// The output placements of a weight-only linear x . w^T, from x's and the (packed) weight's, per mesh dim:
//   x Replicate  . w Shard(0) -> Shard(-1)   Colwise: this rank's output columns, with its rows' scales
//   x Shard(-1)  . w Shard(1) -> Partial     Rowwise: this rank's part of each sum over k, already scaled
//   x p          . w Replicate -> p          where p is Replicate or a Shard of a dim other than k
// Any other pair: one error naming both layouts.
Placements output_placements(const at::Tensor& x, const at::Tensor& w, Scheme scheme);

// The name of a parameter of `linear` other than its weight and bias (an adapter's), or "" where it has none.
std::string other_parameter(nn::LinearImpl& linear);

// The non-template part of linears_to_convert: the checks on one chosen layer.
void check_convertible(const std::string& fqn, nn::LinearImpl& linear, Scheme scheme);

template <class Filter>
std::vector<std::pair<std::string, nn::LinearImpl*>> linears_to_convert(torch::nn::Module& model, Scheme scheme,
                                                                       const Filter& accept) {
  std::vector<std::pair<std::string, nn::LinearImpl*>> chosen;
  for (const auto& item : model.named_modules("", /*include_self=*/true)) {
    auto* linear = dynamic_cast<nn::LinearImpl*>(item.value().get());
    if (linear == nullptr || is_converted(*linear) || (accept && !accept(item.key(), *linear))) continue;
    check_convertible(item.key(), *linear, scheme);
    chosen.emplace_back(item.key(), linear);
  }
  return chosen;
}

}  // namespace dtensor::quant::detail
