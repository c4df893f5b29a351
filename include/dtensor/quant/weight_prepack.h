// Linear weights packed once for the CPU's batched GEMM (IPEX's ipex.optimize(model, weights_prepack=True)): each
// chosen bf16 weight becomes its packed form (dtensor/core/packed_linear.h: the same values, laid out for the AVX-512
// BF16 kernel), a DTensor where the weight was one (same placements: each rank packs its own shard), and the layer's
// forward computes bf16_packed_linear on the local shards:
//   Colwise  W Shard(0)  x Replicate . W^T -> Shard(-1)
//   Rowwise  W Shard(1)  x Shard(-1) . W^T -> Partial (the style's one reduction sums the parts)
//   Replicate            x keeps its placement
// A layout change, not a quantization: the numbers are at::linear's within one bf16 rounding (the sums' order).
// For inference: the packed weight has no gradient and takes no optimizer; it is no weight to save (a checkpoint of a
// packed model would hold the packed order: save before packing).
//
// Which layers: every dtensor::nn::Linear that `filter` accepts and that can run packed — a bf16 weight whose local
// shard is [a multiple of 64, a multiple of 32], no other pass converted it (int8 / int4, float8, async TP), it carries
// no adapter, and its weight is its own or tied to one Embedding alone (Llama 3.2's lm_head): the pair is packed once,
// the lookup gathering its rows from the packed layout (bf16_packed_rows: bit for bit the rows; under a Shard(0)
// weight each rank's rows, zeros elsewhere, Partial for the style's reduction), so a tie costs no second copy. The
// others are left as they are: packing is an optimization, never a refusal.
#pragma once

#include <torch/nn/module.h>

#include <string>
#include <vector>

#include "dtensor/quant/int8_weight_only.h"  // ModuleFilter

namespace dtensor::quant {

// Packs the chosen layers' weights where the packed kernel runs here (bf16_packed_linear_available); elsewhere
// changes nothing, unless `only_where_fast` is false (then the packed layers run the reference, at::linear on the
// unpacked weight: the same numbers, slower; for tests of the pass on any CPU). Returns the packed layers' names in
// module order.
std::vector<std::string> prepack_linear_weights_(torch::nn::Module& model, const ModuleFilter& filter = {},
                                                 bool only_where_fast = true);

// Whether `module` is a Linear (or a tied Embedding) whose weight prepack_linear_weights_ packed.
bool is_prepacked(const torch::nn::Module& module);

}  // namespace dtensor::quant
