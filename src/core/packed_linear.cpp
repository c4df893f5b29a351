// bf16 weights packed once for the AVX-512 BF16 GEMM (include/dtensor/core/packed_linear.h): the layout, its inverse,
// and the call (threads split the panels; each streams its panels once).
#include "dtensor/core/packed_linear.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/core/GradMode.h>

#include <cstring>
#include <vector>

#include "dtensor/core/error.h"
#include "dtensor/core/fast_kernels.h"

namespace dtensor {
namespace detail {
// src/core/bf16_packed_avx512.cpp: rows of x against panels [b0, b1) of the packed weight, each panel's fp32 sums
// rounded once into y (bf16).
void bf16_packed_rows_avx512(const uint16_t* x, int64_t M, int64_t K, const uint32_t* packed, int64_t b0, int64_t b1,
                             uint16_t* y, int64_t ldy);
// src/core/bf16_packed_amx.cpp: the same with AMX tiles; x has M rounded up to a multiple of 16 rows.
void bf16_packed_rows_amx(const uint16_t* x, int64_t M, int64_t K, const uint32_t* packed, int64_t b0, int64_t b1,
                          uint16_t* y, int64_t ldy);
}  // namespace detail

namespace {
constexpr int64_t kPanel = 64;
// Rows of x from which an AMX CPU runs the tiles (below: vdpbf16ps, which wastes nothing on a row of x where a tile
// product computes 16).
constexpr int64_t kAmxMinRows = 4;

bool on_amx() { return std::strcmp(bf16_linear_kernel(), "amx_bf16") == 0; }
}  // namespace

// Not yet on AMX CPUs: there (model 167) one row of x ran 1.5-2x slower packed than by the unpacked dot kernel
// (docs/benchmarks.md); bf16_packed_rows_amx is measured (8-256 rows: 0.7-1.0x the unpacked AMX kernel's time) but off.
bool bf16_packed_linear_available() { return std::strcmp(bf16_linear_kernel(), "avx512_bf16") == 0; }

bool bf16_packable(int64_t N, int64_t K) { return N > 0 && K > 0 && N % kPanel == 0 && K % 32 == 0; }

at::Tensor bf16_pack_weight(const at::Tensor& w) {
  DTENSOR_CHECK(w.dim() == 2 && w.scalar_type() == at::kBFloat16, "dtensor: bf16_pack_weight: a 2-D bf16 weight "
                "is packed (got ", w.dim(), "-D ", w.scalar_type(), ")");
  const int64_t N = w.size(0), K = w.size(1);
  DTENSOR_CHECK(bf16_packable(N, K), "dtensor: bf16_pack_weight: a weight [", N, ", ", K, "] cannot be packed: its "
                "rows must be a multiple of 64 and its columns of 32");
  // [N / 64, 64, K / 2, 2] -> [N / 64, K / 2, 64, 2]: each panel's pairs, 64 rows side by side.
  const at::Tensor packed = w.reshape({N / kPanel, kPanel, K / 2, 2}).permute({0, 2, 1, 3}).contiguous();
  return packed.view(at::kUInt16).view({N, K});
}

at::Tensor bf16_unpack_weight(const at::Tensor& packed) {
  DTENSOR_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kUInt16 && bf16_packable(packed.size(0), packed.size(1)),
                "dtensor: bf16_unpack_weight: not a packed weight (", packed.dim(), "-D ", packed.scalar_type(), ")");
  const int64_t N = packed.size(0), K = packed.size(1);
  return packed.contiguous().view(at::kBFloat16).view({N / kPanel, K / 2, kPanel, 2}).permute({0, 2, 1, 3})
      .reshape({N, K});
}

at::Tensor bf16_packed_linear(const at::Tensor& x, const at::Tensor& packed) {
  DTENSOR_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kUInt16 && packed.is_contiguous(),
                "dtensor: bf16_packed_linear: the weight is not a packed one (", packed.scalar_type(), ")");
  const int64_t N = packed.size(0), K = packed.size(1);
  DTENSOR_CHECK(x.scalar_type() == at::kBFloat16 && x.dim() >= 1 && x.size(-1) == K, "dtensor: bf16_packed_linear: "
                "input ", x.sizes(), " ", x.scalar_type(), " against a packed bf16 weight [", N, ", ", K, "]");
  DTENSOR_CHECK(!(x.requires_grad() && c10::GradMode::is_enabled()), "dtensor: bf16_packed_linear: a packed weight "
                "is for inference; its input requires grad (run under torch::NoGradGuard or leave the weights as "
                "they are)");
  std::vector<int64_t> shape = x.sizes().vec();
  shape.back() = N;
  if (!bf16_packed_linear_available() || !x.device().is_cpu() || x.numel() == 0) {
    return at::linear(x, bf16_unpack_weight(packed)).view(shape);
  }
  at::Tensor x2 = x.reshape({-1, K}).contiguous();
  const int64_t M = x2.size(0);
  at::Tensor y = at::empty({M, N}, x2.options());
  const bool amx = on_amx() && M >= kAmxMinRows;
  if (amx && M % 16 != 0) {  // the tiles read whole 16-row blocks of x: zero rows to the next one
    x2 = at::cat({x2, at::zeros({16 - M % 16, K}, x2.options())});
  }
  const auto* xp = reinterpret_cast<const uint16_t*>(x2.data_ptr<at::BFloat16>());
  const auto* wp = reinterpret_cast<const uint32_t*>(packed.data_ptr<uint16_t>());
  auto* yp = reinterpret_cast<uint16_t*>(y.data_ptr<at::BFloat16>());
  at::parallel_for(0, N / kPanel, /*grain_size=*/1, [&](int64_t b0, int64_t b1) {
    if (amx) {
      detail::bf16_packed_rows_amx(xp, M, K, wp, b0, b1, yp, N);
    } else {
      detail::bf16_packed_rows_avx512(xp, M, K, wp, b0, b1, yp, N);
    }
  });
  return y.view(shape);
}

at::Tensor bf16_packed_rows(const at::Tensor& packed, const at::Tensor& ids) {
  DTENSOR_CHECK(packed.dim() == 2 && packed.scalar_type() == at::kUInt16 && bf16_packable(packed.size(0), packed.size(1)),
                "dtensor: bf16_packed_rows: not a packed weight (", packed.dim(), "-D ", packed.scalar_type(), ")");
  DTENSOR_CHECK(!at::isFloatingType(ids.scalar_type()) && ids.scalar_type() != at::kBool,
                "dtensor: bf16_packed_rows: ids must be integers (got ", ids.scalar_type(), ")");
  const int64_t N = packed.size(0), K = packed.size(1);
  const at::Tensor flat = ids.reshape({-1}).to(at::kLong);
  if (flat.numel() > 0) {
    const auto [min, max] = at::aminmax(flat);  // one pass
    const int64_t lo = min.item<int64_t>(), hi = max.item<int64_t>();
    DTENSOR_CHECK(lo >= 0 && hi < N, "dtensor: bf16_packed_rows: id ", lo < 0 ? lo : hi, " is outside the weight's ",
                  N, " rows");
  }
  // [N / 64, K / 2, 64, 2][n / 64, :, n % 64, :] -> [ids, K / 2, 2]: row n's pairs in order.
  const at::Tensor panels = packed.contiguous().view(at::kBFloat16).view({N / kPanel, K / 2, kPanel, 2});
  const at::Tensor rows = panels.index({flat.div(kPanel, "floor"), at::indexing::Slice(), flat.remainder(kPanel)});
  std::vector<int64_t> shape = ids.sizes().vec();
  shape.push_back(K);
  return rows.reshape(shape);
}

}  // namespace dtensor
